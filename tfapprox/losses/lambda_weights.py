"""Weights of documents and pairs that make a loss follow an IR measure."""

from tfapprox import ops as rank_ops


def chen_weights(labels, positions, topk):
    """Returns Chen et al.'s β(x) = G(l_x)·D(pos_x)·1{pos_x ≤ C} and the normaliser N_C."""
    weights = (rank_ops.gains(labels) * rank_ops.discounts(positions)
               * rank_ops.top_k_cutoff(positions, topk))
    return weights, rank_ops.ideal_dcg(labels, topk)
