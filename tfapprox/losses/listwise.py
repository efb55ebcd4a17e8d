"""Listwise losses over permutation probabilities: ListMLE and Chen et al.'s weighted ListMLE.

F. Xia, T.-Y. Liu, J. Wang, W. Zhang, H. Li. *Listwise approach to learning to rank: theory and
algorithm*, ICML 2008. W. Chen et al., NIPS 2009.
"""

import keras
from keras import ops

from tfapprox import ops as rank_ops
from tfapprox.losses import base, lambda_weights


@keras.saving.register_keras_serializable(package="tfapprox")
class ListMLELoss(base.RankingLoss):
    """ListMLE (Xia et al. 2008): −log Plackett–Luce likelihood of a label-consistent permutation.

        loss = Σ_{s=1}^{n} (−s_{y(s)} + ln Σ_{i ≥ s} e^{s_{y(i)}}),

    where y sorts the documents by descending label. Documents with equal labels are ordered by a
    stateless pseudo-random key hashed from (seed, score): reproducible for a seed, changing from
    step to step as the scores move. Without ties it equals TF-Ranking's `ListMLELoss`. The
    documents are sorted into y once and the suffix log-sum-exps come from one running sum, or,
    in batches where a suffix would underflow it, from a rescaled scan (the pairs in short lists
    without XLA), so a list costs O(L log L) and score gaps of 1e4 stay finite. A list
    contributes when it has a document with label > 0.
    """

    def __init__(self, seed=0, reduction="sum_over_batch_size", name="listmle_loss",
                 dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"`seed` must be an int; got {seed!r}")
        self.seed = seed

    def position_weights(self, labels, positions):
        """Returns the weight of each position's term and the list normaliser, inputs in y order;
        `(None, None)`: every term weighs 1 and nothing divides (fewer ops than ones)."""
        return None, None

    def per_list(self, labels, mask, scores):
        keys = rank_ops.tie_breaking_keys(scores, self.seed)
        order = rank_ops.plackett_luce_order(labels, mask, keys)
        placed_labels, placed_scores = (
            rank_ops.gather_in_lists(x, order) for x in (labels, scores))
        # y puts the real documents first, so position p is real when p < their count.
        placed_mask = (ops.expand_dims(ops.arange(ops.shape(labels)[1]), 0)
                       < ops.expand_dims(ops.sum(ops.cast(mask, "int32"), axis=-1), 1))
        terms = rank_ops.suffix_logsumexp_minus_self(placed_scores, placed_mask)
        positions = ops.cumsum(ops.ones_like(placed_scores), axis=-1)  # s = 1, 2, ..., L
        weights, normaliser = self.position_weights(placed_labels, positions)
        if weights is None:
            return ops.sum(terms, axis=-1), None
        return rank_ops.safe_divide(ops.sum(terms * weights, axis=-1), normaliser), None

    def get_config(self):
        return {**super().get_config(), "seed": self.seed}


@keras.saving.register_keras_serializable(package="tfapprox")
class WeightedListMLELoss(ListMLELoss):
    """Weighted ListMLE (Chen et al. 2009, §4): a tighter upper bound of 1 − NDCG@C.

        loss = (1/N_C) Σ_{s=1}^{n} G(l_{y(s)})·D(s) · (−s_{y(s)} + ln Σ_{i ≥ s} e^{s_{y(i)}}),

    with y the label-consistent permutation of `ListMLELoss`, G(l) = 2^l − 1,
    D(s) = 1/log2(1 + s)·1{s ≤ C}, and N_C the ideal DCG@C. Chen's Theorem 2 gives
    1 − NDCG@C ≤ loss / ln 2. `topk` is C (None: the whole list).
    """

    def __init__(self, topk=None, seed=0, reduction="sum_over_batch_size",
                 name="weighted_listmle_loss", dtype=None):
        super().__init__(seed=seed, reduction=reduction, name=name, dtype=dtype)
        self.topk = base.check_cutoff("topk", topk)

    def position_weights(self, labels, positions):
        return lambda_weights.chen_weights(labels, positions, self.topk)

    def get_config(self):
        return {**super().get_config(), "topk": self.topk}
