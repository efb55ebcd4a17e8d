"""Parity with Rax 0.4 on the JAX backend: the losses Rax also has give Rax's own values and
gradients per list, on random padded lists (our padding: label −1; Rax's: `where=mask`).

Each comparison takes Rax's per-list values (`reduce_fn=None`; a pairwise loss's pair losses,
`[B, L·L]`, summed over the list) and the gradient of their sum, both jitted; lists whose real
labels are all equal have no loss in tfapprox and are left out. Where a convention differs, the
third entry of a case scales ours (values and gradients) to give Rax's:

- `SoftmaxLoss`: Rax's default `label_fn` keeps the labels unnormalised,
  −Σ_i y_i·ln softmax(s)_i; ours (and TF-Ranking's per list) divides by Σ_i y_i:
  Rax = ours · Σ_i y_i.
- DCG-family lambda weights: Rax, like TF-Ranking, scales them by the padded list size L, ours by
  the real documents n: Rax = ours · L/n. `rax.dcg_lambdaweight(normalize=True)` is
  `NDCGLambdaWeight(smooth_fraction=1)` (LambdaRank's |ΔNDCG|), `rax.dcg2_lambdaweight
  (normalize=True)` is `NDCGLambdaWeightV2` (NDCG-Loss2++, with Jagerman et al.'s top-n weights)
  and, without `topn`, `NDCGLambdaWeight()` (NDCG-Loss2); `rax.labeldiff_lambdaweight` is
  `LabelDiffLambdaWeight`. Rax has no lambda weights for softmax or ListMLE.
- `ListMLELoss`: the same per list, compared on labels without ties (Rax breaks ties by a key or
  by list order, ours by a seeded hash).
- `ApproxNDCGLoss(alpha=a)` is `-rax.approx_t12n(rax.ndcg_metric, temperature=1/a)`.
- Gumbel sampling: `rax.gumbel_t12n(..., smoothing_factor=1e-20)` is our transform ln(softmax(s + g)
  + 1e-20) of `GumbelApproxNDCGLoss`; Rax draws g from `jax.random`, ours hashes it from the scores
  and the seed, so the two means over many samples agree within their standard error, and ours
  is the same for a seed.
Reductions differ too (Rax's default `jnp.mean` averages over lists, or over the valid pairs of
the whole batch for a pairwise loss; ours over the lists that have a loss) and are not compared.
"""

import functools
import math
import types

import keras
import numpy as np
import pytest

from conftest import to_numpy
from tfapprox import losses
from tfapprox import ops as rank_ops

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax",
                                reason="Rax is a JAX library: the JAX pass runs these")

BATCH, LIST_SIZE = 6, 9
GUMBEL_SAMPLES = 2000


@pytest.fixture(scope="module")
def rax():
    """Rax 0.4, which calls `jax.util.wraps` (gone from current JAX): a stand-in is supplied."""
    import jax

    if not hasattr(getattr(jax, "util", None), "wraps"):
        def wraps(wrapped, namestr=None, docstr=None, **_):
            return functools.wraps(wrapped)

        jax.util = types.SimpleNamespace(wraps=wraps)
    return pytest.importorskip("rax")


@pytest.fixture(scope="module")
def lists():
    """Padded lists with graded labels 0..3 (ties), their labels without ties, and scores."""
    rng = np.random.default_rng(29)
    real = rng.random((BATCH, LIST_SIZE)) > 0.3
    real[:, :2] = True
    labels = rng.integers(0, 4, size=(BATCH, LIST_SIZE)).astype(np.float32)
    labels[:, 0], labels[:, 1] = 3.0, 0.0
    labels[-1] = 2.0  # a list whose labels are all equal: no loss in tfapprox
    distinct = np.stack([rng.permutation(LIST_SIZE) for _ in range(BATCH)]).astype(np.float32)
    scores = rng.normal(size=(BATCH, LIST_SIZE)).astype(np.float32)
    return (np.where(real, labels, -1.0), np.where(real, distinct, -1.0),
            np.where(real, scores, rng.normal(scale=1e3, size=real.shape)).astype(np.float32))


def _sum_over_pairs(values):
    """Sums Rax's unreduced pair losses, `[B, L·L]`, over each list."""
    return values.sum(axis=-1)


def _cases(rax):
    """name -> (our loss, Rax's per-list function of (scores, labels, where), scale of ours)."""
    def lambda_weighted(weight_fn):
        return lambda s, y, where: _sum_over_pairs(rax.pairwise_logistic_loss(
            s, y, where=where, lambdaweight_fn=weight_fn, reduce_fn=None))

    size_ratio = "L/n"
    return {
        "softmax": (losses.SoftmaxLoss(), lambda s, y, where: rax.softmax_loss(
            s, y, where=where, reduce_fn=None), "sum of labels"),
        "pairwise_hinge": (losses.PairwiseHingeLoss(), lambda s, y, where: _sum_over_pairs(
            rax.pairwise_hinge_loss(s, y, where=where, reduce_fn=None)), None),
        "pairwise_logistic": (losses.PairwiseLogisticLoss(), lambda_weighted(None), None),
        "pairwise_soft_zero_one": (
            losses.PairwiseSoftZeroOneLoss(), lambda s, y, where: _sum_over_pairs(
                rax.pairwise_soft_zero_one_loss(s, y, where=where, reduce_fn=None)), None),
        "label_diff": (losses.PairwiseLogisticLoss(lambda_weight=losses.LabelDiffLambdaWeight()),
                       lambda_weighted(rax.labeldiff_lambdaweight), None),
        "dcg_top3": (losses.PairwiseLogisticLoss(lambda_weight=losses.NDCGLambdaWeight(
            topn=3, smooth_fraction=1.0)), lambda_weighted(functools.partial(
                rax.dcg_lambdaweight, topn=3, normalize=True)), size_ratio),
        "dcg2": (losses.PairwiseLogisticLoss(lambda_weight=losses.NDCGLambdaWeight()),
                 lambda_weighted(functools.partial(rax.dcg2_lambdaweight, normalize=True)),
                 size_ratio),
        "dcg2_top3": (losses.PairwiseHingeLoss(lambda_weight=losses.NDCGLambdaWeightV2(topn=3)),
                      lambda s, y, where: _sum_over_pairs(rax.pairwise_hinge_loss(
                          s, y, where=where, reduce_fn=None, lambdaweight_fn=functools.partial(
                              rax.dcg2_lambdaweight, topn=3, normalize=True))), size_ratio),
        "listmle": (losses.ListMLELoss(), lambda s, y, where: rax.listmle_loss(
            s, y, where=where, reduce_fn=None), None),
        "approx_ndcg": (losses.ApproxNDCGLoss(alpha=10.0), lambda s, y, where: rax.approx_t12n(
            rax.ndcg_metric, temperature=0.1)(s, y, where=where, reduce_fn=None), None),
    }


CASES = ["softmax", "pairwise_hinge", "pairwise_logistic", "pairwise_soft_zero_one", "label_diff",
         "dcg_top3", "dcg2", "dcg2_top3", "listmle", "approx_ndcg"]


def _scale(kind, labels):
    real = labels >= 0
    if kind == "sum of labels":
        return np.where(real, labels, 0.0).sum(axis=1)
    if kind == "L/n":
        return labels.shape[1] / real.sum(axis=1)
    return np.ones(len(labels))


def _values_and_grad(per_list, scores):
    """Returns `per_list(scores)` `[B]` and the gradient of its sum, jitted, as numpy."""
    import jax
    import jax.numpy as jnp

    def total(s):
        values = per_list(s)
        return jnp.sum(values), values

    (_, values), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(jnp.asarray(scores))
    return np.asarray(values), np.asarray(grad)


@pytest.mark.parametrize("name", CASES)
def test_loss_gives_raxs_values_and_gradients_per_list(rax, lists, name):
    import jax.numpy as jnp

    loss, rax_per_list, scale_kind = _cases(rax)[name]
    labels, distinct, scores = lists
    if name == "listmle":
        labels = distinct
    real = labels >= 0
    compared = to_numpy(rank_ops.has_label_pairs(np.where(real, labels, 0.0), real))
    assert compared.sum() == BATCH - (name != "listmle")

    ours, our_grad = _values_and_grad(lambda s: loss.call(labels, s), scores)
    theirs, their_grad = _values_and_grad(
        lambda s: rax_per_list(s, jnp.asarray(labels), jnp.asarray(real)), scores)
    scale = _scale(scale_kind, labels)
    np.testing.assert_allclose(ours[compared] * scale[compared], theirs[compared], rtol=1e-5,
                               atol=1e-6, err_msg=f"{name} values")
    np.testing.assert_allclose((our_grad * scale[:, None])[compared][real[compared]],
                               their_grad[compared][real[compared]], rtol=1e-4, atol=1e-6,
                               err_msg=f"{name} gradients")
    assert np.all(our_grad[~real] == 0)


def test_gumbel_approx_ndcg_has_raxs_expectation_and_ours_is_reproducible(rax, lists):
    import jax
    import jax.numpy as jnp

    labels, _, scores = lists
    real = labels >= 0
    compared = to_numpy(rank_ops.has_label_pairs(np.where(real, labels, 0.0), real))
    gumbel = rax.gumbel_t12n(rax.approx_t12n(rax.ndcg_metric, temperature=0.1),
                             samples=GUMBEL_SAMPLES, smoothing_factor=1e-20)
    samples = np.asarray(jax.jit(lambda s: gumbel(  # [S, B]
        s, jnp.asarray(labels), where=jnp.asarray(real), key=jax.random.PRNGKey(0),
        reduce_fn=None))(jnp.asarray(scores)))
    theirs, error = samples.mean(axis=0), samples.std(axis=0) / math.sqrt(GUMBEL_SAMPLES)
    ours = {seed: jax.jit(losses.GumbelApproxNDCGLoss(sample_size=GUMBEL_SAMPLES, seed=seed).call)
            for seed in (7, 8)}
    value = np.asarray(ours[7](labels, scores))
    assert np.all(np.abs(value - theirs)[compared] <= 5 * math.sqrt(2) * error[compared] + 1e-4), (
        value, theirs)
    np.testing.assert_array_equal(np.asarray(ours[7](labels, scores)), value)
    assert not np.allclose(np.asarray(ours[8](labels, scores))[compared], value[compared])
