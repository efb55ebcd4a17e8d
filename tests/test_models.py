"""Tests for tfapprox.models: presets, padding safety, permutation equivariance, serialization,
for the B-nets and for DASALC's pieces (log1p inputs, input noise, self-attention over the list)."""

import numpy as np
import pytest

import keras
from keras import ops

from tfapprox.models import (
    PRESETS,
    DNNScorer,
    DocumentInteraction,
    MaskedBatchNormalization,
    QuantileTransform,
    build_scorer,
    standardize_within_lists,
    symmetric_log1p,
)

NUM_FEATURES = 5
HIDDEN = (8, 4)
# The scorers every padding and permutation test covers: Bruch et al.'s, and DASALC's pieces that
# let documents meet (two stacked attention blocks; the noise has a test of its own).
SCORERS = {
    "bruch": {},
    "interacting": {
        "input_transform": "log1p",
        "attention_layers": 2,
        "attention_heads": 2,
        "attention_units": 8,
    },
    "quantile": {"input_transform": "quantile"},
    "list_standardized": {"list_standardize": True},  # documents meet through their list's moments
}


def _batch(seed, batch_size=3, list_size=4):
    """Returns (features, mask, labels) with lists of different lengths, labels -1 on padding."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(batch_size, list_size, NUM_FEATURES)).astype("float32")
    lengths = np.arange(batch_size) % list_size + 1
    lengths[-1] = list_size
    mask = np.arange(list_size)[None, :] < lengths[:, None]
    labels = np.where(mask, rng.integers(0, 3, size=mask.shape), -1).astype("float32")
    return features, mask, labels


def _pad(features, mask, labels, extra, fill):
    """Appends `extra` padded slots whose features are `fill` to every list."""
    batch_size, _, num_features = features.shape
    pad_features = np.full((batch_size, extra, num_features), fill, dtype="float32")
    return (
        np.concatenate([features, pad_features], axis=1),
        np.concatenate([mask, np.zeros((batch_size, extra), bool)], axis=1),
        np.concatenate([labels, -np.ones((batch_size, extra), "float32")], axis=1),
    )


def _masked_squared_error(labels, scores):
    """Sum over valid documents of (label - score)^2: padded slots add exactly nothing."""
    return ops.sum(ops.where(labels >= 0, ops.square(labels - scores), 0.0), axis=-1)


def _build(model, features, mask):
    """Builds `model` on a batch before it is compiled, as the trainer builds it: an unbuilt model
    creates its variables in the first trace of the train step, which TensorFlow then traces
    again."""
    model({"features": features, "mask": mask})


def _moving_stats(model):
    return [
        ops.convert_to_numpy(v)
        for layer in model._flatten_layers()
        if isinstance(layer, MaskedBatchNormalization)
        for v in (layer.moving_mean, layer.moving_variance)
    ]


def test_presets_halve_down_to_sixteen():
    b_nets = {name: widths for name, widths in PRESETS.items() if name != "LINEAR"}
    assert sorted(b_nets, key=lambda k: int(k[1:])) == ["B64", "B128", "B256", "B512", "B1024"]
    for name, widths in b_nets.items():
        assert widths[0] == int(name[1:]) and widths[-1] == 16
        assert all(wider == 2 * narrower for wider, narrower in zip(widths, widths[1:]))
    assert PRESETS["B1024"] == (1024, 512, 256, 128, 64, 32, 16)  # Bruch et al. 2019
    assert build_scorer("b256").hidden_units == PRESETS["B256"]
    with pytest.raises(ValueError, match="preset must be one of .* received preset='B100'"):
        build_scorer("B100")


def test_the_linear_preset_scores_an_affine_function_of_the_features():
    rng = np.random.default_rng(0)
    model = build_scorer("linear")
    features = rng.normal(size=(3, 4, 6)).astype(np.float32)
    model(features)  # builds
    scores = keras.ops.convert_to_numpy(model(features, training=False))
    flat = np.c_[features.reshape(-1, 6), np.ones(12)]
    residual = np.linalg.lstsq(flat, scores.reshape(-1), rcond=None)[1]
    assert model.hidden_units == () and residual.size == 1 and residual[0] < 1e-8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hidden_units": (8, 0)}, "hidden_units must be positive integers"),
        ({"hidden_units": (8,), "dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"hidden_units": (8,), "batch_norm_momentum": 1.0}, r"momentum must be in \[0, 1\)"),
        ({"hidden_units": (8,), "input_transform": "log"}, "input_transform must be one of"),
        ({"hidden_units": (8,), "noise_stddev": -0.1}, "noise_stddev must be >= 0"),
        ({"hidden_units": (8,), "attention_layers": 1, "attention_units": 6,
          "attention_heads": 4}, "units must be divisible by heads"),
    ],
)
def test_invalid_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DNNScorer(**kwargs)


def test_invalid_inputs_are_described():
    model = DNNScorer(HIDDEN)
    with pytest.raises(ValueError, match="rank 3"):
        model(np.zeros((2, NUM_FEATURES), "float32"))
    with pytest.raises(ValueError, match="received keys"):
        model({"features": np.zeros((1, 2, NUM_FEATURES), "float32"), "labels": np.zeros((1, 2))})


def test_scores_shape_and_padded_slots_score_zero():
    features, mask, _ = _batch(0)
    model = DNNScorer(HIDDEN)
    scores = ops.convert_to_numpy(model({"features": features, "mask": mask}))
    assert scores.shape == mask.shape and scores.dtype == np.float32
    assert np.all(scores[~mask] == 0.0)
    # A bare tensor means every slot is valid.
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(features)),
        ops.convert_to_numpy(model({"features": features, "mask": np.ones_like(mask)})),
        atol=1e-6,
    )


PAD_FILLS = (1e30, -7.0, np.nan)


@pytest.mark.parametrize("scorer", sorted(SCORERS))
def test_padding_changes_no_valid_score_nor_moving_stats(scorer):
    """One SGD step from the same weights on lists with and without 5 padded slots, the padding
    filled with each of PAD_FILLS: the same weights, moving statistics and valid scores. One
    model, set back to its start before each step, trains them all (its step traced once for the
    unpadded lists and once for the padded ones)."""
    features, mask, labels = _batch(1)
    model = DNNScorer(HIDDEN, batch_norm_momentum=0.5, **SCORERS[scorer])
    _build(model, features, mask)
    start = model.get_weights()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=_masked_squared_error)

    def trained(features, mask, labels):
        """Returns (moving stats, weights, {training: scores}) after one step from `start`."""
        model.set_weights(start)
        model.train_on_batch({"features": features, "mask": mask}, labels)
        stats, weights = _moving_stats(model), model.get_weights()
        return stats, weights, {training: ops.convert_to_numpy(
            model({"features": features, "mask": mask}, training=training))
            for training in (False, True)}

    plain_stats, plain_weights, expected = trained(features, mask, labels)
    list_size = mask.shape[1]
    # attention sums over 7 keys in one model and 12 (5 masked) in the other: the same terms in
    # another order, whose rounding the trained weights carry into scores of up to ~40
    rtol = 1e-4 if SCORERS[scorer].get("attention_layers") else 1e-5
    for fill in PAD_FILLS:
        padded = _pad(features, mask, labels, extra=5, fill=fill)
        stats, weights, got = trained(*padded)
        for before, after in zip(plain_stats + plain_weights, stats + weights):
            np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6, err_msg=f"fill={fill}")
        for training, scores in got.items():
            case = f"fill={fill}, training={training}"
            assert np.all(np.isfinite(scores)), case
            np.testing.assert_allclose(scores[:, :list_size][mask], expected[training][mask],
                                       rtol=rtol, atol=1e-5, err_msg=case)
            assert np.all(scores[~padded[1]] == 0.0), case


def test_all_padding_batch_leaves_moving_stats_alone():
    layer = MaskedBatchNormalization(momentum=0.5)
    x = np.random.default_rng(2).normal(size=(2, 3, 4)).astype("float32")
    layer(x, mask=np.ones((2, 3), bool), training=True)
    before = [ops.convert_to_numpy(layer.moving_mean), ops.convert_to_numpy(layer.moving_variance)]
    out = layer(x * 100.0, mask=np.zeros((2, 3), bool), training=True)
    assert np.all(np.isfinite(ops.convert_to_numpy(out)))
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.moving_mean), before[0])
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.moving_variance), before[1])


def test_masked_batch_norm_matches_keras_batch_norm_on_valid_rows():
    rng = np.random.default_rng(3)
    x = rng.normal(loc=2.0, scale=3.0, size=(4, 6, 5)).astype("float32")
    mask = rng.random((4, 6)) < 0.6
    ours = MaskedBatchNormalization(momentum=0.8, epsilon=1e-3)
    theirs = keras.layers.BatchNormalization(momentum=0.8, epsilon=1e-3)
    got = ops.convert_to_numpy(ours(x, mask=mask, training=True))
    # Keras's layer on the valid rows alone, flattened to [N, F].
    expected = ops.convert_to_numpy(theirs(x[mask], training=True))
    np.testing.assert_allclose(got[mask], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        ops.convert_to_numpy(ours.moving_mean), ops.convert_to_numpy(theirs.moving_mean), rtol=1e-5
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(ours.moving_variance),
        ops.convert_to_numpy(theirs.moving_variance),
        rtol=1e-5,
    )


@pytest.mark.parametrize("scorer", sorted(SCORERS))
def test_scores_are_permutation_equivariant(scorer):
    features, mask, labels = _batch(4, batch_size=4, list_size=6)
    model = DNNScorer(HIDDEN, dropout=0.0, **SCORERS[scorer])
    _build(model, features, mask)
    # Trained a step so that no weight is at its start, eagerly (a traced step costs 10x, and the
    # scores below are eager calls anyway); scorers train under XLA through fit elsewhere.
    model.compile(optimizer="adam", loss=_masked_squared_error, run_eagerly=True)
    model.train_on_batch({"features": features, "mask": mask}, labels)
    permutation = np.random.default_rng(5).permutation(mask.shape[1])
    for training in (False, True):
        scores = ops.convert_to_numpy(
            model({"features": features, "mask": mask}, training=training)
        )
        permuted = ops.convert_to_numpy(
            model(
                {"features": features[:, permutation], "mask": mask[:, permutation]},
                training=training,
            )
        )
        np.testing.assert_allclose(permuted, scores[:, permutation], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("preset", ["B64", "dasalc"])
def test_save_and_load_round_trip(tmp_path, preset):
    features, mask, labels = _batch(6)
    model = build_scorer(preset, dropout=0.25, batch_norm_momentum=0.9)
    _build(model, features, mask)
    # Trained a step eagerly: the test is about what is saved, not how the step compiles (scorers
    # train under XLA through fit in tests/test_fit_variable_lists.py).
    model.compile(optimizer="adam", loss=_masked_squared_error, run_eagerly=True)
    model.train_on_batch({"features": features, "mask": mask}, labels)
    path = tmp_path / "scorer.keras"
    model.save(path)
    restored = keras.models.load_model(
        path, custom_objects={"_masked_squared_error": _masked_squared_error}
    )
    assert isinstance(restored, DNNScorer)
    assert restored.get_config() == model.get_config()
    for a, b in zip(_moving_stats(model), _moving_stats(restored)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(
        ops.convert_to_numpy(restored({"features": features, "mask": mask})),
        ops.convert_to_numpy(model({"features": features, "mask": mask})),
        atol=1e-6,
    )


def test_mixed_precision_scores_are_float32():
    features, mask, _ = _batch(7)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = DNNScorer(HIDDEN)
        scores = model({"features": features, "mask": mask}, training=True)
    finally:
        keras.config.set_dtype_policy(previous)
    assert ops.convert_to_numpy(scores).dtype == np.float32
    assert model.hidden_norms[0].moving_mean.dtype == "float32"


def test_symmetric_log1p_is_odd_and_log1p_on_positives():
    x = np.array([-1e6, -3.0, -1e-7, 0.0, 1e-7, 0.5, 1e30], "float32")
    got = ops.convert_to_numpy(symmetric_log1p(x))
    np.testing.assert_allclose(got, np.sign(x) * np.log1p(np.abs(x)), rtol=1e-6)
    np.testing.assert_array_equal(got, -ops.convert_to_numpy(symmetric_log1p(-x)))


def test_the_dasalc_recipe_and_its_overrides():
    model = build_scorer("DASALC", attention_layers=0)
    assert model.hidden_units == PRESETS["B256"] and model.input_transform == "log1p"
    assert model.noise_stddev > 0 and model.attention_layers == 0 and model.interaction is None
    assert build_scorer("dasalc").interaction.layers == 2


def test_input_noise_is_drawn_in_training_only():
    features, mask, _ = _batch(8)
    inputs = {"features": features, "mask": mask}
    noisy = DNNScorer(HIDDEN, noise_stddev=1.5)  # σ > 1 as DASALC's (GaussianNoise refuses it)
    quiet = DNNScorer(HIDDEN)
    quiet(inputs)
    noisy(inputs)
    noisy.set_weights(quiet.get_weights())  # the noise layer has no weights
    for training, same in ((False, True), (True, False)):
        # One draw of moving averages aside, batch norm in training uses batch moments.
        a = ops.convert_to_numpy(noisy(inputs, training=training))
        b = ops.convert_to_numpy(quiet(inputs, training=training))
        assert np.allclose(a, b, atol=1e-6) == same, training
        assert np.all(a[~mask] == 0.0)


def test_attention_never_reaches_padded_documents():
    """Padded rows are zero, and a valid document's encoding ignores the padded ones."""
    layer = DocumentInteraction(units=8, layers=2, heads=2)
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2, 5, 3)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    out = ops.convert_to_numpy(layer(x, mask=mask))
    assert out.shape == (2, 5, 8) and np.all(out[~mask] == 0.0)
    changed = x.copy()
    changed[0, 3:] = 1e6
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(changed, mask=mask))[0], out[0])
    alone = ops.convert_to_numpy(layer(x[:1, :3], mask=mask[:1, :3]))
    np.testing.assert_allclose(alone[0], out[0, :3], atol=1e-5)


def _normal_quantile(p):
    from statistics import NormalDist

    return np.vectorize(NormalDist().inv_cdf)(p)


def test_quantile_transform_gives_each_value_its_mid_rank_normal_score():
    """Fitted on valid documents only, the transform is Φ⁻¹ of each value's mid-rank: a value
    60 % of documents share (a missing feature's 0) gets Φ⁻¹(0.3); a continuous feature comes
    out standard normal, in the order it went in."""
    rng = np.random.default_rng(0)
    n = 4000
    shared = np.where(rng.random(n) < 0.6, 0.0, 1.0 + rng.random(n))
    continuous = rng.exponential(size=n) ** 3  # heavy-tailed: what log1p only partly tames
    features = np.stack([shared, continuous], -1).reshape(40, 100, 2)
    mask = np.ones((40, 100), bool)
    mask[:, 90:] = False
    features[:, 90:] = 1e9  # padding: must not enter the quantiles
    layer = QuantileTransform(num_quantiles=128).adapt(features, mask)
    alone = QuantileTransform(num_quantiles=128).adapt(features[mask])
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.quantiles),
                                  ops.convert_to_numpy(alone.quantiles))
    z = ops.convert_to_numpy(layer(features.astype("float32")))[mask]
    valid = features[mask]
    zero = valid[:, 0] == 0
    np.testing.assert_allclose(z[zero, 0], _normal_quantile(zero.mean() / 2), atol=0.03)
    assert abs(z[:, 1].mean()) < 0.02 and abs(z[:, 1].std() - 1) < 0.05
    order = np.argsort(valid[:, 1])
    assert np.all(np.diff(z[order, 1]) >= 0)
    # mid-rank scores, exactly computed, within the interpolation between 128 quantiles (coarse
    # in the tails, where Φ⁻¹ is steep: compared on the middle 90 %)
    ranks = (np.argsort(order) + 0.5) / len(order)
    middle = (ranks > 0.05) & (ranks < 0.95)
    np.testing.assert_allclose(z[middle, 1], _normal_quantile(ranks[middle]), atol=0.03)


def test_quantile_transform_before_adapt_passes_normal_inputs_through():
    x = np.linspace(-2, 2, 41, dtype="float32").reshape(1, 41, 1)
    np.testing.assert_allclose(ops.convert_to_numpy(QuantileTransform()(x)), x, atol=0.02)


def test_quantile_transform_refuses_non_finite_training_values():
    features = np.ones((2, 3, 2))
    features[1, 2, 0] = np.nan
    mask = np.ones((2, 3), bool)
    with pytest.raises(ValueError, match="1 non-finite feature values .* in 1 of 6 valid"):
        QuantileTransform().adapt(features, mask)
    mask[1, 2] = False  # padding may hold anything
    QuantileTransform().adapt(features, mask)


@pytest.mark.parametrize("num_quantiles", [1, 2.5, None])
def test_quantile_transform_refuses_bad_sizes(num_quantiles):
    with pytest.raises(ValueError, match="num_quantiles must be an integer >= 2"):
        QuantileTransform(num_quantiles=num_quantiles)


def test_adapted_quantiles_survive_save_and_load(tmp_path):
    features, mask, _ = _batch(8, batch_size=6, list_size=10)
    model = build_scorer("B64", input_transform="quantile", list_standardize=True)
    _build(model, features, mask)
    model.adapt(features ** 3, mask)
    path = tmp_path / "scorer.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(ops.convert_to_numpy(restored.quantile.quantiles),
                                  ops.convert_to_numpy(model.quantile.quantiles))
    assert restored.list_standardize
    np.testing.assert_allclose(
        ops.convert_to_numpy(restored({"features": features, "mask": mask})),
        ops.convert_to_numpy(model({"features": features, "mask": mask})), atol=1e-6)


def test_list_standardization_is_each_features_z_score_over_its_lists_real_documents():
    rng = np.random.default_rng(9)
    features = rng.normal(loc=3.0, scale=2.0, size=(4, 7, NUM_FEATURES)).astype("float32")
    mask = rng.random((4, 7)) < 0.6
    mask[0] = [True] + [False] * 6  # a document alone: every feature is its list's mean
    mask[1] = True
    features[:, :, 2] = 5.0  # a feature constant within every list
    features[~mask] = 1e6  # padding: must enter no mean nor variance
    got = ops.convert_to_numpy(standardize_within_lists(features, mask))
    for q in range(4):
        valid = features[q][mask[q]].astype("float64")
        expected = (valid - valid.mean(0)) / np.sqrt(valid.var(0) + 1e-3)
        np.testing.assert_allclose(got[q][mask[q]], expected, rtol=1e-4, atol=1e-5)
    assert np.all(got[~mask] == 0.0) and np.all(got[0, 0] == 0.0) and np.all(got[..., 2] == 0.0)


def test_list_standardized_inputs_reach_the_tower_beside_the_features():
    features, mask, _ = _batch(10, batch_size=3, list_size=6)
    plain = DNNScorer(HIDDEN, list_standardize=True, input_batch_norm=False)
    _build(plain, features, mask)
    assert plain.hidden_dense[0].kernel.shape == (2 * NUM_FEATURES, HIDDEN[0])
    # shifting and scaling one list's features moves only the raw half of the inputs
    shifted = features.copy()
    shifted[0] = 3.0 * shifted[0] + 1.0
    kernel = ops.convert_to_numpy(plain.hidden_dense[0].kernel)
    kernel[:NUM_FEATURES] = 0.0  # the tower sees the standardised half alone
    plain.hidden_dense[0].kernel.assign(kernel)
    np.testing.assert_allclose(
        ops.convert_to_numpy(plain({"features": shifted, "mask": mask})),
        ops.convert_to_numpy(plain({"features": features, "mask": mask})), atol=1e-4)
