"""The scoring signatures of a model over named features: requests parsed by its `FeatureSpec`.

`build_named_archive` returns the `SignatureArchive` that
`tfapprox.export.export_saved_model(..., feature_spec=spec)` writes. `serving_default` and
`tensorflow/serving/predict` take serialized ExampleListWithContext protos (the context features
in the context, the document features in each document, under the spec's names);
`score_examples` and `tensorflow/serving/regress` take one serialized tf.Example per document
holding its features and its list's context features, as TF Serving's Regress API merges them
(the context's bytes, then the example's). The vocabularies travel as the SavedModel's assets.
What they take, return and refuse is described in docs/serving.md.

Every feature is parsed as a ragged list of its dtype (which no count of values can fail), then
checked here, so that an error names the signature and the feature: a fixed-length feature with
another number of values, a float that is NaN or infinite, a document (or a context) holding
none of the spec's features; a feature of another dtype fails the parse and is named by reading
the Examples' feature kinds. A feature a record lacks reads as its spec default, as in training.
"""

import os

import numpy as np
import tensorflow as tf

from tfapprox.data import records
from tfapprox.data.named_records import unflatten, encode_named_list, feature_bytes
from tfapprox.export_signatures import (
    _PAD_KEY,
    _assert_at_most,
    _list_documents,
    _parse_or_explain,
    STRING_SIGNATURES,
    _quietly,
    archive_of,
    checked_scores,
    wrong_proto_message,
)
from tfapprox.named_inputs import FeatureLookup

NAMED_SIGNATURES = tuple(name for name, *_ in STRING_SIGNATURES)

# tf.train.Feature's kinds, in the field order of its `oneof kind`, as spec dtypes.
_KINDS = ("bytes_list", "float_list", "int64_list")
_KIND_DTYPES = ("string", "float32", "int64")


def _ragged_spec(features):
    """`{name: tf.io.RaggedFeature(dtype)}`: every value a record holds, whatever its count."""
    return {f.name: tf.io.RaggedFeature(f.tf_dtype, row_splits_dtype=tf.int32) for f in features}


def _labels(features, describe):
    """A string tensor of `describe(feature)` per feature, for naming the features in errors."""
    return tf.constant([describe(f) for f in features], tf.string)


def _named(signature, failing, features, describe, text):
    """An Assert that no `failing` [K] feature holds, naming those that do."""
    return tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(failing)),
        [f"{signature}: {text}:", tf.boolean_mask(_labels(features, describe), failing)],
        summarize=len(features),
    )


def _wrong_dtypes(examples, features):
    """Returns bool [K]: whether some Example of `examples` [N] holds feature k in a kind other
    than its spec dtype, read from the Examples' wire format (tensorflow.Example's own
    descriptor, linked into TensorFlow)."""
    if not features:
        return tf.zeros([0], tf.bool)

    def fields(serialized, message, names):
        decoded = tf.io.decode_proto(tf.reshape(serialized, [-1]), message, list(names),
                                     [tf.string] * len(names))
        return decoded.sizes, decoded.values

    sizes, (maps,) = fields(examples, "tensorflow.Example", ["features"])
    maps = tf.RaggedTensor.from_tensor(maps, lengths=sizes[:, 0]).flat_values
    sizes, (entries,) = fields(maps, "tensorflow.Features", ["feature"])
    entries = tf.RaggedTensor.from_tensor(entries, lengths=sizes[:, 0]).flat_values
    _, (keys, values) = fields(entries, "tensorflow.Features.FeatureEntry", ["key", "value"])
    keys = tf.pad(keys, [[0, 0], [0, 1 - tf.shape(keys)[1]]])[:, 0]
    values = tf.pad(values, [[0, 0], [0, 1 - tf.shape(values)[1]]])[:, 0]
    kinds, _ = fields(values, "tensorflow.Feature", _KINDS)
    held = tf.reduce_any(kinds > 0, axis=1)
    wrong = []
    for feature in features:
        kind = _KIND_DTYPES.index(feature.dtype)
        wrong.append(tf.reduce_any(tf.equal(keys, feature.name) & held & (kinds[:, kind] == 0)))
    return tf.stack(wrong)


def _dtype_check(signature, features, unit):
    """`_parse_or_explain`'s check of well-formed Examples that failed the parse: the features
    some of them hold in another dtype than the spec's."""

    def check(examples):
        return _named(signature, _wrong_dtypes(examples, features), features,
                      lambda f: f"{f.name} ({f.dtype})",
                      f"some {unit} hold a feature in another dtype than the spec gives it (in "
                      "brackets)")

    return check


def _checked_values(signature, parsed, features, real, unit):
    """Returns `{name: values}` of `parsed` ragged [N, None] features: fixed-length ones dense
    [N, length] (the spec default where a record lacks one), token lists ragged; fails naming
    the features when a `real` [N] record holds another number of values than a fixed length, a
    NaN or infinite float, or none of `features` (for a level that has any)."""
    counts = {f.name: parsed[f.name].row_lengths() for f in features}
    fixed = [f for f in features if f.length is not None]
    floats = [f for f in features if f.dtype == "float32"]
    checks = []
    if fixed:
        wrong = [tf.reduce_any((counts[f.name] != 0) & (counts[f.name] != f.length) & real)
                 for f in fixed]
        checks.append(_named(signature, tf.stack(wrong), fixed,
                             lambda f: f"{f.name} ({f.length} {f.dtype})",
                             f"some {unit} hold another number of values than the spec gives (in "
                             "brackets) for"))
    if floats:
        finite = [tf.reduce_all(tf.math.is_finite(parsed[f.name]), axis=1) | ~real for f in floats]
        checks.append(_named(signature, ~tf.reduce_all(tf.stack(finite), axis=1), floats,
                             lambda f: f.name,
                             f"feature values must be finite; some {unit} hold NaN or infinite "
                             "values in"))
    if features:
        held = tf.reduce_any(tf.stack([counts[f.name] > 0 for f in features]), axis=0)
        none = tf.reduce_any(real & ~held)
        checks.append(tf.debugging.Assert(tf.logical_not(none), [
            f"{signature}: some {unit} hold none of the features this model reads there: "
            f"{', '.join(f.name for f in features)}."
            + (" For the Regress API, TF Serving merges the context of an ExampleListWithContext "
               "into each example; a client sending tf.Examples merges it itself."
               if unit == "contexts"
               else "")]))
    with tf.control_dependencies(checks):
        out = {}
        for feature in features:
            value = parsed[feature.name]
            if feature.length is not None:
                default = feature.io_spec().default_value[0]
                value = value.to_tensor(default_value=tf.constant(default, feature.tf_dtype),
                                        shape=[None, feature.length])
            out[feature.name] = tf.identity(value) if isinstance(value, tf.Tensor) else (
                value.with_flat_values(tf.identity(value.flat_values)))
        return out


def _relaxed_specs(ids, spec):
    """The `tf.TensorSpec` of each looked-up feature with any batch, list and token count: only a
    fixed-length feature keeps its last dimension (its number of values)."""
    lengths = {feature.name: feature.length for feature in spec.context + spec.document}
    return {name: tf.TensorSpec(
        [None] * (value.shape.rank - 1) + ([value.shape[-1]] if lengths.get(name) else [None]),
        value.dtype) for name, value in ids.items()}


class _NamedSignatures:
    """The signatures' functions for a model over named features.

    Args:
        model: takes the spec's features as `FeatureLookup` gives them (ids, float32 numbers,
            the mask under `spec.mask_feature_name`) and returns scores [B, L]; a
            `NamedFeatureScorer` holding its own lookup is called past it.
        spec: the `FeatureSpec`.
        lookup: the `FeatureLookup` whose vocabularies the SavedModel carries.
        bounds: an `export_signatures._Bounds`, what one request may hold.
    """

    def __init__(self, model, spec, lookup, bounds):
        self.model, self.spec, self.lookup, self.bounds = model, spec, lookup, bounds
        self.document_spec = {**_ragged_spec(spec.document),
                              _PAD_KEY: tf.io.FixedLenFeature([], tf.int64, default_value=0)}
        self.context_spec = _ragged_spec(spec.context)
        self.example_spec = _ragged_spec(spec.context + spec.document)
        if getattr(model, "lookup", None) is not None:  # a NamedFeatureScorer, past its own
            self._score_ids = lambda ids: model.scorer(model.feature_inputs(ids), training=False)
        else:
            self._score_ids = lambda ids: model(ids, training=False)
        self._traced_model = None

    def _model_scores(self, ids):
        """Scores [B, L] of looked-up `ids`. In the signatures the model is traced once, on its
        first call, into one function every signature calls (not once per trace of each of the
        four signatures); eagerly (the export's check) it runs as it is."""
        if tf.executing_eagerly():
            return self._score_ids(ids)
        if self._traced_model is None:
            self._traced_model = tf.function(
                self._score_ids, input_signature=[_relaxed_specs(ids, self.spec)], autograph=False)
        return self._traced_model(ids)

    def _scores(self, signature, features, mask, lists):
        """Scores [B, L] of raw `features` {name: [B, ...] / [B, L, ...]} and `mask` [B, L]."""

        def score(mask):
            return self._model_scores(
                self.lookup({**features, self.spec.mask_feature_name: mask}))

        # An empty batch is answered without the model: ragged token lists of no list lose their
        # list dimension when made dense.
        return tf.cond(tf.shape(mask)[0] > 0,
                       lambda: checked_scores(signature, self.bounds, mask, score, lists),
                       lambda: tf.zeros(tf.shape(mask)))

    def lists(self, signature, argument, elwc):
        """Scores [B, L] of ELWCs `elwc` [B], the input `argument` of `signature`."""
        wrong_proto = wrong_proto_message(signature, argument, elwc, lists=True)
        # DecodeProtoV2 refuses an empty batch: one empty list is appended and its row dropped.
        batch = tf.concat([elwc, [""]], axis=0)
        longest = _quietly(lambda r: tf.reduce_max(records.decode_elwc(r)[1]), batch,
                           tf.constant(0))
        batch = _assert_at_most(signature, self.bounds, tf.size(elwc), longest, batch)
        size = tf.size(batch)
        documents = _parse_or_explain(_list_documents, batch, self.document_spec, wrong_proto,
                                      _dtype_check(signature, self.spec.document, "documents"))
        real = tf.equal(documents[_PAD_KEY], 0)  # padded slots hold only `_PAD_KEY`
        width = tf.size(real) // size
        documents = _checked_values(signature, documents, self.spec.document, real, "documents")
        features = {name: unflatten(value, size, width) for name, value in documents.items()}
        mask = tf.reshape(real, [size, width])
        if self.spec.context:
            contexts = _parse_or_explain(lambda r: records.decode_elwc_with_context(r)[2], batch,
                                         self.context_spec, wrong_proto,
                                         _dtype_check(signature, self.spec.context, "contexts"))
            features.update(_checked_values(signature, contexts, self.spec.context,
                                            tf.range(size) < size - 1, "contexts"))
        features = {name: value[:-1] for name, value in features.items()}
        return self._scores(signature, features, mask[:-1], lists=True)

    def documents(self, signature, argument, examples):
        """Scores [n] of tf.Examples `examples` [n], each a document and its list's context,
        each scored as a list of its own."""
        wrong_proto = wrong_proto_message(signature, argument, examples, lists=False)
        examples = _assert_at_most(signature, self.bounds, tf.size(examples), 1, examples,
                                   in_lists=False)
        features = self.spec.context + self.spec.document
        parsed = _parse_or_explain(tf.identity, examples, self.example_spec, wrong_proto,
                                   _dtype_check(signature, features, "documents"))
        real = tf.ones([tf.size(examples)], tf.bool)
        values = _checked_values(signature, parsed, self.spec.document, real, "documents")
        values = {name: unflatten(value, tf.size(examples), 1) for name, value in values.items()}
        values.update(_checked_values(signature, parsed, self.spec.context, real, "contexts"))
        mask = tf.ones([tf.size(examples), 1], tf.bool)
        return self._scores(signature, values, mask, lists=False)[:, 0]


def check_model_accepts(model, spec, vocabularies, bounds):
    """Builds `model` on one list of one document holding every feature of `spec`, through the
    signatures' parsing, failing clearly if it cannot score them."""
    lookup = FeatureLookup(spec, vocabularies)
    _, inputs = next(sample_requests(spec, vocabularies)(1, 1))
    try:
        scores = _NamedSignatures(model, spec, lookup, bounds).lists(
            "serving_default", "elwc", tf.constant(inputs["elwc"]))
    except Exception as error:  # noqa: BLE001 - re-raised with the export context
        raise ValueError(
            f"The model cannot score the features of its feature_spec: one list of one document "
            f"holding each of them failed with: {error}") from error
    if tuple(scores.shape) != (1, 1):
        raise ValueError("The model must return scores [batch, list]; for one list of one "
                         f"document it returned shape {tuple(scores.shape)}.")
    if not model.built:  # a NamedFeatureScorer called past its own lookup
        model.build()


def build_named_archive(model, spec, lookup, bounds):
    """Returns a `SignatureArchive` of `model` holding the four named signatures."""
    signatures = _NamedSignatures(model, spec, lookup, bounds)
    archive = archive_of(model, signatures)
    archive.track(lookup)
    return archive


def asset_lookup(spec, vocabularies, directory):
    """Returns a `FeatureLookup` of `spec` whose tables read `vocabularies` ({file as the spec
    names it: values}) from files written into `directory`, so that a SavedModel of it carries
    them as assets: one value a line, as `read_vocabulary` reads them (the same ids)."""
    lookup = FeatureLookup(spec, vocabularies)
    for index, vocabulary in enumerate(vocabularies):
        table = lookup.table(vocabulary)
        path = os.path.join(directory, f"vocabulary_{index}_{os.path.basename(vocabulary)}")
        with open(path, "w", encoding="utf-8") as file:
            file.write("".join(f"{value}\n" for value in vocabularies[vocabulary]))
        table.set_vocabulary(path)
    lookup.build()
    return lookup


def _sample_values(feature, vocabularies):
    """One record's value of `feature` in the warm-up requests: 1 for numbers, the vocabulary's
    first value for categories (one token for a token list)."""
    if feature.categorical:
        value = vocabularies[feature.vocabulary][0]
    else:
        value = 1.0 if feature.dtype == "float32" else 1
    return np.array([value] * (feature.length or 1),
                    dtype=object if feature.dtype == "string" else None)


def sample_requests(spec, vocabularies):
    """Returns `requests(lists, documents)`, yielding `(signature, inputs)` for every named
    signature: `lists` lists of `documents` documents, each holding every feature of the spec."""
    context = {f.name: _sample_values(f, vocabularies) for f in spec.context}
    document = {f.name: _sample_values(f, vocabularies) for f in spec.document}
    merged = records.example_bytes({name: feature_bytes(values)
                                    for name, values in {**context, **document}.items()})

    def requests(lists, documents):
        elwc = np.array([encode_named_list(context, [document] * documents)] * lists, object)
        examples = np.array([merged] * (lists * documents), object)
        for name, argument, _, lists in STRING_SIGNATURES:
            yield name, {argument: elwc if lists else examples}

    return requests
