"""IR measures written once, as formulas over positions and truncation indicators.

Qin, Liu & Li (2010) §4.1 express NDCG, AP and P@k through the position π(x) of each document
and the indicators 1{π(x) ≤ k} and 1{π(x) < π(y)}. A `Positions` object carries those parts:
`Positions.exact` uses the true positions and hard indicators (the metric), `Positions.smooth`
uses π̂ and sigmoids (the surrogate loss). Every measure below is fed either one, so a loss can
never drift from the metric it approximates.

Each measure returns one value per list, `[B]`; lists where the measure is undefined (no relevant
document) get 0, and `tfapprox.ops.count_per_list` of the relevance tells callers which they are.
"""

from keras import ops

from tfapprox import ops as rank_ops
from tfapprox import pair_sums


class Positions:
    """Positions of the documents of each list, with the truncation indicators built on them."""

    def __init__(self, ranks, mask, beta=None, pairwise="auto"):
        self.ranks = ranks
        self.mask = mask
        self.beta = beta
        self.pairwise = pairwise

    @classmethod
    def exact(cls, scores, mask):
        """True positions π(x) (ties keep list order) with hard indicators."""
        return cls(rank_ops.exact_ranks(scores, mask), mask)

    @classmethod
    def smooth(cls, scores, mask, alpha, beta, pairwise="auto"):
        """Smooth positions π̂(x) (Qin eq. 20) with sigmoid indicators of slope `beta`; pairwise
        sums dense or in blocks as `pairwise` says (`tfapprox.pair_sums.PAIRWISE_MODES`)."""
        return cls(rank_ops.approx_ranks(scores, mask, alpha, pairwise), mask, beta, pairwise)

    def in_top(self, k):
        """Returns 1{π(x) ≤ k}, or σ(β(k + ½ − π̂(x))) when smooth; ones when `k` is None."""
        if self.beta is None:
            return rank_ops.top_k_cutoff(self.ranks, k)
        return rank_ops.smooth_top_k_cutoff(self.ranks, k, self.beta)

    def relevant_before(self, relevance):
        """Returns Σ_{x≠y} r(x)·1{π(x) < π(y)} for each y, or Σ_{x≠y} r(x)·σ(β(π̂(y) − π̂(x))).

        Smooth, it is `sigmoid_pair_sums` of −βπ̂ weighted by r, less its x = y term r(y)·σ(0):
        summed in blocks for long lists. Exact, the positions are a permutation of 1..L
        (`tfapprox.ops.exact_ranks`), so it is the running count of relevant documents in rank
        order, before y's own place: O(L log L) (padded x have r(x) = 0).
        """
        if self.beta is not None:
            positions = -self.beta * self.ranks  # span β·(L − 1): fits 174 only in short lists
            return (pair_sums.sigmoid_pair_sums(positions, relevance, self.pairwise,
                                                factored=False) - 0.5 * relevance)
        place = ops.cast(self.ranks, "int32") - 1
        by_rank = ops.take_along_axis(relevance, ops.argsort(place, axis=-1), axis=-1)
        before = ops.cumsum(by_rank, axis=-1) - by_rank
        return ops.take_along_axis(before, place, axis=-1)


def ndcg(labels, positions, k=None):
    """NDCG@k = Σ_x G(y_x)·D(π(x))·1{π(x) ≤ k} / N_k, with G = 2^y − 1, D(r) = 1/log2(1+r)."""
    dcg = ops.sum(rank_ops.gains(labels) * rank_ops.discounts(positions.ranks)
                  * positions.in_top(k), axis=-1)
    return rank_ops.safe_divide(dcg, rank_ops.ideal_dcg(labels, k))


def average_precision(relevance, positions):
    """AP = 1/|D+| Σ_y r(y)/π(y) · (1 + Σ_{x≠y} r(x)·1{π(x) < π(y)})  (Qin et al. eq. 7)."""
    precision_at_own_rank = (1.0 + positions.relevant_before(relevance)) / positions.ranks
    return rank_ops.safe_divide(ops.sum(relevance * precision_at_own_rank, axis=-1),
                                ops.sum(relevance, axis=-1))


def precision_at_k(relevance, positions, k):
    """P@k = (1/k) Σ_x r(x)·1{π(x) ≤ k}  (Qin et al. eq. 13); the divisor is k, as in trec_eval."""
    return ops.sum(relevance * positions.in_top(k), axis=-1) / float(k)


def reciprocal_rank(relevance, positions):
    """RR = max_x r(x)/π(x): one over the position of the first relevant document."""
    return ops.max(relevance / positions.ranks, axis=-1, initial=0.0)
