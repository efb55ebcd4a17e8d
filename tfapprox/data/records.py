"""TFRecord encodings of ranking lists, and graph-only parsers for them.

One list (all documents of one query) is stored as one record. Two record kinds are supported:

* ``"elwc"`` (the default): TF-Ranking's ``ExampleListWithContext`` -- field 1, repeated
  ``tf.train.Example`` (one per document); field 2, a context ``tf.train.Example`` (here: the query id
  under ``"qid"``). TF-Ranking tooling and TF Serving requests share this format.
* ``"sequence_example"``: a ``tf.train.SequenceExample`` with feature lists ``"features"`` and
  ``"relevance"``, one entry per document.

A document ``tf.train.Example`` comes in one of two layouts:

* ``"vector"`` (what this package writes): one float feature ``"features"`` of length F (NaN where
  a value is missing), and the graded label as a one-element float feature ``"relevance"``.
* ``"per_feature"`` (what TF-Ranking's LETOR examples write): scalar float features ``"1"`` .. ``"F"``
  (a missing one reads as 0, as in sparse SVMlight) and ``"relevance"`` (float or int64).

Encoding is done by writing the protobuf wire format directly with numpy: every document of a list has
the same byte layout, so a list encodes as one ``[n, width]`` byte matrix. Decoding uses only TF ops
(``tf.io.decode_proto`` with an in-memory descriptor, ``tf.io.parse_example``, and for documents in
the exact layout written here, the floats read in place), so the parsers work inside a ``tf.data``
pipeline and inside an exported ``tf.function`` served by TF Serving.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from google.protobuf import descriptor_pb2

FEATURES_KEY = "features"
LABEL_KEY = "relevance"
QID_KEY = "qid"
PAD_LABEL = -1.0

RECORD_FORMATS = ("elwc", "sequence_example")
# A document without the vector "features" key reads as this NaN, whose payload arithmetic never
# makes (numpy, C and protobuf write NaN as 0x7fc00000 or 0xffc00000): a missing value (NaN) in a
# document is data, an absent key an error.
ABSENT_BITS = 0x7FC0ADD5
ABSENT = np.array(ABSENT_BITS, np.uint32).view(np.float32)[()]


def is_absent(values):
    """Where float32 tensor `values` are `ABSENT` (a key the document does not hold), not a NaN
    sent or written in one."""
    return tf.equal(tf.bitcast(values, tf.int32), ABSENT_BITS)
EXAMPLE_LAYOUTS = ("vector", "per_feature")


# --------------------------------------------------------------------------------------------------
# Descriptor for in-graph decoding of ExampleListWithContext
# --------------------------------------------------------------------------------------------------
def _elwc_descriptor_set() -> bytes:
    """Returns a serialized FileDescriptorSet declaring a wire-compatible ExampleListWithContext.

    The sub-messages are declared as ``bytes`` (identical on the wire to an embedded message), so the
    decoder hands back each serialized ``tf.train.Example`` for ``tf.io.parse_example``, and the
    descriptor needs no dependency on TensorFlow's own ``.proto`` files.
    """
    fdp = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="tfapprox/example_list_with_context.proto", package="tfapprox", syntax="proto3"
    )
    message = file_proto.message_type.add(name="ExampleListWithContext")
    message.field.add(name="examples", number=1, type=fdp.TYPE_BYTES, label=fdp.LABEL_REPEATED)
    message.field.add(name="context", number=2, type=fdp.TYPE_BYTES, label=fdp.LABEL_OPTIONAL)
    return descriptor_pb2.FileDescriptorSet(file=[file_proto]).SerializeToString()


ELWC_DESCRIPTOR_SET = _elwc_descriptor_set()
ELWC_MESSAGE_TYPE = "tfapprox.ExampleListWithContext"


# --------------------------------------------------------------------------------------------------
# Wire-format encoding
# --------------------------------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    """Returns the protobuf base-128 varint encoding of a non-negative integer."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """Returns a length-delimited field (wire type 2): tag, length, payload."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _bytes_feature(values: list[bytes]) -> bytes:
    """Returns a serialized ``tf.train.Feature`` holding a BytesList."""
    return _field(1, b"".join(_field(1, v) for v in values))


class _FixedLayout:
    """Byte layout of a message made of fixed-size float payloads separated by constant headers.

    ``parts`` alternates constant ``bytes`` and integer slot sizes (number of float32 values);
    ``encode(*arrays)`` fills the slots row-wise from ``[n, size]`` float arrays and returns the
    ``[n, width]`` uint8 matrix whose rows are the serialized messages.
    """

    def __init__(self, parts: list):
        self.parts = parts
        self.width = sum(len(p) if isinstance(p, bytes) else 4 * p for p in parts)

    def encode(self, *arrays: np.ndarray) -> np.ndarray:
        n = arrays[0].shape[0]
        out = np.empty((n, self.width), dtype=np.uint8)
        col, k = 0, 0
        for part in self.parts:
            if isinstance(part, bytes):
                out[:, col:col + len(part)] = np.frombuffer(part, dtype=np.uint8)
                col += len(part)
            else:
                values = np.ascontiguousarray(arrays[k], dtype="<f4").reshape(n, part)
                out[:, col:col + 4 * part] = values.view(np.uint8)
                col += 4 * part
                k += 1
        return out


def _float_feature_layout(size: int) -> list:
    """Returns the layout parts of a ``tf.train.Feature`` holding a FloatList of ``size`` floats."""
    float_list_len = 1 + len(_varint(4 * size)) + 4 * size
    return [_varint((2 << 3) | 2) + _varint(float_list_len) + b"\x0a" + _varint(4 * size), size]


def _length(parts: list) -> int:
    return sum(len(p) if isinstance(p, bytes) else 4 * p for p in parts)


def _wrap(number: int, parts: list) -> list:
    """Prefixes layout parts with the tag and length of field ``number`` holding them."""
    return [_varint((number << 3) | 2) + _varint(_length(parts))] + parts


def _merge(parts: list) -> list:
    """Joins adjacent constant byte parts."""
    merged: list = []
    for part in parts:
        if isinstance(part, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] += part
        else:
            merged.append(part)
    return merged


def _map_entry(key: str, value_parts: list) -> list:
    """Layout parts of one ``Features.feature`` map entry (field 1 of Features)."""
    return _wrap(1, [_field(1, key.encode())] + _wrap(2, value_parts))


def _example_layout(num_features: int, with_label: bool) -> list:
    """Layout parts of a vector-layout document ``tf.train.Example`` (without an outer wrapper)."""
    entries = _map_entry(FEATURES_KEY, _float_feature_layout(num_features))
    if with_label:
        entries += _map_entry(LABEL_KEY, _float_feature_layout(1))
    return _wrap(1, entries)


_LAYOUT_CACHE: dict = {}


def _cached_layout(kind: str, num_features: int, with_label: bool) -> _FixedLayout:
    key = (kind, num_features, with_label)
    if key not in _LAYOUT_CACHE:
        example = _example_layout(num_features, with_label)
        if kind == "example":
            parts = example
        elif kind == "elwc_entry":  # one document inside an ELWC: field 1 wrapping an Example
            parts = _wrap(1, example)
        elif kind == "seq_features":  # one Feature inside FeatureList "features"
            parts = _wrap(1, _float_feature_layout(num_features))
        else:  # "seq_label": one Feature inside FeatureList "relevance"
            parts = _wrap(1, _float_feature_layout(1))
        _LAYOUT_CACHE[key] = _FixedLayout(_merge(parts))
    return _LAYOUT_CACHE[key]


def _check_list(features, labels) -> tuple[np.ndarray, np.ndarray | None]:
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 2:
        raise ValueError(
            f"features must be a [num_docs, num_features] array; got shape {features.shape}"
        )
    if labels is not None:
        labels = np.asarray(labels, dtype=np.float32).reshape(-1)
        if labels.shape[0] != features.shape[0]:
            raise ValueError(
                f"labels must have one entry per document: {features.shape[0]} documents, "
                f"{labels.shape[0]} labels"
            )
        if not np.isfinite(labels).all():
            raise ValueError(f"labels must be finite; got {labels[~np.isfinite(labels)][0]}")
    return features, labels


def encode_examples(features, labels=None) -> list[bytes]:
    """Returns one serialized vector-layout ``tf.train.Example`` per row of ``features`` [n, F].

    ``labels`` [n] (optional) is stored as ``"relevance"``; leave it out for serving requests.
    """
    features, labels = _check_list(features, labels)
    layout = _cached_layout("example", features.shape[1], labels is not None)
    arrays = (features,) if labels is None else (features, labels[:, None])
    return [row.tobytes() for row in layout.encode(*arrays)]


def _qid_features(qid) -> bytes:
    """Returns a serialized ``tf.train.Features`` holding the query id (empty when ``qid`` is None)."""
    if qid is None:
        return b""
    return _map_entry_bytes(QID_KEY, _bytes_feature([str(qid).encode()]))


def _map_entry_bytes(key: str, value: bytes) -> bytes:
    return _field(1, _field(1, key.encode()) + _field(2, value))


def encode_elwc(features, labels=None, qid=None) -> bytes:
    """Returns one serialized ExampleListWithContext for a list: ``features`` [n, F], ``labels`` [n].

    Documents use the vector layout; the context Example holds ``"qid"`` (bytes) when ``qid`` is given.
    Byte-identical to building the message with protobuf classes and serialising it.
    """
    features, labels = _check_list(features, labels)
    layout = _cached_layout("elwc_entry", features.shape[1], labels is not None)
    arrays = (features,) if labels is None else (features, labels[:, None])
    body = layout.encode(*arrays).tobytes() if features.shape[0] else b""
    return body + _field(2, _field(1, _qid_features(qid)))


def encode_sequence_example(features, labels, qid=None) -> bytes:
    """Returns one serialized ``tf.train.SequenceExample`` for a list (``"sequence_example"``)."""
    features, labels = _check_list(features, labels)
    n, num_features = features.shape
    rows = _cached_layout("seq_features", num_features, True).encode(features).tobytes() if n else b""
    label_rows = _cached_layout("seq_label", 1, True).encode(labels[:, None]).tobytes() if n else b""
    feature_lists = _map_entry_bytes(FEATURES_KEY, rows) + _map_entry_bytes(LABEL_KEY, label_rows)
    return _field(1, _qid_features(qid)) + _field(2, feature_lists)


def example_bytes(features: dict[str, bytes]) -> bytes:
    """Returns a serialized ``tf.train.Example`` of ``{name: serialized tf.train.Feature}``."""
    return _field(1, _features_bytes(features))


def _features_bytes(features: dict[str, bytes]) -> bytes:
    return b"".join(_map_entry_bytes(name, value) for name, value in features.items())


def sequence_example_bytes(context: dict[str, bytes], feature_lists: dict[str, list[bytes]]
                           ) -> bytes:
    """Returns a serialized ``tf.train.SequenceExample``: ``context`` ``{name: serialized
    Feature}``, ``feature_lists`` ``{name: [serialized Feature per document]}``."""
    lists = b"".join(_map_entry_bytes(name, b"".join(_field(1, f) for f in features))
                     for name, features in feature_lists.items())
    return _field(1, _features_bytes(context)) + _field(2, lists)


def join_elwc(examples: list[bytes], context: bytes = b"") -> bytes:
    """Returns the ExampleListWithContext of serialized document Examples and a context Example."""
    return b"".join(_field(1, e) for e in examples) + _field(2, context)


def float_feature(values) -> bytes:
    """Returns a serialized ``tf.train.Feature`` holding a FloatList (packed float32) of ``values``."""
    return _field(2, _field(1, np.asarray(values, "<f4").tobytes()))


def int64_feature(values) -> bytes:
    """Returns a serialized ``tf.train.Feature`` holding an Int64List (packed varints) of
    non-negative ``values``."""
    if any(v < 0 for v in values):
        raise ValueError(f"int64_feature encodes non-negative values; got {list(values)}")
    return _field(3, _field(1, b"".join(_varint(int(v)) for v in values)))


def message_bytes(*fields: tuple[int, bytes]) -> bytes:
    """Returns a serialized protobuf message of length-delimited ``(field number, payload)`` fields,
    in order (for messages of other protos, such as TF Serving's request logs)."""
    return b"".join(_field(number, payload) for number, payload in fields)


def encode_list(features, labels, qid=None, record_format: str = "elwc") -> bytes:
    """Returns a list serialized in ``record_format`` (``"elwc"`` or ``"sequence_example"``)."""
    if record_format == "elwc":
        return encode_elwc(features, labels, qid)
    if record_format == "sequence_example":
        return encode_sequence_example(features, labels, qid)
    raise ValueError(f"record_format must be one of {RECORD_FORMATS}; got {record_format!r}")


# --------------------------------------------------------------------------------------------------
# Graph-only parsing
# --------------------------------------------------------------------------------------------------
def _check_parse_args(num_features: int, layout: str) -> None:
    if not isinstance(num_features, (int, np.integer)) or num_features < 1:
        raise ValueError(f"num_features must be a positive integer; got {num_features!r}")
    if layout not in EXAMPLE_LAYOUTS:
        raise ValueError(f"layout must be one of {EXAMPLE_LAYOUTS}; got {layout!r}")


def _decode_elwc_fields(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    serialized = tf.convert_to_tensor(serialized, dtype=tf.string)
    sizes, (examples, contexts) = tf.io.decode_proto(
        serialized,
        message_type=ELWC_MESSAGE_TYPE,
        field_names=["examples", "context"],
        output_types=[tf.string, tf.string],
        descriptor_source=b"bytes://" + ELWC_DESCRIPTOR_SET,
    )
    return examples, sizes[:, 0], contexts


def decode_elwc(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Returns ``(examples [B, L] string, lengths [B] int32)`` from serialized ELWC ``[B]``.

    ``examples[b, :lengths[b]]`` are list ``b``'s serialized document Examples; the rest is ``""``.
    ``L`` is the longest list of the batch. Graph-only.
    """
    examples, lengths, _ = _decode_elwc_fields(serialized)
    return examples, lengths


def decode_elwc_with_context(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Returns ``(examples [B, L], lengths [B], contexts [B])``: :func:`decode_elwc` and each list's
    serialized context Example (``""`` when it has none). Graph-only."""
    examples, lengths, contexts = _decode_elwc_fields(serialized)
    # An optional field comes back [B, 0] when no list of the batch has it, else [B, 1].
    contexts = tf.pad(contexts, [[0, 0], [0, 1 - tf.shape(contexts)[1]]])[:, 0]
    return examples, lengths, contexts


def _parse_documents(serialized, num_features, layout, label_dtype, with_labels, missing_features):
    """``tf.io.parse_example`` of document Examples; a missing vector ``"features"`` reads as
    ``missing_features`` (None: an error)."""
    spec = {}
    if layout == "vector":
        default = None if missing_features is None else [missing_features] * num_features
        spec[FEATURES_KEY] = tf.io.FixedLenFeature([num_features], tf.float32, default_value=default)
    else:
        for i in range(1, num_features + 1):
            spec[str(i)] = tf.io.FixedLenFeature([], tf.float32, default_value=0.0)
    if with_labels:
        default = PAD_LABEL if label_dtype == tf.float32 else int(PAD_LABEL)
        spec[LABEL_KEY] = tf.io.FixedLenFeature([], label_dtype, default_value=default)
    parsed = tf.io.parse_example(serialized, spec)
    if layout == "vector":
        features = parsed[FEATURES_KEY]
    else:
        features = tf.stack([parsed[str(i)] for i in range(1, num_features + 1)], axis=-1)
    labels = tf.cast(parsed[LABEL_KEY], tf.float32) if with_labels else None
    return features, labels


def parse_examples(
    serialized: tf.Tensor,
    num_features: int,
    *,
    layout: str = "vector",
    label_dtype: tf.DType = tf.float32,
    with_labels: bool = False,
):
    """Returns ``features [N, F] float32`` parsed from serialized document Examples ``[N]``.

    With ``with_labels=True`` returns ``(features, labels [N] float32)``; a missing label reads as -1.
    ``layout="vector"`` reads one float feature ``"features"`` of length F (required);
    ``layout="per_feature"`` reads scalar features ``"1"``..``"F"`` (missing ones read as 0).
    ``label_dtype`` is the stored type of ``"relevance"`` (``tf.float32`` or ``tf.int64``). Graph-only.
    """
    _check_parse_args(num_features, layout)
    serialized = tf.convert_to_tensor(serialized, dtype=tf.string)
    features, labels = _parse_documents(serialized, num_features, layout, label_dtype, with_labels, None)
    return (features, labels) if with_labels else features


def parse_example_lists(
    examples: tf.Tensor,
    lengths: tf.Tensor,
    num_features: int,
    *,
    layout: str = "vector",
    label_dtype: tf.DType = tf.float32,
):
    """Returns ``(features [B, L, F], mask [B, L], labels [B, L])`` from ``examples [B, L]`` strings.

    ``examples[b, :lengths[b]]`` are serialized document Examples (as from :func:`decode_elwc`).
    Padded slots get features 0, mask False and label -1; a real document without a vector
    ``"features"`` raises ``InvalidArgumentError``. Graph-only.
    """
    examples = tf.convert_to_tensor(examples, dtype=tf.string)
    shape = tf.shape(examples)
    # Parsing the [B * L] grid, padding ("") included, and reshaping is cheaper than gathering the
    # real documents and scattering them back. Padding reads the ABSENT default, replaced below.
    features, labels = _parse_documents(
        tf.reshape(examples, [-1]), num_features, layout, label_dtype, True, ABSENT
    )
    features = tf.reshape(features, [shape[0], shape[1], num_features])
    labels = tf.reshape(labels, shape)
    mask = tf.sequence_mask(lengths, maxlen=shape[1])
    checks = [assert_finite_labels(labels, mask)]
    if layout == "vector":
        absent = is_absent(features[:, :, 0])
        message = f"a document Example has no {FEATURES_KEY!r} feature"
        checks.append(tf.debugging.Assert(tf.logical_not(tf.reduce_any(absent & mask)), [message]))
    with tf.control_dependencies(checks):
        features = tf.where(mask[:, :, None], features, 0.0)
    return features, mask, tf.where(mask, labels, PAD_LABEL)


def assert_finite_labels(labels: tf.Tensor, mask: tf.Tensor, key: str = LABEL_KEY) -> tf.Operation:
    """An assertion that no real document's label is NaN or infinite (a NaN is not padding)."""
    bad = tf.reduce_any(tf.logical_not(tf.math.is_finite(labels)) & mask)
    message = f"a document's label is NaN or infinite (the {key!r} feature)"
    return tf.debugging.Assert(tf.logical_not(bad), [message])


def parse_elwc(
    serialized: tf.Tensor,
    num_features: int,
    *,
    layout: str = "vector",
    label_dtype: tf.DType = tf.float32,
):
    """Returns ``(features [B, L, F] float32, mask [B, L] bool, labels [B, L] float32)``.

    ``serialized`` is a ``[B]`` string tensor of ExampleListWithContext records; ``L`` is the longest
    list of the batch. Padded slots have features 0, mask False and label -1; a real document without
    a ``"relevance"`` feature (a serving request) also reads label -1 but mask True. Graph-only TF ops,
    so it can run inside an exported ``tf.function``.
    """
    _check_parse_args(num_features, layout)
    examples, lengths = decode_elwc(serialized)
    return parse_example_lists(examples, lengths, num_features, layout=layout, label_dtype=label_dtype)


def parse_sequence_examples(serialized: tf.Tensor, num_features: int):
    """Returns ``(features [B, L, F], mask [B, L], labels [B, L])`` from SequenceExamples ``[B]``."""
    _check_parse_args(num_features, "vector")
    serialized = tf.convert_to_tensor(serialized, dtype=tf.string)
    _, sequences, lengths = tf.io.parse_sequence_example(
        serialized,
        sequence_features={
            FEATURES_KEY: tf.io.FixedLenSequenceFeature([num_features], tf.float32),
            LABEL_KEY: tf.io.FixedLenSequenceFeature([], tf.float32),
        },
    )
    features = sequences[FEATURES_KEY]
    mask = tf.sequence_mask(lengths[FEATURES_KEY], maxlen=tf.shape(features)[1])
    with tf.control_dependencies([assert_finite_labels(sequences[LABEL_KEY], mask)]):
        labels = tf.where(mask, sequences[LABEL_KEY], PAD_LABEL)
    return features, mask, labels


def parse_lists(serialized: tf.Tensor, num_features: int, *, record_format: str = "elwc", **kwargs):
    """Returns ``(features, mask, labels)`` from serialized lists of ``record_format``."""
    if record_format == "elwc":
        return parse_elwc(serialized, num_features, **kwargs)
    if record_format == "sequence_example":
        return parse_sequence_examples(serialized, num_features)
    raise ValueError(f"record_format must be one of {RECORD_FORMATS}; got {record_format!r}")


# --------------------------------------------------------------------------------------------------
# Reading vector-layout documents as bytes
# --------------------------------------------------------------------------------------------------
# A document holding only the "features" float list, as `encode_elwc`/`encode_examples` and
# protobuf write it, always has the same bytes around its 4F float bytes:
#
#   [0a len]  Example (one ELWC `examples` entry; absent in a bare tf.Example)
#   0a len    Example.features
#   0a len    Features.feature, the map entry
#   0a 08 "features"   its key
#   12 len    its value, a Feature
#   12 len    Feature.float_list
#   0a len    FloatList.value, packed: len = 4F
#   4F bytes  the float32 values, little-endian
#
# and an ELWC is its documents' entries followed by an optional context (`BARE_CONTEXTS`). Whether
# a string is exactly that is decided by ops that cannot fail (lengths, byte comparisons), and its
# floats are then read in place (the exported signatures' fast path; docs/benchmarks.md#serving).
BARE_CONTEXTS = (b"", b"\x12\x00", b"\x12\x02\x0a\x00")  # none, an empty Example, empty Features


def vector_document_header(num_features: int, in_list: bool) -> bytes:
    """Returns the bytes before the floats of a document holding only F "features" floats: a
    tf.Example as protobuf serializes it, wrapped as an ELWC `examples` entry if ``in_list``."""
    header, _ = _cached_layout("elwc_entry" if in_list else "example", num_features, False).parts
    return header


def read_vector_documents(serialized: tf.Tensor, num_features: int, lists: bool,
                          max_documents: int, max_pairs: int | None = None):
    """Returns ``(fits, features [B, L, F], mask [B, L])`` for ``serialized`` [B]: whether every
    string holds only vector-layout documents of F features (ELWCs of them with no or an empty
    context if ``lists``, else one tf.Example each; see above), and the features and mask they
    hold if so (anything otherwise).

    Only ops that cannot fail, whatever the bytes, run here. Lists of different lengths are
    padded: L is the longest string's length divided by a document's, so the grid holds at most
    B times the longest string's bytes; when B x L exceeds ``max_documents`` (or B x L² exceeds
    ``max_pairs``, when given) no grid is read and ``fits`` is False.
    """
    header = vector_document_header(num_features, lists)
    width = len(header) + 4 * num_features
    sizes = tf.strings.length(serialized)
    if lists:
        counts = sizes // width
        bodies = counts * width
        tails = tf.strings.substr(serialized, bodies, sizes - bodies)
        fits = tf.reduce_all(tf.reduce_any(tf.equal(tails[:, None], BARE_CONTEXTS), axis=1))
        length = tf.reduce_max(tf.concat([counts, [0]], axis=0))
        documents = tf.cast(tf.size(serialized), tf.int64) * tf.cast(length, tf.int64)
        within = documents <= max_documents
        if max_pairs is not None:
            within &= documents * tf.cast(length, tf.int64) <= max_pairs
        fits &= within
        length = tf.where(within, length, 0)
        mask = tf.sequence_mask(counts, length)
    else:
        fits = tf.reduce_all(tf.equal(sizes, width)) & (tf.size(serialized) <= max_documents)
        length, mask = 1, tf.ones([tf.size(serialized), 1], tf.bool)
    # Row b: the first `length` documents' bytes of string b, zeros past its end (DecodePaddedRaw
    # refuses a fixed_length of 0: one document more is decoded when all lists are empty).
    rows = tf.maximum(length, 1)
    grid = tf.io.decode_raw(serialized, tf.uint8, fixed_length=rows * width)
    grid = tf.reshape(grid, [tf.size(serialized), rows, width])[:, :length]
    headers_fit = tf.equal(grid[:, :, : len(header)], list(header)) | ~mask[:, :, None]
    # tf.bitcast reads the host's byte order; the wire's is little-endian.
    little_endian = tf.equal(tf.bitcast(tf.constant(1, tf.uint16), tf.uint8)[0], 1)
    fits &= tf.reduce_all(headers_fit) & little_endian
    values = tf.reshape(grid[:, :, len(header) :], [tf.size(serialized), length, num_features, 4])
    return fits, tf.bitcast(values, tf.float32), mask


# --------------------------------------------------------------------------------------------------
# Truncating and padding batches of lists
# --------------------------------------------------------------------------------------------------
def choose_documents(lengths: tf.Tensor, width: tf.Tensor, list_size: int, seed: tf.Tensor | None):
    """Returns ``(indices [B, k], new_lengths [B])`` choosing at most ``list_size`` real slots per list.

    With ``seed`` (shape [2]) the kept documents are a uniformly random subset of each longer list, in
    their original order; without it the first ``list_size`` are kept.
    """
    k = tf.minimum(width, list_size)
    new_lengths = tf.minimum(lengths, k)
    if seed is None:
        batch = tf.shape(lengths)[0]
        return tf.tile(tf.range(k)[None, :], [batch, 1]), new_lengths
    positions = tf.range(width)
    valid = positions[None, :] < lengths[:, None]
    keys = tf.random.stateless_uniform(tf.shape(valid), seed=seed)
    keys = tf.where(valid, keys, -1.0)  # padding sorts after every real document
    _, indices = tf.math.top_k(keys, k=k)
    # Real slots form a prefix, so sorting keeps the chosen real documents first, in original order.
    return tf.sort(indices, axis=1), new_lengths


def batch_seed(seed, batch_index) -> tf.Tensor:
    """The stateless seed ``[seed, batch_index]`` of one batch's random truncation."""
    return tf.stack([tf.convert_to_tensor(seed, tf.int64), tf.cast(batch_index, tf.int64)])


def pad_lists(tensor: tf.Tensor, list_size: int, value) -> tf.Tensor:
    pad = list_size - tf.shape(tensor)[1]
    paddings = tf.concat([[[0, 0], [0, pad]], tf.zeros([tf.rank(tensor) - 2, 2], tf.int32)], axis=0)
    return tf.pad(tensor, paddings, constant_values=value)


# --------------------------------------------------------------------------------------------------
# Python-side inspection (used to detect the format of existing files)
# --------------------------------------------------------------------------------------------------
def split_elwc(serialized: bytes) -> tuple[list[bytes], bytes]:
    """Returns ``(document Examples, context Example)`` of one serialized ELWC, in Python.

    Raises ``ValueError`` if the bytes are not a well-formed ExampleListWithContext.
    """
    examples: list[bytes] = []
    context = b""
    pos, end = 0, len(serialized)
    while pos < end:
        tag, pos = _read_varint(serialized, pos)
        if tag & 7 != 2:
            raise ValueError(f"not an ExampleListWithContext: field {tag >> 3} has wire type {tag & 7}")
        length, pos = _read_varint(serialized, pos)
        if pos + length > end:
            raise ValueError("not an ExampleListWithContext: a field runs past the end of the record")
        payload = serialized[pos:pos + length]
        pos += length
        if tag >> 3 == 1:
            examples.append(payload)
        elif tag >> 3 == 2:
            context = payload
    return examples, context


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("not an ExampleListWithContext: truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def describe_example(serialized: bytes) -> dict:
    """Returns ``{"layout", "num_features", "label_dtype"}`` guessed from one document Example."""
    example = tf.train.Example.FromString(serialized)
    feature_map = example.features.feature
    label_dtype = tf.float32
    if LABEL_KEY in feature_map and feature_map[LABEL_KEY].WhichOneof("kind") == "int64_list":
        label_dtype = tf.int64
    if FEATURES_KEY in feature_map:
        return {
            "layout": "vector",
            "num_features": len(feature_map[FEATURES_KEY].float_list.value),
            "label_dtype": label_dtype,
        }
    numbered = [int(k) for k in feature_map if k.isdigit()]
    if not numbered:
        raise ValueError(
            f"document Example has neither a {FEATURES_KEY!r} feature nor numbered features '1'..'F'; "
            f"its keys are {sorted(feature_map)}"
        )
    return {"layout": "per_feature", "num_features": max(numbered), "label_dtype": label_dtype}
