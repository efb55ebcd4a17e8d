"""The scoring signatures of an export: request parsing, checks and scoring as TensorFlow graphs.

`build_archive` returns the `SignatureArchive` that `tfapprox.export.export_saved_model`
writes; what each signature takes, returns and refuses is described in docs/serving.md.
"""

from typing import NamedTuple

import tensorflow as tf

from tfapprox.data import records
from tfapprox.models import scores_depend_on_list
from tfapprox.signature_archive import SignatureArchive

# TF-Ranking's signature names (tfr.keras.saved_model.Signatures), which are TF Serving's method
# names: clients written for TF-Ranking models, and TF Serving's Regress API, use them.
PREDICT = "tensorflow/serving/predict"
REGRESS = "tensorflow/serving/regress"
# Dense features with a mask: padded lists for a model whose scores depend on the list.
MASKED = "score_features_masked"
SIGNATURES = ("serving_default", "score_features", MASKED, "score_examples", PREDICT, REGRESS)


class _Bounds(NamedTuple):
    """What one request may hold: `documents`, padding counted, and for a model whose documents
    attend to each other `pairs`, lists x longest list² (None for other models)."""

    documents: int
    pairs: int | None


# A padded slot of a list is handed to the parser as this Example, which only it holds the key of,
# so that padding needs no lengths beside the parsed features: its documents read `_PAD_KEY` 1,
# real ones 0 (and the parse runs on one string tensor, as tf.data's Example parser requires).
_PAD_KEY = "tfapprox.padding"


def _pad_example():
    """Returns the serialized Example of a padded slot: only `_PAD_KEY`, int64 1."""
    return records.example_bytes({_PAD_KEY: records.int64_feature([1])})


def _document_spec(num_features, example_layout):
    """Returns the tf.io.parse_example spec of a document: its features (a missing key reads as
    `records.ABSENT`: all F values for a missing "features" in the vector layout) and the padding
    mark."""
    if example_layout == "vector":
        spec = {
            records.FEATURES_KEY: tf.io.FixedLenFeature(
                [num_features], tf.float32, default_value=[records.ABSENT] * num_features
            )
        }
    else:
        spec = {
            str(i): tf.io.FixedLenFeature([], tf.float32, default_value=records.ABSENT)
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
    attempt = (
        tf.data.Dataset.from_tensors(request)
        .map(documents)
        .apply(tf.data.experimental.parse_example_dataset(spec))
        .map(lambda parsed: (parsed, True))
    )
    nothing = (tf.io.parse_example(tf.constant([], tf.string), spec), False)
    fallback = tf.data.Dataset.from_tensors(nothing)
    return attempt.ignore_errors().concatenate(fallback).take(1).get_single_element()


def _parse_or_explain(documents, request, spec, wrong_proto, check=None):
    """Returns `tf.io.parse_example(documents(request), spec)`, parsed once.

    If that fails, explains why without quoting the request: `wrong_proto` (a list of Assert
    data) when its strings are not the expected protos, else the Assert `check(examples)` makes of
    the well-formed Examples (if given), else TF's error for protos that do not fit `spec` (e.g.
    "Key: features ... Values size: 5 but output shape: [7]").
    """
    parsed, ok = _try_parse(documents, request, spec)

    def explain():
        wire_spec = {_WIRE_CHECK_SPEC_KEY: tf.io.FixedLenFeature([], tf.string, default_value="")}
        _, well_formed = _try_parse(documents, request, wire_spec)
        checks = [tf.debugging.Assert(well_formed, wrong_proto)]
        if check is not None:
            with tf.control_dependencies(checks):
                checks.append(check(documents(request)))
        with tf.control_dependencies(checks):
            return tf.io.parse_example(documents(request), spec)

    return tf.cond(ok, lambda: parsed, explain)


def _list_documents(elwc):
    """Returns the serialized documents of the ELWC `elwc` [B], list by list, each list padded to
    the longest with `_pad_example()`: [B * L] strings."""
    examples, lengths = records.decode_elwc(elwc)
    real = tf.sequence_mask(lengths, tf.shape(examples)[1])
    return tf.where(tf.reshape(real, [-1]), tf.reshape(examples, [-1]), _pad_example())


def _checked_documents(signature, parsed, num_features, example_layout):
    """Returns `(features [N, F], real [N])` of `parsed` documents, failing with an error naming
    `signature` if a real document has no "features" (vector layout) or none of "1".."F"
    (per_feature; the keys it lacks read as 0)."""
    real = tf.equal(parsed[_PAD_KEY], 0)
    if example_layout == "vector":
        features = parsed[records.FEATURES_KEY]
        missing = tf.reduce_all(records.is_absent(features), axis=1) & real
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
        held = tf.logical_not(records.is_absent(values))
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


def _assert_finite(signature, features, mask, allows_nan=False):
    """Returns `features` [B, L, F] once the values of every real document (`mask` [B, L]) are
    finite, else fails: a NaN or infinite feature value is refused, as in training data
    (tfapprox.data.letor). For a model that handles missing values (`allows_nan`), NaN marks one
    and passes; infinite values are refused."""
    if allows_nan:
        bad, rule, held = tf.math.is_inf(features), "must not be infinite", "infinite"
    else:
        bad, rule, held = ~tf.math.is_finite(features), "must be finite", "NaN or infinite"
    bad = tf.reduce_any(bad, axis=2) & mask
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(bad)),
        [
            f"{signature}: feature values {rule}; some documents hold {held} values. Documents "
            "that do:",
            tf.reduce_sum(tf.cast(bad, tf.int32)),
        ],
    )
    with tf.control_dependencies([check]):
        return tf.identity(features)


def _assert_at_most(signature, bounds, lists, length, tensor, in_lists=True):
    """Returns `tensor` once `lists` x `length` (the documents of a request, counting the slots
    that pad each list to the longest) is at most `bounds.documents`, and, for lists of a model
    whose documents attend to each other, `lists` x `length`² at most `bounds.pairs`, else fails
    saying so."""
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
    attempt = tf.data.Dataset.from_tensors(request).map(compute).ignore_errors()
    return attempt.concatenate(tf.data.Dataset.from_tensors(fallback)).take(1).get_single_element()


def _read_canonical(requests, num_features, lists, bounds):
    """Returns `(fits, features [B, L, F], mask [B, L])` of `requests` [B] read as bytes
    (`tfapprox.data.records.read_vector_documents`) within `bounds`; when `fits` is False the
    parser's path takes the request (and refuses it if it exceeds `bounds`).

    The fast path of the string signatures: with tf.data's quiet Example parser (`_try_parse`)
    alone, `serving_default` took 2.2-3x the time of `score_features` at 16 lists x 100 documents
    (B64, F = 46, C++ loader); with requests read as bytes, about 1.3x (docs/benchmarks.md#serving).
    """
    return records.read_vector_documents(requests, num_features, lists, bounds.documents,
                                         bounds.pairs)


def _runtime_rank(shape):
    """Returns the length of `shape` counted at run time: tf.rank or tf.size(shape) would be
    folded into the declared rank by the graph optimiser, while TF Serving feeds tensors of any
    rank."""
    return tf.math.count_nonzero(shape >= 0, dtype=tf.int32)


def _refuse_padded_lists(features):
    """Returns `features` [B, L, F] unless a list of more than one document ends in one whose
    features are all 0, as zero padding does; fails saying how to send padded lists then."""
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


def _checked_shape(signature, features, num_features):
    """Returns `features` once they are [batch, list, F], failing with the shape received."""
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


def _checked_mask(features, mask):
    """Returns `mask` once it is [batch, list], the first two dimensions of `features`."""
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
        return tf.identity(mask)


class _Signatures:
    """The signatures' functions for one model: requests in, checked features and mask, scores out.

    Args:
        model: the scorer, `{"features": [B, L, F], "mask": [B, L]}` -> [B, L].
        num_features: F.
        example_layout: how the string signatures' documents store their features.
        bounds: a `_Bounds`, what one request may hold.
    """

    def __init__(self, model, num_features, example_layout, bounds):
        self.num_features = num_features
        self.example_layout = example_layout
        self.bounds = bounds
        self.spec = _document_spec(num_features, example_layout)
        self.depends_on_list = scores_depend_on_list(model)
        # The model is traced once, into one function every signature calls, not once per trace
        # of each of the six signatures.
        self.scores = tf.function(
            lambda features, mask: model({"features": features, "mask": mask}, training=False),
            input_signature=[tf.TensorSpec([None, None, num_features], tf.float32),
                             tf.TensorSpec([None, None], tf.bool)],
            autograph=False,
        )
        # A scorer trained on data with missing values (its `handles_missing`) reads NaN as one.
        self.allows_nan = bool(getattr(model, "handles_missing", False))

    def score(self, signature, features, mask, lists=True):
        """Returns the scores [B, L] of `features` (`checked_scores`)."""
        return checked_scores(signature, self.bounds, mask,
                              lambda mask: self.scores(features, mask), lists)

    def parse(self, signature, requests, documents, wrong_proto, lists):
        """Returns features [B, L, F] (0 on padded slots) and mask [B, L] of `requests` [B],
        serialized ELWCs if `lists`, else tf.Examples (L = 1): read as bytes when they are
        canonical (`_read_canonical`), else parsed, failing with `wrong_proto` or TF's error."""

        def parse_safely():
            return self._parse_with_checks(signature, requests, documents, wrong_proto, lists)

        if self.example_layout == "vector":
            fits, features, mask = _read_canonical(requests, self.num_features, lists, self.bounds)
            features, mask = tf.cond(fits, lambda: (features, mask), parse_safely)
        else:
            features, mask = parse_safely()
        features = _assert_finite(signature, features, mask, self.allows_nan)
        return tf.where(mask[:, :, None], features, 0.0), mask

    def _parse_with_checks(self, signature, requests, documents, wrong_proto, lists):
        """`parse`'s path for requests not read as bytes: tf.data's Example parser, the bounds
        checked before the padded grid is made."""
        # DecodeProtoV2 refuses an empty batch: one empty list is appended and its row dropped.
        batch = tf.concat([requests, [""]], axis=0) if lists else requests
        if lists:  # bound the padded grid before it is made (0 for bytes that are no ELWCs)
            longest = _quietly(
                lambda r: tf.reduce_max(records.decode_elwc(r)[1]), batch, tf.constant(0)
            )
            batch = _assert_at_most(signature, self.bounds, tf.size(requests), longest, batch)
        parsed = _parse_or_explain(documents, batch, self.spec, wrong_proto)
        features, real = _checked_documents(signature, parsed, self.num_features,
                                            self.example_layout)
        grid = [tf.size(batch), -1 if lists else 1]
        features, real = tf.reshape(features, grid + [self.num_features]), tf.reshape(real, grid)
        return (features[:-1], real[:-1]) if lists else (features, real)

    def lists(self, signature, argument, elwc):
        """Scores [B, L] of ELWCs `elwc` [B], the input `argument` of `signature`."""
        wrong_proto = wrong_proto_message(signature, argument, elwc, lists=True)
        features, mask = self.parse(signature, elwc, _list_documents, wrong_proto, lists=True)
        return self.score(signature, features, mask)

    def documents(self, signature, argument, examples):
        """Scores [n] of tf.Examples `examples` [n], each a list of its own."""
        wrong_proto = wrong_proto_message(signature, argument, examples, lists=False)
        features, mask = self.parse(signature, examples, tf.identity, wrong_proto, lists=False)
        return self.score(signature, features, mask, lists=False)[:, 0]

    def features(self, features):
        """`score_features`: every slot of `features` [B, L, F] is a document."""
        features = _checked_shape("score_features", features, self.num_features)
        mask = tf.ones(tf.shape(features)[:2], dtype=tf.bool)
        features = _assert_finite("score_features", features, mask, self.allows_nan)
        if self.depends_on_list:
            features = _refuse_padded_lists(features)
        return {"scores": self.score("score_features", features, mask)}

    def masked_features(self, features, mask):
        """`score_features_masked`: the slots of `features` [B, L, F] where `mask` [B, L] holds."""
        features = _checked_shape(MASKED, features, self.num_features)
        mask = _checked_mask(features, mask)
        features = _assert_finite(MASKED, features, mask, self.allows_nan)
        features = tf.where(mask[:, :, None], features, 0.0)
        return {"scores": self.score(MASKED, features, mask)}


def wrong_proto_message(signature, argument, strings, lists):
    """The Assert data refusing `strings` that are not the protos of `signature`'s `argument`:
    ELWCs if `lists`, else tf.Examples."""
    if lists:
        expected = ("serialized ExampleListWithContext protos, one per list", "a serialized "
                    f"tf.Example per document goes to score_examples or {REGRESS}")
    else:
        expected = ("serialized tf.Example protos, one per document", "a serialized "
                    f"ExampleListWithContext goes to serving_default or {PREDICT}")
    return [
        f"{signature} expects `{argument}`: {expected[0]}; some of the strings received are not "
        f"({expected[1]}). Number of strings received:",
        tf.size(strings),
    ]


def checked_scores(signature, bounds, mask, score, lists=True):
    """Returns `score(mask)` as float32 scores [B, L] (`mask` [B, L], True on real documents), 0
    on padded slots, once B x L is within `bounds`; fails if a real document's score is NaN or
    infinite."""
    shape = tf.shape(mask)
    mask = _assert_at_most(signature, bounds, shape[0], shape[1], mask, lists)
    scores = tf.cast(tf.reshape(score(mask), shape), tf.float32)
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


# The signatures taking serialized protos: (name, input, output, whether one string is a list).
STRING_SIGNATURES = (
    ("serving_default", "elwc", "scores", True),
    ("score_examples", "examples", "scores", False),
    (PREDICT, "inputs", "outputs", True),
    (REGRESS, "inputs", "outputs", False),
)


def _endpoint(function, name, argument, output):
    """The function of the string signature `name`: `{output: function(name, argument, strings)}`
    (one argument, as a signature's function takes)."""
    return lambda strings: {output: function(name, argument, strings)}


def archive_of(model, signatures):
    """Returns a `SignatureArchive` tracking `model`, with the `STRING_SIGNATURES` of
    `signatures` (its `lists` and `documents` functions)."""
    archive = SignatureArchive()
    archive.track(model)
    for name, argument, output, lists in STRING_SIGNATURES:
        function = signatures.lists if lists else signatures.documents
        archive.add_endpoint(name, _endpoint(function, name, argument, output),
                             [tf.TensorSpec([None], tf.string, name=argument)])
    return archive


def build_archive(model, num_features, example_layout, bounds):
    """Returns a `SignatureArchive` of `model` holding the six scoring signatures."""
    signatures = _Signatures(model, num_features, example_layout, bounds)
    features = tf.TensorSpec([None, None, num_features], tf.float32, name="features")
    archive = archive_of(model, signatures)
    archive.add_endpoint("score_features", signatures.features, [features])
    archive.add_endpoint(
        MASKED,
        signatures.masked_features,
        [features, tf.TensorSpec([None, None], tf.bool, name="mask")],
    )
    return archive
