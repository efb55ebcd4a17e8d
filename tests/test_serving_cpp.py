"""Exports served by TensorFlow's C++ loader, as TF Serving serves them (tests/cpp_loader.py).

The runner is compiled once per source, TensorFlow wheel and compiler into `cpp_loader.CACHE_DIR`,
kept across runs; these tests are skipped only where no C++ compiler is found.
"""

import math
import os

import keras
import numpy as np
import pytest

import cpp_loader
from tfapprox import export
from tfapprox.data import records
from tfapprox.ensemble import ScoreEnsemble
from tfapprox.models import MAX_ATTENTION_PAIRS, DNNScorer, build_scorer

NUM_FEATURES = 7
SHAPES = ((1, 1), (4, 10), (16, 100), (0, 0))  # (lists, documents per list); the last: empty
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="export needs the TF backend")]


@pytest.fixture(scope="session")
def runner():
    if cpp_loader.compiler() is None:
        pytest.skip("no C++ compiler found (set CXX or install g++)")
    return cpp_loader.build(cpp_loader.CACHE_DIR)


def _fitted(model, seed):
    """Returns `model` after a few steps on random lists, so that no weight is at its start
    (eager steps: tracing one costs seconds, and only the weights they leave matter here)."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(8, 6, NUM_FEATURES)).astype("float32")
    labels = rng.integers(0, 3, size=(8, 6)).astype("float32")
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", run_eagerly=True)
    for _ in range(3):
        model.train_on_batch({"features": features, "mask": np.ones((8, 6), bool)}, labels)
    return model


def _adarank_scorer(seed):
    """The scorer an AdaRank run exports (trainer/train.py): linear, no batch norm."""
    model = DNNScorer(hidden_units=(), input_batch_norm=False, name="adarank_scorer")
    model(np.zeros((1, 1, NUM_FEATURES), "float32"))
    weights = np.random.default_rng(seed).normal(size=(NUM_FEATURES, 1)).astype("float32")
    model.set_weights([weights, np.zeros([1], "float32")])
    return model


def _adapted(model, seed):
    """Returns `model` with its input quantiles fitted to heavy-tailed random documents."""
    model.adapt(np.random.default_rng(seed).exponential(size=(64, NUM_FEATURES)) ** 3)
    return model


MODELS = {
    "B64": lambda: _fitted(build_scorer("B64"), 1),
    "linear": lambda: _fitted(build_scorer("LINEAR"), 2),
    "adarank": lambda: _adarank_scorer(3),
    # DASALC's pieces, small: input noise, self-attention over the list, and its inputs through
    # their training quantiles to N(0, 1) (the quantiles travel as weights; log1p is elementwise),
    # each also standardised within its list
    "dasalc": lambda: _fitted(_adapted(build_scorer("dasalc", hidden_units=(16,),
                                                    attention_layers=1, attention_units=8,
                                                    input_transform="quantile",
                                                    list_standardize=True), 5), 4),
    # two small scorers' scores, each standardised by constants fitted to random lists (they
    # travel as weights, with the members' own, quantiles included); the second member's inputs
    # are also standardised within their list
    "ensemble": lambda: ScoreEnsemble([_fitted(DNNScorer((8,)), 6),
                                       _fitted(_adapted(DNNScorer((8,), input_transform="quantile",
                                                                  list_standardize=True), 7), 8)])
    .adapt([{"features": _features(8, 6, seed=9), "mask": np.ones((8, 6), bool)}]),
}
# Scorers whose documents meet (a document's score depends on its list), and those among them
# whose documents attend to each other.
INTERACTING = {"dasalc", "ensemble"}
ATTENDING = {"dasalc"}
# Signatures that take one document a string: each document is scored as a list of its own.
DOCUMENT_SIGNATURES = ("score_examples", export.REGRESS)


@pytest.fixture(scope="module", params=sorted(MODELS))
def served(request, runner, tmp_path_factory):
    """Yields `(export path, Python-loaded signatures, C++ loader)` for one kind of scorer."""
    import tensorflow as tf

    path = export.export_saved_model(
        MODELS[request.param](), tmp_path_factory.mktemp("saved_models"), "ranker", NUM_FEATURES
    )
    with cpp_loader.CppLoader(runner, path) as loader:
        yield path, tf.saved_model.load(path).signatures, loader


def _features(lists, documents, seed=0):
    features = np.random.default_rng(seed).normal(size=(lists, documents, NUM_FEATURES))
    return features.astype("float32")


def _requests(lists, documents, seed=0):
    """Returns {signature: inputs} scoring the same random lists×documents in every signature."""
    return cpp_loader.signature_requests(_features(lists, documents, seed))


def _expected(signatures, features, signature):
    """Returns score_features' scores (flat) of `features` [B, L, F] grouped as `signature`
    groups them: in lists, or one document a list for `DOCUMENT_SIGNATURES`."""
    if signature in DOCUMENT_SIGNATURES:
        features = features.reshape(-1, 1, NUM_FEATURES)
    return _python_outputs(signatures, "score_features", {"features": features})["scores"].ravel()


def _python_outputs(signatures, signature, inputs):
    import tensorflow as tf

    outputs = signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
    return {key: value.numpy() for key, value in outputs.items()}


@pytest.mark.parametrize("lists, documents", SHAPES)
def test_every_signature_scores_as_in_python(served, lists, documents, request):
    _, signatures, loader = served
    requests = _requests(lists, documents)
    assert set(requests) == set(export.SIGNATURES)
    scores = {}
    for signature, inputs in requests.items():
        cpp, _ = loader.run(signature, inputs)
        python = _python_outputs(signatures, signature, inputs)
        assert cpp.keys() == python.keys(), signature
        for key in cpp:
            assert cpp[key].dtype == np.float32 and cpp[key].shape == python[key].shape
            np.testing.assert_allclose(cpp[key], python[key], rtol=1e-5, atol=1e-6)
        scores[signature] = next(iter(cpp.values())).reshape(-1)
    # The same lists get the same scores whichever way they are sent; so do documents sent one
    # a string, and, unless the scorer lets documents meet, those are the lists' scores too.
    features = _features(lists, documents)
    for signature in scores:
        expected = _expected(signatures, features, signature)
        np.testing.assert_allclose(scores[signature], expected, atol=1e-5)
    if request.node.callspec.params["served"] not in INTERACTING:
        np.testing.assert_allclose(scores["score_examples"], scores["score_features"], atol=1e-5)


def test_warmup_requests_run(served):
    import tensorflow as tf

    prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")
    path, _, loader = served
    warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
    replayed = set()
    for record in tf.data.TFRecordDataset(warmup).as_numpy_iterator():
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        signature = request.model_spec.signature_name
        outputs, _ = loader.run(signature, dict(request.inputs))
        sent = tf.make_ndarray(next(iter(request.inputs.values())))
        assert next(iter(outputs.values())).shape[0] == sent.shape[0]
        replayed.add(signature)
    assert replayed == set(export.SIGNATURES)


@pytest.mark.parametrize(
    "signature, inputs, message",
    [
        ("serving_default", {"elwc": np.array([b"\xff\xfe not a protobuf"], dtype=object)},
         "serving_default expects `elwc`: serialized ExampleListWithContext"),
        ("score_examples", {"examples": np.array([b"\x0a\x05abc"], dtype=object)},
         "score_examples expects `examples`: serialized tf.Example"),
        ("score_features", {"features": np.zeros((3, NUM_FEATURES), "float32")},
         r"expects float32 features \[batch, list, 7\]; received shape\] \[3 7\]"),
        ("score_features", {"features": np.zeros((2, 3, 5), "float32")},
         r"expects float32 features \[batch, list, 7\]; received shape\] \[2 3 5\]"),
        ("score_features", {"features": np.zeros((2, 3, NUM_FEATURES), "float64")},
         "Expects arg\[0\] to be float but double is provided"),
        ("score_features", {"features": np.full((1, 2, NUM_FEATURES), np.inf, "float32")},
         "score_features: feature values must be finite"),
        ("score_features", {"examples": np.array([b""], dtype=object)},
         "signature score_features has no input examples"),
        (export.MASKED, {"features": np.ones((2, 3, NUM_FEATURES), "float32"),
                         "mask": np.ones((2, 4), bool)},
         r"expects a bool mask \[batch, list\].*received mask shape\] \[2 4\].*\[2 3\]"),
        (export.MASKED, {"features": np.ones((2, 3, NUM_FEATURES), "float32"),
                         "mask": np.ones(6, bool)},
         r"expects a bool mask \[batch, list\].*received mask shape\] \[6\]"),
        (export.MASKED, {"features": np.ones((2, 3, NUM_FEATURES), "float32"),
                         "mask": np.ones((2, 3), "float32")},
         r"Expects arg\[1\] to be bool but float is provided"),
    ],
)
def test_malformed_requests_get_an_error_status(served, signature, inputs, message):
    _, _, loader = served
    with pytest.raises(cpp_loader.CppError, match=message):
        loader.run(signature, inputs)
    outputs, _ = loader.run("score_features", _requests(1, 3)["score_features"])  # still serving
    assert outputs["scores"].shape == (1, 3)


def _grpc_requests(lists, documents, qid):
    """Returns `(features, [(signature, request inputs)])`: the gRPC requests a client builds
    with tensorflow-serving-api for every signature, and the tensors TF Serving feeds for each;
    the lists' context holds `qid`, or nothing if it is None (the layout read as bytes).

    A RegressionRequest carries an Input proto, which TF Serving turns into the `inputs` tensor
    of serialized tf.Examples: for an ExampleListWithContext, each example's bytes after the
    context's (the example's fields win the merge).
    """
    import tensorflow as tf

    input_pb2 = pytest.importorskip("tensorflow_serving.apis.input_pb2")
    predict_pb2 = pytest.importorskip("tensorflow_serving.apis.predict_pb2")
    regression_pb2 = pytest.importorskip("tensorflow_serving.apis.regression_pb2")
    features = np.random.default_rng(5).normal(size=(lists, documents, NUM_FEATURES))
    features = features.astype("float32")
    elwc = []
    for list_features in features:
        message = input_pb2.ExampleListWithContext()
        if qid is not None:
            message.context.features.feature["qid"].bytes_list.value.append(qid)
        for document in list_features:
            example = message.examples.add()
            example.features.feature[records.FEATURES_KEY].float_list.value.extend(document)
        elwc.append(message)

    def predict(signature, key, values):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "ranker"
        request.model_spec.signature_name = signature
        request.inputs[key].CopyFrom(tf.make_tensor_proto(values))
        return signature, dict(request.inputs)

    serialized = [message.SerializeToString() for message in elwc]
    requests = [
        predict("serving_default", "elwc", serialized),
        predict(export.PREDICT, "inputs", serialized),
        predict("score_features", "features", features),
        predict("score_examples", "examples",
                [e.SerializeToString() for m in elwc for e in m.examples]),
    ]
    for message in elwc:  # one Regress call per list, as TF-Ranking's clients send them
        request = regression_pb2.RegressionRequest()
        request.model_spec.signature_name = export.REGRESS
        request.input.example_list_with_context.CopyFrom(message)
        given = request.input.example_list_with_context
        merged = [
            given.context.SerializeToString() + example.SerializeToString()
            for example in given.examples
        ]
        requests.append((export.REGRESS, {"inputs": tf.make_tensor_proto(merged)}))
    return features, requests


@pytest.mark.parametrize("qid", [b"q1", None])
def test_grpc_requests_run_through_the_cpp_loader(served, qid):
    _, signatures, loader = served
    features, requests = _grpc_requests(4, 10, qid)
    regressed = []
    for signature, inputs in requests:
        outputs, _ = loader.run(signature, inputs)
        (scores,) = outputs.values()
        if signature == export.REGRESS:
            regressed.append(scores)
        else:
            expected = _expected(signatures, features, signature)
            np.testing.assert_allclose(scores.reshape(-1), expected, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(regressed),
                               _expected(signatures, features, export.REGRESS), atol=1e-5)


def _zero_padded(lengths, seed):
    """Returns `(features [B, L, F], mask [B, L])`: random lists of `lengths` padded with zeros
    to the longest, as a client pads them for `score_features`."""
    mask = np.arange(max(lengths)) < np.array(lengths)[:, None]
    features = _features(len(lengths), max(lengths), seed)
    features[~mask] = 0.0
    return features, mask


def test_padded_lists_sent_with_their_mask_score_as_unpadded_lists(served):
    _, _, loader = served
    features, mask = _zero_padded((3, 5, 1), seed=11)
    outputs, _ = loader.run(export.MASKED, {"features": features, "mask": mask})
    scores = outputs["scores"]
    assert scores.shape == mask.shape and not scores[~mask].any()
    for row, real in zip(range(len(mask)), mask):
        alone, _ = loader.run("score_features", {"features": features[row : row + 1, real]})
        np.testing.assert_allclose(scores[row, real], alone["scores"][0], atol=1e-5)


def test_zero_padded_lists_without_a_mask_are_refused_by_list_dependent_models(served, request):
    _, _, loader = served
    features, mask = _zero_padded((3, 5), seed=12)
    if request.node.callspec.params["served"] in INTERACTING:
        with pytest.raises(cpp_loader.CppError, match=(
                "score_features: this model scores each document in the context of its list.*"
                rf"Send padded lists to {export.MASKED} with `mask`.*Lists ending so:\] \[1\]")):
            loader.run("score_features", {"features": features})
    else:  # each document is scored on its own: padding may hold anything
        padded, _ = loader.run("score_features", {"features": features})
        masked, _ = loader.run(export.MASKED, {"features": features, "mask": mask})
        np.testing.assert_allclose(padded["scores"][mask], masked["scores"][mask], atol=1e-5)


# One list this long is within the documents' bound (MAX_DOCUMENTS) but its pairs, LONG², are not
# within the default bound of a model whose documents attend to each other.
LONG = math.isqrt(MAX_ATTENTION_PAIRS) + 1
LIST_SIGNATURES = ("serving_default", "score_features", export.MASKED, export.PREDICT)


def test_attention_is_bounded_by_the_pairs_of_a_request(served, request):
    _, _, loader = served
    assert LONG <= export.MAX_DOCUMENTS
    requests = cpp_loader.signature_requests(_features(1, LONG, seed=13))
    for signature in LIST_SIGNATURES:
        if request.node.callspec.params["served"] in ATTENDING:
            with pytest.raises(cpp_loader.CppError, match=(
                    rf"{signature}: the documents of a list attend to each other in this model, "
                    rf"so a request may hold at most {MAX_ATTENTION_PAIRS} document pairs.*"
                    rf"this one: 1 lists of up to {LONG} documents")):
                loader.run(signature, requests[signature])
        else:
            outputs, _ = loader.run(signature, requests[signature])
            assert next(iter(outputs.values())).shape == (1, LONG)
