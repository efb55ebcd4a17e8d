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

    def __init__(self, ranks, mask, beta=None, pairwise="auto", scores=None):
        self.ranks = ranks
        self.mask = mask
        self.beta = beta
        self.pairwise = pairwise
        self.scores = scores  # what the positions order (read by pair accuracy's ties)

    @classmethod
    def exact(cls, scores, mask):
        """True positions π(x) (ties keep list order) with hard indicators."""
        return cls(rank_ops.exact_ranks(scores, mask), mask, scores=scores)

    @classmethod
    def smooth(cls, scores, mask, alpha, beta, pairwise="auto"):
        """Smooth positions π̂(x) (Qin eq. 20) with sigmoid indicators of slope `beta`; pairwise
        sums dense or in blocks as `pairwise` says (`tfapprox.pair_sums.PAIRWISE_MODES`)."""
        return cls(rank_ops.approx_ranks(scores, mask, alpha, pairwise), mask, beta, pairwise,
                   scores)

    def per_subtopic(self, num_subtopics):
        """Returns these positions repeated for each of `num_subtopics` subtopics: lists
        `[B·T, L]`, row b·T + t for subtopic t of list b (as `subtopic_rows` lays labels out)."""
        def repeat(x):
            shape = ops.shape(x)
            return ops.reshape(ops.broadcast_to(ops.expand_dims(x, 1),
                                                (shape[0], num_subtopics, shape[1])),
                               (shape[0] * num_subtopics, shape[1]))

        return Positions(repeat(self.ranks), repeat(self.mask), self.beta, self.pairwise)

    def size(self, k):
        """Returns k, or each list's number of real documents `[B]` when `k` is None."""
        return float(k) if k is not None else rank_ops.count_per_list(self.mask)

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


def dcg(labels, positions, k=None, gain_fn=None, rank_discount_fn=None):
    """DCG@k = Σ_x G(y_x)·D(π(x))·1{π(x) ≤ k}, with G = 2^y − 1 (`tfapprox.ops.gains`) and
    D(r) = 1/log2(1 + r) unless `gain_fn` / `rank_discount_fn` say otherwise (Järvelin &
    Kekäläinen 2002, with Burges et al.'s gains)."""
    gain = rank_ops.gains(labels) if gain_fn is None else gain_fn(labels)
    discount = (rank_ops.discounts(positions.ranks) if rank_discount_fn is None
                else rank_discount_fn(positions.ranks))
    real = ops.cast(positions.mask, gain.dtype)
    return ops.sum(gain * discount * positions.in_top(k) * real, axis=-1)


def ndcg(labels, positions, k=None, gain_fn=None, rank_discount_fn=None):
    """NDCG@k = Σ_x G(y_x)·D(π(x))·1{π(x) ≤ k} / N_k, with G = 2^y − 1, D(r) = 1/log2(1+r) unless
    `gain_fn` / `rank_discount_fn` say otherwise; N_k is the DCG@k of the documents ordered by
    gain (`tfapprox.ops.ideal_dcg` for the default functions)."""
    if gain_fn is None and rank_discount_fn is None:
        ideal = rank_ops.ideal_dcg(labels, k)
    else:
        gain = rank_ops.gains(labels) if gain_fn is None else gain_fn(labels)
        by_gain = Positions.exact(ops.stop_gradient(gain), positions.mask)
        ideal = dcg(labels, by_gain, k, gain_fn, rank_discount_fn)
    return rank_ops.safe_divide(dcg(labels, positions, k, gain_fn, rank_discount_fn), ideal)


def average_precision(relevance, positions, k=None):
    """AP@k = 1/|D+| Σ_y r(y)·1{π(y) ≤ k}/π(y) · (1 + Σ_{x≠y} r(x)·1{π(x) < π(y)})  (Qin et al.
    eq. 7, truncated at k as TF-Ranking's MAP@k: |D+| counts the whole list)."""
    precision_at_own_rank = (1.0 + positions.relevant_before(relevance)) / positions.ranks
    return rank_ops.safe_divide(
        ops.sum(relevance * positions.in_top(k) * precision_at_own_rank, axis=-1),
        ops.sum(relevance, axis=-1))


def precision_at_k(relevance, positions, k):
    """P@k = (1/k) Σ_x r(x)·1{π(x) ≤ k}  (Qin et al. eq. 13); the divisor is k, as in trec_eval,
    or the number of real documents when k is None."""
    return ops.sum(relevance * positions.in_top(k), axis=-1) / positions.size(k)


def recall_at_k(relevance, positions, k):
    """R@k = Σ_x r(x)·1{π(x) ≤ k} / Σ_x r(x): the share of the relevant documents in the top k."""
    return rank_ops.safe_divide(ops.sum(relevance * positions.in_top(k), axis=-1),
                                ops.sum(relevance, axis=-1))


def hits_at_k(relevance, positions, k):
    """Hits@k = max_x r(x)·1{π(x) ≤ k}: 1 when a relevant document is in the top k."""
    return ops.max(relevance * positions.in_top(k), axis=-1, initial=0.0)


def reciprocal_rank(relevance, positions, k=None):
    """RR@k = max_x r(x)·1{π(x) ≤ k}/π(x): one over the position of the first relevant document,
    0 when it is below k."""
    return ops.max(relevance * positions.in_top(k) / positions.ranks, axis=-1, initial=0.0)


def average_relevance_position(labels, positions):
    """ARP = Σ_x y_x·π(x) / Σ_x y_x: the mean position of the documents, weighted by their labels
    (Zhu et al. 2004; TF-Ranking's ARP). Lower is better."""
    return rank_ops.safe_divide(ops.sum(labels * positions.ranks, axis=-1),
                                ops.sum(labels, axis=-1))


def ordered_pairs(labels, positions):
    """Returns `(OPA, pairs)`, `[B]` each: pairs = #{(i, j) real: y_i > y_j}, and the ordered pair
    accuracy OPA = #{(i, j): y_i > y_j, s_i > s_j} / pairs. Read from the scores, not the
    positions: a pair of equal scores is not ordered (as TF-Ranking counts it), where positions
    would order it by list place. Pairs are counted dense or in blocks (`positions.pairwise`)."""
    real_labels = ops.where(positions.mask, labels, float("-inf"))
    real = ops.cast(positions.mask, rank_ops.COMPUTE_DTYPE)
    pairs = ops.sum(real * pair_sums.higher_counts(real_labels, positions.pairwise), axis=-1)
    ordered = ops.sum(real * pair_sums.concordant_counts(real_labels, positions.scores,
                                                         positions.pairwise), axis=-1)
    return rank_ops.safe_divide(ordered, pairs), pairs


def expected_reciprocal_rank(labels, positions, k=None, max_label=4.0):
    """ERR@k = Σ_x 1{π(x) ≤ k}/π(x) · R(y_x) · Π_{z: π(z) < π(x)} (1 − R(y_z)), with the
    probability that document x satisfies the user R(y) = (2^y − 1)/2^{y_max} (Chapelle et al.,
    CIKM 2009, eq. 4; y_max = `max_label`, labels above it count as it). The product over the
    documents placed before x is exp Σ ln(1 − R), a `relevant_before` sum."""
    capped = ops.minimum(labels, max_label)
    satisfied = ops.power(2.0, capped - max_label) - 2.0 ** -max_label  # 0 on padded slots
    not_yet = ops.exp(positions.relevant_before(ops.log1p(-satisfied)))
    return ops.sum(positions.in_top(k) * satisfied * not_yet / positions.ranks, axis=-1)


def subtopic_rows(subtopic_labels):
    """Returns labels `[B, L, T]` as lists `[B·T, L]`, row b·T + t holding subtopic t of list b."""
    batch_size, list_size, num_subtopics = ops.shape(subtopic_labels)
    return ops.reshape(ops.transpose(subtopic_labels, (0, 2, 1)),
                       (batch_size * num_subtopics, list_size))


def alpha_dcg(subtopic_labels, positions, k=None, alpha=0.5, rank_discount_fn=None):
    """α-DCG@k = Σ_x D(π(x))·1{π(x) ≤ k} Σ_t y_{x,t}·(1 − α)^{c_{x,t}}, c_{x,t} = Σ_{z: π(z) < π(x)}
    y_{z,t} the documents placed before x that cover subtopic t (Clarke et al., SIGIR 2008,
    eq. 7 and the gain above it; unnormalised, as TF-Ranking's AlphaDCGMetric). Subtopic labels
    `[B, L, T]`."""
    batch_size, list_size, num_subtopics = ops.shape(subtopic_labels)
    covered_before = positions.per_subtopic(num_subtopics).relevant_before(
        subtopic_rows(subtopic_labels))
    covered_before = ops.transpose(
        ops.reshape(covered_before, (batch_size, num_subtopics, list_size)), (0, 2, 1))
    novelty = ops.sum(subtopic_labels * ops.power(1.0 - alpha, covered_before), axis=-1)
    discount = (rank_ops.discounts(positions.ranks) if rank_discount_fn is None
                else rank_discount_fn(positions.ranks))
    return ops.sum(novelty * discount * positions.in_top(k), axis=-1)


def precision_ia(subtopic_relevance, positions, k=None):
    """Pre-IA@k = 1/|T+| Σ_{t ∈ T+} P@k(t), P@k(t) = (1/k) Σ_x r(x, t)·1{π(x) ≤ k}, T+ the
    subtopics some document of the list covers (Agrawal et al., WSDM 2009, with uniform subtopic
    weights; Clarke et al., TREC 2009 Web Track). The divisor is k, as for `precision_at_k`.
    Subtopic relevance `[B, L, T]`."""
    covered = ops.sum(ops.sum(subtopic_relevance, axis=-1) * positions.in_top(k), axis=-1)
    subtopics = rank_ops.count_per_list(ops.any(subtopic_relevance > 0, axis=1))
    return rank_ops.safe_divide(covered, subtopics * positions.size(k))
