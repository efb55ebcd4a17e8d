"""Ranking math of LambdaRank, SoftRank, SVM^map and PermuRank (losses in `tfapprox.losses`).

Written with `keras.ops`, like `tfapprox.ops`: tensors are `[batch, list_size]` unless a docstring
says otherwise, `mask` is True on real documents, and no padded slot enters a sum. Ranks, gains,
discounts and ideal DCGs come from `tfapprox.ops`.
"""

import keras
from keras import ops

from tfapprox import ops as rank_ops


def both_real(mask):
    """Returns bool `[B, L, L]`: entry `[b, i, j]` is True when documents i and j are both real."""
    return ops.logical_and(ops.expand_dims(mask, 2), ops.expand_dims(mask, 1))


def real_pairs(mask):
    """Returns bool `[B, L, L]`: entry `[b, i, j]` is True when i ≠ j are both real documents."""
    not_self = ops.logical_not(ops.eye(ops.shape(mask)[1], dtype="bool"))
    return ops.logical_and(both_real(mask), ops.expand_dims(not_self, 0))


def pair_differences(values):
    """Returns `[B, L, L]`: entry `[b, i, j]` = v_i − v_j."""
    return ops.expand_dims(values, 2) - ops.expand_dims(values, 1)


def ndcg_swap_weights(labels, mask, scores, topk=None):
    """Returns |ΔNDCG@k| of swapping documents i and j in the ranking by `scores`, `[B, L, L]`.

        |ΔNDCG_ij| = |G(l_i) − G(l_j)| · |D_k(π_i) − D_k(π_j)| / N_k,   D_k(r) = D(r)·1{r ≤ k},

    with π the exact positions of the current scores (Burges et al. 2006; LambdaMART's weight
    in Burges 2010). No gradient; 0 on pairs with a padded document.
    """
    positions = rank_ops.exact_ranks(ops.stop_gradient(scores), mask)
    discount = rank_ops.discounts(positions) * rank_ops.top_k_cutoff(positions, topk)
    swap = ops.abs(pair_differences(rank_ops.gains(labels))) * ops.abs(pair_differences(discount))
    weights = rank_ops.safe_divide(swap, ops.reshape(rank_ops.ideal_dcg(labels, topk), (-1, 1, 1)))
    return ops.stop_gradient(ops.where(real_pairs(mask), weights, 0.0))


def beat_probabilities(scores, mask, sigma):
    """Returns π_ij = P(S_i > S_j) = Φ((s_i − s_j) / (√2·σ)) for independent S_i ~ N(s_i, σ²),
    `[B, L, L]` (Taylor et al. 2008); 0 where i = j or either document is padded."""
    beat = 0.5 * (1.0 + ops.erf(pair_differences(scores) / (2.0 * sigma)))
    return ops.where(real_pairs(mask), beat, 0.0)


def for_each_index(count, step, state):
    """Returns `state` after `state = step(i, state)` for i = 0, ..., count − 1, differentiably.

    On JAX `count` is a Python int (shapes are static under jit) and `fori_loop` becomes a scan,
    which reverse-mode differentiates. Elsewhere a while loop runs, bounded by max(count, 1):
    TensorFlow needs a bound to differentiate it under XLA (a tensor for a `None` list size),
    and XLA one of at least 1 to compile its body.
    """
    if keras.backend.backend() == "jax":
        return ops.fori_loop(0, count, step, state)
    index = ops.convert_to_tensor(0, "int32")
    return ops.while_loop(lambda i, _: i < count, lambda i, s: (i + 1, step(i, s)),
                          (index, state), maximum_iterations=ops.maximum(count, 1))[1]


def _add_document(i, state):
    """One step of `rank_distributions`: adds document i to every document's distribution.

    At module level and with `rows` in the state, so that eager JAX reuses its trace.
    """
    distributions, rows, top = state
    beats_j = ops.expand_dims(ops.take(rows, i, axis=1), 2)  # π_ij for every j, [B, L, 1]
    # One position down; what rolls over from r = L − 1 is 0, as nothing is beaten L times.
    pushed_down = ops.roll(distributions, 1, axis=2) * (1.0 - top)
    # In this form the gradient keeps one [B, L, L] tensor per step, pushed_down − distributions.
    return distributions + beats_j * (pushed_down - distributions), rows, top


def rank_distributions(beat):
    """Returns p[b, j, r] = P(document j is at position r + 1), `[B, L, L]` (Taylor et al.).

    The documents are added one at a time; adding i moves j one position down with probability
    π_ij:  p_j^(i)(r) = p_j^(i−1)(r − 1)·π_ij + p_j^(i−1)(r)·(1 − π_ij),  from p_j^(0) = 1{r = 0}.
    `beat` is `beat_probabilities` (a document that is padded or j itself has π_ij = 0 and changes
    nothing). L steps of O(B·L²) each: O(L³) per list, and the gradient keeps one [B, L, L]
    tensor per step, 4·B·L³ bytes.
    """
    list_size = ops.shape(beat)[1]
    top = ops.cast(ops.equal(ops.arange(list_size), 0), rank_ops.COMPUTE_DTYPE)  # r = 0
    # A zero row i = L: XLA compiles the loop body even for an empty list, and refuses to slice
    # a row out of an empty axis.
    rows = ops.pad(beat, ((0, 0), (0, 1), (0, 0)))
    # 0·π keeps an empty list's result connected to the scores: a zero gradient, not None.
    return for_each_index(list_size, _add_document, (0.0 * beat + top, rows, top))[0]


def expected_discounts(distributions):
    """Returns Σ_r D(r)·p_j(r) for every document j, `[B, L]`: its discount in expectation."""
    positions = ops.cast(ops.arange(1, ops.shape(distributions)[2] + 1), rank_ops.COMPUTE_DTYPE)
    return ops.sum(distributions * rank_ops.discounts(positions), axis=-1)


def _precision_losses(relevant_rank, nonrelevant_rank):
    """Returns f(i, j) = i/(i + j − 1) − i/(i + j), `[B, L, L]`: what the precision at the i-th
    relevant document loses when the j-th non-relevant document moves above it."""
    i = ops.expand_dims(ops.maximum(relevant_rank, 1.0), 2)
    j = ops.expand_dims(ops.maximum(nonrelevant_rank, 1.0), 1)
    return i / ((i + j - 1.0) * (i + j))


def ap_structural_hinge(relevance, mask, scores, pair_scale):
    """Returns max_y [Δ_AP(y) + F(y) − F(y*)] per list, `[B]` (0 where nothing is to be swapped).

    y ranges over the rankings; y* puts every relevant document above every non-relevant one;
    Δ_AP(y) = 1 − AP(y); F(y) = c·Σ_{i rel, j nonrel} y_ij (s_i − s_j) with y_ij = +1 when y puts
    i above j and −1 otherwise, and c = `pair_scale` [B]. The maximiser keeps the relevant and
    the non-relevant documents each in score order (Yue et al. 2007), so it interleaves the two,
    and the objective is a sum over the pairs it swaps (non-relevant j above relevant i):

        Σ_{(i, j) swapped} ( f(i, j)/|rel| + 2c(s_j − s_i) ),  f as in `_precision_losses`,

    with i and j counted within their class. Each non-relevant document can be placed on its
    own, where its sum over the relevant documents it passes is largest: f(i, j) and s_j both
    decrease in j, so these places come out in order (Yue et al.'s greedy search). O(L log L)
    for the sort and O(L²) for the pairs. The search sees no gradient; the value carries the
    gradient of F at the maximiser (a subgradient).
    """
    order = ops.argsort(-ops.where(mask, ops.stop_gradient(scores), float("-inf")), axis=-1)
    relevant, nonrelevant, scores = (
        ops.take_along_axis(x, order, axis=-1)
        for x in (relevance, ops.cast(mask, rank_ops.COMPUTE_DTYPE) - relevance, scores))
    pairs = ops.logical_and(ops.expand_dims(relevant, 2) > 0, ops.expand_dims(nonrelevant, 1) > 0)
    precision_losses = rank_ops.safe_divide(
        _precision_losses(ops.cumsum(relevant, axis=-1), ops.cumsum(nonrelevant, axis=-1)),
        ops.reshape(ops.sum(relevant, axis=-1), (-1, 1, 1)))
    margins = 2.0 * ops.reshape(pair_scale, (-1, 1, 1)) * pair_differences(scores)
    swap_gains = ops.where(pairs, precision_losses - margins, 0.0)
    # gain_from[b, x, y]: the gain of putting non-relevant y directly above relevant x, i.e. of
    # swapping y with x and with every relevant document below x.
    fixed = ops.stop_gradient(swap_gains)
    gain_from = ops.where(pairs, ops.flip(ops.cumsum(ops.flip(fixed, 1), axis=1), 1),
                          float("-inf"))
    best = ops.max(gain_from, axis=1, keepdims=True, initial=0.0)  # 0: y stays below them all
    at_best = ops.cast(ops.logical_and(ops.equal(gain_from, best), best > 0),
                       rank_ops.COMPUTE_DTYPE)
    swapped = ops.logical_and(pairs, ops.cumsum(at_best, axis=1) > 0)
    return ops.sum(ops.where(swapped, swap_gains, 0.0), axis=(1, 2))
