"""The papers' theorems as properties over many random lists (hypothesis).

Qin, Liu & Li (2010): Thm 3 bounds the position approximation, Thm 6 the ApproxNDCG error and
Thm 5 the ApproxAP error. Chen et al. (2009): the weighted RankNet / ListMLE losses bound
1 − NDCG from above. Scores are drawn distinct with a minimum gap δ, so ε = (n−1)/(e^{δα}+1) is
the Thm 3 bound on |π̂ − π|.
"""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import to_numpy
from tfapprox import losses, measures
from tfapprox import ops as rank_ops

FLOAT_SLACK = 1e-4  # float32 sums over up to 200 terms
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True)


@st.composite
def ranked_lists(draw, max_size=200, min_size=1):
    """A list of `n` documents: graded labels 0..4 and distinct scores with minimum gap δ."""
    n = draw(st.integers(min_size, max_size))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    delta = draw(st.sampled_from([0.05, 0.1, 0.5, 1.0]))
    gaps = delta * (1.0 + rng.exponential(0.5, size=n))
    scores = rng.permutation(np.cumsum(gaps) - np.sum(gaps) / 2)
    labels = rng.integers(0, 5, size=n).astype(np.float32)
    if draw(st.booleans()):
        labels = (rng.random(n) < 0.2).astype(np.float32)  # sparse binary relevance
    min_gap = np.min(np.diff(np.sort(scores))) if n > 1 else np.inf
    return labels[None], scores[None].astype(np.float32), float(min_gap)


def epsilon(n, min_gap, alpha):
    """Qin Thm 3: the bound (n − 1)/(e^{δα} + 1) on |π̂(x) − π(x)|."""
    if n == 1:
        return 0.0
    return (n - 1) / (math.exp(min(min_gap * alpha, 700.0)) + 1.0)


def exact_and_smooth(labels, scores, alpha, beta=10.0):
    mask = np.ones_like(labels, bool)
    return (measures.Positions.exact(scores, mask),
            measures.Positions.smooth(scores, mask, alpha, beta))


@PROPERTY
@given(ranked_lists(), st.sampled_from([2.0, 5.0, 10.0, 50.0]))
def test_qin_theorem_3_position_approximation(data, alpha):
    labels, scores, gap = data
    exact, smooth = exact_and_smooth(labels, scores, alpha)
    error = np.max(np.abs(to_numpy(smooth.ranks) - to_numpy(exact.ranks)))
    assert error <= epsilon(labels.shape[1], gap, alpha) + FLOAT_SLACK


@PROPERTY
@given(ranked_lists(), st.sampled_from([2.0, 5.0, 10.0, 50.0]))
def test_qin_theorem_6_approx_ndcg_error(data, alpha):
    labels, scores, gap = data
    if not labels.any():
        return
    exact, smooth = exact_and_smooth(labels, scores, alpha)
    error = abs(float(to_numpy(measures.ndcg(labels, smooth)[0]))
                - float(to_numpy(measures.ndcg(labels, exact)[0])))
    assert error <= epsilon(labels.shape[1], gap, alpha) / (2 * math.log(2)) + FLOAT_SLACK


@PROPERTY
@given(ranked_lists(), st.sampled_from([10.0, 50.0, 100.0]), st.sampled_from([1.0, 10.0, 100.0]))
def test_qin_theorem_5_approx_ap_error(data, alpha, beta):
    """With ε < ½ the smooth positions keep the order, every pairwise truncation is off by less
    than η = 1/(1 + e^{β(1−2ε)}), and |ApproxAP − AP| < ε + (|D+| − 1)·η."""
    labels, scores, gap = data
    relevance = (labels >= 1).astype(np.float32)
    eps = epsilon(labels.shape[1], gap, alpha)
    if eps >= 0.5 or not relevance.any():
        return
    exact, smooth = exact_and_smooth(labels, scores, alpha, beta)
    error = abs(float(to_numpy(measures.average_precision(relevance, smooth)[0]))
                - float(to_numpy(measures.average_precision(relevance, exact)[0])))
    eta = 1.0 / (1.0 + math.exp(beta * (1.0 - 2.0 * eps)))
    assert error <= eps + (relevance.sum() - 1) * eta + FLOAT_SLACK


@PROPERTY
@given(ranked_lists(max_size=60), st.sampled_from([None, 1, 3, 10]))
def test_steep_sigmoids_give_the_exact_measures(data, k):
    labels, scores, gap = data
    relevance = (labels >= 1).astype(np.float32)
    steep = 20.0 / gap + 1e3  # δα ≥ 20: ε < n·2e-9
    exact, smooth = exact_and_smooth(labels, scores, steep, beta=steep)
    for measure in (lambda p: measures.ndcg(labels, p, k),
                    lambda p: measures.average_precision(relevance, p),
                    lambda p: measures.precision_at_k(relevance, p, k or 5),
                    lambda p: measures.reciprocal_rank(relevance, p)):
        np.testing.assert_allclose(to_numpy(measure(smooth)), to_numpy(measure(exact)),
                                   atol=1e-5)


@st.composite
def lists_with_ties(draw):
    """Graded labels and scores that may tie (Chen's bounds hold for any scores)."""
    n = draw(st.integers(1, 120))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    labels = rng.integers(0, draw(st.integers(1, 4)) + 1, size=(1, n)).astype(np.float32)
    scores = rng.normal(scale=draw(st.sampled_from([0.1, 1.0, 10.0])), size=(1, n))
    if draw(st.booleans()):
        scores = np.round(scores)  # many ties
    return labels, scores.astype(np.float32)


@PROPERTY
@given(lists_with_ties(), st.sampled_from([None, 1, 5, 10]), st.integers(0, 3))
def test_chen_weighted_losses_bound_one_minus_ndcg(data, topk, seed):
    labels, scores = data
    if not labels.any():
        return
    mask = np.ones_like(labels, bool)
    ndcg = float(to_numpy(measures.ndcg(labels, measures.Positions.exact(scores, mask), topk)[0]))
    for loss in (losses.WeightedRankNetLoss(topk=topk, reduction=None),
                 losses.WeightedListMLELoss(topk=topk, seed=seed, reduction=None)):
        value = float(to_numpy(loss(labels, scores))[0])
        assert 1.0 - ndcg <= value / math.log(2) + 1e-5, type(loss).__name__


@PROPERTY
@given(lists_with_ties(), st.sampled_from([None, 3]))
def test_chen_weighted_loss_is_at_most_unweighted_times_max_weight(data, topk):
    labels, scores = data
    if not labels.any():
        return
    n_c = float(to_numpy(rank_ops.ideal_dcg(labels, topk))[0])
    max_weight = float(np.max(2.0 ** labels - 1.0))  # G·D with D ≤ 1
    pairs = (losses.WeightedRankNetLoss(topk=topk, reduction=None),
             losses.RankNetLoss(reduction=None))
    lists = (losses.WeightedListMLELoss(topk=topk, reduction=None),
             losses.ListMLELoss(reduction=None))
    for weighted, plain in (pairs, lists):
        bound = float(to_numpy(plain(labels, scores))[0]) * max_weight / n_c
        assert float(to_numpy(weighted(labels, scores))[0]) <= bound * (1 + 1e-5) + 1e-6
