"""Ranking math of LambdaRank (its loss is in `tfapprox.losses`).

Written with `keras.ops`, like `tfapprox.ops`: tensors are `[batch, list_size]` unless a docstring
says otherwise, `mask` is True on real documents, and no padded slot enters a sum. Ranks, gains,
discounts and ideal DCGs come from `tfapprox.ops`.
"""

from keras import ops

from tfapprox import ops as rank_ops


def real_pairs(mask):
    """Returns bool `[B, L, L]`: entry `[b, i, j]` is True when i ≠ j are both real documents."""
    not_self = ops.logical_not(ops.eye(ops.shape(mask)[1], dtype="bool"))
    both_real = ops.logical_and(ops.expand_dims(mask, 2), ops.expand_dims(mask, 1))
    return ops.logical_and(both_real, ops.expand_dims(not_self, 0))


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
