"""SavedModel export for TF Serving: six scoring signatures, written atomically.

`export_saved_model(model, base_dir, name, num_features)` writes `base_dir/name/<version>/`, the
layout TF Serving watches (`--model_base_path=base_dir/name`). The SavedModel holds:

| signature         | input (name: dtype [shape])               | output `scores`         |
|-------------------|-------------------------------------------|-------------------------|
| `serving_default` | `elwc`: string [batch], serialized        | float32 [batch, list],  |
|                   | ExampleListWithContext (TF-Ranking's)     | 0 on padded slots       |
| `score_features`  | `features`: float32 [batch, list, F]      | float32 [batch, list]   |
| `score_features_  | `features` as above and `mask`: bool      | float32 [batch, list],  |
|  masked`          | [batch, list], True on real documents     | 0 where mask is False   |
| `score_examples`  | `examples`: string [n], serialized        | float32 [n]             |
|                   | tf.Example, one document each             |                         |

and, for clients written for TF-Ranking's `tfr.keras.saved_model.Signatures` and for TF Serving's
Regress API (which feeds a regress signature's `inputs` with serialized tf.Examples, merging an
ExampleListWithContext's context into each), the same graph under TF-Ranking's names:

| signature                    | input                                 | output `outputs`      |
|------------------------------|---------------------------------------|-----------------------|
| `tensorflow/serving/predict` | `inputs`: as `serving_default`'s elwc | float32 [batch, list] |
| `tensorflow/serving/regress` | `inputs`: as `score_examples`' input  | float32 [n]           |

Documents are stored as in `tfapprox.data.records` (by default one float feature `"features"` of
length F per tf.Example). Parsing runs inside the graph, so a client sends raw protos; the served
model is loadable with `tf.saved_model.load` without tfapprox installed.

`score_features` declares F (`saved_model_cli` and TF Serving's metadata show `(-1, -1, F)`) and
also checks the shape in the graph, since TF Serving feeds a tensor without comparing its shape with
the signature's: a request of another rank (`[batch, F]`, a missing nesting level, is an easy REST
mistake) or feature count fails with a message naming the expected `[batch, list, F]` and the
received shape, rather than with an error deep in the network. Every slot is scored: for a scorer
that scores each document on its own, a client pads short lists with any finite values and ignores
their scores. An empty batch gets empty scores from every signature.

A scorer whose documents meet (`tfapprox.models.scores_depend_on_list`: DASALC's self-attention
over the list, `tfapprox.models.DocumentInteraction`, or features standardised within the list,
`list_standardize=True`, or an ensemble holding either) scores each document in the context of its
list. Its signatures are the same, but padding must not join a list: ELWCs to `serving_default` and
`predict` are whole lists, `score_features_masked` leaves out the slots its `mask` marks as
padding, and `score_features`, whose every slot is a document, refuses lists ending in an
all-zero document as zero padding does (`_refuse_padded_lists`); `score_examples` and `regress`
score each document as a list of its own.

Bad requests get an InvalidArgumentError naming the signature, and neither the error nor the
server's log quotes the request's bytes:
- strings that are not the signature's proto kind (a tf.Example to `serving_default`, an ELWC to
  `score_examples`, any other bytes): "... expects `elwc`: serialized ExampleListWithContext ...";
- a document without the `"features"` feature (vector layout; per_feature reads a missing key as
  0), or with a feature count other than F;
- a NaN or infinite feature value, in every signature: training data cannot hold one
  (`tfapprox.data.letor` refuses it), so its score would mean nothing; a NaN score would also sort
  arbitrarily among the list's others. For the same reason every signature checks its scores:
  finite features that overflow the model (values near ±3e38) are refused too;
- a per_feature document holding none of the keys "1".."F" (a vector-layout one, say);
- more than `max_documents` documents, counting the slots that pad each list to the longest: a
  `serving_default` request is scored as one [lists, longest list, F] grid, so the bound is checked
  before that grid is made and bounds the memory one request takes; for a model whose documents
  attend to each other (`tfapprox.models.attends_within_lists`), whose attention holds [lists,
  heads, L, L] grids, also more than `max_pairs` document pairs, lists x longest list².
Requests in the layout that `tfapprox.data.records` and protobuf write for documents holding only
`"features"` (no context features, no labels) are read as bytes (`_read_canonical`), after checks
that cannot fail; any other request is parsed once, by tf.data's Example parser inside the graph
(`_try_parse`), whose failures are caught rather than logged; only a failed request is parsed again
to say why.

Each version also holds TF Serving's warm-up file, `assets.extra/tf_serving_warmup_requests`: a
TFRecord file of PredictionLog requests, every signature at two sizes, which TF Serving runs when it
loads the version so that the first real request does not pay for initialising the graph.

Versions are integers, and only directories named by ASCII digits count as versions, as in TF
Serving. Without `version`, the next integer after the largest existing version (or file named
like one, which the version directory cannot be named over) is used (1 for a new model), so
versions sort in export order and TF Serving serves the newest.
The SavedModel is written to a hidden temporary directory next to the version directories
(`base_dir/name/.tmp-...`, which TF Serving ignores because its name is not a number) and renamed
into place in one `os.rename`, so a watcher never sees a half-written version; a failed export
removes the temporary directory and leaves no version behind. One left by a killed export is removed
by the next export of the model once its writer, named in it, is gone (or after a day); nothing
else in the model directory is ever deleted, and export refuses a model directory that is a
symbolic link rather than write through it.

Export needs the TensorFlow backend. A model trained with another backend can be saved as `.keras`
and exported from a process running with `KERAS_BACKEND=tensorflow`.
"""

import os
import re
import shutil
import socket
import uuid
from typing import NamedTuple

import keras
import numpy as np

from tfapprox.files import remove_abandoned
from tfapprox.models import MAX_ATTENTION_PAIRS, attends_within_lists, scores_depend_on_list

__all__ = [
    "MASKED", "MAX_DOCUMENTS", "PREDICT", "REGRESS", "SIGNATURES", "export_saved_model",
    "next_version"
]

# TF-Ranking's signature names (tfr.keras.saved_model.Signatures), which are TF Serving's method
# names: clients written for TF-Ranking models, and TF Serving's Regress API, use them.
PREDICT = "tensorflow/serving/predict"
REGRESS = "tensorflow/serving/regress"
# Dense features with a mask: padded lists for a model whose scores depend on the list.
MASKED = "score_features_masked"
SIGNATURES = ("serving_default", "score_features", MASKED, "score_examples", PREDICT, REGRESS)


def next_version(model_dir):
    """Returns the version `export_saved_model` would pick in `model_dir`: 1 + the largest version
    there, or 1 when there is none (or no `model_dir`). A file named like a version (TF Serving
    ignores it) is stepped past too, since the version directory cannot take its name."""
    try:
        names = os.listdir(model_dir)
    except FileNotFoundError:
        return 1
    return max((int(n) for n in names if _is_version(n)), default=0) + 1


def _is_version(name):
    """Whether TF Serving reads directory `name` as a version: ASCII digits only (str.isdigit also
    takes '²' and '٣')."""
    return re.fullmatch(r"[0-9]+", name) is not None


def _check_arguments(name, num_features, version, example_layout, max_documents, max_pairs):
    from tfapprox.data import records

    if not isinstance(name, str) or not name or name.startswith(".") or os.sep in name or (
        os.altsep and os.altsep in name
    ):
        raise ValueError(
            f"name must be a non-empty directory name without path separators that does not start "
            f"with '.'; received name={name!r}."
        )
    if isinstance(num_features, bool) or not isinstance(num_features, (int, np.integer)) or (
        num_features < 1
    ):
        raise ValueError(f"num_features must be a positive integer; received {num_features!r}.")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0
    ):
        raise ValueError(
            f"version must be None or a non-negative integer (TF Serving versions are integers); "
            f"received version={version!r}."
        )
    for bound, value in (("max_documents", max_documents), ("max_pairs", max_pairs)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{bound} must be a positive integer; received {bound}={value!r}.")
    if example_layout not in records.EXAMPLE_LAYOUTS:
        raise ValueError(
            f"example_layout must be one of {records.EXAMPLE_LAYOUTS}; "
            f"received example_layout={example_layout!r}."
        )


def _check_model_accepts(model, num_features):
    """Builds `model` on a one-document batch, failing clearly if it cannot take F features."""
    probe = {
        "features": np.zeros((1, 1, num_features), "float32"),
        "mask": np.ones((1, 1), bool),
    }
    try:
        scores = model(probe, training=False)
    except Exception as error:  # noqa: BLE001 - re-raised with the export context
        raise ValueError(
            f"The model cannot score documents with num_features={num_features}: calling it on "
            f"{{'features': [1, 1, {num_features}], 'mask': [1, 1]}} failed with: {error}"
        ) from error
    if tuple(scores.shape) != (1, 1):
        raise ValueError(
            "The model must return scores [batch, list]; for features [1, 1, "
            f"{num_features}] it returned shape {tuple(scores.shape)}."
        )


# A padded slot of a list is handed to the parser as this Example, which only it holds the key of,
# so that padding needs no lengths beside the parsed features: its documents read `_PAD_KEY` 1,
# real ones 0 (and the parse runs on one string tensor, as tf.data's Example parser requires).
_PAD_KEY = "tfapprox.padding"


def _pad_example():
    """Returns the serialized Example of a padded slot: only `_PAD_KEY`, int64 1."""
    from tfapprox.data.records import _field, _map_entry_bytes

    return _field(1, _map_entry_bytes(_PAD_KEY, _field(3, _field(1, b"\x01"))))


# per_feature: a key that a document does not hold reads as this NaN, whose payload arithmetic never
# makes (NaNs computed or written by numpy, C or protobuf are 0x7fc00000 or 0xffc00000), so that a
# missing key (read as 0, as in sparse SVMlight) is told apart from a NaN sent in one (refused).
_MISSING_BITS = 0x7FC0ADD5
_MISSING = np.array(_MISSING_BITS, np.uint32).view(np.float32)[()]


def _document_spec(num_features, example_layout):
    """Returns the tf.io.parse_example spec of a document: its features (vector layout: a missing
    "features" reads as all NaN; per_feature: a missing one as `_MISSING`) and the padding mark."""
    import tensorflow as tf

    from tfapprox.data import records

    if example_layout == "vector":
        spec = {
            records.FEATURES_KEY: tf.io.FixedLenFeature(
                [num_features], tf.float32, default_value=[float("nan")] * num_features
            )
        }
    else:
        spec = {
            str(i): tf.io.FixedLenFeature([], tf.float32, default_value=_MISSING)
            for i in range(1, num_features + 1)
        }
    spec[_PAD_KEY] = tf.io.FixedLenFeature([], tf.int64, default_value=0)
    return spec


# A key no document has: parsing only it checks every Example's wire format.
_WIRE_CHECK_SPEC_KEY = "tfapprox.wire_check"


def _try_parse(documents, request, spec):
    """Returns `(parsed, ok)`: `tf.io.parse_example(documents(request), spec)` and True, or, when
    `documents` or the parse fails, the parse of no document and False.

    It runs inside tf.data, whose `ignore_errors` is the only way a graph can catch an op's error,
    with tf.data's own Example parser: its errors, unlike tf.io.parse_example's, are neither logged
    nor quote the request's bytes (clients cannot even decode them).
    """
    import tensorflow as tf

    attempt = (
        tf.data.Dataset.from_tensors(request)
        .map(documents)
        .apply(tf.data.experimental.parse_example_dataset(spec))
        .map(lambda parsed: (parsed, True))
    )
    nothing = (tf.io.parse_example(tf.constant([], tf.string), spec), False)
    fallback = tf.data.Dataset.from_tensors(nothing)
    return attempt.ignore_errors().concatenate(fallback).take(1).get_single_element()


def _parse_or_explain(documents, request, spec, wrong_proto):
    """Returns `tf.io.parse_example(documents(request), spec)`, parsed once.

    If that fails, explains why without quoting the request: `wrong_proto` (a list of Assert
    data) when its strings are not the expected protos, else TF's error for well-formed protos
    that do not fit `spec` (e.g. "Key: features ... Values size: 5 but output shape: [7]").
    """
    import tensorflow as tf

    parsed, ok = _try_parse(documents, request, spec)

    def explain():
        wire_spec = {_WIRE_CHECK_SPEC_KEY: tf.io.FixedLenFeature([], tf.string, default_value="")}
        _, well_formed = _try_parse(documents, request, wire_spec)
        check = tf.debugging.Assert(well_formed, wrong_proto)
        with tf.control_dependencies([check]):
            return tf.io.parse_example(documents(request), spec)

    return tf.cond(ok, lambda: parsed, explain)


def _list_documents(elwc):
    """Returns the serialized documents of the ELWC `elwc` [B], list by list, each list padded to
    the longest with `_pad_example()`: [B * L] strings."""
    import tensorflow as tf

    from tfapprox.data import records

    examples, lengths = records.decode_elwc(elwc)
    real = tf.sequence_mask(lengths, tf.shape(examples)[1])
    return tf.where(tf.reshape(real, [-1]), tf.reshape(examples, [-1]), _pad_example())


def _checked_documents(signature, parsed, num_features, example_layout):
    """Returns `(features [N, F], real [N])` of `parsed` documents, failing with an error naming
    `signature` if a real document has no "features" (vector layout) or none of "1".."F"
    (per_feature; the keys it lacks read as 0)."""
    import tensorflow as tf

    from tfapprox.data import records

    real = tf.equal(parsed[_PAD_KEY], 0)
    if example_layout == "vector":
        features = parsed[records.FEATURES_KEY]
        missing = tf.reduce_all(tf.math.is_nan(features), axis=1) & real
        no_features = tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(missing)),
            [
                f"{signature}: a document has no {records.FEATURES_KEY!r} feature; every document "
                f"holds {num_features} float values there. Documents without it:",
                tf.reduce_sum(tf.cast(missing, tf.int32)),
            ],
        )
        with tf.control_dependencies([no_features]):
            features = tf.identity(features)
    else:
        values = tf.stack([parsed[str(i)] for i in range(1, num_features + 1)], axis=1)
        held = tf.not_equal(tf.bitcast(values, tf.int32), _MISSING_BITS)
        empty = tf.logical_not(tf.reduce_any(held, axis=1)) & real
        none_held = tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(empty)),
            [
                f'{signature}: a document holds none of the features "1" .. "{num_features}" '
                'that this model reads (it was exported with example_layout="per_feature"; a '
                f'document holding one {records.FEATURES_KEY!r} list is the "vector" layout). '
                "Documents that hold none:",
                tf.reduce_sum(tf.cast(empty, tf.int32)),
            ],
        )
        with tf.control_dependencies([none_held]):
            features = tf.where(held, values, 0.0)
    return features, real


def _assert_finite(signature, features, finite, unit):
    """Returns `features` once `finite` (bool per unit) holds everywhere, else fails: a NaN or
    infinite feature value is refused, as in training data (tfapprox.data.letor)."""
    import tensorflow as tf

    check = tf.debugging.Assert(
        tf.reduce_all(finite),
        [
            f"{signature}: feature values must be finite; some {unit} hold NaN or infinite "
            f"values. {unit.capitalize()} that do:",
            tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int32)),
        ],
    )
    with tf.control_dependencies([check]):
        return tf.identity(features)


def _assert_at_most(signature, bounds, lists, length, tensor, in_lists=True):
    """Returns `tensor` once `lists` x `length` (the documents of a request, counting the slots
    that pad each list to the longest) is at most `bounds.documents`, and, for lists of a model
    whose documents attend to each other, `lists` x `length`² at most `bounds.pairs`, else fails
    saying so."""
    import tensorflow as tf

    lists, length = tf.cast(lists, tf.int64), tf.cast(length, tf.int64)
    max_documents = bounds.documents
    received = (
        tf.strings.format("this one: {} lists of up to {} documents", (lists, length))
        if in_lists
        else tf.strings.format("this one: {} documents", lists * length)
    )
    check = tf.debugging.Assert(
        lists * length <= max_documents,
        [
            tf.strings.join([
                f"{signature}: a request may hold at most {max_documents} documents, counting "
                "the slots that pad every list to the longest (max_documents, set at export); ",
                received,
                ". Send a long list in a request of its own, or fewer documents per request.",
            ])
        ],
    )
    checks = [check]
    if in_lists and bounds.pairs is not None:
        checks.append(tf.debugging.Assert(
            lists * length * length <= bounds.pairs,
            [
                tf.strings.join([
                    f"{signature}: the documents of a list attend to each other in this model, "
                    f"so a request may hold at most {bounds.pairs} document pairs, lists x "
                    "longest list² (max_pairs, set at export); ",
                    received,
                    ". Send a long list in a request of its own, or shorter lists.",
                ])
            ],
        ))
    with tf.control_dependencies(checks):
        return tf.identity(tensor)


def _quietly(compute, request, fallback):
    """Returns `compute(request)`, or `fallback` when it fails, inside tf.data (see `_try_parse`),
    so that neither an error nor the request's bytes are logged."""
    import tensorflow as tf

    attempt = tf.data.Dataset.from_tensors(request).map(compute).ignore_errors()
    return attempt.concatenate(tf.data.Dataset.from_tensors(fallback)).take(1).get_single_element()


# The fast path of the string signatures. With tf.data's quiet Example parser (`_try_parse`),
# `serving_default` took 2.2-3x the time of `score_features` at 16 lists x 100 documents (B64,
# F = 46, C++ loader); read as below, about 1.3x (docs/serving.md). A document holding only the
# "features" float list, as `tfapprox.data.records.encode_elwc`/`encode_examples` and protobuf
# write it, always has the same bytes around its 4F float bytes:
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
# and an ELWC is its documents' entries followed by an optional context (`_CONTEXTS`). Whether
# a request is exactly that is decided by ops that cannot fail (lengths, byte comparisons), and
# its floats are then read as bytes; any other request (a context with features, labels, other
# features, another F, another proto) is parsed as before. See docs/serving.md for the figures.
_CONTEXTS = (b"", b"\x12\x00", b"\x12\x02\x0a\x00")  # none, an empty Example, empty Features


def _canonical_header(num_features, in_list):
    """Returns the bytes before the floats of a document holding only F "features" floats: a
    tf.Example serialized by protobuf, wrapped as an ELWC `examples` entry if `in_list`."""
    import tensorflow as tf

    from tfapprox.data import records

    example = tf.train.Example()
    example.features.feature[records.FEATURES_KEY].float_list.value.extend([0.0] * num_features)
    document = example.SerializeToString()
    if in_list:
        document = records._field(1, document)
    header, values = document[: -4 * num_features], document[-4 * num_features :]
    assert values == bytes(4 * num_features), "the floats are not the last bytes"
    return header


def _read_canonical(requests, num_features, lists, bounds):
    """Returns `(fits, features [B, L, F], mask [B, L])` for `requests` [B]: whether every string
    is canonical (ELWCs of canonical documents if `lists`, else one canonical tf.Example each; see
    above), and the features and mask they hold if so (anything otherwise).

    Only ops that cannot fail, whatever the bytes, run here. Lists of different lengths are
    padded: L is the longest string's length divided by a document's, so the grid holds at most
    B times the longest string's bytes; when B x L exceeds `bounds.documents` (or B x L² exceeds
    `bounds.pairs`, when set) no grid is read and `fits` is False (the parser's path then refuses
    the request).
    """
    import tensorflow as tf

    header = _canonical_header(num_features, lists)
    width = len(header) + 4 * num_features
    sizes = tf.strings.length(requests)
    if lists:
        counts = sizes // width
        bodies = counts * width
        tails = tf.strings.substr(requests, bodies, sizes - bodies)
        fits = tf.reduce_all(tf.reduce_any(tf.equal(tails[:, None], _CONTEXTS), axis=1))
        length = tf.reduce_max(tf.concat([counts, [0]], axis=0))
        documents = tf.cast(tf.size(requests), tf.int64) * tf.cast(length, tf.int64)
        within = documents <= bounds.documents
        if bounds.pairs is not None:
            within &= documents * tf.cast(length, tf.int64) <= bounds.pairs
        fits &= within
        length = tf.where(within, length, 0)
        mask = tf.sequence_mask(counts, length)
    else:
        fits = tf.reduce_all(tf.equal(sizes, width)) & (tf.size(requests) <= bounds.documents)
        length, mask = 1, tf.ones([tf.size(requests), 1], tf.bool)
    # Row b: the first `length` documents' bytes of string b, zeros past its end (DecodePaddedRaw
    # refuses a fixed_length of 0: one document more is decoded when all lists are empty).
    rows = tf.maximum(length, 1)
    grid = tf.io.decode_raw(requests, tf.uint8, fixed_length=rows * width)
    grid = tf.reshape(grid, [tf.size(requests), rows, width])[:, :length]
    headers_fit = tf.equal(grid[:, :, : len(header)], list(header)) | ~mask[:, :, None]
    # tf.bitcast reads the host's byte order; the wire's is little-endian.
    little_endian = tf.equal(tf.bitcast(tf.constant(1, tf.uint16), tf.uint8)[0], 1)
    fits &= tf.reduce_all(headers_fit) & little_endian
    values = tf.reshape(grid[:, :, len(header) :], [tf.size(requests), length, num_features, 4])
    return fits, tf.bitcast(values, tf.float32), mask


def _runtime_rank(shape):
    """Returns the length of `shape` counted at run time: tf.rank or tf.size(shape) would be
    folded into the declared rank by the graph optimiser, while TF Serving feeds tensors of any
    rank."""
    import tensorflow as tf

    return tf.math.count_nonzero(shape >= 0, dtype=tf.int32)


def _refuse_padded_lists(features):
    """Returns `features` [B, L, F] unless a list of more than one document ends in one whose
    features are all 0, as zero padding does; fails saying how to send padded lists then."""
    import tensorflow as tf

    last_is_zero = tf.reduce_all(tf.equal(features[:, -1:], 0.0), axis=[1, 2])
    padded = last_is_zero & (tf.shape(features)[1] > 1)
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(padded)),
        [
            "score_features: this model scores each document in the context of its list (its "
            "documents attend to each other, or features are standardised within the list), "
            "and some lists end in a document whose features are all 0, as zero padding does: "
            "padding would join the list and change the scores of the real documents. Send padded "
            f"lists to {MASKED} with `mask` [batch, list] (True on real documents), or lists "
            "without padding. Lists ending so:",
            tf.reduce_sum(tf.cast(padded, tf.int32)),
        ],
    )
    with tf.control_dependencies([check]):
        return tf.identity(features)


def _build_archive(model, num_features, example_layout, bounds):
    """Returns a `keras.export.ExportArchive` holding the six scoring signatures."""
    import tensorflow as tf

    from tfapprox.data import records

    spec = _document_spec(num_features, example_layout)
    depends_on_list = scores_depend_on_list(model)

    def score(signature, features, mask, lists=True):
        """Returns the scores [B, L] of `features`, 0 on padded slots, after checking that B x L is
        within `bounds`; fails if a real document's score is NaN or infinite."""
        shape = tf.shape(mask)
        features = _assert_at_most(signature, bounds, shape[0], shape[1], features, lists)
        scores = model({"features": features, "mask": mask}, training=False)
        scores = tf.cast(tf.reshape(scores, shape), tf.float32)
        finite = tf.math.is_finite(scores) | ~mask
        check = tf.debugging.Assert(
            tf.reduce_all(finite),
            [
                f"{signature}: scores are not finite (NaN or infinite) for some "
                "documents, though their features are: feature values this large overflow the "
                "model. Documents affected:",
                tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int32)),
            ],
        )
        with tf.control_dependencies([check]):
            return tf.where(mask, scores, tf.zeros_like(scores))

    def parse(signature, requests, documents, wrong_proto, lists):
        """Returns features [B, L, F] (0 on padded slots) and mask [B, L] of `requests` [B],
        serialized ELWCs if `lists`, else tf.Examples (L = 1): read as bytes when they are
        canonical (`_read_canonical`), else parsed, failing with `wrong_proto` or TF's error."""

        def parse_safely():
            # DecodeProtoV2 refuses an empty batch: one empty list is appended and its row dropped.
            batch = tf.concat([requests, [""]], axis=0) if lists else requests
            if lists:  # bound the padded grid before it is made (0 for bytes that are no ELWCs)
                longest = _quietly(
                    lambda r: tf.reduce_max(records.decode_elwc(r)[1]), batch, tf.constant(0)
                )
                batch = _assert_at_most(signature, bounds, tf.size(requests), longest, batch)
            parsed = _parse_or_explain(documents, batch, spec, wrong_proto)
            features, real = _checked_documents(signature, parsed, num_features, example_layout)
            grid = [tf.size(batch), -1 if lists else 1]
            features, real = tf.reshape(features, grid + [num_features]), tf.reshape(real, grid)
            return (features[:-1], real[:-1]) if lists else (features, real)

        if example_layout == "vector":
            fits, features, mask = _read_canonical(requests, num_features, lists, bounds)
            features, mask = tf.cond(fits, lambda: (features, mask), parse_safely)
        else:
            features, mask = parse_safely()
        finite = tf.reduce_all(tf.math.is_finite(features), axis=2) | ~mask
        features = _assert_finite(signature, features, finite, "documents")
        return tf.where(mask[:, :, None], features, 0.0), mask

    def score_lists(signature, argument, elwc):
        wrong_proto = [
            f"{signature} expects `{argument}`: serialized ExampleListWithContext protos, one "
            "per list; some of the strings received are not (a serialized tf.Example per "
            f"document goes to score_examples or {REGRESS}). Number of strings received:",
            tf.size(elwc),
        ]
        features, mask = parse(signature, elwc, _list_documents, wrong_proto, lists=True)
        return score(signature, features, mask)

    def score_documents(signature, argument, examples):
        wrong_proto = [
            f"{signature} expects `{argument}`: serialized tf.Example protos, one per "
            "document; some of the strings received are not (a serialized "
            f"ExampleListWithContext goes to serving_default or {PREDICT}). Number of strings "
            "received:",
            tf.size(examples),
        ]
        features, mask = parse(signature, examples, tf.identity, wrong_proto, lists=False)
        return score(signature, features, mask, lists=False)[:, 0]

    def checked_features(signature, features):
        """Returns `features` once they are [batch, list, F] and finite where `mask` is True."""
        received = tf.shape(features)
        check = tf.debugging.Assert(
            tf.equal(_runtime_rank(received), 3)
            & tf.reduce_any(tf.equal(received[2:], num_features)),
            [
                f"{signature} expects float32 features [batch, list, {num_features}]; "
                "received shape",
                received,
            ],
            summarize=8,
        )
        with tf.control_dependencies([check]):
            return tf.identity(features)

    def score_features(features):
        features = checked_features("score_features", features)
        finite = tf.reduce_all(tf.math.is_finite(features), axis=2)
        features = _assert_finite("score_features", features, finite, "documents")
        if depends_on_list:
            features = _refuse_padded_lists(features)
        mask = tf.ones(tf.shape(features)[:2], dtype=tf.bool)
        return {"scores": score("score_features", features, mask)}

    def score_features_masked(features, mask):
        features = checked_features(MASKED, features)
        received, grid = tf.shape(mask), tf.shape(features)[:2]
        fits = tf.equal(_runtime_rank(received), 2) & tf.reduce_all(
            tf.equal(tf.pad(received, [[0, 2]])[:2], grid)
        )
        check = tf.debugging.Assert(
            fits,
            [
                f"{MASKED} expects a bool mask [batch, list], the first two dimensions "
                "of the features, True on real documents; received mask shape",
                received,
                "for features [batch, list]",
                grid,
            ],
            summarize=8,
        )
        with tf.control_dependencies([check]):
            mask = tf.identity(mask)
        finite = tf.reduce_all(tf.math.is_finite(features), axis=2) | ~mask
        features = _assert_finite(MASKED, features, finite, "documents")
        features = tf.where(mask[:, :, None], features, 0.0)
        return {"scores": score(MASKED, features, mask)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default",
        lambda elwc: {"scores": score_lists("serving_default", "elwc", elwc)},
        [tf.TensorSpec([None], tf.string, name="elwc")],
    )
    archive.add_endpoint(
        "score_features",
        score_features,
        [tf.TensorSpec([None, None, num_features], tf.float32, name="features")],
    )
    archive.add_endpoint(
        MASKED,
        score_features_masked,
        [
            tf.TensorSpec([None, None, num_features], tf.float32, name="features"),
            tf.TensorSpec([None, None], tf.bool, name="mask"),
        ],
    )
    archive.add_endpoint(
        "score_examples",
        lambda examples: {"scores": score_documents("score_examples", "examples", examples)},
        [tf.TensorSpec([None], tf.string, name="examples")],
    )
    inputs = [tf.TensorSpec([None], tf.string, name="inputs")]
    archive.add_endpoint(
        PREDICT,
        lambda inputs: {"outputs": score_lists(PREDICT, "inputs", inputs)},
        inputs,
    )
    archive.add_endpoint(
        REGRESS,
        lambda inputs: {"outputs": score_documents(REGRESS, "inputs", inputs)},
        inputs,
    )
    return archive


# TF Serving replays this file's requests when it loads a version (its "SavedModel warmup").
_WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# (lists, documents per list) of the warm-up requests: a single document and a small batch.
_WARMUP_SIZES = ((1, 1), (4, 10))


def _warmup_requests(num_features, example_layout, bounds):
    """Yields `(signature, inputs)`: every signature at each of `_WARMUP_SIZES` within `bounds`,
    all features 1 (0 would look like padding to `_refuse_padded_lists`), documents in
    `example_layout`."""
    from tfapprox.data import records
    from tfapprox.data.records import _field, _map_entry_bytes

    # A per_feature document: Example.features {"1": float_list [1.0]} (the others read as 0).
    one = _field(1, _map_entry_bytes("1", _field(2, _field(1, np.float32(1).tobytes()))))
    for lists, documents in _WARMUP_SIZES:
        if lists * documents > bounds.documents or (
            bounds.pairs is not None and lists * documents**2 > bounds.pairs
        ):
            continue
        features = np.ones((lists, documents, num_features), "float32")
        if example_layout == "vector":
            elwc = [records.encode_elwc(list_features) for list_features in features]
            examples = records.encode_examples(features.reshape(-1, num_features))
        else:
            elwc = [_field(1, one) * documents] * lists
            examples = [one] * (lists * documents)
        elwc, examples = np.array(elwc, dtype=object), np.array(examples, dtype=object)
        yield "serving_default", {"elwc": elwc}
        yield "score_features", {"features": features}
        yield MASKED, {"features": features, "mask": np.ones((lists, documents), bool)}
        yield "score_examples", {"examples": examples}
        yield PREDICT, {"inputs": elwc}
        yield REGRESS, {"inputs": examples}


def _prediction_log(signature, inputs):
    """Returns a serialized `tensorflow.serving.PredictionLog` holding one PredictRequest.

    Written in the protobuf wire format, so that tensorflow-serving-api is not needed; the field
    numbers are those of tensorflow_serving/apis: PredictionLog.predict_log = 6,
    PredictLog.request = 1, PredictRequest.model_spec = 1 and .inputs = 2 (map entries: key = 1,
    value = 2, a TensorProto), ModelSpec.signature_name = 3. The model name is left out: TF Serving
    runs warm-up requests on the version it is loading, whatever name it serves it under.
    """
    import tensorflow as tf

    from tfapprox.data.records import _field

    model_spec = _field(1, _field(3, signature.encode()))
    entries = (
        _field(1, name.encode()) + _field(2, tf.make_tensor_proto(value).SerializeToString())
        for name, value in inputs.items()
    )
    request = model_spec + b"".join(_field(2, entry) for entry in entries)
    return _field(6, _field(1, request))


def _write_warmup_requests(saved_model_dir, *arguments):
    """Writes TF Serving's warm-up file (TFRecords of PredictionLog) into `saved_model_dir`, of
    `_warmup_requests(*arguments)`."""
    import tensorflow as tf

    path = os.path.join(saved_model_dir, _WARMUP_FILE)
    os.mkdir(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for signature, inputs in _warmup_requests(*arguments):
            writer.write(_prediction_log(signature, inputs))


# The default bound on the documents of one request (`max_documents`).
MAX_DOCUMENTS = 100_000


class _Bounds(NamedTuple):
    """What one request may hold: `documents`, padding counted, and for a model whose documents
    attend to each other `pairs`, lists x longest list² (None for other models)."""

    documents: int
    pairs: int | None


def export_saved_model(
    model, base_dir, name, num_features, version=None, *, example_layout="vector",
    max_documents=MAX_DOCUMENTS, max_pairs=MAX_ATTENTION_PAIRS,
):
    """Returns the path `base_dir/name/<version>` of a TF Serving SavedModel, written atomically.

    Args:
        model: A scorer taking `{"features": [B, L, F], "mask": [B, L]}` and returning `[B, L]`
            (e.g. `tfapprox.models.DNNScorer`); built here if it is not yet.
        base_dir: Directory holding one subdirectory per served model (created if missing).
        name: The model's name: `base_dir/name` is TF Serving's `--model_base_path`.
        num_features: F, the number of features per document.
        version: Non-negative integer version; default: one more than the largest existing one
            (1 for a new model). An existing version is never overwritten.
        example_layout: How a document's features are stored in the tf.Example protos the
            string signatures receive: `"vector"` (one float feature `"features"` of length F) or
            `"per_feature"` (scalar features `"1"` .. `"F"`), as in `tfapprox.data.records`.
        max_documents: The most documents one request may hold, counting the slots that pad
            every list of a `serving_default` request to its longest; a larger request is
            refused with an error saying so. It bounds the memory one request can take.
        max_pairs: For a model whose documents attend to each other (DASALC's
            `DocumentInteraction`, any `MultiHeadAttention` inside), the most document pairs one
            request may hold, lists x longest list² (each attention block holds [lists, heads,
            L, L] grids); a larger request is refused before any grid is made.

    Raises:
        ValueError: for invalid arguments, or a model that cannot score F features.
        FileExistsError: if `base_dir/name/<version>` already exists.
        RuntimeError: if the Keras backend is not TensorFlow.
    """
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "export_saved_model needs the TensorFlow backend; the Keras backend is "
            f"{keras.backend.backend()!r}. Save the model with model.save('scorer.keras') and "
            "export it from a process run with KERAS_BACKEND=tensorflow."
        )
    _check_arguments(name, num_features, version, example_layout, max_documents, max_pairs)
    num_features = int(num_features)
    _check_model_accepts(model, num_features)

    model_dir = os.path.join(os.fspath(base_dir), name)
    if os.path.islink(model_dir):
        raise ValueError(
            f"{model_dir} is a symbolic link, and export does not write through links: export to "
            f"the directory it points to, {os.path.realpath(model_dir)}, instead."
        )
    os.makedirs(model_dir, exist_ok=True)
    version = next_version(model_dir) if version is None else int(version)
    target = os.path.join(model_dir, str(version))
    if os.path.lexists(target):
        raise FileExistsError(f"Version {version} of model {name!r} already exists: {target}")

    _remove_stale_staging(model_dir)
    # os.mkdir (unlike tempfile.mkdtemp's 0700) honours the umask, so the renamed version is
    # readable by a TF Serving process running as another user.
    staging = os.path.join(
        model_dir, f".tmp-{version}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"
    )
    os.mkdir(staging)
    try:
        bounds = _Bounds(int(max_documents),
                         int(max_pairs) if attends_within_lists(model) else None)
        _build_archive(model, num_features, example_layout, bounds).write_out(
            staging, verbose=False
        )
        _write_warmup_requests(staging, num_features, example_layout, bounds)
        if os.path.lexists(target):
            raise FileExistsError(
                f"Version {version} of model {name!r} appeared during export: {target}"
            )
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# A staging directory names its writer: .tmp-<version>-<host>-<pid>-<random hex> (exports of
# tfapprox 0.1.0 wrote .tmp-<version>-<random hex>, with no writer).
_STAGING_NAME = re.compile(r"\.tmp-\d+-(?:(?P<host>.+)-(?P<pid>\d+)-)?[0-9a-f]{32}")
_STAGING_MAX_AGE_SECONDS = 24 * 3600


def _remove_stale_staging(model_dir):
    """Deletes the staging directories of killed exports: those whose writer on this host is no
    longer running, or untouched for a day (another host's, or 0.1.0's, which name no writer)."""
    remove_abandoned(model_dir, _STAGING_NAME, max_age_seconds=_STAGING_MAX_AGE_SECONDS)
