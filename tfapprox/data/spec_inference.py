"""A feature spec inferred from ranking records: ``python -m tfapprox.data spec``.

A sample of ELWC or SequenceExample lists (the format is detected) is read, and each context and
document feature becomes a :class:`~tfapprox.data.feature_spec.Feature`: its dtype, its length (the
number of values when every record that holds it holds as many, else variable: a token list), its
default (0, or "" for a fixed-length string) and how many records of the sample lacked it.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import tensorflow as tf

from tfapprox.data import named_records, shards
from tfapprox.data.dataset import resolve_files
from tfapprox.data.feature_spec import Feature, FeatureSpec, FeatureSpecError

DEFAULTS = {"float32": 0.0, "int64": 0, "string": ""}
_LISTED = 8  # features missing from some records that the summary names


class _Seen:
    """What the sample showed of one feature: its dtypes, value counts and how many records had it."""

    def __init__(self):
        self.dtypes: Counter = Counter()
        self.counts: set = set()
        self.records = 0

    def add(self, dtype: str, count: int) -> None:
        self.dtypes[dtype] += 1
        self.counts.add(count)
        self.records += 1


def _sample(files: list[Path], sample: int, label: str):
    """``(record_format, context seen, document seen, lists, documents)`` of the first ``sample``
    lists of ``files``."""
    record_format = None
    context: dict[str, _Seen] = {}
    documents: dict[str, _Seen] = {}
    lists = docs = 0
    for path in files:
        try:
            for serialized in tf.data.TFRecordDataset(str(path)).take(sample - lists):
                serialized = serialized.numpy()
                if record_format is None:
                    record_format = named_records.detect_format(serialized, [label])
                    if record_format is None:
                        raise shards.RecordError(
                            f"{path}: the first record is neither an ExampleListWithContext nor a "
                            "SequenceExample ranking list")
                read = named_records.read_record(serialized, record_format)
                if read is None:
                    raise shards.RecordError(
                        f"{path}: record {lists + 1} of the sample is not an "
                        f"{named_records.FORMAT_NAMES[record_format]} like the first")
                for name, (dtype, count) in read[0].items():
                    context.setdefault(name, _Seen()).add(dtype, count)
                for document in read[1]:
                    for name, (dtype, count) in document.items():
                        documents.setdefault(name, _Seen()).add(dtype, count)
                lists += 1
                docs += len(read[1])
        except tf.errors.OpError as err:
            raise shards.RecordError(f"{path}: corrupt or truncated TFRecord file "
                                     f"({shards.error_summary(err)})") from None
        if lists >= sample:
            break
    if not lists:
        raise shards.RecordError(f"no records in {', '.join(map(str, files))}")
    return record_format, context, documents, lists, docs


def _feature(name: str, seen: _Seen, total: int, vocabulary: str | None, where: str) -> Feature:
    if len(seen.dtypes) > 1:
        kinds = ", ".join(f"{d} in {n}" for d, n in seen.dtypes.most_common())
        raise shards.RecordError(f"{where}: feature {name!r} has more than one dtype ({kinds})")
    dtype = next(iter(seen.dtypes))
    length = next(iter(seen.counts)) if len(seen.counts) == 1 else None
    if dtype == "string" and vocabulary is None:
        raise FeatureSpecError(f"{where}: string feature {name!r} needs a vocabulary: "
                               f"--vocabulary {name}=FILE (one value a line)")
    if vocabulary is not None and dtype == "float32":
        raise FeatureSpecError(f"--vocabulary {name}: {name!r} is a float32 feature; a "
                               "vocabulary goes with string and int64 features")
    return Feature(name, dtype, length, DEFAULTS[dtype] if length is not None else None,
                   vocabulary=vocabulary, missing=total - seen.records)


def infer_spec(file_pattern, label: str, vocabularies: dict[str, str] | None = None,
               sample: int = 1000, spec_dir: str | os.PathLike | None = None) -> FeatureSpec:
    """Returns the spec of the first ``sample`` lists behind ``file_pattern``.

    ``label``: the document feature that holds the grade (float32 or int64, one value).
    ``vocabularies``: ``{feature: vocabulary file}``, needed for each string feature; their
    paths are kept relative to ``spec_dir``, where the spec file goes (absolute when None).
    Raises ``shards.RecordError`` or ``FeatureSpecError`` naming the file and the feature.
    """
    if sample < 1:
        raise ValueError(f"sample must be a positive number of lists; got {sample!r}")
    files = resolve_files(file_pattern, converted=False)
    where = str(files[0]) + (f" (and {len(files) - 1} more files)" if len(files) > 1 else "")
    record_format, context, documents, lists, docs = _sample(files, sample, label)
    if label in context:
        raise shards.RecordError(f"{where}: the label {label!r} is a context feature; it must be "
                                 "a document's")
    if label not in documents:
        raise shards.RecordError(f"{where}: no document holds the label {label!r}; document "
                                 f"features: {', '.join(sorted(documents)) or 'none'}")
    vocabularies = dict(vocabularies or {})
    unknown = sorted(set(vocabularies) - set(context) - set(documents))
    if unknown:
        raise FeatureSpecError(f"--vocabulary names {', '.join(map(repr, unknown))}, which no "
                               f"record of {where} holds")
    relative = {}
    for name, path in vocabularies.items():
        path = Path(path).resolve()
        relative[name] = str(path if spec_dir is None
                             else os.path.relpath(path, Path(spec_dir).resolve()))
    labels = documents.pop(label)
    label_dtype = next(iter(labels.dtypes)) if len(labels.dtypes) == 1 else None
    if label_dtype not in ("float32", "int64") or labels.counts != {1}:
        raise shards.RecordError(f"{where}: the label {label!r} must be one float32 or int64 value "
                                 f"per document; the sample holds {dict(labels.dtypes)} with "
                                 f"{sorted(labels.counts)} values")
    spec = FeatureSpec(
        context=tuple(_feature(n, s, lists, relative.get(n), where)
                      for n, s in sorted(context.items(), key=lambda item: _natural(item[0]))),
        document=tuple(_feature(n, s, docs, relative.get(n), where)
                       for n, s in sorted(documents.items(), key=lambda item: _natural(item[0]))),
        label=label, label_dtype=label_dtype, label_missing=docs - labels.records,
        record_format=record_format, base_dir=None if spec_dir is None else str(spec_dir))
    spec.check_vocabularies(where="--vocabulary")
    return spec


def _natural(name: str) -> tuple:
    """Sorts ``custom_features_2`` before ``custom_features_10``."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


def summary(spec: FeatureSpec) -> list[str]:
    """Lines that say what the spec holds and which features some records lacked."""
    lines = [f"{len(spec.context)} context and {len(spec.document)} document features, "
             f"label {spec.label!r} ({spec.label_dtype}), format {spec.record_format}"]
    lacking = [f for f in spec.context + spec.document if f.missing]
    for feature in lacking[:_LISTED]:
        if feature.missing:
            kind = "lists" if feature in spec.context else "documents"
            lines.append(f"  {feature.name}: missing from {feature.missing} {kind}; they read as "
                         f"{feature.default!r}" if feature.length is not None
                         else f"  {feature.name}: missing from {feature.missing} {kind} (empty)")
    if len(lacking) > _LISTED:
        lines.append(f"  ... and {len(lacking) - _LISTED} more features missing from some records "
                     "(each feature's \"missing\" in the spec)")
    if spec.label_missing:
        lines.append(f"  {spec.label}: missing from {spec.label_missing} documents; they read as "
                     f"the label default {spec.label_default:g} (padding: in no loss, no metric)")
    return lines
