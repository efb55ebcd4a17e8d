"""Loss semantics: padding, permutation, edge cases, reductions, arguments, reference formulas."""

import math

import keras
import numpy as np
import pytest

from keras import ops

from conftest import (COMPILE_MODES, REPO, REQUIRED_ARGS, backend, compiled_on_jax,
                      loss_and_grad, random_batch, registered, registered_losses_in_modes,
                      to_numpy, value_and_grad_function)
from tfapprox import direct_ops
from tfapprox import losses
from tfapprox import neural_sort
from tfapprox import ops as rank_ops
from tfapprox.pair_plan import PairPlan, using
from tfapprox.losses import sampling

ALL_LOSSES = [
    losses.ApproxNDCGLoss(),
    losses.ApproxNDCGLoss(alpha=50.0, topk=3, beta=5.0),
    losses.ApproxAPLoss(),
    losses.ApproxPrecisionLoss(k=3),
    losses.RankNetLoss(),
    losses.WeightedRankNetLoss(),
    losses.WeightedRankNetLoss(topk=2),
    losses.ListMLELoss(),
    losses.WeightedListMLELoss(),
    losses.WeightedListMLELoss(topk=3),
    losses.LambdaRankLoss(),
    losses.LambdaRankLoss(topk=3),
    losses.SoftRankLoss(),
    losses.SVMMapLoss(),
    losses.PermuRankLoss(),
    losses.SoftmaxLoss(),
    losses.SoftmaxLoss(lambda_weight=losses.NDCGLambdaWeight(topn=3), temperature=0.5),
    losses.UniqueSoftmaxLoss(temperature=2.0),
    losses.PairwiseLogisticLoss(temperature=0.5),
    losses.PairwiseLogisticLoss(lambda_weight=losses.NDCGLambdaWeightV2(topn=3)),
    losses.PairwiseHingeLoss(),
    losses.PairwiseHingeLoss(lambda_weight=losses.DCGLambdaWeight(topn=4, smooth_fraction=0.5)),
    losses.PairwiseSoftZeroOneLoss(lambda_weight=losses.PrecisionLambdaWeight(topn=2)),
    losses.PairwiseSoftZeroOneLoss(lambda_weight=losses.YetiDCGLambdaWeight()),
    losses.PairwiseMSELoss(lambda_weight=losses.LabelDiffLambdaWeight()),
    losses.SigmoidCrossEntropyLoss(),
    losses.MeanSquaredLoss(),
    losses.ApproxMRRLoss(),
    losses.GumbelApproxNDCGLoss(),
    losses.GumbelApproxAPLoss(sample_size=3, seed=5),
    losses.GumbelApproxPrecisionLoss(k=3),
    losses.ListMLELoss(lambda_weight=losses.ListMLELambdaWeight(), temperature=2.0),
    losses.CalibratedSoftmaxLoss(virtual_label=1.0),
    losses.YetiLogisticLoss(sample_size=2),
    losses.NeuralNDCGLoss(),
    losses.CoupledRankDistilLoss(),
    losses.CoupledRankDistilLoss(sample_size=3, topk=2, temperature=0.5, seed=4),
    losses.NeuralNDCGLoss(temperature=0.3, topk=3, sinkhorn_iterations=5),
]
IDS = [f"{type(l).__name__}-{i}" for i, l in enumerate(ALL_LOSSES)]


def per_list(loss, labels, scores):
    """`loss.call`'s values per list: op by op on TensorFlow, jitted on JAX."""
    return to_numpy(compiled_on_jax(loss.call)(labels, scores))


@pytest.mark.parametrize("loss", ALL_LOSSES, ids=IDS)
def test_padding_changes_no_value_and_no_gradient(loss, rng):
    labels, scores = random_batch(rng, batch=6, list_size=7, pad_fraction=0.0)
    labels[:, 0] = 2.0  # every list has a relevant document
    pad_labels = np.full((6, 5), -1.0, np.float32)
    pad_scores = rng.normal(scale=1e3, size=(6, 5)).astype(np.float32)
    pad_scores[0, 0], pad_scores[1, 1], pad_scores[2, 2] = np.nan, np.inf, -np.inf
    # Padding on both sides of the real documents.
    padded_labels = np.concatenate([pad_labels[:, :2], labels, pad_labels[:, 2:]], axis=1)
    padded_scores = np.concatenate([pad_scores[:, :2], scores, pad_scores[:, 2:]], axis=1)

    value, grad = loss_and_grad(lambda y, s: loss.call(y, s), labels, scores)
    padded_value, padded_grad = loss_and_grad(lambda y, s: loss.call(y, s), padded_labels,
                                              padded_scores)
    np.testing.assert_allclose(padded_value, value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(padded_grad[:, 2:9], grad, rtol=1e-5, atol=1e-6)
    assert np.all(padded_grad[:, :2] == 0) and np.all(padded_grad[:, 9:] == 0)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("loss", ALL_LOSSES, ids=IDS)
def test_mask_in_dict_is_the_same_as_negative_labels(loss, rng):
    labels, scores = random_batch(rng, batch=5, list_size=9, pad_fraction=0.3)
    mask = labels >= 0
    as_dict = {"labels": np.where(mask, labels, 0.0), "mask": mask}
    np.testing.assert_allclose(per_list(loss, as_dict, scores), per_list(loss, labels, scores),
                               rtol=1e-6)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("loss", ALL_LOSSES, ids=IDS)
def test_permuting_a_list_changes_nothing(loss, rng):
    list_size = 8
    # Distinct labels: the label-consistent permutation of ListMLE is then unique.
    labels = np.stack([rng.permutation(list_size) for _ in range(4)]).astype(np.float32) / 2
    _, scores = random_batch(rng, batch=4, list_size=list_size, pad_fraction=0.0)
    order = rng.permutation(list_size)
    np.testing.assert_allclose(per_list(loss, labels[:, order], scores[:, order]),
                               per_list(loss, labels, scores), rtol=1e-5, atol=1e-6)


FINITE_GRADIENT_CASES = ("huge_scores", "single_item", "equal_scores", "zero_labels",
                         "all_padding", "nan_in_padding")


@pytest.mark.parametrize("loss", ALL_LOSSES, ids=IDS)
def test_gradients_stay_finite(loss, rng):
    """Each case through one function of the loss (on JAX one compile per shape, not per case)."""
    value_and_grad = value_and_grad_function(lambda y, s: loss(y, s))
    for case in FINITE_GRADIENT_CASES:
        labels, scores = random_batch(rng, batch=3, list_size=6, pad_fraction=0.0)
        labels[:, 0] = 1.0
        if case == "huge_scores":
            scores = rng.uniform(-1e4, 1e4, size=scores.shape).astype(np.float32)
        elif case == "single_item":
            labels, scores = labels[:, :1], scores[:, :1]
        elif case == "equal_scores":
            scores = np.full_like(scores, 0.7)
        elif case == "zero_labels":
            labels = np.zeros_like(labels)
        elif case == "all_padding":
            labels = np.full_like(labels, -1.0)
        elif case == "nan_in_padding":
            labels[:, -1] = -1.0
            scores[:, -1] = np.nan
        value, grad = value_and_grad(labels, scores)
        assert np.isfinite(value) and np.all(np.isfinite(grad)), (case, value, grad)
        if case in ("zero_labels", "all_padding", "single_item"):
            assert value == 0 and np.all(grad == 0), (case, value, grad)


# conftest.SKELETON_VARIANTS: the first mode only (eager on TensorFlow), here and below. A
# batch of no lists, or of no lists of no documents, only in that mode too (a compile each costs
# more than the three shapes share: the empty lists of a `None` list size are what the
# compiled steps see).
@pytest.mark.parametrize("loss, mode, shape", [
    pytest.param(*param.values, shape, id=f"{param.id}-{name}")
    for param in registered_losses_in_modes(COMPILE_MODES, COMPILE_MODES[:1])
    for shape, name in (((0, 5), "no_lists"), ((3, 0), "empty_lists"), ((0, 0), "nothing"))
    if shape == (3, 0) or param.values[1] == COMPILE_MODES[0]])
def test_a_batch_of_no_lists_or_of_empty_lists_has_zero_loss_and_zero_gradient(loss, mode,
                                                                                 shape):
    labels, scores = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    value, grad = loss_and_grad(lambda y, s: loss(y, s), labels, scores, mode)
    assert value == 0 and grad.shape == shape
    assert per_list(type(loss).from_config({**loss.get_config(), "reduction": None}),
                    labels, scores).shape == (shape[0],)


@pytest.mark.parametrize("loss", registered(keras.losses.Loss), ids=lambda l: type(l).__name__)
def test_a_nan_label_on_a_real_document_makes_its_list_nan_not_padding(loss, rng):
    labels, scores = random_batch(rng, batch=3, list_size=6, pad_fraction=0.0)
    labels[:, 0] = 2.0
    labels[0, 3] = np.nan
    # Op by op on JAX too: its three calls on one shape share each primitive's compile (jitted,
    # each compiles on its own: 12.4 -> 17.3 s CPU for the registered losses).
    values = to_numpy(loss.call(labels, scores))
    assert np.isnan(values[0]) and np.all(np.isfinite(values[1:]))
    assert np.isnan(float(to_numpy(loss(labels, scores))))
    masked = {"labels": labels, "mask": ~np.isnan(labels)}  # masked out, a NaN label is padding
    assert np.all(np.isfinite(to_numpy(loss.call(masked, scores))))


# TensorFlow's XLA mode checks these two through `model.fit` for every loss, as the trainer runs
# them (tests/test_fit_variable_lists.py): here the other modes, and jit on JAX.
MODES_BESIDE_FIT = [mode for mode in COMPILE_MODES if mode != "xla"]


@pytest.mark.parametrize("loss, mode", registered_losses_in_modes(MODES_BESIDE_FIT,
                                                                 MODES_BESIDE_FIT[:1]))
def test_a_nan_score_on_a_real_document_makes_its_list_and_the_mean_nan(loss, mode, rng):
    """So `keras.callbacks.TerminateOnNaN` sees it: no loss may hide a NaN score as 0."""
    labels, scores = random_batch(rng, batch=3, list_size=6, pad_fraction=0.0)
    labels[:, 0], labels[:, 1] = 2.0, 0.0
    scores[0, 3] = np.nan
    values = per_list(type(loss).from_config({**loss.get_config(), "reduction": None}),
                      labels, scores)
    assert np.isnan(values[0]) and np.all(np.isfinite(values[1:]))
    value, _ = loss_and_grad(lambda y, s: loss(y, s), labels, scores, mode)
    assert np.isnan(value)


@pytest.mark.parametrize("loss, mode", registered_losses_in_modes(MODES_BESIDE_FIT,
                                                                 MODES_BESIDE_FIT[:1]))
def test_a_list_whose_labels_are_all_equal_has_no_loss_and_no_gradient(loss, mode, rng):
    """Every order of such a list is ideal: it has nothing to teach, whatever its labels."""
    labels, scores = random_batch(rng, batch=4, list_size=6, pad_fraction=0.0)
    labels[:, 0], labels[:, 1] = 2.0, 0.0
    equal = np.array([[1.0] * 6, [3.0] * 4 + [-1.0] * 2, [0.0] * 6, [2.0] + [-1.0] * 5],
                     np.float32)
    value_and_grad = value_and_grad_function(lambda y, s: loss(y, s), mode)  # a trace a shape
    value, grad = value_and_grad(equal, scores)
    assert value == 0 and np.all(grad == 0)
    mixed_labels = np.concatenate([labels, equal])
    mixed_scores = np.concatenate([scores, rng.normal(size=scores.shape).astype(np.float32)])
    mixed, mixed_grad = value_and_grad(mixed_labels, mixed_scores)
    assert math.isclose(mixed, value_and_grad(labels, scores)[0], rel_tol=1e-5)
    assert np.all(mixed_grad[4:] == 0)


@pytest.mark.parametrize("name, params", [
    ("approx_ndcg", {}), ("approx_ndcg", {"topk": 2}), ("weighted_ranknet", {}),
    ("weighted_listmle", {"topk": 3})])
def test_labels_of_128_and_more_give_the_formula_not_nan(name, params, rng):
    """2^128 overflows float32: the gains are scaled per list, which NDCG's ratios cancel. Lists
    of 3 to 8 documents, one per offset, padded into one batch of the paper-formula test's shape
    (on JAX each new shape compiles every op of an eager call again)."""
    offsets = (60.0, 127.0, 150.0, 300.0, 1000.0)
    labels, scores = np.full((5, 8), -1.0, np.float32), np.zeros((5, 8), np.float32)
    for y, s, offset in zip(labels, scores, offsets):
        n = int(rng.integers(3, 9))
        y[:n] = (rng.permutation(n) + 2) / 2 + offset
        y[rng.integers(n)] = 0.0
        s[:n] = rng.normal(size=n)
    ours = per_list(losses.get(name, reduction=None, **params), labels, scores)
    for value, y, s, offset in zip(ours, labels, scores, offsets):
        real = y >= 0
        assert math.isclose(value, _reference(name, y[real].astype(float), s[real].astype(float),
                                              **params), rel_tol=2e-5, abs_tol=1e-6), offset


@pytest.mark.backend_neutral
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("loss", ALL_LOSSES, ids=IDS)
def test_half_precision_scores_give_float32_losses_close_to_float32(loss, dtype, rng):
    labels, scores = random_batch(rng, batch=4, list_size=10)
    half = keras.ops.cast(scores, dtype)
    reference = float(to_numpy(loss(labels, keras.ops.cast(half, "float32"))))
    value = loss(labels, half)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    assert math.isclose(float(to_numpy(value)), reference, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("loss", ALL_LOSSES, ids=IDS)
def test_lists_without_a_loss_do_not_dilute_the_mean(loss, rng):
    labels, scores = random_batch(rng, batch=3, list_size=6, pad_fraction=0.0)
    labels[:, 0] = 3.0
    labels[:, 1] = 0.0
    empty_labels = np.concatenate([labels, np.zeros((2, 6), np.float32),
                                   np.full((1, 6), -1.0, np.float32)])
    more_scores = np.concatenate([scores, rng.normal(size=(3, 6)).astype(np.float32)])
    mean = float(to_numpy(loss(labels, scores)))
    assert math.isclose(float(to_numpy(loss(empty_labels, more_scores))), mean, rel_tol=1e-6)
    assert math.isclose(mean, float(np.mean(per_list(loss, labels, scores))), rel_tol=1e-6)


@pytest.mark.parametrize("cls", [losses.GumbelApproxNDCGLoss, losses.YetiLogisticLoss,
                                 losses.CoupledRankDistilLoss])
def test_gumbel_samples_are_reproducible_for_a_seed_and_differ_between_seeds(cls, rng):
    """The noise is hashed from the scores and the seed (`tfapprox.losses.sampling`): one seed,
    one value; another seed or other scores, other samples. (Their expectation is TF-Ranking's:
    tests/test_parity_tfranking.py.)"""
    labels, scores = random_batch(rng, batch=4, list_size=8, pad_fraction=0.0)
    labels[:, 0], labels[:, 1] = 3.0, 0.0
    value = per_list(cls(seed=1, reduction=None), labels, scores)
    np.testing.assert_array_equal(per_list(cls(seed=1, reduction=None), labels, scores), value)
    assert not np.allclose(per_list(cls(seed=2, reduction=None), labels, scores), value)
    uniforms = to_numpy(sampling.uniforms(scores, 64, 1))
    assert 0.0 < uniforms.min() and uniforms.max() < 1.0 and abs(uniforms.mean() - 0.5) < 0.02


def test_reductions_and_list_weights(rng):
    labels, scores = random_batch(rng, batch=4, list_size=6, pad_fraction=0.0)
    labels[:, 0] = 2.0
    values = per_list(losses.ApproxNDCGLoss(), labels, scores)
    weights = np.array([1.0, 0.0, 2.0, 3.0], np.float32)
    weighted_mean = float(np.sum(values * weights) / np.sum(weights))
    assert math.isclose(float(to_numpy(losses.ApproxNDCGLoss()(labels, scores, weights))),
                        weighted_mean, rel_tol=1e-6)
    assert math.isclose(float(to_numpy(losses.ApproxNDCGLoss()(labels, scores,
                                                               weights[:, None]))),
                        weighted_mean, rel_tol=1e-6)
    total = losses.ApproxNDCGLoss(reduction="sum")(labels, scores)
    assert math.isclose(float(to_numpy(total)), float(np.sum(values)), rel_tol=1e-6)
    assert to_numpy(losses.ApproxNDCGLoss(reduction=None)(labels, scores)).shape == (4,)
    with pytest.raises(ValueError, match="one weight per list"):
        losses.ApproxNDCGLoss()(labels, scores, np.ones((4, 6), np.float32))


def test_scores_may_carry_a_trailing_unit_axis(rng):
    labels, scores = random_batch(rng)
    loss = losses.ApproxAPLoss(reduction=None)
    np.testing.assert_allclose(to_numpy(loss(labels, scores[..., None])),
                               to_numpy(loss(labels, scores)), rtol=1e-7)


@pytest.mark.backend_neutral  # constructors' argument checks: Python
@pytest.mark.parametrize("make, message", [
    (lambda: losses.ApproxNDCGLoss(alpha=0.0), "`alpha` must be a finite number > 0; got 0.0"),
    (lambda: losses.ApproxNDCGLoss(alpha=float("inf")), "`alpha`"),
    (lambda: losses.ApproxNDCGLoss(topk=0), "`topk` must be None or an int >= 1; got 0"),
    (lambda: losses.ApproxNDCGLoss(beta="10"), "`beta`"),
    (lambda: losses.ApproxPrecisionLoss(k=None), "`k` must be an int >= 1; got None"),
    (lambda: losses.ApproxAPLoss(relevance_threshold=float("nan")), "`relevance_threshold`"),
    (lambda: losses.ListMLELoss(seed=1.5), "`seed` must be an int"),
    (lambda: losses.RankNetLoss(reduction="avg"), "`reduction` must be one of"),
    (lambda: losses.ApproxAPLoss(pairwise="sparse"), "`pairwise` must be one of"),
    (lambda: losses.get("lambdamart"), "unknown loss 'lambdamart'"),
])
def test_bad_arguments_are_named_in_the_error(make, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        make()


def test_bad_shapes_are_named_in_the_error():
    loss = losses.ApproxNDCGLoss()
    with pytest.raises(ValueError, match=r"y_true \(labels\) has shape \(2, 3\) but y_pred "
                                         r"\(scores\) has shape \(2, 4\)"):
        loss(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"must have shape \[batch, list_size\]"):
        loss(np.zeros((3,), np.float32), np.zeros((3,), np.float32))
    with pytest.raises(ValueError, match="needs the key 'labels'"):
        loss({"label": np.zeros((2, 3))}, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"y_true\['mask'\] has shape \(2, 2\)"):
        loss({"labels": np.zeros((2, 3)), "mask": np.ones((2, 2), bool)},
             np.zeros((2, 3), np.float32))


@pytest.mark.backend_neutral
@pytest.mark.parametrize("loss", ALL_LOSSES, ids=IDS)
def test_config_round_trip_and_keras_lookup(loss, rng):
    labels, scores = random_batch(rng)
    config = keras.losses.serialize(loss)
    rebuilt = keras.losses.deserialize(config)
    assert type(rebuilt) is type(loss) and rebuilt.get_config() == loss.get_config()
    np.testing.assert_allclose(to_numpy(rebuilt(labels, scores)), to_numpy(loss(labels, scores)))
    assert type(keras.losses.get(config)) is type(loss)
    assert config["registered_name"] == f"tfapprox>{type(loss).__name__}"


@pytest.mark.backend_neutral
def test_get_builds_each_loss_by_name():
    for name, cls in losses.LOSSES.items():
        assert type(losses.get(name, **REQUIRED_ARGS.get(cls.__name__, {}))) is cls


# TF-Ranking 0.5.5's public Keras loss and lambda-weight classes (tfr.keras.losses), and its
# RankingLossKey strings.
TFRANKING_LOSS_CLASSES = [
    "PairwiseHingeLoss", "PairwiseLogisticLoss", "PairwiseSoftZeroOneLoss", "PairwiseMSELoss",
    "YetiLogisticLoss", "SoftmaxLoss", "CalibratedSoftmaxLoss", "UniqueSoftmaxLoss", "ListMLELoss",
    "ApproxMRRLoss", "ApproxNDCGLoss", "GumbelApproxNDCGLoss", "ClickEMLoss", "MixtureEMLoss",
    "SigmoidCrossEntropyLoss", "MeanSquaredLoss", "OrdinalLoss", "CoupledRankDistilLoss"]
TFRANKING_LAMBDA_WEIGHTS = [
    "LabelDiffLambdaWeight", "DCGLambdaWeight", "NDCGLambdaWeightV2", "YetiDCGLambdaWeight",
    "NDCGLambdaWeight", "PrecisionLambdaWeight", "ListMLELambdaWeight"]
TFRANKING_LOSS_KEYS = [
    "pairwise_hinge_loss", "pairwise_logistic_loss", "pairwise_soft_zero_one_loss",
    "pairwise_mse_loss", "yeti_logistic_loss", "softmax_loss", "calibrated_softmax_loss",
    "unique_softmax_loss", "sigmoid_cross_entropy_loss", "mean_squared_loss", "ordinal_loss",
    "list_mle_loss", "approx_ndcg_loss", "approx_mrr_loss", "gumbel_approx_ndcg_loss",
    "coupled_rankdistil_loss"]


def _migration_rows(heading):
    """The first cells of the table rows under `## heading` in docs/migrating.md."""
    text = (REPO / "docs" / "migrating.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return {line.split("|")[1].strip().strip("`") for line in section.splitlines()
            if line.startswith("| `")}


@pytest.mark.backend_neutral
def test_every_tfranking_loss_and_lambda_weight_has_a_migration_row():
    assert set(TFRANKING_LOSS_CLASSES) <= _migration_rows("Losses")
    assert set(TFRANKING_LAMBDA_WEIGHTS) <= _migration_rows("Lambda weights")
    for name in TFRANKING_LAMBDA_WEIGHTS:
        assert isinstance(getattr(losses, name)(**({"topn": 3} if "Precision" in name else {})),
                          losses.lambda_weights.LambdaWeight)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("key", TFRANKING_LOSS_KEYS)
def test_get_takes_every_tfranking_loss_key_with_its_arguments(key):
    loss = losses.get(key, reduction="auto", lambda_weight=None, name=None)
    assert loss.reduction == "sum_over_batch_size"
    if key in ("softmax_loss", "pairwise_hinge_loss", "list_mle_loss"):
        weight = (losses.ListMLELambdaWeight() if key == "list_mle_loss"
                  else losses.NDCGLambdaWeight(topn=5))
        assert losses.get(key, lambda_weight=weight, temperature=0.5).lambda_weight is weight


PAIRWISE_LOSSES = {  # pairwise -> a loss whose pair sums are dense or blocked as it says
    "approx_ndcg@3": lambda pairwise: losses.ApproxNDCGLoss(topk=3, pairwise=pairwise),
    "approx_ap": lambda pairwise: losses.ApproxAPLoss(alpha=3.0, pairwise=pairwise),
    "weighted_ranknet@2": lambda pairwise: losses.WeightedRankNetLoss(topk=2, pairwise=pairwise),
}


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("name", sorted(PAIRWISE_LOSSES))
def test_pairs_summed_in_blocks_give_the_dense_loss_and_gradient(name, mode, rng):
    """Blocks of 4 columns over lists of 11 (the last block padded), with padded documents, NaN
    in a padded slot and, in the last list, score gaps up to 2e4."""
    labels, scores = random_batch(rng, batch=4, list_size=11, pad_fraction=0.3)
    labels[:, 0], labels[:, -1] = 3.0, -1.0
    scores[:, -1], scores[-1] = np.nan, rng.uniform(-1e4, 1e4, size=11)
    dense = loss_and_grad(PAIRWISE_LOSSES[name]("dense"), labels, scores, mode)
    with using(PairPlan(pair_block=4)):
        blocked = loss_and_grad(PAIRWISE_LOSSES[name]("blocked"), labels, scores, mode)
    assert np.isfinite(blocked[0]) and np.all(np.isfinite(blocked[1]))
    for ours, expected in zip(blocked, dense):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [mode for mode in COMPILE_MODES if mode != "eager"])
def test_auto_blocks_by_list_size_when_it_is_known_only_at_run_time(mode, rng):
    """Above blocked_above = 8, lists of 13 are summed in blocks of 4 and lists of 6 densely; on
    TensorFlow one graph traced for [None, None] inputs chooses with ops.cond, when it runs, for
    both. (Eager, the list size is always known:
    `test_auto_sums_pairs_in_blocks_above_blocked_above`.)"""
    batches = []
    for list_size in (6, 13):
        labels, scores = random_batch(rng, batch=3, list_size=list_size, pad_fraction=0.2)
        labels[:, 0] = 2.0
        batches.append((labels, scores))
    for name in ("approx_ap", "weighted_ranknet@2"):
        with using(PairPlan(pair_block=4, blocked_above=8)):
            auto = value_and_grad_function(PAIRWISE_LOSSES[name]("auto"), mode,
                                           unknown_shape=True)
            for labels, scores in batches:
                dense = loss_and_grad(PAIRWISE_LOSSES[name]("dense"), labels, scores)
                for ours, expected in zip(auto(labels, scores), dense):
                    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5,
                                               err_msg=f"{name}, lists of {labels.shape[1]}")


# --- Reference formulas, written as plain loops over one list ----------------------------------

def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _approx_ranks(s, alpha):
    return np.array([1 + sum(_sigmoid(alpha * (s[y] - s[x])) for y in range(len(s)) if y != x)
                     for x in range(len(s))])


def _ideal_dcg(y, k=None):
    gains = np.sort(2.0 ** y - 1)[::-1]
    k = len(y) if k is None else k
    return sum(g / np.log2(2 + i) for i, g in enumerate(gains[:k]))


def _ranknet(y, s, weight):
    return sum(weight[i] * np.log1p(np.exp(-(s[i] - s[j])))
               for i in range(len(y)) for j in range(len(y)) if y[i] > y[j])


def _listmle(y, s, weight):
    order = np.argsort(-y, kind="stable")
    total = 0.0
    for pos, doc in enumerate(order):
        rest = s[order[pos:]]
        total += weight(pos + 1, doc) * (-s[doc] + np.log(np.sum(np.exp(rest))))
    return total


def _reference(name, y, s, alpha=10.0, beta=10.0, k=3, topk=None):
    r = (y >= 1).astype(float)
    ranks = _approx_ranks(s, alpha)
    if name == "approx_ndcg":
        cut = np.ones_like(ranks) if topk is None else _sigmoid(beta * (topk + 0.5 - ranks))
        return -sum((2 ** y - 1) / np.log2(1 + ranks) * cut) / _ideal_dcg(y, topk)
    if name == "approx_ap":
        ap = 0.0
        for yy in range(len(y)):
            before = sum(r[x] * _sigmoid(beta * (ranks[yy] - ranks[x]))
                         for x in range(len(y)) if x != yy)
            ap += r[yy] / ranks[yy] * (1 + before)
        return -ap / r.sum()
    if name == "approx_precision":
        return -sum(r * _sigmoid(beta * (k + 0.5 - ranks))) / k
    best = np.array([1 + np.sum(y > y[i]) for i in range(len(y))])
    chen = lambda p, doc: ((2 ** y[doc] - 1) / np.log2(1 + p)  # noqa: E731
                           * (1.0 if topk is None or p <= topk else 0.0))
    if name == "ranknet":
        return _ranknet(y, s, np.ones(len(y)))
    if name == "weighted_ranknet":
        return _ranknet(y, s, [chen(best[i], i) for i in range(len(y))]) / _ideal_dcg(y, topk)
    if name == "listmle":
        return _listmle(y, s, lambda p, doc: 1.0)
    if name == "weighted_listmle":
        return _listmle(y, s, chen) / _ideal_dcg(y, topk)
    raise KeyError(name)


@pytest.mark.parametrize("name, params", [
    ("approx_ndcg", {}), ("approx_ndcg", {"alpha": 3.0, "topk": 2, "beta": 4.0}),
    ("approx_ap", {"alpha": 5.0, "beta": 2.0}), ("approx_precision", {"k": 3}),
    ("ranknet", {}), ("weighted_ranknet", {}), ("weighted_ranknet", {"topk": 2}),
    ("listmle", {}), ("weighted_listmle", {}), ("weighted_listmle", {"topk": 3}),
])
def test_matches_the_paper_formula_written_as_loops(name, params, rng):
    """Five lists of 2 to 8 documents, padded into one batch of lists of 8."""
    labels, scores = np.full((5, 8), -1.0, np.float32), np.zeros((5, 8), np.float32)
    for y, s in zip(labels, scores):
        n = int(rng.integers(2, 9))
        y[:n] = rng.permutation(n) % 4  # some ties for the pairwise losses
        if name.endswith("listmle"):
            y[:n] = (rng.permutation(n) + 2) / 2  # no ties: a unique order
        y[0] = max(y[0], 1.0)
        s[:n] = rng.normal(size=n)
    ours = per_list(losses.get(name, reduction=None, **params), labels, scores)
    for value, y, s in zip(ours, labels, scores):
        real = y >= 0
        assert math.isclose(value, _reference(name, y[real].astype(float),
                                              s[real].astype(float), **params),
                            rel_tol=2e-5, abs_tol=1e-6)


def _neural_ndcg(y, s, temperature, topk, iterations):
    """NeuralNDCG of one list as allRank computes it (NeuralSort, Sinkhorn, NDCG@k), in numpy."""
    n = len(s)
    spread = np.abs(s[:, None] - s[None, :]).sum(axis=1)
    logits = ((n + 1 - 2 * np.arange(1, n + 1))[:, None] * s[None, :] - spread[None, :])
    logits = logits / temperature
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = p / p.sum(axis=1, keepdims=True)
    for _ in range(iterations):
        p = p / p.sum(axis=1, keepdims=True)
        p = p / p.sum(axis=0, keepdims=True)
    k = n if topk is None else min(topk, n)
    dcg = sum((p[i] @ (2.0 ** y - 1)) / np.log2(2 + i) for i in range(k))
    return -dcg / _ideal_dcg(y, topk)


@pytest.mark.parametrize("params", [{}, {"temperature": 0.5, "topk": 3, "sinkhorn_iterations": 7}])
def test_neural_ndcg_is_allranks_formula_and_tends_to_minus_ndcg(params, rng):
    labels, scores = random_batch(rng, batch=5, list_size=8, pad_fraction=0.3)
    labels[:, 0] = 2.0
    ours = per_list(losses.NeuralNDCGLoss(reduction=None, **params), labels, scores)
    for value, y, s in zip(ours, labels, scores):
        real = y >= 0
        if len(set(y[real])) > 1:
            expected = _neural_ndcg(y[real].astype(float), s[real].astype(float),
                                    params.get("temperature", 1.0), params.get("topk"),
                                    params.get("sinkhorn_iterations", 50))
            assert math.isclose(value, expected, rel_tol=1e-4, abs_tol=1e-5)
    sharp = per_list(losses.NeuralNDCGLoss(temperature=1e-3, reduction=None), labels, scores)
    exact = per_list(losses.ApproxNDCGLoss(alpha=1e4, reduction=None), labels, scores)
    np.testing.assert_allclose(sharp, exact, atol=1e-4)


def _sorted_gains_by_autodiff(scores, mask, gains, temperature, iterations):
    """`neural_sort.sorted_gains` as autodiff differentiates it: NeuralSort's P̂ written out
    densely, then each Sinkhorn round divides the matrix itself, so a gradient keeps every
    round's matrices (O(T·L²) memory)."""
    real = ops.cast(mask, "float32")
    count = ops.sum(real, axis=-1, keepdims=True)
    positions = ops.cast(ops.arange(1, ops.shape(scores)[1] + 1), "float32")
    spread = ops.sum(ops.abs(direct_ops.pair_differences(scores)) * ops.expand_dims(real, 1), -1)
    weights = count + 1.0 - 2.0 * positions
    logits = ops.matmul(ops.stack([weights, ops.ones_like(weights)], axis=-1) / temperature,
                        ops.stack([scores, -spread], axis=1))
    logits = ops.where(ops.expand_dims(mask, 1), logits, rank_ops.LOWEST_FLOAT32)
    rows = ops.cast(positions <= count, "float32")
    matrix = ops.softmax(logits, axis=-1) * ops.expand_dims(rows, -1) * ops.expand_dims(real, 1)

    def scale(_, current):
        current = rank_ops.safe_divide(current, ops.sum(current, axis=2, keepdims=True))
        return rank_ops.safe_divide(current, ops.sum(current, axis=1, keepdims=True))

    matrix = direct_ops.for_each_index(iterations, scale, matrix)
    return ops.sum(matrix * ops.expand_dims(gains, 1), axis=-1)


@pytest.mark.parametrize("params", [{}, {"temperature": 0.3, "topk": 3, "sinkhorn_iterations": 5},
                                    {"temperature": 0.05, "sinkhorn_iterations": 20}])
def test_neural_ndcg_gradient_is_autodiffs_through_every_sinkhorn_round(params, rng,
                                                                        monkeypatch):
    """In every mode, against autodiff through the rounds in the first mode (one reference)."""
    labels, scores = random_batch(rng, batch=5, list_size=12, pad_fraction=0.3)
    labels[:, 0] = 2.0
    loss = losses.NeuralNDCGLoss(**params)
    # compiled, for the trainer's [None, None] lists
    ours = {mode: loss_and_grad(lambda y, s: loss(y, s), labels, scores, mode, mode != "eager")
            for mode in COMPILE_MODES}
    monkeypatch.setattr(neural_sort, "sorted_gains", _sorted_gains_by_autodiff)
    expected, expected_grad = loss_and_grad(lambda y, s: loss(y, s), labels, scores)
    for mode, (value, grad) in ours.items():
        assert math.isclose(value, expected, rel_tol=1e-6), (mode, value, expected)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5,
                                   atol=1e-5 * np.abs(expected_grad).max(), err_msg=mode)


@pytest.mark.skipif(backend() != "jax", reason="reads XLA's memory plan through JAX")
def test_neural_ndcg_gradient_keeps_no_matrix_per_sinkhorn_round():
    """The temporaries XLA plans for the gradient of one list of 400: a few [L, L] tensors
    whatever the rounds (autodiff through the rounds planned 19 at 5 rounds, 132 at 50)."""
    import jax

    labels, scores = random_batch(np.random.default_rng(0), batch=1, list_size=400,
                                  pad_fraction=0.0)

    def planned_matrices(iterations):
        loss = losses.NeuralNDCGLoss(sinkhorn_iterations=iterations)
        step = jax.jit(jax.grad(lambda s, y: loss(y, s)))
        plan = step.lower(scores, labels).compile().memory_analysis()
        return plan.temp_size_in_bytes / (4 * 400 ** 2)

    few, many = planned_matrices(5), planned_matrices(50)
    assert many < 6 and many - few < 1, (few, many)



@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_neural_ndcg_in_row_blocks_is_autodiffs(mode, rng, monkeypatch):
    """Lists longer than `neural_sort.ROW_BLOCK` (5 here: lists of 12 in blocks 0-4, 5-9 and
    7-11, whose last overlaps the one before) give autodiff's loss and gradient; on JAX in both
    forms of the Sinkhorn rounds (`short_sinkhorn_on_jax_up_to`: short lists' and longer ones')."""
    labels, scores = random_batch(rng, batch=5, list_size=12, pad_fraction=0.3)
    labels[:, 0] = 2.0
    loss = losses.NeuralNDCGLoss(temperature=0.3, sinkhorn_iterations=5)
    monkeypatch.setattr(neural_sort, "ROW_BLOCK", 5)
    plans = [PairPlan()] + ([PairPlan(short_sinkhorn_on_jax_up_to=0)] if backend() == "jax"
                            else [])
    ours = []
    for plan in plans:
        with using(plan):
            ours.append(loss_and_grad(lambda y, s: loss(y, s), labels, scores, mode,
                                      mode != "eager"))
    monkeypatch.setattr(neural_sort, "sorted_gains", _sorted_gains_by_autodiff)
    expected, expected_grad = loss_and_grad(lambda y, s: loss(y, s), labels, scores, mode, False)
    for plan, (value, grad) in zip(plans, ours):
        assert math.isclose(value, expected, rel_tol=1e-6), plan
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5,
                                   atol=1e-5 * np.abs(expected_grad).max(), err_msg=str(plan))


@pytest.mark.skipif(backend() != "jax", reason="reads XLA's memory plan through JAX")
def test_neural_ndcg_gradient_of_a_long_list_keeps_about_two_matrices(monkeypatch):
    """The temporaries XLA plans for the gradient of one list of 400 in blocks of 100 rows:
    P̂'s softmax and the logits it is made from, and blocks (3.1 [L, L] tensors before)."""
    import jax

    monkeypatch.setattr(neural_sort, "ROW_BLOCK", 100)
    labels, scores = random_batch(np.random.default_rng(0), batch=1, list_size=400,
                                  pad_fraction=0.0)
    step = jax.jit(jax.grad(lambda s, y: losses.NeuralNDCGLoss()(y, s)))
    plan = step.lower(scores, labels).compile().memory_analysis()
    assert plan.temp_size_in_bytes / (4 * 400 ** 2) < 2.6, plan.temp_size_in_bytes

# --- OrdinalLoss: K logits per document, [B, L, K] -----------------------------------------------

def _ordinal_reference(y, logits, fraction):
    """Per list: the mean over documents of Σ_j sigmoid cross-entropy against 1{y ≥ j} (or the
    clipped fraction), written as loops."""
    total = 0.0
    for label, row in zip(y, logits):
        for j, s in enumerate(row, start=1):
            target = min(max(label - j + 1, 0.0), 1.0) if fraction else float(label >= j)
            total += -target * np.log(_sigmoid(s)) - (1 - target) * np.log(1 - _sigmoid(s))
    return total / len(y)


@pytest.mark.parametrize("fraction", [False, True])
def test_ordinal_loss_is_the_formula_and_padding_takes_no_part(fraction, rng):
    """K = 3 logits per document; labels 0..4 with fractions; padded slots on both sides hold
    NaN, inf and huge logits: the same values, zero gradient there (padding in the dict form
    too)."""
    loss = losses.OrdinalLoss(ordinal_size=3, use_fraction_label=fraction, reduction=None)
    labels = rng.integers(0, 5, size=(4, 6)).astype(np.float32)
    labels[:, :3] += rng.uniform(0, 1, size=(4, 3)).astype(np.float32)
    labels[:, 0], labels[:, 1] = 0.0, 2.5
    logits = rng.normal(scale=2.0, size=(4, 6, 3)).astype(np.float32)
    ours = per_list(loss, labels, logits)
    for value, y, s in zip(ours, labels.astype(float), logits.astype(float)):
        assert math.isclose(value, _ordinal_reference(y, s, fraction), rel_tol=1e-5)
    pad = rng.normal(scale=1e3, size=(4, 2, 3)).astype(np.float32)
    pad[0, 0, 0], pad[1, 1, 2], pad[2, 0, 1] = np.nan, np.inf, -np.inf
    padded_labels = np.concatenate([-np.ones((4, 1)), labels, -np.ones((4, 1))], 1)
    padded_logits = np.concatenate([pad[:, :1], logits, pad[:, 1:]], axis=1)
    value, grad = loss_and_grad(lambda y, s: loss.call(y, s), labels, logits, COMPILE_MODES[-1])
    padded_value, padded_grad = loss_and_grad(lambda y, s: loss.call(y, s), padded_labels,
                                              padded_logits, COMPILE_MODES[-1])
    np.testing.assert_allclose(padded_value, value, rtol=1e-6)
    np.testing.assert_allclose(padded_grad[:, 1:-1], grad, rtol=1e-5, atol=1e-7)
    assert np.all(padded_grad[:, [0, -1]] == 0)
    as_dict = {"labels": np.maximum(padded_labels, 0.0), "mask": padded_labels >= 0}
    np.testing.assert_allclose(per_list(loss, as_dict, padded_logits), ours, rtol=1e-6)


def test_ordinal_loss_shapes_config_and_score(rng):
    """K = 1 takes `[B, L]` scores too; another width is named in the error; the config keeps
    `ordinal_size` and `use_fraction_label`; the expected label ranks."""
    labels, scores = random_batch(rng, batch=4, list_size=6)  # the shapes above: JAX's caches
    labels[:, 0] = 2.0
    one = losses.get("ordinal_loss", reduction=None)
    np.testing.assert_allclose(per_list(one, labels, scores),
                               per_list(one, labels, scores[..., None]), rtol=1e-6)
    with pytest.raises(ValueError, match=r"must have shape \[batch, list_size, 2\] \(2 outputs "
                                         r"per document\); got shape \(4, 6, 3\)"):
        losses.OrdinalLoss(ordinal_size=2)(labels, np.zeros((4, 6, 3), np.float32))
    with pytest.raises(ValueError, match="`ordinal_size` must be an int >= 1; got 0"):
        losses.OrdinalLoss(ordinal_size=0)
    loss = losses.get("ordinal_loss", ordinal_size=2, use_fraction_label=True)
    rebuilt = losses.OrdinalLoss.from_config(loss.get_config())  # keras lookup: registered
    assert (rebuilt.ordinal_size, rebuilt.use_fraction_label) == (2, True)
    logits = np.array([[[3.0, 3.0], [3.0, -3.0], [-3.0, -3.0]]], np.float32)
    np.testing.assert_allclose(to_numpy(losses.OrdinalLoss.expected_labels(logits)),
                               [[1.905148, 1.0, 0.094852]], rtol=1e-5)


def test_ordinal_loss_takes_ragged_logits():
    """`ragged=True`: labels `[B, (L)]` and logits `[B, (L), K]` give the padded values."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("ragged tensors are TensorFlow's")
    import tensorflow as tf

    labels = tf.ragged.constant([[2.0, 0.0, 1.0], [1.0, 0.0]])
    logits = tf.ragged.constant([[[0.6, 0.2], [0.8, 0.3], [-1.0, 0.5]], [[0.0, -0.2], [1.0, 2.0]]],
                                ragged_rank=1)
    ragged = losses.OrdinalLoss(ordinal_size=2, reduction=None, ragged=True)
    padded = losses.OrdinalLoss(ordinal_size=2, reduction=None)
    np.testing.assert_allclose(to_numpy(ragged(labels, logits)),
                               to_numpy(padded(labels.to_tensor(-1.0), logits.to_tensor())),
                               rtol=1e-6)


@pytest.mark.backend_neutral
def test_every_loss_constructor_shows_ragged_in_its_signature():
    """`RankingLoss.__init_subclass__` adds the keyword `ragged` to every constructor."""
    import inspect

    for cls in (losses.OrdinalLoss, losses.SoftmaxLoss, losses.ApproxNDCGLoss):
        parameter = inspect.signature(cls).parameters["ragged"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is False


# The Gumbel-sampled losses stay finite, value and gradient, for any finite scores. 0.50243497
# is a score whose hashed uniform for sample 0 (seed None) has its top bits all ones:
# before the fix that uniform was (2^24 − ½)/2^24, which rounds to 1 in float32, its Gumbel noise
# −ln(−ln 1) = +∞ and the loss and gradient NaN (1 draw in 2^24: the B64 YetiLogisticLoss run on
# YAHOO Fold2 drew one in epoch 16). ±3e38 with τ = ½ overflowed (s + g)/τ before the scores were
# shifted by their maximum.
TOP_UNIFORM_SCORE = 0.50243497  # its sample-0 uniform is the largest one (k = all ones)
EXTREME_LABELS = np.array([[2.0, 1.0, 0.0, 1.0, -1.0],
                   [1.0, 0.0, 2.0, 0.0, -1.0]], np.float32)
EXTREME_SCORES = np.array([[TOP_UNIFORM_SCORE, 0.1, -0.3, 0.7, 0.0],
                   [3e38, -3e38, 1e30, 0.0, 3e38]], np.float32)  # the last column is padding

EXTREME_GUMBEL_LOSSES = [
    losses.YetiLogisticLoss(gumbel_temperature=0.5),
    losses.GumbelApproxNDCGLoss(gumbel_temperature=0.5),
]


def test_uniforms_stay_below_one_at_the_top_of_the_hash():
    u = to_numpy(sampling.uniforms(np.array([[TOP_UNIFORM_SCORE]], np.float32), 1, None))
    assert 0.0 < u.min() and u.max() < 1.0 and u.max() > 1.0 - 2.0 ** -23


@pytest.mark.parametrize("loss", EXTREME_GUMBEL_LOSSES, ids=lambda loss: type(loss).__name__)
def test_gumbel_losses_are_finite_at_extreme_uniforms_and_scores(loss):
    value, grad = loss_and_grad(loss, EXTREME_LABELS, EXTREME_SCORES)
    assert np.isfinite(value) and np.all(np.isfinite(grad)), (value, grad)
    assert np.all(grad[:, -1] == 0.0)  # padding takes no gradient
