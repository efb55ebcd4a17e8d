"""The ranking math in tfapprox.ops (ranks, gains, discounts, ideal DCG, stability) and the pair
sums of tfapprox.pair_sums (dense or blocked, factored or per pair)."""

import gc
import math
import re
import sys
import weakref

import numpy as np
import pytest
from keras import ops

from conftest import (COMPILE_MODES, REPO, backend, compiled_on_jax, loss_and_grad, random_batch,
                      to_numpy, value_and_grad_function)
from tfapprox import losses
from tfapprox import ops as rank_ops
from tfapprox import pair_sums
from tfapprox.pair_plan import DEFAULT, PairPlan, using

sys.path.insert(0, str(REPO / "benchmarks"))
import pair_paths  # noqa: E402  (benchmarks/pair_paths.py)


def test_exact_ranks_sort_descending_and_keep_list_order_on_ties():
    scores = np.array([[0.1, 0.9, 0.5, 0.9, 7.0]], np.float32)
    mask = np.array([[True, True, True, True, False]])
    np.testing.assert_array_equal(to_numpy(rank_ops.exact_ranks(scores, mask)[:, :4]),
                                  [[4, 1, 3, 2]])


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_exact_ranks_are_the_pairwise_count_with_ties_padding_and_infinities(mode):
    """Sorted, or under XLA counted; the ranks are read back from the gradient of Σ π(x)·s_x
    (positions carry no gradient)."""
    rng = np.random.default_rng(5)
    scores = rng.integers(-3, 3, size=(32, 9)).astype(np.float32)  # many ties
    scores[rng.random(scores.shape) < 0.1] = -np.inf
    mask = rng.random(scores.shape) < 0.8  # padding anywhere in the list
    _, ranks = loss_and_grad(lambda y, s: rank_ops.exact_ranks(s, mask) * s, None, scores, mode)
    for b in range(32):
        for x in np.flatnonzero(mask[b]):
            above = [y for y in np.flatnonzero(mask[b])
                     if scores[b, y] > scores[b, x] or (scores[b, y] == scores[b, x] and y < x)]
            assert ranks[b, x] == 1 + len(above)
        np.testing.assert_array_equal(np.sort(ranks[b]), np.arange(1, 10))  # a permutation


def test_approx_ranks_ignore_padding_and_approach_exact_ranks():
    scores = np.array([[3.0, 1.0, 2.0, 100.0]], np.float32)
    mask = np.array([[True, True, True, False]])
    ranks = to_numpy(rank_ops.approx_ranks(scores, mask, alpha=50.0))[0, :3]
    np.testing.assert_allclose(ranks, [1, 3, 2], atol=1e-6)
    soft = to_numpy(rank_ops.approx_ranks(scores, mask, alpha=1.0))[0, :3]
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert soft[0] == pytest.approx(1 + sigmoid(-2) + sigmoid(-1), rel=1e-6)


@pytest.mark.parametrize("spread", [1e2, 1e3, 1e4])
def test_approx_ranks_are_finite_with_huge_score_gaps(spread):
    scores = np.array([[-spread, 0.0, spread, spread * 0.5]], np.float32)
    mask = np.ones_like(scores, bool)
    value, grad = loss_and_grad(
        lambda y, s: rank_ops.discounts(rank_ops.approx_ranks(s, mask, alpha=10.0)), None,
        scores)
    assert np.isfinite(value) and np.all(np.isfinite(grad))


def test_gains_discounts_and_ideal_dcg():
    labels = np.array([[0.0, 2.0, 1.0, 0.0]], np.float32)
    np.testing.assert_allclose(to_numpy(rank_ops.gains(labels)), [[0, 3, 1, 0]])
    np.testing.assert_allclose(to_numpy(rank_ops.discounts(np.array([1.0, 3.0], np.float32))),
                               [1.0, 0.5], rtol=1e-6)
    assert to_numpy(rank_ops.ideal_dcg(labels))[0] == pytest.approx(3 + 1 / math.log2(3))
    assert to_numpy(rank_ops.ideal_dcg(labels, topk=1))[0] == pytest.approx(3.0)


def test_smooth_cutoff_is_a_sigmoid_around_k_plus_half():
    ranks = np.array([[1.0, 3.5, 6.0]], np.float32)
    cut = to_numpy(rank_ops.smooth_top_k_cutoff(ranks, 3, beta=10.0))[0]
    assert cut[0] > 0.999 and cut[1] == pytest.approx(0.5) and cut[2] < 1e-6


def test_ideal_positions_and_label_consistent_permutation():
    labels = np.array([[1.0, 2.0, 1.0, 0.0]], np.float32)
    mask = np.ones_like(labels, bool)
    np.testing.assert_array_equal(to_numpy(rank_ops.ideal_positions(labels, mask)),
                                  [[2, 1, 2, 4]])
    keys = np.array([[200, 500, 900, 100]], np.int32)
    np.testing.assert_array_equal(
        to_numpy(rank_ops.plackett_luce_order(labels, mask, keys)), [[1, 2, 0, 3]])


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("list_size, network", [(12, True), (12, False), (300, True)])
@pytest.mark.parametrize("label_step", [1.0, 0.25])  # integer labels: one argsort; else two
def test_label_consistent_permutation_is_a_lexicographic_sort(label_step, list_size, network,
                                                             mode):
    """Under XLA integer labels take a sorting network (or with that off, a count), others two
    argsorts; without XLA every label takes one argsort of int64 codes. The order is read back
    from the gradient of Σ_p (p + 1)·s_{order[p]}."""
    rng = np.random.default_rng(7)
    labels = (rng.integers(0, 4, size=(16, list_size)) * label_step).astype(np.float32)
    labels[0, :3] = 2040.0 if list_size == 300 else 8000.0  # below the one-sort label limits
    labels[1, :2] = -0.0  # a real label (not < 0), ordered as 0
    mask = np.arange(list_size) < rng.integers(1, list_size + 1, size=(16, 1))
    keys = to_numpy(rank_ops.tie_breaking_keys(
        rng.normal(size=(16, list_size)).astype(np.float32), seed=3))
    keys[:, ::3] = keys[:, 1::3]  # equal keys too: those stay in list order
    with using(DEFAULT if network else PairPlan(network_order_up_to=0)):
        _, places = loss_and_grad(
            lambda y, s: ops.take_along_axis(s, rank_ops.plackett_luce_order(labels, mask, keys),
                                             axis=-1)
            * (1.0 + np.arange(list_size, dtype=np.float32)),
            None, rng.normal(size=(16, list_size)).astype(np.float32), mode)
    order = np.argsort(places, axis=-1)
    for b in range(16):
        real = np.flatnonzero(mask[b])
        expected = real[np.lexsort((real, -keys[b, real], -labels[b, real]))]
        np.testing.assert_array_equal(order[b, :real.size], expected)


def test_tie_breaking_keys_spread_over_their_range_and_follow_the_seed(rng):
    """Keys are ints in [0, KEY_LEVELS), near-uniform over nearby scores, equal for equal scores,
    and another seed gives other keys."""
    scores = rng.normal(size=(64, 128)).astype(np.float32)
    keys = to_numpy(rank_ops.tie_breaking_keys(scores, seed=0))
    assert keys.dtype == np.int32 and keys.min() >= 0 and keys.max() < rank_ops.KEY_LEVELS
    counts = np.bincount(keys.ravel() * 16 // rank_ops.KEY_LEVELS, minlength=16)
    assert counts.min() > 0.8 * keys.size / 16 and counts.max() < 1.2 * keys.size / 16
    close = to_numpy(rank_ops.tie_breaking_keys(np.float32(1.0) + np.arange(4096, dtype=np.float32)
                                                * np.float32(2 ** -23), seed=0))
    assert len(np.unique(close)) > 600  # neighbouring floats: keys spread too
    np.testing.assert_array_equal(to_numpy(rank_ops.tie_breaking_keys(scores[:, :1], seed=0)),
                                  keys[:, :1])
    assert np.mean(to_numpy(rank_ops.tie_breaking_keys(scores, seed=1)) == keys) < 0.01


@pytest.mark.parametrize("list_size", [129, 256, 1000])
def test_network_order_is_a_stable_descending_sort(list_size, rng):
    """The bitonic network, traced where XLA would take it, is a stable descending argsort of
    codes up to its limit (many ties; lists not a power of two padded)."""
    limit = pair_sums.network_code_limit(list_size)
    codes = rng.integers(0, 8, size=(5, list_size)).astype(np.int32)
    codes[0] = rng.integers(0, limit, size=list_size)
    codes[1, :4] = limit - 1
    order = to_numpy(compiled_on_jax(pair_sums.descending_order_by_network)(
        ops.convert_to_tensor(codes)))
    np.testing.assert_array_equal(order, np.argsort(-codes.astype(np.int64), axis=-1,
                                                    kind="stable"))


def test_standardize_masks_padding_and_squeezes_scores():
    labels, mask, scores = rank_ops.standardize(
        {"labels": np.array([[1.0, 0.0, 2.0]]), "mask": np.array([[True, True, False]])},
        np.array([[[0.5], [np.nan], [np.inf]]], np.float32))
    np.testing.assert_array_equal(to_numpy(mask), [[True, True, False]])
    np.testing.assert_array_equal(to_numpy(labels), [[1, 0, 0]])
    assert np.isnan(to_numpy(scores)[0, 1]) and to_numpy(scores)[0, 2] == 0.0


def test_safe_divide_has_finite_gradient_at_zero():
    value, grad = loss_and_grad(
        lambda y, s: rank_ops.safe_divide(s, s * 0.0), None, np.array([[1.0, 2.0]], np.float32))
    assert value == 0 and np.all(grad == 0)


@pytest.mark.backend_neutral  # a choice by static shape
def test_auto_sums_pairs_in_blocks_above_blocked_above():
    def pick(list_size, pairwise="auto"):
        return pair_sums._dense_or_blocked(pairwise, np.zeros((1, list_size), np.float32),
                                           lambda: "dense", lambda: "blocked")

    assert pick(DEFAULT.blocked_above) == "dense" and pick(1000) == "dense"
    assert pick(DEFAULT.blocked_above + 1) == "blocked"
    assert pick(5000, "dense") == "dense" and pick(3, "blocked") == "blocked"
    with pytest.raises(ValueError, match="`pairwise` must be one of"):
        pick(3, "sparse")


PAIR_SUMS = {  # pairwise -> a loss_fn(labels, scores) on each blocked sum, with uneven upstream
    "approx_ranks": lambda mask, labels, weights, pairwise: lambda y, s: (
        rank_ops.approx_ranks(s, mask, 3.0, pairwise) * weights),
    "sigmoid_pair_sums": lambda mask, labels, weights, pairwise: lambda y, s: (
        pair_sums.sigmoid_pair_sums(2.0 * s, weights, pairwise) * (1.0 + s)),
    "logistic_pair_sums": lambda mask, labels, weights, pairwise: lambda y, s: (
        pair_sums.logistic_pair_sums(s, labels, mask, pairwise) * weights),
    "ideal_positions": lambda mask, labels, weights, pairwise: lambda y, s: (  # not graded
        rank_ops.ideal_positions(labels + 0.5, mask, pairwise) * s * mask),
}


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("name", sorted(PAIR_SUMS))
def test_pair_sums_in_blocks_equal_dense_values_and_gradients(name, mode, rng):
    """Blocks of 4 columns over lists of 11 (the last block padded), with padded documents."""
    labels = rng.integers(0, 4, size=(3, 11)).astype(np.float32)
    mask = rng.random((3, 11)) > 0.3
    weights = rng.random((3, 11)).astype(np.float32) * mask
    scores = rng.normal(size=(3, 11)).astype(np.float32)
    dense = loss_and_grad(PAIR_SUMS[name](mask, labels, weights, "dense"), None, scores, mode)
    with using(PairPlan(pair_block=4)):
        blocked = loss_and_grad(PAIR_SUMS[name](mask, labels, weights, "blocked"), None, scores,
                                mode)
    for ours, expected in zip(blocked, dense):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, pair_function", [("approx_ranks", "sigmoid"),
                                                  ("logistic_pair_sums", "softplus")])
def test_an_eager_tape_keeps_no_block_of_pairs_alive(name, pair_function, rng, monkeypatch):
    """Under an eager tf.GradientTape the blocked forward pass must not be recorded: the tape
    would keep every block's [B, L, pair_block] intermediates alive, O(B·L²) in all, though the
    custom gradient recomputes them. Each block's pairs (σ or softplus of the differences) must
    be freed as soon as the block is summed, and the gradient stay the dense one."""
    if backend() != "tensorflow":
        pytest.skip("only TensorFlow records eager operations on a tape")
    import tensorflow as tf

    blocks, pairs_of = [], getattr(ops, pair_function)
    monkeypatch.setattr(ops, pair_function, lambda x: blocks.append(pairs_of(x)) or blocks[-1])
    labels = rng.integers(0, 4, size=(3, 11)).astype(np.float32)
    mask = rng.random((3, 11)) > 0.3
    weights = rng.random((3, 11)).astype(np.float32) * mask
    scores = tf.constant(rng.normal(size=(3, 11)).astype(np.float32))
    with using(PairPlan(pair_block=4)):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            value = tf.reduce_sum(PAIR_SUMS[name](mask, labels, weights, "blocked")(None, scores))
            freed = [weakref.ref(block) for block in blocks]
            blocks.clear()
            gc.collect()
            assert len(freed) == 3 and all(block() is None for block in freed)
        blocked_gradient = tape.gradient(value, scores).numpy()
    dense = loss_and_grad(PAIR_SUMS[name](mask, labels, weights, "dense"), None, scores.numpy())
    np.testing.assert_allclose(blocked_gradient, dense[1], rtol=1e-5, atol=1e-5)


def test_logistic_sums_of_long_lists_take_softplus_whatever_the_elementwise_bound():
    """Without XLA, short lists sum RankNet's pairs by one log per row of a product of σs, each
    ≥ ½: a list of 150 equal scores would make it 2^-149 (0 once denormals flush) and the value
    infinite, so lists over 127 take softplus however far `elementwise_sums_up_to` is raised."""
    labels = np.arange(150, dtype=np.float32)[None]
    with using(PairPlan(elementwise_sums_up_to=1000)):
        value = to_numpy(pair_sums.logistic_pair_sums(np.zeros((1, 150), np.float32), labels,
                                                      np.ones((1, 150), bool), "dense"))
    np.testing.assert_allclose(value[0], np.arange(150) * math.log(2.0), rtol=1e-5)


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("size", [9, 37])
def test_dense_logistic_pair_sums_match_float64(size, mode, rng):
    """The dense RankNet sums (under XLA: logs of `log_chunk` pairs at a time, over lists padded
    to whole chunks; exps per document, or per pair for the wide spreads) against float64, with
    pairs from tiny to saturated margins: the spreads 1, 30 and 1e4 of one draw of scores, through
    one function (a trace and compile for all three)."""
    labels = rng.integers(0, 3, size=(2, size)).astype(np.float32)
    mask = rng.random((2, size)) > 0.2
    normal = rng.normal(size=(2, size))
    value_and_grad = value_and_grad_function(
        lambda y, s: pair_sums.logistic_pair_sums(s, labels, mask, "dense")
        * np.arange(1, size + 1), mode)
    for spread in (1.0, 30.0, 1e4):
        scores = (normal * spread).astype(np.float32)
        value, grad = value_and_grad(None, scores)
        s, expected, expected_grad = scores.astype(np.float64), 0.0, np.zeros((2, size))
        for b, k, j in np.ndindex(2, size, size):
            if mask[b, k] and mask[b, j] and labels[b, k] > labels[b, j]:
                d = s[b, j] - s[b, k]
                expected += (k + 1) * np.logaddexp(0.0, d)
                expected_grad[b, j] += (k + 1) / (1.0 + np.exp(-d))
                expected_grad[b, k] -= (k + 1) / (1.0 + np.exp(-d))
        assert value == pytest.approx(expected, rel=1e-6), spread
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6,
                                   err_msg=f"spread {spread}")


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("spread, factored", [(1.0, True), (20.0, True), (200.0, True),
                                              (1.0, False)],
                         ids=["factored", "factored_wide", "too_wide", "per_pair"])
def test_dense_sigmoid_pair_sums_match_float64(spread, factored, mode, rng):
    """Lists spanning up to 2·EXP_LIMIT take two exps per document, wider batches (or
    `factored=False`) one exp per pair; all equal float64 in values and gradients, with weights
    of 0 (padding) and an uneven upstream."""
    values = (rng.normal(size=(3, 10)) * spread).astype(np.float32)
    weights = (rng.random((3, 10)) * (rng.random((3, 10)) < 0.8)).astype(np.float32)
    upstream = 1.0 + np.arange(10.0)
    value, grad = loss_and_grad(
        lambda y, s: pair_sums.sigmoid_pair_sums(s, weights, "dense", factored) * upstream,
        None, values, mode)
    v, w = values.astype(np.float64), weights.astype(np.float64)
    sigmoid = 1.0 / (1.0 + np.exp(v[:, :, None] - v[:, None, :]))  # [b, k, j] = σ(v_j − v_k)
    slope = sigmoid * (1.0 - sigmoid)
    expected_grad = (w * (slope @ upstream) - upstream * np.einsum("bkj,bj->bk", slope, w))
    assert value == pytest.approx(((sigmoid @ w[:, :, None])[..., 0] @ upstream).sum(), rel=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(backend() != "jax", reason="the JAX kernels")
@pytest.mark.parametrize("spread", [1.0, 1e4])
def test_jax_kernels_match_float64(spread, rng):
    """The σ sums' backward passes without constants, taken here for short lists, give the
    float64 values and gradients of the test above (RankNet's JAX pass, "Select last", is taken
    at every size, so the test before it covers it)."""
    with using(PairPlan(constant_free_above=0)):
        test_dense_sigmoid_pair_sums_match_float64(spread, spread == 1.0, "jit", rng)


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("label_step", [1.0, 0.5, 40.0], ids=["graded", "fractional", "large"])
def test_ideal_dcg_counts_graded_labels_and_sorts_others(label_step, mode):
    """Integer labels below GRADES are counted per grade, others sorted: both give the DCG of
    the labels sorted in float64, with ties, zeros (padding) and a cut-off."""
    rng = np.random.default_rng(11)
    labels = (rng.integers(0, 5, size=(6, 30)) * label_step).astype(np.float32)
    labels[:, 20:] = 0.0
    for topk in (None, 1, 7):
        value, _ = loss_and_grad(lambda y, s: rank_ops.ideal_dcg(y, topk) * s[:, 0], labels,
                                 np.ones((6, 30), np.float32), mode)
        best = -np.sort(-labels.astype(np.float64), axis=-1)[:, :topk]
        shift = np.maximum(best[:, :1] - rank_ops.MAX_EXACT_GAIN_EXPONENT, 0.0)
        expected = ((2.0 ** (best - shift) - 2.0 ** -shift)
                    / np.log2(2.0 + np.arange(best.shape[1]))).sum()
        assert value == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("pairwise", ["dense", "blocked"])
@pytest.mark.parametrize("label_step", [1.0, 0.5, 40.0], ids=["graded", "fractional", "large"])
def test_ideal_positions_count_graded_labels_and_compare_others(label_step, pairwise, mode):
    """Graded labels are counted per grade, others compared pairwise (in blocks of 4 columns
    when blocked): both give 1 + #{real y: l_y > l_x}, and 1 + #real on padded slots."""
    rng = np.random.default_rng(5)
    labels = (rng.integers(0, 5, size=(4, 11)) * label_step).astype(np.float32)
    mask = rng.random((4, 11)) < 0.8
    weights = rng.random((4, 11)).astype(np.float32)
    with using(PairPlan(pair_block=4)):
        value, _ = loss_and_grad(
            lambda y, s: rank_ops.ideal_positions(y, mask, pairwise) * s, labels, weights, mode)
    real = np.where(mask, labels, -np.inf)
    expected = 1.0 + (real[:, None, :] > real[:, :, None]).sum(-1)
    assert value == pytest.approx((expected * weights).sum(), rel=1e-6)


# Every mode with static list sizes, and TensorFlow's traced modes with a `None` list size.
MODES_AND_SHAPES = ([(mode, False) for mode in COMPILE_MODES]
                    + [(mode, True) for mode in COMPILE_MODES if mode in ("graph", "xla")])


SUFFIX_CASES = {"cumsum_path": (3.0, 20.0), "wide_gaps": (1e4, 1e8),
                "padding_far_above": (3.0, 1e4)}


@pytest.mark.parametrize("mode, unknown_shape", MODES_AND_SHAPES)
@pytest.mark.parametrize("list_size", [10, 40])  # without XLA, running sums of 10 by a matmul
def test_suffix_logsumexp_is_exact_on_both_paths(list_size, mode, unknown_shape, rng):
    """Small score gaps take the O(L) running sums, huge ones the fallback (the pairs of short
    lists without XLA, else the scan), and so do small ones under padded scores far above them;
    values and the written-out gradient equal float64, with a static list size and a `None`
    one, and padded slots above the real scores change nothing and get no gradient. The three
    cases (SUFFIX_CASES: spread of the scores, padded score) scale one draw and run through one
    function (a trace and compile for all three)."""
    normal = rng.normal(size=(3, list_size))
    mask = rng.random((3, list_size)) < 0.85
    weights = (1.0 + np.arange(list_size)).astype(np.float32)
    value_and_grad = value_and_grad_function(
        lambda y, s: rank_ops.suffix_logsumexp_minus_self(s, y > 0.0) * weights, mode,
        unknown_shape)
    for case, (spread, padded) in SUFFIX_CASES.items():
        scores = (normal * spread).astype(np.float32)
        scores[~mask] = padded
        value, grad = value_and_grad(mask.astype(np.float32), scores)
        expected, expected_grad = 0.0, np.zeros(scores.shape)
        for row, (s, m) in enumerate(zip(scores.astype(np.float64), mask)):
            real, where = s[m], np.flatnonzero(m)
            log_sums = [real[p:].max() + np.log(np.exp(real[p:] - real[p:].max()).sum())
                        for p in range(len(real))]
            for p in range(len(real)):
                expected += weights[where[p]] * (log_sums[p] - real[p])
                expected_grad[row, where[p]] = -weights[where[p]] + sum(
                    weights[where[i]] * np.exp(real[p] - log_sums[i]) for i in range(p + 1))
        assert value == pytest.approx(expected, rel=1e-5), case
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-4, atol=1e-3, err_msg=case)
        assert np.all(grad[~mask] == 0), case


PAIR_SUMS_OF_SHORT_LISTS = {
    "sigmoid": lambda y, s: pair_sums.sigmoid_pair_sums(s, y, "dense") * (1.0 + y),
    "logistic": lambda y, s: pair_sums.logistic_pair_sums(s, y, y >= 1.0, "dense") * (1.0 + y),
}


@pytest.mark.parametrize("unknown_shape", [False, True], ids=["static", "none"])
@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("name", sorted(PAIR_SUMS_OF_SHORT_LISTS))
def test_short_lists_sum_pairs_by_products_as_the_matmul_does(name, mode, unknown_shape, rng):
    """Without XLA, lists of a static size up to `elementwise_sums_up_to` sum their pairs by
    products and reductions, others (and a `None` size) by matmul: the same values and
    gradients, weights of 0 and padding included."""
    labels = rng.integers(0, 4, size=(5, 10)).astype(np.float32)
    scores = (rng.normal(size=(5, 10)) * 3.0).astype(np.float32)
    assert pair_sums.elementwise_sums_apply(np.zeros((5, 10, 10)))
    assert not pair_sums.elementwise_sums_apply(np.zeros((5, 40, 40)))
    loss = PAIR_SUMS_OF_SHORT_LISTS[name]
    by_products = loss_and_grad(loss, labels, scores, mode, unknown_shape)
    with using(PairPlan(elementwise_sums_up_to=0)):
        by_matmul = loss_and_grad(loss, labels, scores, mode, unknown_shape)
    assert by_products[0] == pytest.approx(by_matmul[0], rel=1e-6)
    np.testing.assert_allclose(by_products[1], by_matmul[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("unknown_shape", [False, True], ids=["static", "none"])
@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_descending_order_is_a_stable_sort_and_gathers_within_lists(mode, unknown_shape, rng):
    """`descending_order` (one top_k) sorts each list descending, ties in list order, and
    `gather_in_lists` reads each list at those indices (read back from the gradient of
    Σ_p (p + 1)·s_{order[p]})."""
    keys = rng.integers(0, 4, size=(6, 9)).astype(np.float32)  # many ties
    keys[1] = float("-inf")
    _, places = loss_and_grad(
        lambda y, s: rank_ops.gather_in_lists(s, rank_ops.descending_order(y))
        * (1.0 + np.arange(9, dtype=np.float32)), keys, rng.normal(size=(6, 9)).astype(np.float32),
        mode, unknown_shape)
    np.testing.assert_array_equal(np.argsort(places, axis=-1),
                                  np.argsort(-keys, axis=-1, kind="stable"))


# Losses whose compiled-mode choices cover every `pair_plan.xla_path` caller: pair sums of σ
# (ApproxNDCG, ApproxAP's two kinds) and of softplus (RankNet), ideal positions and DCG
# (weighted RankNet), orders by network (ListMLE) and by counting (ApproxAP's exact ranks).
LOSSES_BY_PATH = ("approx_ndcg", "approx_ap", "ranknet", "weighted_ranknet", "listmle")


def _paths_traced(loss, mode, plan=DEFAULT):
    """Returns {choice: {path}} recorded while a forward+backward step of `loss` on 2 lists of 6
    is traced in `mode` under `plan` (`benchmarks/pair_paths.py`; nothing is compiled or run)."""
    labels, scores = random_batch(np.random.default_rng(0), batch=2, list_size=6)
    with using(plan):
        if backend() == "jax":
            return pair_paths.traced_on_jax(loss, labels, scores)
        return pair_paths.traced_on_tensorflow(loss, labels, scores, jit_compile=mode == "xla")


@pytest.mark.parametrize("mode", [m for m in COMPILE_MODES if m != "eager"])
@pytest.mark.parametrize("name", LOSSES_BY_PATH)
def test_compiled_losses_take_the_xla_paths(name, mode):
    """Under `jax.jit` and `jit_compile=True` every compiled-mode choice of a loss takes its XLA
    path, and in a TensorFlow graph that XLA does not compile, none does."""
    taken = _paths_traced(losses.get(name), mode)
    compiled = {what: paths for what, paths in taken.items() if paths <= {"XLA", "no XLA"}}
    assert compiled, f"no compiled-mode choice was recorded: {taken}"
    expected = "no XLA" if mode == "graph" else "XLA"
    assert set().union(*compiled.values()) == {expected}, taken


@pytest.mark.parametrize("mode", [m for m in COMPILE_MODES if m != "eager"])
def test_jax_kernels_are_taken_on_jax(mode):
    """The σ sums' backward passes without constants are taken under `jax.jit` for lists longer
    than `constant_free_above` ("Separate passes"), never under TensorFlow's XLA, nor at or below
    the bound; RankNet's backward pass selects last under `jax.jit` at every size ("Select
    last"), never under TensorFlow's XLA; without XLA neither kernel is traced."""
    on_jax = backend() == "jax"
    expected = {"no constants"} if on_jax else {"σ(1 − σ)"} if mode == "xla" else None
    below = PairPlan(constant_free_above=5)  # the traced lists hold 6
    assert (_paths_traced(losses.get("approx_ap"), mode, below).get("sigmoid gradient")
            == expected)
    at = PairPlan(constant_free_above=6)
    assert (_paths_traced(losses.get("approx_ap"), mode, at).get("sigmoid gradient")
            == ({"σ(1 − σ)"} if expected else None))
    ranknet = {"select last"} if on_jax else {"where-masked"} if mode == "xla" else None
    assert _paths_traced(losses.get("ranknet"), mode).get("logistic gradient") == ranknet


@pytest.mark.parametrize("mode", [m for m in COMPILE_MODES if m != "eager"])
def test_small_batches_take_per_pair_sigmoid_exponentials_on_jax(mode):
    """Under `jax.jit` on the CPU, the σ sums of batches of up to
    `per_pair_sigmoid_exps_on_cpu_up_to` pairs take one exp per pair, larger ones the factors, and
    RankNet's logistic sums the factors at every size; TensorFlow's XLA takes the factors
    everywhere, and without XLA no exps are chosen."""
    on_jax = backend() == "jax"
    factored = {"factored where lists fit"} if on_jax or mode == "xla" else None
    traced = PairPlan(per_pair_sigmoid_exps_on_cpu_up_to=2 * 6 * 6, device="cpu")
    assert (_paths_traced(losses.get("approx_ndcg"), mode, traced).get("exps")
            == ({"per pair"} if on_jax else factored))
    assert _paths_traced(losses.get("ranknet"), mode, traced).get("exps") == factored
    fewer = PairPlan(per_pair_sigmoid_exps_on_cpu_up_to=2 * 6 * 6 - 1, device="cpu")
    assert _paths_traced(losses.get("approx_ndcg"), mode, fewer).get("exps") == factored


@pytest.mark.skipif(backend() != "jax", reason="the GPU's paths are JAX's")
def test_a_gpu_takes_dense_pairs_and_per_pair_exponentials():
    """On a GPU (a plan for one), pairs are summed densely at every list size, and lists up to
    `per_pair_exps_on_gpu_up_to` take one exp per pair, longer ones the factors; the CPU keeps
    blocks above `blocked_above` and the factors."""
    def plan(**settings):  # the traced lists hold 6
        return PairPlan(blocked_above=5, per_pair_exps_on_gpu_up_to=6, **settings)

    for name in ("approx_ndcg", "ranknet"):
        on_cpu = _paths_traced(losses.get(name), "xla", plan(device="cpu"))
        assert on_cpu["pairs"] == {"blocked"} and "exps" not in on_cpu, on_cpu
        on_gpu = _paths_traced(losses.get(name), "xla", plan(device="gpu"))
        assert on_gpu["pairs"] == {"dense"} and on_gpu["exps"] == {"per pair"}, on_gpu
    longer = PairPlan(blocked_above=5, per_pair_exps_on_gpu_up_to=5, device="gpu")
    assert (_paths_traced(losses.get("ranknet"), "xla", longer)["exps"]
            == {"factored where lists fit"})


@pytest.mark.skipif(backend() != "jax", reason="reads the HLO that jax.jit compiles")
@pytest.mark.parametrize("name, batch, list_size, tensors",
                         [("approx_ndcg", 2, 64, 0), ("approx_ap", 2, 64, 0), ("ranknet", 2, 64, 2)])
def test_jit_writes_tensors_of_pairs_only_where_planned(name, batch, list_size, tensors, rng):
    """Under `jax.jit` the σ pair sums of a forward+backward step above `constant_free_above`
    (lowered to this list) fuse whole: no fusion writes a [B, L, L] tensor ("Separate passes" in
    `tfapprox.pair_sums`); RankNet's backward pass writes its pulls, computed in one loop whose
    reduction YNNPACK takes alone ("Select last"), and no masks: one tensor for the factored
    exponentials and one in the per-pair fallback (`_only_if`). 2 lists of 64 make 8192
    pairs, enough for XLA to hand the reductions to YNNPACK (from 4096 elements), and the σ sums
    take the factors that larger batches take (`per_pair_sigmoid_exps_on_cpu_up_to` lowered)."""
    import jax
    import jax.numpy as jnp

    loss = losses.get(name)
    labels, scores = random_batch(rng, batch=batch, list_size=list_size)
    step = jax.jit(jax.value_and_grad(lambda s, y: jnp.sum(loss(y, s))))
    with using(PairPlan(constant_free_above=list_size - 1, per_pair_sigmoid_exps_on_cpu_up_to=0)):
        compiled = step.lower(scores, labels).compile().as_text()
    pairs = re.compile(rf"= \w+\[{batch},{list_size},{list_size}\]")
    written = [line.strip()[:160] for line in compiled.splitlines()
               if " fusion(" in line and pairs.search(line)]
    assert len(written) == tensors, written
