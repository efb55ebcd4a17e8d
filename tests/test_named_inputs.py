"""Tests for tfapprox.named_inputs: a FeatureSpec's named features (numbers, categories, token
lists; context and document) into the scorers, as the dataset gives them (dicts of tensors and
ragged tensors, built here by hand): ids, embeddings and transforms against numpy, padding safety,
permutation equivariance, fit with variable list lengths under XLA, save/load, JAX, and
TF-Ranking's ConcatFeatures and DocumentInteractionAttention."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from conftest import REPO, to_numpy
from tfapprox import losses, named_inputs
from tfapprox.data.feature_spec import Feature, FeatureSpec
from tfapprox.models import DocumentInteraction, MaskedBatchNormalization
from tfapprox.named_inputs import (
    ConcatFeatures,
    DocumentInteractionAttention,
    FeatureInputs,
    FeatureLookup,
    NamedFeatureScorer,
    build_named_scorer,
)

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="TensorFlow's pass; JAX runs in a process of its own")

WORDS = ["the", "cat", "sat", "on", "mat", "dog"]
SITES = [7, 11, 13]
HIDDEN = (8, 4)
SCORERS = {  # as in test_models.py: Bruch et al.'s, and documents meeting through attention or
    "bruch": {},  # their list's moments
    "interacting": {"attention_layers": 1, "attention_heads": 2, "attention_units": 8},
    "list_standardized": {"list_standardize": True},
}


def write_text_spec(directory):
    """TF-Ranking's antique example's features (query and document tokens sharing a vocabulary),
    an int64 category, and numbers under each transform, in context and document; its vocabulary
    files written to `directory`."""
    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    (directory / "sites.txt").write_text("\n".join(map(str, SITES)) + "\n")
    return FeatureSpec(
        context=(Feature("query_tokens", "string", None, vocabulary="vocab.txt", embedding_dim=3),
                 Feature("query_length", "float32", 1, transform="log1p")),
        document=(
            Feature("document_tokens", "string", None, vocabulary="vocab.txt", embedding_dim=3),
            Feature("site", "int64", 1, vocabulary="sites.txt", embedding_dim=2),
            Feature("bm25", "float32", 2),
            Feature("clicks", "float32", 1, transform="log1p"),
            Feature("age", "float32", 1, transform="quantile"),
        ),
        label="relevance", base_dir=str(directory))


@pytest.fixture
def text_spec(tmp_path):
    return write_text_spec(tmp_path)


NUMERIC_SPEC = FeatureSpec(
    context=(Feature("query_length", "float32", 1, transform="log1p"),),
    document=(Feature("bm25", "float32", 2), Feature("clicks", "float32", 1, transform="log1p"),
              Feature("age", "float32", 1, transform="quantile")),
    label="utility")


def raw_batch(seed, lengths, list_size=None, pad_with_garbage=False):
    """Raw features of lists of `lengths` documents, padded to `list_size`, as the dataset gives
    them (ragged token lists, `[B, L, length]` numbers, the mask), and labels −1 on padding.
    Padded documents hold real-looking tokens and NaN numbers if `pad_with_garbage`."""
    rng = np.random.default_rng(seed)
    list_size = list_size or max(lengths)
    mask = np.arange(list_size)[None] < np.asarray(lengths)[:, None]
    words = WORDS + ["unknown", "other"]

    def tokens(n):
        return [str(rng.choice(words)) for _ in range(n)]

    document_tokens = [[tokens(rng.integers(0, 4)) if real or pad_with_garbage else []
                        for real in row] for row in mask]
    numbers = {name: rng.lognormal(size=(len(lengths), list_size, width)).astype("float32")
               for name, width in (("bm25", 2), ("clicks", 1), ("age", 1))}
    if pad_with_garbage:
        for values in numbers.values():
            values[~mask] = np.nan
    features = {
        "query_tokens": tf.ragged.constant([tokens(rng.integers(1, 4)) for _ in lengths],
                                           dtype=tf.string),
        "query_length": rng.integers(1, 9, size=(len(lengths), 1)).astype("float32"),
        "document_tokens": tf.ragged.constant(document_tokens, dtype=tf.string, ragged_rank=2,
                                              inner_shape=()),
        "site": rng.choice(SITES + [5], size=(len(lengths), list_size, 1)).astype("int64"),
        **numbers,
        "example_list_mask": mask,
    }
    labels = np.where(mask, rng.integers(0, 3, size=mask.shape), -1).astype("float32")
    return features, labels


def looked_up(spec, features):
    return {name: to_numpy(value) for name, value in FeatureLookup(spec)(features).items()}


def _masked_squared_error(labels, scores):
    return ops.sum(ops.where(labels >= 0, ops.square(labels - scores), 0.0), axis=-1)


def test_lookup_gives_vocabulary_ids_an_oov_bucket_and_padded_token_lists(text_spec):
    features = {
        "query_tokens": tf.ragged.constant([["cat", "zebra"], []]),
        "query_length": np.ones((2, 1), "float32"),
        "document_tokens": tf.ragged.constant([[["the"], ["dog", "mat", "the"]], [[], ["on"]]],
                                              ragged_rank=2),
        "site": np.array([[[11], [5]], [[7], [13]]], "int64"),
        **{name: np.zeros((2, 2, width), "float32")
           for name, width in (("bm25", 2), ("clicks", 1), ("age", 1))},
        "example_list_mask": np.array([[True, True], [False, True]]),
        "query_id": np.array([3, 4]),  # not the spec's: dropped
    }
    got = looked_up(text_spec, features)
    # 0: no token, 1: out of vocabulary, 2 + i: WORDS[i] (query and document share the vocabulary)
    np.testing.assert_array_equal(got["query_tokens"], [[3, 1], [0, 0]])
    np.testing.assert_array_equal(got["document_tokens"],
                                  [[[2, 0, 0], [7, 6, 2]], [[0, 0, 0], [5, 0, 0]]])
    np.testing.assert_array_equal(got["site"], [[[3], [1]], [[2], [4]]])
    assert got["document_tokens"].dtype == np.int32 and got["bm25"].dtype == np.float32
    assert sorted(got) == sorted([f.name for f in text_spec.context + text_spec.document]
                                 + ["example_list_mask"])
    # dense token lists padded with "" give what the ragged ones give; int32 categories, int64's
    dense = {**features, "query_tokens": features["query_tokens"].to_tensor(""),
             "document_tokens": features["document_tokens"].to_tensor(""),
             "site": features["site"].astype("int32")}
    # VarLenFeature's sparse token lists too
    sparse = {**features, "query_tokens": features["query_tokens"].to_sparse(),
              "document_tokens": features["document_tokens"].to_sparse()}
    for other in (dense, sparse):
        for name, value in looked_up(text_spec, other).items():
            np.testing.assert_array_equal(value, got[name], err_msg=name)
    # token lists padded up to a multiple of 4 tokens: a compiled model sees fewer shapes
    padded = {k: to_numpy(v) for k, v in FeatureLookup(text_spec, token_multiple=4)(features).items()}
    assert padded["query_tokens"].shape == (2, 4) and padded["document_tokens"].shape == (2, 2, 4)
    np.testing.assert_array_equal(padded["document_tokens"][..., :3], got["document_tokens"])
    np.testing.assert_array_equal(padded["document_tokens"][..., 3:], 0)
    np.testing.assert_array_equal(padded["site"], got["site"])  # fixed-length: as it was


def test_feature_inputs_are_each_features_transform_embedding_mean_and_context(text_spec):
    features, _ = raw_batch(0, lengths=[3, 1])
    ids = looked_up(text_spec, features)
    layer = FeatureInputs(text_spec)
    out = layer(ids)
    got, mask = to_numpy(out["features"]), to_numpy(out["mask"])
    np.testing.assert_array_equal(mask, features["example_list_mask"])
    assert layer.output_width == got.shape[-1] == 3 + 1 + 3 + 2 + 2 + 1 + 1

    def mean_embedding(embedding, token_ids):
        table = to_numpy(embedding.embeddings)
        real = token_ids > 0
        return (table[token_ids] * real[..., None]).sum(-2) / np.maximum(real.sum(-1), 1)[..., None]

    words, sites = layer.embeddings  # query and document tokens share the first table
    quantile = layer.quantiles["document"]
    age = to_numpy(quantile(features["age"]))
    list_size = mask.shape[1]
    context = np.concatenate([np.log1p(features["query_length"]),
                              mean_embedding(words, ids["query_tokens"])], -1)
    expected = np.concatenate([
        np.repeat(context[:, None], list_size, axis=1),
        features["bm25"], np.log1p(features["clicks"]), age,
        mean_embedding(words, ids["document_tokens"]), mean_embedding(sites, ids["site"]),
    ], -1)
    np.testing.assert_allclose(got[mask], expected[mask], rtol=1e-6, atol=1e-6)
    assert np.all(got[~mask] == 0.0)


def test_a_token_list_without_tokens_embeds_as_zeros_and_padded_ids_change_nothing(text_spec):
    layer = FeatureInputs(text_spec)
    features, _ = raw_batch(1, lengths=[2, 2])
    ids = looked_up(text_spec, features)
    ids["document_tokens"][0, 0] = 0  # the first document has no token
    base = to_numpy(layer(ids)["features"])
    start = 1 + 3 + 2 + 1 + 1  # the document tokens' columns
    np.testing.assert_array_equal(base[0, 0, start:start + 3], 0.0)
    wider = {**ids, "document_tokens": np.pad(ids["document_tokens"], ((0, 0), (0, 0), (0, 4))),
             "query_tokens": np.pad(ids["query_tokens"], ((0, 0), (0, 2)))}
    np.testing.assert_array_equal(to_numpy(layer(wider)["features"]), base)


def test_quantiles_are_fitted_to_real_documents_only(text_spec):
    batches = [raw_batch(seed, lengths=[4, 2], pad_with_garbage=True) for seed in range(3)]
    batches = [(looked_up(text_spec, features), labels) for features, labels in batches]
    layer = FeatureInputs(text_spec).adapt(batches)
    ages = np.concatenate([f["age"][f["example_list_mask"]] for f, _ in batches])
    assert np.isfinite(ages).all()  # the padded documents' NaN never came in
    levels = np.linspace(0.0, 1.0, layer.quantiles["document"].num_quantiles)
    np.testing.assert_allclose(to_numpy(layer.quantiles["document"].quantiles),
                               np.quantile(ages, levels, axis=0), rtol=1e-6)


# Tests whose property is not the compiled step take their training step op by op
# (`run_eagerly=True`): the same ops, without tracing the step (3-7 s a model on a CI core against
# under 1 s); fit under XLA below and on JAX run it compiled.


def _trained_copy(spec, preset_kwargs, weights, features, labels):
    """A fresh model with `weights` after one SGD step on `features` (looked up)."""
    model = build_named_scorer(spec, "B64", hidden_units=HIDDEN, batch_norm_momentum=0.5,
                               **preset_kwargs)
    model.build()
    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=_masked_squared_error,
                  run_eagerly=True)
    model.train_on_batch(features, labels)
    return model


def _moving_stats(model):
    return [to_numpy(v) for layer in model._flatten_layers()
            if isinstance(layer, MaskedBatchNormalization)
            for v in (layer.moving_mean, layer.moving_variance)]


def _unpadded_batch():
    return raw_batch(2, lengths=[3, 1, 2])


@pytest.fixture(scope="module")
def module_text_spec(tmp_path_factory):
    return write_text_spec(tmp_path_factory.mktemp("text_spec"))


@pytest.fixture(scope="module", params=sorted(SCORERS))
def stepped(request, module_text_spec):
    """`(scorer, its initial weights, the scorer after one SGD step from them on the looked-up
    `_unpadded_batch()`, that scorer's weights and batch norm statistics just after the step)`,
    for each kind of scorer; the padding and permutation tests share the step."""
    scorer = request.param
    features, labels = _unpadded_batch()
    reference = build_named_scorer(module_text_spec, "B64", hidden_units=HIDDEN,
                                   **SCORERS[scorer])
    reference.build()
    weights = reference.get_weights()
    plain = _trained_copy(module_text_spec, SCORERS[scorer], weights,
                          looked_up(module_text_spec, features), labels)
    return scorer, weights, plain, plain.get_weights()


@pytest.mark.slow
def test_padded_documents_and_tokens_change_no_real_score_nor_batch_norm_statistics(
        module_text_spec, stepped):
    text_spec = module_text_spec
    scorer, weights, plain, after_step = stepped
    plain.set_weights(after_step)  # as the step left it (calls in training mode move statistics)
    features, labels = _unpadded_batch()
    padded, _ = raw_batch(2, lengths=[3, 1, 2], list_size=8, pad_with_garbage=True)
    for name in ("bm25", "clicks", "age", "site"):  # the same lists, 5 more padded documents
        padded[name][:, :3] = features[name]
    padded["document_tokens"] = tf.concat(
        [features["document_tokens"], padded["document_tokens"][:, 3:]], axis=1)
    padded["query_tokens"], padded["query_length"] = (features["query_tokens"],
                                                      features["query_length"])
    padded_labels = np.pad(labels, ((0, 0), (0, 5)), constant_values=-1.0)
    ids, padded_ids = looked_up(text_spec, features), looked_up(text_spec, padded)
    # and 3 more padded tokens in every token list
    padded_ids["document_tokens"] = np.pad(padded_ids["document_tokens"], ((0, 0), (0, 0), (0, 3)))
    mask = features["example_list_mask"]

    with_pads = _trained_copy(text_spec, SCORERS[scorer], weights, padded_ids, padded_labels)
    for before, after in zip(_moving_stats(plain) + plain.get_weights(),
                             _moving_stats(with_pads) + with_pads.get_weights()):
        # the sums run over 3 or 8 slots (order differs): float32 reassociation, ~1e-6 after a step
        np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    for training in (False, True):
        expected = to_numpy(plain(ids, training=training))
        got = to_numpy(with_pads(padded_ids, training=training))
        assert np.all(np.isfinite(got)) and np.all(got[~padded_ids["example_list_mask"]] == 0.0)
        np.testing.assert_allclose(got[:, :3][mask], expected[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_scores_are_permutation_equivariant(module_text_spec, stepped):
    _, weights, model, _ = stepped  # after a step: no weight at its start
    assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), weights))
    features, labels = raw_batch(3, lengths=[5, 3, 4])  # other lists than the step's, longer
    ids = looked_up(module_text_spec, features)
    permutation = np.random.default_rng(4).permutation(labels.shape[1])
    permuted = {name: value[:, permutation] if value.ndim > 2 or name == "example_list_mask"
                else value for name, value in ids.items()}
    for training in (False, True):
        np.testing.assert_allclose(to_numpy(model(permuted, training=training)),
                                   to_numpy(model(ids, training=training))[:, permutation],
                                   rtol=1e-5, atol=1e-6)


LIST_SIZES = (4, 9)  # the list dimension changes from batch to batch (two XLA compiles)


def variable_length_batches():
    for seed, list_size in enumerate(LIST_SIZES):
        lengths = [list_size, max(1, list_size // 2), list_size - 1]
        yield raw_batch(seed, lengths)


def raw_dataset():
    """The batches as tf.data gives them: ragged token lists, `None` list and token dimensions."""
    spec = ({"query_tokens": tf.RaggedTensorSpec((None, None), tf.string, 1),
             "query_length": tf.TensorSpec((None, 1), tf.float32),
             "document_tokens": tf.RaggedTensorSpec((None, None, None), tf.string, 2),
             "site": tf.TensorSpec((None, None, 1), tf.int64),
             "bm25": tf.TensorSpec((None, None, 2), tf.float32),
             "clicks": tf.TensorSpec((None, None, 1), tf.float32),
             "age": tf.TensorSpec((None, None, 1), tf.float32),
             "example_list_mask": tf.TensorSpec((None, None), tf.bool)},
            tf.TensorSpec((None, None), tf.float32))
    return tf.data.Dataset.from_generator(variable_length_batches, output_signature=spec)


@pytest.mark.slow
def test_fits_on_variable_length_lists_under_xla_with_the_lookup_in_the_dataset(text_spec):
    keras.utils.set_random_seed(1)
    model = build_named_scorer(text_spec, "dasalc", hidden_units=HIDDEN, attention_layers=1,
                               attention_units=8)
    model.build()
    lookup = FeatureLookup(text_spec)
    data = raw_dataset().map(lambda features, labels: (lookup(features), labels))
    model.feature_inputs.adapt(data)
    before = [to_numpy(e.embeddings) for e in model.feature_inputs.embeddings]
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=losses.ApproxNDCGLoss(),
                  jit_compile=True)
    history = model.fit(data, epochs=1, verbose=0).history
    assert model.jit_compile and np.all(np.isfinite(history["loss"]))
    after = [to_numpy(e.embeddings) for e in model.feature_inputs.embeddings]
    assert all(np.all(np.isfinite(a)) and not np.allclose(a, b) for a, b in zip(after, before))


@pytest.mark.slow
def test_fits_on_raw_features_with_the_lookup_in_the_model(text_spec):
    """The lookup inside the model: Keras compiles the step without XLA, which cannot run it."""
    keras.utils.set_random_seed(1)
    model = build_named_scorer(text_spec, "B64", hidden_units=HIDDEN, lookup=True)
    model.build()
    before = to_numpy(model.feature_inputs.embeddings[0].embeddings)
    with pytest.warns(UserWarning, match="doesn't support `jit_compile=True`"):
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=losses.ApproxNDCGLoss(),
                      jit_compile=True)
    history = model.fit(raw_dataset(), epochs=1, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    assert not np.allclose(to_numpy(model.feature_inputs.embeddings[0].embeddings), before)


@pytest.mark.slow
@pytest.mark.parametrize("lookup", [False, True], ids=["ids", "raw"])
def test_save_and_load_round_trip_without_the_vocabulary_files(text_spec, tmp_path, lookup):
    features, labels = raw_batch(5, lengths=[3, 2])
    inputs = features if lookup else looked_up(text_spec, features)
    model = build_named_scorer(text_spec, "dasalc", hidden_units=HIDDEN, attention_units=8,
                               lookup=lookup)
    model.build()
    model.feature_inputs.adapt([looked_up(text_spec, features)])
    model.compile(optimizer="adam", loss=_masked_squared_error, run_eagerly=True)
    model.train_on_batch(inputs, labels)
    path = tmp_path / "named.keras"
    model.save(path)
    for vocabulary in ("vocab.txt", "sites.txt"):  # the saved model carries what it needs
        (tmp_path / vocabulary).unlink()
    restored = keras.models.load_model(
        path, custom_objects={"_masked_squared_error": _masked_squared_error})
    assert isinstance(restored, NamedFeatureScorer) and restored.spec == text_spec
    as_saved = json.loads(json.dumps(model.get_config()))  # tuples become lists
    assert restored.get_config() == as_saved
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(to_numpy(restored(inputs)), to_numpy(model(inputs)), atol=1e-6)


def test_concat_features_is_tf_rankings_with_padded_documents_zeroed():
    # TF-Ranking's docstring example; its circular padding would copy [1, 1, 0] into the pad
    context = {"context_feature_1": np.array([[1.0], [2.0]], "float32")}
    example = {"example_feature_1": np.array([[[1, 0], [0, 1]], [[0, 1], [1, 0]]], "float32")}
    mask = np.array([[True, False], [True, True]])
    got = to_numpy(ConcatFeatures()((context, example, mask)))
    np.testing.assert_array_equal(got, [[[1, 1, 0], [0, 0, 0]], [[2, 0, 1], [2, 1, 0]]])
    more = {"b": np.array([[5.0], [6.0]], "float32"), **context}  # sorted names: b first
    got = to_numpy(ConcatFeatures()((more, example, mask)))
    np.testing.assert_array_equal(got[1, 1], [6, 2, 1, 0])


def test_document_interaction_attention_is_document_interaction_under_tf_rankings_names():
    layer = DocumentInteractionAttention(num_heads=2, head_size=8, num_layers=2, dropout=0.0)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 5, 3)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    out = to_numpy(layer((x, mask)))
    twin = DocumentInteraction(units=8, layers=2, heads=2)
    twin(x, mask=mask)
    twin.set_weights(layer.get_weights())
    np.testing.assert_array_equal(out, to_numpy(twin(x, mask=mask)))
    assert out.shape == (2, 5, 8) and np.all(out[~mask] == 0.0)
    np.testing.assert_allclose(to_numpy(layer((x, None))),
                               to_numpy(layer((x, np.ones_like(mask)))), atol=1e-6)
    config = layer.get_config()
    assert {k: config[k] for k in ("num_heads", "head_size", "num_layers", "dropout")} == {
        "num_heads": 2, "head_size": 8, "num_layers": 2, "dropout": 0.0}
    assert not {"units", "layers", "heads"} & set(config)
    assert DocumentInteractionAttention.from_config(config).get_config() == config


def test_bad_specs_and_inputs_are_named(text_spec, tmp_path):
    varying = FeatureSpec(context=(), document=(Feature("scores", "float32", None),), label="y")
    with pytest.raises(ValueError, match="feature 'scores': a variable-length float32 feature"):
        FeatureInputs(varying)
    features, _ = raw_batch(0, lengths=[2])
    del features["bm25"]
    with pytest.raises(ValueError, match="the features lack 'bm25'"):
        FeatureLookup(text_spec)(features)
    with pytest.raises(ValueError, match="the features lack 'bm25'"):
        FeatureInputs(text_spec)({k: v for k, v in looked_up(
            text_spec, raw_batch(0, lengths=[2])[0]).items() if k != "bm25"})
    (tmp_path / "vocab.txt").write_text("\n\n")
    with pytest.raises(ValueError, match=r"vocab.txt: the vocabulary file is empty"):
        FeatureLookup(text_spec)
    (tmp_path / "sites.txt").write_text("7\nseven\n")
    with pytest.raises(ValueError, match=r"sites.txt:2: an int64 vocabulary holds integers"):
        named_inputs.read_vocabulary(tmp_path / "sites.txt", "int64")
    with pytest.raises(ValueError, match=r"nowhere.txt: no such vocabulary file"):
        named_inputs.read_vocabulary(tmp_path / "nowhere.txt")


# One process on JAX serves two tests (a fresh interpreter costs seconds of imports): what
# `import keras, tfapprox` registered, before anything else is imported, and fits with jit of a
# numeric spec straight from arrays and of the text spec with its lookup in tf.data (the model
# over ids is backend-neutral).
ON_JAX = """
    import json, sys
    import keras, tfapprox
    registered = sorted(k for k in keras.saving.get_custom_objects() if k.startswith("tfapprox>"))

    import numpy as np, tensorflow as tf
    sys.path.insert(0, "tests")
    import test_named_inputs as t
    from tfapprox import losses, named_inputs

    def fit(model, data):
        model.build()
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss=losses.ApproxNDCGLoss(),
                      jit_compile=True)
        return model.fit(data, epochs=3, verbose=0).history["loss"]

    keras.utils.set_random_seed(0)
    numeric = named_inputs.build_named_scorer(t.NUMERIC_SPEC, "B64", hidden_units=(8, 4))
    features, labels = t.raw_batch(0, lengths=[6, 3, 5, 1] * 4, pad_with_garbage=True)
    features = {f.name: features[f.name] for f in t.NUMERIC_SPEC.context + t.NUMERIC_SPEC.document}
    features["example_list_mask"] = labels >= 0
    numeric.adapt([features])
    numeric_loss = fit(numeric, tf.data.Dataset.from_tensor_slices((features, labels)).batch(4))
    # scored by one compiled predict step: called eagerly, JAX compiles each op on its own
    scores = numeric.predict(features, batch_size=len(labels), verbose=0)

    spec = t.FeatureSpec.load(sys.argv[1])
    lookup = named_inputs.FeatureLookup(spec)
    text = named_inputs.build_named_scorer(spec, "B64", hidden_units=(8, 4))
    text_loss = fit(text, t.raw_dataset().map(lambda f, y: (lookup(f), y)))
    print(json.dumps({"backend": keras.backend.backend(), "registered": registered,
                      "numeric_loss": numeric_loss, "text_loss": text_loss,
                      "finite": bool(np.isfinite(scores).all()),
                      "padded_scores": scores[labels < 0].tolist()}))
"""


@pytest.fixture(scope="module")
def on_jax(tmp_path_factory):
    """The JSON that ON_JAX prints."""
    directory = tmp_path_factory.mktemp("on_jax")
    write_text_spec(directory).save(directory / "spec.json")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ON_JAX), str(directory / "spec.json")], cwd=REPO,
        env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
             "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"},
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_tfapprox_registers_the_layers(on_jax):
    for name in ("ConcatFeatures", "DocumentInteractionAttention", "FeatureInputs",
                 "FeatureLookup", "NamedFeatureScorer"):
        assert f"tfapprox>{name}" in on_jax["registered"], name


@pytest.mark.slow
def test_numeric_specs_and_looked_up_ids_fit_on_jax(on_jax):
    result = on_jax
    assert result["backend"] == "jax" and result["finite"]
    assert result["padded_scores"] == [0.0] * len(result["padded_scores"])
    for name in ("numeric_loss", "text_loss"):
        assert np.all(np.isfinite(result[name])) and result[name][-1] < result[name][0], result
