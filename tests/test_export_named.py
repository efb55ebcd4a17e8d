"""An export of a model over named features, served by TensorFlow's C++ loader (tests/cpp_loader.py)
as TF Serving serves it: ELWC and tf.Example requests under the spec's names score as the Keras
model does, the vocabularies travel as assets, warm-up requests replay, and bad requests get an
error naming the signature and the feature, without the request's bytes in it or in the log.

One tiny model is exported once for the module; the C++ runner is compiled once per TensorFlow
wheel and kept in `cpp_loader.CACHE_DIR`.
"""

import os

import keras
import numpy as np
import pytest

import cpp_loader
from tfapprox import export

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="export needs the TF backend")]

WORDS = ["the", "cat", "sat", "on", "mat"]
SITES = [7, 11, 13]
MAX_DOCUMENTS = 40
SIGNATURE_INPUTS = {"serving_default": "elwc", export.PREDICT: "inputs",
                    "score_examples": "examples", export.REGRESS: "inputs"}
LIST_SIGNATURES = ("serving_default", export.PREDICT)
DOCUMENT_SIGNATURES = ("score_examples", export.REGRESS)
SECRET = "zebra-quartz-1729"  # a token no error or log may quote


def _spec(directory):
    from tfapprox.data.feature_spec import Feature, FeatureSpec

    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    (directory / "sites.txt").write_text("\n".join(map(str, SITES)) + "\n")
    return FeatureSpec(
        context=(Feature("query_tokens", "string", None, vocabulary="vocab.txt", embedding_dim=3),
                 Feature("query_length", "float32", 1)),
        document=(Feature("document_tokens", "string", None, vocabulary="vocab.txt",
                          embedding_dim=3),
                  Feature("bm25", "float32", 2, default=0.5),
                  Feature("site", "int64", 1, vocabulary="sites.txt", embedding_dim=2),
                  Feature("clicks", "int64", 1)),
        label="relevance", base_dir=str(directory))


def _document(rng, drop=()):
    document = {"document_tokens": list(rng.choice(WORDS + ["dog"], rng.integers(0, 4))),
                "bm25": rng.normal(size=2).astype("float32"),
                "site": [int(rng.choice(SITES + [99]))], "clicks": [int(rng.integers(0, 9))]}
    return {k: v for k, v in document.items() if k not in drop}


def _lists(seed, lengths):
    """`(context, documents)` lists: context tokens in and out of the vocabulary, documents some
    lacking bm25 (its default then) or tokens."""
    rng = np.random.default_rng(seed)
    return [({"query_tokens": list(rng.choice(WORDS + ["emu"], 2)),
              "query_length": [float(rng.integers(1, 5))]},
             [_document(rng, drop=("bm25",) if i == 1 else ()) for i in range(n)])
            for n in lengths]


def _elwc(lists):
    from tfapprox.data.named_records import encode_named_list

    return np.array([encode_named_list(c, d) for c, d in lists], dtype=object)


def _merged_examples(lists):
    """One tf.Example per document as TF Serving's Regress API makes it of an ELWC: the context's
    serialized bytes, then the document's."""
    from tfapprox.data import records
    from tfapprox.data.named_records import feature_bytes

    def example(features):
        return records.example_bytes({k: feature_bytes(v) for k, v in features.items()})

    return np.array([example(c) + example(d) for c, documents in lists for d in documents],
                    dtype=object)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Yields `(spec, Keras model, export path, C++ loader, its log file)`."""
    if cpp_loader.compiler() is None:
        pytest.skip("no C++ compiler found (set CXX or install g++)")
    from tfapprox.named_inputs import build_named_scorer

    runner = cpp_loader.build(cpp_loader.CACHE_DIR)
    spec = _spec(tmp_path_factory.mktemp("spec"))
    model = build_named_scorer(spec, "B64", lookup=True)
    path = export.export_saved_model(model, tmp_path_factory.mktemp("saved_models"), "ranker",
                                     feature_spec=spec, max_documents=MAX_DOCUMENTS)
    log = tmp_path_factory.mktemp("log") / "runner.log"
    with open(log, "wb") as log_file, cpp_loader.CppLoader(runner, path, log=log_file) as loader:
        yield spec, model, path, loader, log


def _keras_scores(spec, model, lists):
    """The Keras model's scores [B, L] of `lists`, read as training reads them."""
    from tfapprox.data import named_records

    reader = named_records.batch_reader(named_records.resolve_spec(spec), "elwc")
    features, _ = reader(_elwc(lists))
    return keras.ops.convert_to_numpy(model(features))


def _run(loader, signature, strings):
    outputs, _ = loader.run(signature, {SIGNATURE_INPUTS[signature]: strings})
    (scores,) = outputs.values()
    return scores


@pytest.mark.parametrize("lengths", [(1,), (3, 1, 5), ()])
def test_requests_by_name_score_as_the_keras_model(served, lengths):
    spec, model, _, loader, _ = served
    lists = _lists(1, lengths)
    for signature in LIST_SIGNATURES:
        scores = _run(loader, signature, _elwc(lists))
        assert scores.shape[0] == len(lengths)  # an empty batch: empty scores
        if lists:
            np.testing.assert_allclose(scores, _keras_scores(spec, model, lists), atol=1e-5)
    # each document alone, its list's context merged in: scored as a list of one document
    alone = [(context, [document]) for context, documents in lists for document in documents]
    for signature in DOCUMENT_SIGNATURES:
        scores = _run(loader, signature, _merged_examples(lists))
        assert scores.shape == (len(alone),)
        if alone:
            np.testing.assert_allclose(scores, _keras_scores(spec, model, alone)[:, 0],
                                       atol=1e-5)


def test_the_vocabularies_travel_as_assets(served):
    spec, _, path, _, _ = served
    assets = os.listdir(os.path.join(path, "assets"))
    assert len(assets) == 2  # vocab.txt (query and document tokens share it) and sites.txt
    for name in assets:
        values = open(os.path.join(path, "assets", name)).read().split()
        assert values in (WORDS, [str(s) for s in SITES])


def test_warmup_requests_replay_on_every_signature(served):
    import tensorflow as tf

    prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")
    _, _, path, loader, _ = served
    warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
    replayed = set()
    for record in tf.data.TFRecordDataset(warmup).as_numpy_iterator():
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        outputs, _ = loader.run(request.model_spec.signature_name, dict(request.inputs))
        assert np.all(np.isfinite(next(iter(outputs.values()))))
        replayed.add(request.model_spec.signature_name)
    assert replayed == set(export.NAMED_SIGNATURES) == set(SIGNATURE_INPUTS)


def _with(document=None, context=None, drop=()):
    """One list of two documents, the second's features (and the context) updated."""
    ((list_context, documents),) = _lists(2, (2,))
    documents[1].update(document or {})
    list_context.update(context or {})
    for name in drop:
        documents[1].pop(name, None)
        list_context.pop(name, None)
    return [(list_context, documents)]


BAD_LISTS = {  # (lists, what the error says after "<signature>: ")
    "dtype": (_with({"bm25": [1, 2]}),
              r"some documents hold a feature in another dtype than the spec gives it \(in "
              r"brackets\):\] \[bm25 \(float32\)\]"),
    "token dtype": (_with({"document_tokens": [1.0]}),
                    r"some documents hold a feature in another dtype.*\[document_tokens "
                    r"\(string\)\]"),
    "length": (_with({"bm25": [1.0, 2.0, 3.0]}),
               r"some documents hold another number of values than the spec gives \(in "
               r"brackets\) for:\] \[bm25 \(2 float32\)\]"),
    "nan": (_with({"bm25": [np.nan, 1.0]}),
            r"feature values must be finite; some documents hold NaN or infinite values in:\] "
            r"\[bm25\]"),
    "inf": (_with(context={"query_length": [np.inf]}),
            r"feature values must be finite; some contexts hold NaN or infinite values in:\] "
            r"\[query_length\]"),
    "no feature": (_with(drop=("document_tokens", "bm25", "site", "clicks")),
                   "some documents hold none of the features this model reads there: "
                   "document_tokens, bm25, site, clicks"),
    "no context": (_with(drop=("query_tokens", "query_length")),
                   "some contexts hold none of the features this model reads there: "
                   "query_tokens, query_length"),
}


@pytest.mark.parametrize("case", sorted(BAD_LISTS))
@pytest.mark.parametrize("signature", ["serving_default", "score_examples"])
def test_bad_features_are_refused_naming_the_signature_and_the_feature(served, case, signature):
    _, _, _, loader, _ = served
    lists, message = BAD_LISTS[case]
    strings = _elwc(lists) if signature in LIST_SIGNATURES else _merged_examples(lists)
    with pytest.raises(cpp_loader.CppError, match=f"{signature}: {message}"):
        _run(loader, signature, strings)
    good = _lists(4, (2,))
    good = _elwc(good) if signature in LIST_SIGNATURES else _merged_examples(good)
    assert _run(loader, signature, good).shape[0] == len(good)  # still serving


def test_wrong_protos_and_too_many_documents_are_refused(served):
    _, _, _, loader, _ = served
    lists = _lists(3, (10,) * 5)  # 50 documents
    elwc, examples = _elwc(lists), _merged_examples(lists)
    for signature in LIST_SIGNATURES:
        with pytest.raises(cpp_loader.CppError, match=(
                f"{signature} expects `{SIGNATURE_INPUTS[signature]}`: serialized "
                "ExampleListWithContext protos")):
            _run(loader, signature, np.array([b"\xff\xfe" + SECRET.encode()], dtype=object))
        with pytest.raises(cpp_loader.CppError, match=(
                f"{signature}: a request may hold at most {MAX_DOCUMENTS} documents.*this one: "
                "5 lists of up to 10 documents")):
            _run(loader, signature, elwc)
    for signature in DOCUMENT_SIGNATURES:
        with pytest.raises(cpp_loader.CppError, match=(
                f"{signature} expects `{SIGNATURE_INPUTS[signature]}`: serialized tf.Example")):
            _run(loader, signature, np.array([b"\x0a\x05" + SECRET.encode()], dtype=object))
        with pytest.raises(cpp_loader.CppError, match=(
                f"{signature}: a request may hold at most {MAX_DOCUMENTS} documents.*this one: "
                "50 documents")):
            _run(loader, signature, examples)


def test_no_error_nor_log_quotes_the_request(served):
    _, _, _, loader, log = served
    secret = {"document_tokens": [SECRET], "bm25": [1, 2]}  # a wrong dtype beside the token
    for signature in SIGNATURE_INPUTS:
        lists = _with(secret)
        strings = _elwc(lists) if signature in LIST_SIGNATURES else _merged_examples(lists)
        with pytest.raises(cpp_loader.CppError) as error:
            _run(loader, signature, strings)
        assert signature in str(error.value) and SECRET not in str(error.value)
    assert SECRET not in log.read_text(errors="replace")


def test_a_model_over_other_features_or_vector_arguments_are_refused(served, tmp_path):
    import dataclasses

    spec, model, _, _, _ = served
    without_context = dataclasses.replace(spec, context=())
    with pytest.raises(ValueError, match="built over another feature spec.*'query_length', "
                                         "'query_tokens' differ"):
        export.export_saved_model(model, tmp_path, "ranker", feature_spec=without_context)
    with pytest.raises(ValueError, match="give it without num_features"):
        export.export_saved_model(model, tmp_path, "ranker", 7, feature_spec=spec)
    # a model whose lookup runs in the dataset, exported with vocabularies of another size
    from tfapprox.named_inputs import build_named_scorer

    outside = build_named_scorer(spec, "B64")
    shorter = dataclasses.replace(_spec(tmp_path), base_dir=str(tmp_path))
    (tmp_path / "vocab.txt").write_text("the\ncat\n")
    with pytest.raises(ValueError, match="vocabulary 'vocab.txt' holds 2 values but the model's "
                                         "embedding was built for 5"):
        export.export_saved_model(outside, tmp_path, "ranker", feature_spec=shorter)
    assert not (tmp_path / "ranker").exists()
