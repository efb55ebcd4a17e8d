"""SavedModel export for TF Serving: scoring signatures, written atomically.

`export_saved_model(model, base_dir, name, num_features)` writes `base_dir/name/<version>/`, the
layout TF Serving watches (`--model_base_path=base_dir/name`), with its warm-up requests: six
signatures over F float features per document (`tfapprox.export_signatures`), or, with
`feature_spec=` instead of `num_features`, four over a spec's named features
(`tfapprox.named_signatures`). What they take, return and refuse, and the versions and their
atomic writing (`tfapprox.model_versions`) are described in docs/serving.md. The SavedModel loads
with `tf.saved_model.load` without tfapprox installed.

Export needs the TensorFlow backend. A model trained with another backend can be saved as `.keras`
and exported from a process running with `KERAS_BACKEND=tensorflow`.
"""

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tfapprox.data import records
from tfapprox.export_signatures import MASKED, PREDICT, REGRESS, SIGNATURES, _Bounds, build_archive
from tfapprox.model_versions import next_version, write_version
from tfapprox.models import MAX_ATTENTION_PAIRS, attends_within_lists
from tfapprox.named_signatures import (
    NAMED_SIGNATURES,
    asset_lookup,
    build_named_archive,
    check_model_accepts,
    sample_requests,
)

__all__ = [
    "MASKED", "MAX_DOCUMENTS", "NAMED_SIGNATURES", "PREDICT", "REGRESS", "SIGNATURES",
    "export_saved_model", "next_version"
]


def _check_arguments(name, version, example_layout, max_documents, max_pairs):
    if not isinstance(name, str) or not name or name.startswith(".") or os.sep in name or (
        os.altsep and os.altsep in name
    ):
        raise ValueError(
            f"name must be a non-empty directory name without path separators that does not start "
            f"with '.'; received name={name!r}."
        )
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


def _check_num_features(num_features):
    if isinstance(num_features, bool) or not isinstance(num_features, (int, np.integer)) or (
        num_features < 1
    ):
        raise ValueError(
            f"num_features must be a positive integer (or give feature_spec= for a model over "
            f"named features); received {num_features!r}."
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


# TF Serving replays this file's requests when it loads a version (its "SavedModel warmup").
_WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# (lists, documents per list) of the warm-up requests: a single document and a small batch.
_WARMUP_SIZES = ((1, 1), (4, 10))


def _vector_requests(num_features, example_layout):
    """Returns `requests(lists, documents)`, yielding `(signature, inputs)` for every signature:
    all features 1 (0 would look like padding to `_refuse_padded_lists`), documents in
    `example_layout`."""
    # A per_feature document: Example.features {"1": float_list [1.0]} (the others read as 0).
    one = records.example_bytes({"1": records.float_feature([1.0])})

    def requests(lists, documents):
        features = np.ones((lists, documents, num_features), "float32")
        if example_layout == "vector":
            elwc = [records.encode_elwc(list_features) for list_features in features]
            examples = records.encode_examples(features.reshape(-1, num_features))
        else:
            elwc = [records.join_elwc([one] * documents)] * lists
            examples = [one] * (lists * documents)
        elwc, examples = np.array(elwc, dtype=object), np.array(examples, dtype=object)
        yield "serving_default", {"elwc": elwc}
        yield "score_features", {"features": features}
        yield MASKED, {"features": features, "mask": np.ones((lists, documents), bool)}
        yield "score_examples", {"examples": examples}
        yield PREDICT, {"inputs": elwc}
        yield REGRESS, {"inputs": examples}

    return requests


def _warmup_requests(requests, bounds):
    """Yields `requests(lists, documents)` at each of `_WARMUP_SIZES` within `bounds`."""
    for lists, documents in _WARMUP_SIZES:
        if lists * documents <= bounds.documents and (
            bounds.pairs is None or lists * documents**2 <= bounds.pairs
        ):
            yield from requests(lists, documents)


def _prediction_log(signature, inputs):
    """Returns a serialized `tensorflow.serving.PredictionLog` holding one PredictRequest.

    Written in the protobuf wire format, so that tensorflow-serving-api is not needed; the field
    numbers are those of tensorflow_serving/apis: PredictionLog.predict_log = 6,
    PredictLog.request = 1, PredictRequest.model_spec = 1 and .inputs = 2 (map entries: key = 1,
    value = 2, a TensorProto), ModelSpec.signature_name = 3. The model name is left out: TF Serving
    runs warm-up requests on the version it is loading, whatever name it serves it under.
    """
    model_spec = records.message_bytes((3, signature.encode()))
    entries = (
        records.message_bytes(
            (1, name.encode()), (2, tf.make_tensor_proto(value).SerializeToString())
        )
        for name, value in inputs.items()
    )
    request = records.message_bytes((1, model_spec), *((2, entry) for entry in entries))
    return records.message_bytes((6, records.message_bytes((1, request))))


def _write_warmup_requests(saved_model_dir, *arguments):
    """Writes TF Serving's warm-up file (TFRecords of PredictionLog) into `saved_model_dir`, of
    `_warmup_requests(*arguments)`."""
    path = os.path.join(saved_model_dir, _WARMUP_FILE)
    os.mkdir(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for signature, inputs in _warmup_requests(*arguments):
            writer.write(_prediction_log(signature, inputs))


def _named_vocabularies(model, spec):
    """Returns `(spec, {vocabulary: values})` for exporting `model` over the `FeatureSpec` `spec`
    (or its file's path): the vocabularies the model holds (a `NamedFeatureScorer` with its
    lookup inside), else the spec's files. Refuses a model built over other features, or
    vocabularies of other sizes than its embeddings'."""
    from tfapprox.data.feature_spec import FeatureSpec
    from tfapprox.named_inputs import FeatureLookup

    if isinstance(spec, (str, os.PathLike)):
        spec = FeatureSpec.load(spec)
    if not isinstance(spec, FeatureSpec):
        raise ValueError(f"feature_spec must be a FeatureSpec or a spec file's path; received "
                         f"{type(spec).__name__}.")
    model_spec = getattr(model, "spec", None)
    if isinstance(model_spec, FeatureSpec):
        if model_spec.model_inputs() != spec.model_inputs():
            differ = sorted({f[0] for f in set(model_spec.model_inputs()) ^ set(
                spec.model_inputs())})
            raise ValueError(f"the model was built over another feature spec than feature_spec: "
                             f"features {', '.join(map(repr, differ))} differ.")
    own = getattr(model, "lookup", None)
    vocabularies = (own if own is not None else FeatureLookup(spec)).vocabularies
    sizes = getattr(getattr(model, "feature_inputs", None), "vocabulary_sizes", None) or {}
    for vocabulary, size in sizes.items():
        if len(vocabularies.get(vocabulary, ())) != size:
            raise ValueError(
                f"vocabulary {vocabulary!r} holds {len(vocabularies.get(vocabulary, ()))} values "
                f"but the model's embedding was built for {size}: export with the vocabulary "
                "files the model was trained with.")
    return spec, vocabularies


# The default bound on the documents of one request (`max_documents`).
MAX_DOCUMENTS = 100_000


def export_saved_model(
    model, base_dir, name, num_features=None, version=None, *, feature_spec=None,
    example_layout="vector", max_documents=MAX_DOCUMENTS, max_pairs=MAX_ATTENTION_PAIRS,
):
    """Returns the path `base_dir/name/<version>` of a TF Serving SavedModel, written atomically.

    Args:
        model: A scorer taking `{"features": [B, L, F], "mask": [B, L]}` and returning `[B, L]`
            (e.g. `tfapprox.models.DNNScorer`); built here if it is not yet. With
            `feature_spec`: a model over named features (`tfapprox.named_inputs.
            build_named_scorer`, or any model taking the features as `FeatureLookup` gives them).
        base_dir: Directory holding one subdirectory per served model (created if missing).
        name: The model's name: `base_dir/name` is TF Serving's `--model_base_path`.
        num_features: F, the number of features per document (vector features).
        version: Non-negative integer version; default: one more than the largest existing one
            (1 for a new model). An existing version is never overwritten.
        feature_spec: For a model over named features instead of `num_features`: its
            `tfapprox.data.feature_spec.FeatureSpec` (or the spec file's path). The signatures
            then parse ExampleListWithContext and tf.Example requests holding the spec's
            features by name; the vocabularies travel in the SavedModel as assets.
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
        ValueError: for invalid arguments, or a model that cannot score F features (or was
            built over another feature spec).
        FileExistsError: if `base_dir/name/<version>` already exists.
        RuntimeError: if the Keras backend is not TensorFlow.
    """
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "export_saved_model needs the TensorFlow backend; the Keras backend is "
            f"{keras.backend.backend()!r}. Save the model with model.save('scorer.keras') and "
            "export it from a process run with KERAS_BACKEND=tensorflow."
        )
    _check_arguments(name, version, example_layout, max_documents, max_pairs)
    bounds = _Bounds(int(max_documents), int(max_pairs) if attends_within_lists(model) else None)
    if feature_spec is not None:
        if num_features is not None or example_layout != "vector":
            raise ValueError("feature_spec names the features a request holds: give it without "
                             "num_features and example_layout.")
        spec, vocabularies = _named_vocabularies(model, feature_spec)
        check_model_accepts(model, spec, vocabularies, bounds)
        requests = sample_requests(spec, vocabularies)

        def write_archive(directory):
            with tempfile.TemporaryDirectory() as files:  # copied into the SavedModel's assets
                lookup = asset_lookup(spec, vocabularies, files)
                build_named_archive(model, spec, lookup, bounds).write_out(directory)
    else:
        _check_num_features(num_features)
        num_features = int(num_features)
        _check_model_accepts(model, num_features)
        requests = _vector_requests(num_features, example_layout)

        def write_archive(directory):
            build_archive(model, num_features, example_layout, bounds).write_out(directory)

    def write(directory):
        write_archive(directory)
        _write_warmup_requests(directory, requests, bounds)

    return write_version(base_dir, name, version, write)
