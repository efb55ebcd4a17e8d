"""Ranking lists with named features: TF-Ranking's ELWC and SequenceExample records, read by spec.

Where the vector layouts hold one float vector per document, these records hold features by name:
context features once per list (the query's tokens, the user), document features per document and
the label under its own key. :func:`resolve_spec` takes TF-Ranking's ``tf.io`` spec dictionaries as
they are (or a :class:`~tfapprox.data.feature_spec.FeatureSpec`), and :func:`batch_reader` parses a
batch of serialized lists into what TF-Ranking's ``SimpleDatasetBuilder`` yields:

- each context feature ``[B, ...]`` as ``tf.io.parse_example`` gives it: dense for
  ``FixedLenFeature``, ``SparseTensor`` for ``VarLenFeature``, ``RaggedTensor`` for ``RaggedFeature``;
- each document feature ``[B, L, ...]`` likewise (ragged ``[B, L, None]`` for ``RaggedFeature``);
- ``features[mask_feature_name]``, bool ``[B, L]``: True on real documents;
- labels float32 ``[B, L]``: the label (its spec's default where a document lacks it), −1 on
  padded slots.

Padded slots hold each feature's default (0 or "" where the spec gives none). :func:`scan` reads
files once and checks them against a spec (dtypes, lengths, features no record holds, documents
without a label); :func:`encode_named_list` and :func:`write_named_records` write such records.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import numpy as np
import tensorflow as tf

from tfapprox.data import records, shards
from tfapprox.data.feature_spec import MASK_FEATURE_NAME, FeatureSpec
from tfapprox.files import create_file, fresh_name

FORMATS = {"elwc": "elwc", "example_list_with_context": "elwc",
           "sequence_example": "sequence_example"}
_DTYPES = (tf.float32, tf.int64, tf.string)
_SCAN_BATCH = 256


class NamedSpec(NamedTuple):
    """TF-Ranking's three specs, checked: what :func:`batch_reader` parses."""

    context: dict  # {name: tf.io spec}
    example: dict  # {name: tf.io spec} of the document features, the label's included
    label: str
    mask_feature_name: str
    record_format: str | None  # None: detected from the files
    label_default: float


# --------------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------------
def resolve_spec(feature_spec=None, context_feature_spec=None, example_feature_spec=None,
                 label_spec=None, mask_feature_name=MASK_FEATURE_NAME,
                 data_format=None) -> NamedSpec | None:
    """Returns the checked spec, or None when neither a ``feature_spec`` nor TF-Ranking's specs are
    given (the vector layouts). ``feature_spec``: a :class:`FeatureSpec` or its file's path."""
    tf_specs = (context_feature_spec, example_feature_spec, label_spec)
    if feature_spec is None and all(s is None for s in tf_specs):
        if data_format is not None:
            raise ValueError("data_format goes with a feature spec; the vector layouts are detected")
        return None
    if feature_spec is not None:
        if any(s is not None for s in tf_specs):
            raise ValueError("give either feature_spec or TF-Ranking's context_feature_spec/"
                             "example_feature_spec/label_spec, not both")
        if isinstance(feature_spec, (str, os.PathLike)):
            feature_spec = FeatureSpec.load(feature_spec)
        context_feature_spec = feature_spec.context_feature_spec()
        example_feature_spec = feature_spec.example_feature_spec()
        label_spec = feature_spec.label_spec()
        if mask_feature_name == MASK_FEATURE_NAME:
            mask_feature_name = feature_spec.mask_feature_name
        data_format = data_format or feature_spec.record_format
    if not example_feature_spec:
        raise ValueError("example_feature_spec must name at least one document feature")
    if label_spec is None:
        raise ValueError("label_spec is missing: (name, tf.io.FixedLenFeature([1], tf.float32, "
                         "default_value=-1.0))")
    label, label_feature = _checked_label_spec(label_spec)
    context, example = dict(context_feature_spec or {}), dict(example_feature_spec)
    if example.get(label, label_feature) != label_feature:
        raise ValueError(f"example_feature_spec's {label!r} differs from label_spec's")
    example[label] = label_feature
    for where, specs in (("context_feature_spec", context), ("example_feature_spec", example)):
        for name, spec in specs.items():
            _check_io_spec(where, name, spec)
    both = sorted(set(context) & set(example))
    if both:
        raise ValueError(f"{', '.join(both)}: named both as a context and a document feature")
    if mask_feature_name in context or mask_feature_name in example:
        raise ValueError(f"mask_feature_name {mask_feature_name!r} is also a feature's name")
    if data_format is not None and data_format not in FORMATS:
        raise ValueError(f"data_format must be one of {sorted(set(FORMATS))}; got {data_format!r}")
    default = label_feature.default_value
    label_default = float(-1.0 if default is None else np.reshape(default, [-1])[0])
    return NamedSpec(context, example, label, mask_feature_name,
                     FORMATS.get(data_format), label_default)


def _checked_label_spec(label_spec) -> tuple[str, tf.io.FixedLenFeature]:
    usage = "label_spec must be (name, tf.io.FixedLenFeature([1], tf.float32 or tf.int64, default))"
    if not isinstance(label_spec, (tuple, list)) or len(label_spec) != 2:
        raise ValueError(f"{usage}; got {label_spec!r}")
    name, spec = label_spec
    if (not isinstance(name, str) or not isinstance(spec, tf.io.FixedLenFeature)
            or int(np.prod(spec.shape)) != 1 or spec.dtype not in (tf.float32, tf.int64)):
        raise ValueError(f"{usage}; got {label_spec!r}")
    return name, spec


def _check_io_spec(where: str, name: str, spec) -> None:
    if not isinstance(spec, (tf.io.FixedLenFeature, tf.io.VarLenFeature, tf.io.RaggedFeature)):
        raise ValueError(f"{where}[{name!r}]: a FixedLenFeature, VarLenFeature or RaggedFeature is "
                         f"read; got {type(spec).__name__}")
    if spec.dtype not in _DTYPES:
        raise ValueError(f"{where}[{name!r}]: dtype must be float32, int64 or string; got "
                         f"{spec.dtype.name}")
    if isinstance(spec, tf.io.RaggedFeature) and (
            spec.partitions or spec.value_key not in (None, name)):
        raise ValueError(f"{where}[{name!r}]: a RaggedFeature is read as one token list per "
                         "document (no partitions, no other value_key)")
    if isinstance(spec, tf.io.FixedLenFeature) and not all(
            isinstance(d, (int, np.integer)) and d >= 0 for d in spec.shape):
        raise ValueError(f"{where}[{name!r}]: FixedLenFeature needs a fully defined shape; got "
                         f"{spec.shape}")


def _value_count(spec) -> int | None:
    """Values a record must hold for ``spec``: its size when fixed, None when it varies."""
    return int(np.prod(spec.shape)) if isinstance(spec, tf.io.FixedLenFeature) else None


def _default_row(spec) -> tf.Tensor:
    """A fixed-length feature's default, shaped like one value of it."""
    default = spec.default_value
    if default is None:
        default = "" if spec.dtype == tf.string else 0
    return tf.broadcast_to(tf.constant(default, spec.dtype), spec.shape)


def _padding_example(specs: dict) -> bytes:
    """A document Example for padded slots: zeros for each fixed-length feature without a default
    (which ``tf.io.parse_example`` would otherwise require), nothing else."""
    example = tf.train.Example()
    for name, spec in specs.items():
        if isinstance(spec, tf.io.FixedLenFeature) and spec.default_value is None:
            values = example.features.feature[name]
            size = _value_count(spec)
            if spec.dtype == tf.string:
                values.bytes_list.value.extend([b""] * size)
            elif spec.dtype == tf.int64:
                values.int64_list.value.extend([0] * size)
            else:
                values.float_list.value.extend([0.0] * size)
    return example.SerializeToString()


# --------------------------------------------------------------------------------------------------
# Parsing a batch of serialized lists
# --------------------------------------------------------------------------------------------------
def unflatten(value, batch, width):
    """``[B * W, ...]`` -> ``[B, W, ...]`` for a dense, ragged or sparse tensor."""
    if isinstance(value, tf.RaggedTensor):
        return tf.RaggedTensor.from_uniform_row_length(value, tf.cast(width, value.row_splits.dtype))
    if isinstance(value, tf.SparseTensor):
        shape = tf.concat([tf.cast([batch, width], tf.int64), value.dense_shape[1:]], axis=0)
        return tf.sparse.reshape(value, shape)
    reshaped = tf.reshape(value, tf.concat([[batch, width], tf.shape(value)[1:]], axis=0))
    reshaped.set_shape([None, None] + value.shape[1:])
    return reshaped


def _take_documents(value, frames, spec, indices, valid):
    """Gathers ``indices [B, K]`` along the document axis of a parsed SequenceExample feature (dense
    ``[B, W, ...]``, ragged ``[B, (W), (N)]`` or sparse ``[B, W, N]``); slots that are not ``valid``,
    or past the list's ``frames`` of this feature, get the default (an empty row, if ragged)."""
    batch, k = tf.shape(indices, tf.int64)[0], tf.shape(indices, tf.int64)[1]
    indices = tf.cast(indices, tf.int64)
    real = valid & (indices < tf.cast(frames, tf.int64)[:, None])
    sparse = isinstance(value, tf.SparseTensor)
    if sparse:
        width = value.dense_shape[1]
        shape = value.dense_shape
        rows = tf.RaggedTensor.from_sparse(
            tf.sparse.reshape(value, tf.stack([shape[0] * shape[1], shape[2]])))
        starts = tf.range(batch) * width
    elif isinstance(value, tf.RaggedTensor):
        rows, starts = value.values, tf.cast(value.row_starts(), tf.int64)
    else:
        width = tf.shape(value, tf.int64)[1]
        rows = tf.reshape(value, tf.concat([[-1], tf.shape(value)[2:]], axis=0))
        starts = tf.range(batch) * width
    if isinstance(rows, tf.RaggedTensor):
        padding_row = tf.RaggedTensor.from_row_lengths(tf.zeros([0], value.dtype),
                                                       tf.zeros([1], rows.row_splits.dtype))
        count = tf.cast(rows.nrows(), tf.int64)
    else:
        padding_row = _default_row(spec)[None]
        count = tf.shape(rows, tf.int64)[0]
    rows = tf.concat([rows, padding_row], axis=0)
    flat = tf.where(real, starts[:, None] + indices, count)
    taken = unflatten(tf.gather(rows, tf.reshape(flat, [-1])), batch, k)
    return taken.to_sparse() if sparse else taken


def _sequence_feature(spec):
    """The ``parse_sequence_example`` spec of a document feature."""
    if isinstance(spec, tf.io.FixedLenFeature):
        return tf.io.FixedLenSequenceFeature(spec.shape, spec.dtype, allow_missing=True)
    return spec


def _frames(value, lengths: dict, name: str, batch) -> tf.Tensor:
    """Per list, how many documents a parsed SequenceExample feature holds."""
    if name in lengths:
        return lengths[name]
    if isinstance(value, tf.RaggedTensor):
        return tf.cast(value.row_lengths(), tf.int64)
    last = tf.math.unsorted_segment_max(value.indices[:, 1] + 1, value.indices[:, 0], batch)
    return tf.maximum(last, 0)


def batch_reader(spec: NamedSpec, record_format: str, list_size: int | None = None,
                 seed: tf.Tensor | None = None) -> Callable:
    """Returns ``read(serialized [B], batch_index, size=None) -> (features, labels)``.

    ``list_size=None`` pads to the batch's longest list, or to ``size`` (a length bucket) when that
    is larger; an int truncates and pads every list to ``list_size``. With ``seed`` truncation keeps
    a uniformly random subset of each longer list, drawn from ``(seed, batch_index)`` (TF-Ranking
    shuffles a list before truncating it: the same draw), in list order; without it, the head.
    """
    padding = _padding_example(spec.example)
    context_specs = spec.context

    def positions(lengths, width, batch_index, size):
        """``(indices [B, K], valid [B, K])``: the documents each slot takes (a SequenceExample's;
        an ELWC's are chosen before parsing)."""
        lengths = tf.cast(lengths, tf.int32)
        if list_size is not None:
            step_seed = None if seed is None else records.batch_seed(seed, batch_index)
            indices, kept = records.choose_documents(lengths, width, list_size, step_seed)
            return records.pad_lists(indices, list_size, 0), tf.sequence_mask(kept, list_size)
        k = width if size is None else tf.maximum(size, width)
        indices = tf.tile(tf.range(k)[None, :], [tf.shape(lengths)[0], 1])
        return indices, tf.sequence_mask(lengths, k)

    def read_elwc(serialized, batch_index, size):
        examples, lengths, contexts = records.decode_elwc_with_context(serialized)
        width = tf.shape(examples)[1]
        if list_size is not None:  # slots past a list's kept documents are "" (padding)
            step_seed = None if seed is None else records.batch_seed(seed, batch_index)
            indices, lengths = records.choose_documents(lengths, width, list_size, step_seed)
            examples = records.pad_lists(tf.gather(examples, indices, batch_dims=1), list_size, "")
        elif size is not None:
            examples = records.pad_lists(examples, tf.maximum(size, width), "")
        mask = tf.sequence_mask(lengths, tf.shape(examples)[1])
        if padding:
            examples = tf.where(mask, examples, padding)
        shape = tf.shape(examples)
        parsed = tf.io.parse_example(tf.reshape(examples, [-1]), spec.example)
        documents = {name: unflatten(value, shape[0], shape[1]) for name, value in parsed.items()}
        context = tf.io.parse_example(contexts, context_specs) if context_specs else {}
        return context, documents, mask

    def read_sequences(serialized, batch_index, size):
        context, sequences, lengths = tf.io.parse_sequence_example(
            serialized, context_features=context_specs or None,
            sequence_features={name: _sequence_feature(s) for name, s in spec.example.items()})
        batch = tf.shape(serialized)[0]
        frames = {name: _frames(value, lengths, name, batch) for name, value in sequences.items()}
        list_lengths = tf.reduce_max(tf.stack(list(frames.values())), axis=0)
        indices, mask = positions(list_lengths, tf.cast(tf.reduce_max(list_lengths), tf.int32),
                                  batch_index, size)
        documents = {name: _take_documents(value, frames[name], spec.example[name], indices, mask)
                     for name, value in sequences.items()}
        return context, documents, mask

    parse = read_elwc if record_format == "elwc" else read_sequences

    def read(serialized, batch_index=None, size=None):
        context, documents, mask = parse(tf.convert_to_tensor(serialized, tf.string),
                                         batch_index, size)
        labels = tf.cast(tf.reshape(documents.pop(spec.label), tf.shape(mask)), tf.float32)
        with tf.control_dependencies([records.assert_finite_labels(labels, mask, spec.label)]):
            labels = tf.where(mask, labels, records.PAD_LABEL)
        if list_size is not None:
            mask = tf.ensure_shape(mask, [None, list_size])
            labels = tf.ensure_shape(labels, [None, list_size])
            documents = {name: tf.ensure_shape(value, [None, list_size, *value.shape[2:]])
                         if isinstance(value, tf.Tensor) else value
                         for name, value in documents.items()}
        return {**context, **documents, spec.mask_feature_name: mask}, labels

    return read


def lengths_reader(spec: NamedSpec, record_format: str) -> Callable:
    """Returns ``lengths(serialized [B]) -> int64 [B]``, each list's document count (for a
    SequenceExample, its label's feature list), read without parsing the other features."""

    def lengths(serialized):
        if record_format == "elwc":
            return tf.cast(records.decode_elwc(serialized)[1], tf.int64)
        label = _sequence_feature(spec.example[spec.label])
        _, _, counts = tf.io.parse_sequence_example(serialized, sequence_features={spec.label: label})
        return counts[spec.label]

    return lengths


# --------------------------------------------------------------------------------------------------
# Checking files against a spec
# --------------------------------------------------------------------------------------------------
_KINDS = {"float_list": "float32", "int64_list": "int64", "bytes_list": "string"}


def _described(feature_map) -> dict:
    """``{name: (dtype name, value count)}`` of a ``tf.train.Features`` map; an empty Feature
    (no values) is left out: it holds nothing."""
    out = {}
    for name, feature in feature_map.items():
        kind = feature.WhichOneof("kind")
        count = len(getattr(feature, kind).value) if kind else 0
        if count:
            out[name] = (_KINDS[kind], count)
    return out


def _as_elwc(serialized: bytes) -> tuple[dict, list[dict]]:
    examples, context = records.split_elwc(serialized)
    documents = [_described(tf.train.Example.FromString(e).features.feature) for e in examples]
    return _described(tf.train.Example.FromString(context).features.feature), documents


def _as_sequence_example(serialized: bytes) -> tuple[dict, list[dict]]:
    sequence = tf.train.SequenceExample.FromString(serialized)
    lists = sequence.feature_lists.feature_list
    documents = [{} for _ in range(max([len(f.feature) for f in lists.values()], default=0))]
    for name, feature_list in lists.items():
        for document, values in zip(documents, feature_list.feature):
            document.update(_described({name: values}))
    return _described(sequence.context.feature), documents


_READERS = {"elwc": _as_elwc, "sequence_example": _as_sequence_example}
FORMAT_NAMES = {"elwc": "ExampleListWithContext (ELWC)", "sequence_example": "SequenceExample"}


def read_record(serialized: bytes, record_format: str) -> tuple[dict, list[dict]] | None:
    """``(context, documents)`` of one record read as ``record_format``, each a ``{name: (dtype
    name, value count)}`` of the features it holds; None when the bytes are not such a record (they
    do not parse, or their keys are not names)."""
    try:
        context, documents = _READERS[record_format](serialized)
    except Exception:  # noqa: BLE001 - protobuf raises DecodeError or others for other messages
        return None
    names = [*context, *(n for d in documents for n in d)]
    if not documents or not all(n.isprintable() for n in names):
        return None
    return context, documents


def detect_format(serialized: bytes, expected: Iterable[str] = ()) -> str | None:
    """The format a record is in: of those it reads as, the one holding most of the ``expected``
    names (else the only one). None when it reads as neither."""
    fits = {f: read_record(serialized, f) for f in _READERS}
    fits = {f: read for f, read in fits.items() if read is not None}
    expected = set(expected)

    def held(record_format):
        context, documents = fits[record_format]
        return len(expected & ({*context} | {n for d in documents for n in d}))

    if len(fits) > 1 and expected:
        return max(fits, key=held)
    return next(iter(fits)) if len(fits) == 1 else None


def record_format_of(files: list[Path], spec: NamedSpec) -> str:
    """The record format of ``files``, checked against the spec's; the first file whose first
    record is in another format is named."""
    names = set(spec.example) | set(spec.context)
    found = None
    for path in files:
        first = list(tf.data.TFRecordDataset(str(path)).take(1).as_numpy_iterator())
        if not first:
            continue
        detected = detect_format(first[0], names)
        if detected is None:
            raise shards.RecordError(f"{path}: the first record is neither an "
                                     "ExampleListWithContext nor a SequenceExample ranking list")
        wanted = spec.record_format or found
        if wanted is not None and detected != wanted:
            source = "data_format" if spec.record_format else f"{files[0]}'s records"
            raise shards.RecordError(
                f"{path}: records are {FORMAT_NAMES[detected]}s but {source} says "
                f"{FORMAT_NAMES[wanted]}; pass data_format={detected!r}")
        found = detected
    if found is None:
        raise shards.RecordError(f"no records in any of {len(files)} file(s): {files[0]} ...")
    return found


class ScanResult(NamedTuple):
    lists: int
    documents: int
    present: dict  # {feature name: lists (context) or documents holding it}
    label_missing: int  # real documents without a label


def _scan_batch(spec: NamedSpec, record_format: str) -> Callable:
    """Returns ``counts(serialized [B])``: lists, documents, and per feature how many records hold
    it and how many hold another number of values than a fixed-length spec says."""
    context_specs = {n: tf.io.RaggedFeature(s.dtype) for n, s in spec.context.items()}
    example_specs = {n: tf.io.RaggedFeature(s.dtype) for n, s in spec.example.items()}
    expected = {n: _value_count(s) for n, s in {**spec.context, **spec.example}.items()}

    def counts(serialized):
        if record_format == "elwc":
            examples, lengths, contexts = records.decode_elwc_with_context(serialized)
            real = tf.boolean_mask(examples, tf.sequence_mask(lengths, tf.shape(examples)[1]))
            documents = tf.io.parse_example(real, example_specs)
            values = {n: v.row_lengths() for n, v in documents.items()}
            context = tf.io.parse_example(contexts, context_specs) if context_specs else {}
            values.update({n: v.row_lengths() for n, v in context.items()})
            num_docs = tf.reduce_sum(tf.cast(lengths, tf.int64))
        else:
            context, documents, _ = tf.io.parse_sequence_example(
                serialized, context_features=context_specs or None,
                sequence_features=example_specs)
            values = {n: v.values.row_lengths() for n, v in documents.items()}
            values.update({n: v.row_lengths() for n, v in context.items()})
            num_docs = tf.reduce_sum(tf.reduce_max(tf.stack(
                [v.row_lengths() for v in documents.values()]), axis=0))
        out = {"lists": tf.size(serialized, tf.int64), "documents": num_docs}
        for name, count in values.items():
            held = count > 0
            out["present/" + name] = tf.reduce_sum(tf.cast(held, tf.int64))
            if expected[name] is not None:
                # A SequenceExample cannot leave a fixed-length value out of a document's frame.
                strict = record_format == "sequence_example" and name in spec.example
                wrong = (count != expected[name]) & (True if strict else held)
                out["wrong/" + name] = tf.reduce_sum(tf.cast(wrong, tf.int64))
                out["count/" + name] = tf.reduce_max(tf.where(wrong, count, -1))
        return out

    return counts


_SCAN_FUNCTIONS: dict = {}


def _scan_function(spec: NamedSpec, record_format: str) -> Callable:
    """``_scan_batch`` as one traced function per (features, format) in a process: tracing the
    checks of every feature costs seconds with a hundred features, and a training run reads its
    splits with the same spec."""
    key = (repr(sorted(spec.context.items())), repr(sorted(spec.example.items())), record_format)
    if key not in _SCAN_FUNCTIONS:
        _SCAN_FUNCTIONS[key] = tf.function(
            _scan_batch(spec, record_format),
            input_signature=[tf.TensorSpec([None], tf.string)])
    return _SCAN_FUNCTIONS[key]


def _feature_error(path: Path, err: tf.errors.OpError) -> shards.RecordError:
    text = shards.error_summary(err)
    match = re.search(r"(?:Key|Feature list): ([^,]+), Index: \d+\.\s+([^\n\[]*)",
                      err.message or "")
    if match:
        text = f"feature {match.group(1)!r}: {match.group(2).strip()}"
    return shards.RecordError(f"{path}: {text}")


def scan(files: list[Path], spec: NamedSpec, record_format: str,
         limit: int | None = None) -> ScanResult:
    """Reads ``files`` (each file's first ``limit`` lists, or all) and checks them against ``spec``.

    Raises ``shards.RecordError`` naming the file and the feature for a feature of another dtype,
    a fixed-length feature with another number of values, a corrupt file, and a feature of the
    spec that no record read holds.
    """
    counts = _scan_function(spec, record_format)
    totals: dict = {}
    for path in files:
        data = tf.data.TFRecordDataset(str(path))
        if limit is not None:
            data = data.take(limit)
        file_totals: dict = {}
        try:
            for batch in data.batch(_SCAN_BATCH):
                for key, value in counts(batch).items():
                    value = int(value)
                    merge = max if key.startswith("count/") else int.__add__
                    file_totals[key] = merge(file_totals.get(key, -1 if merge is max else 0), value)
        except tf.errors.OpError as err:
            raise _feature_error(path, err) from None
        for name, spec_of in {**spec.context, **spec.example}.items():
            if file_totals.get("wrong/" + name):
                where = "lists" if name in spec.context else "documents"
                raise shards.RecordError(
                    f"{path}: feature {name!r} holds {file_totals['count/' + name]} values in "
                    f"{file_totals['wrong/' + name]} {where}; the spec says "
                    f"{_value_count(spec_of)} ({spec_of.dtype.name}, shape {list(spec_of.shape)})")
        for key, value in file_totals.items():
            totals[key] = max(totals.get(key, 0), value) if key.startswith("count/") else (
                totals.get(key, 0) + value)
    read = f"{'the first ' + str(limit) + ' lists of ' if limit else ''}{_files_named(files)}"
    for name in [*spec.context, *spec.example]:
        if not totals.get("present/" + name):
            kind = "context" if name in spec.context else "document"
            raise shards.RecordError(f"{read}: no record holds the {kind} feature {name!r} that "
                                     "the spec names")
    present = {n: totals.get("present/" + n, 0) for n in [*spec.context, *spec.example]}
    return ScanResult(totals.get("lists", 0), totals.get("documents", 0), present,
                      totals.get("documents", 0) - present[spec.label])


def _files_named(files: list[Path]) -> str:
    return str(files[0]) + (f" (and {len(files) - 1} more files)" if len(files) > 1 else "")


def label_warning(result: ScanResult, spec: NamedSpec, files: list[Path]) -> str | None:
    """One line saying how many documents lack a label and what they read as; None if none do."""
    if not result.label_missing:
        return None
    effect = ("padding: in no loss and no metric" if spec.label_default < 0
              else "irrelevant" if spec.label_default == 0 else "that grade")
    return (f"{_files_named(files)}: {result.label_missing} of {result.documents} documents have no "
            f"{spec.label!r} label; they read as the spec's default {spec.label_default:g} "
            f"({effect})")


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------
_FLOAT_SCALAR = b"\x12\x06\x0a\x04"  # Feature{float_list{value: [one float]}}, before its 4 bytes


def feature_bytes(values) -> bytes:
    """A serialized ``tf.train.Feature`` of ``values``: floats as a float list, integers as an int64
    list, strings and bytes as a bytes list; a scalar is a one-value list, an empty list holds
    nothing."""
    if isinstance(values, (float, np.floating)):  # the common case, kept fast
        return _FLOAT_SCALAR + struct.pack("<f", values)
    values = np.asarray(values).reshape(-1)
    feature = tf.train.Feature()
    if values.size == 0:
        pass
    elif values.dtype.kind in "SUO":
        feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else bytes(v)
                                        for v in values)
    elif values.dtype.kind in "iub":
        feature.int64_list.value.extend(values.astype(np.int64).tolist())
    elif values.dtype.kind == "f":
        feature.float_list.value.extend(values.astype(np.float32).tolist())
    else:
        raise ValueError(f"feature values must be numbers or strings; got dtype {values.dtype}")
    return feature.SerializeToString()


def encode_named_list(context: dict, documents: list[dict], record_format: str = "elwc") -> bytes:
    """Returns one serialized list: ``context`` ``{name: values}`` and one ``{name: values}`` per
    document, a document lacking any feature it does not hold (values as :func:`feature_bytes`
    takes them). In a SequenceExample a document that lacks a feature others hold gets an empty
    value there."""
    context = {name: feature_bytes(values) for name, values in context.items()}
    documents = [{name: feature_bytes(v) for name, v in document.items()} for document in documents]
    if record_format == "elwc":
        return records.join_elwc([records.example_bytes(d) for d in documents],
                                 records.example_bytes(context))
    if record_format != "sequence_example":
        raise ValueError(f"record_format must be 'elwc' or 'sequence_example'; got "
                         f"{record_format!r}")
    names = dict.fromkeys(name for document in documents for name in document)
    return records.sequence_example_bytes(
        context, {name: [d.get(name, b"") for d in documents] for name in names})


def write_named_records(path: str | os.PathLike, lists: Iterable[tuple[dict, list[dict]]],
                        record_format: str = "elwc") -> int:
    """Writes ``(context, documents)`` lists (see :func:`encode_named_list`) to the new TFRecord
    file ``path`` and returns how many it wrote. An existing file (or link) there is refused."""
    path = Path(path)
    if os.path.lexists(path):
        raise FileExistsError(f"{path} exists; records go to a new file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = fresh_name(path.parent, f".{path.name}.")
    os.close(create_file(tmp))
    count = 0
    try:
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for context, documents in lists:
                writer.write(encode_named_list(context, documents, record_format))
                count += 1
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # ours, created above
        raise
    return count
