"""Structural hinge losses over AP: SVM^map and PermuRank.

Y. Yue, T. Finley, F. Radlinski, T. Joachims. *A support vector method for optimizing average
precision*, SIGIR 2007. J. Xu, T.-Y. Liu, M. Lu, H. Li, W.-Y. Ma. *Directly optimizing evaluation
measures in learning to rank*, SIGIR 2008.
"""

import keras
from keras import ops

from tfapprox import direct_ops
from tfapprox import ops as rank_ops
from tfapprox.losses import base


class _APStructuralHingeLoss(base.RankingLoss):
    """The hinge of 1 − AP at the most violated ranking; subclasses give F's scale per list."""

    def __init__(self, relevance_threshold, reduction, name, dtype):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.relevance_threshold = base.check_threshold(relevance_threshold)

    def pair_scale(self, num_relevant, num_nonrelevant):
        """Returns c, the scale of F(y) = c·Σ_{i rel, j nonrel} y_ij (s_i − s_j), `[B]`."""
        raise NotImplementedError

    def per_list(self, labels, mask, scores):
        relevance = rank_ops.binary_relevance(labels, mask, self.relevance_threshold)
        num_relevant = ops.sum(relevance, axis=-1)
        num_nonrelevant = rank_ops.count_per_list(mask) - num_relevant
        hinge = direct_ops.ap_structural_hinge(relevance, mask, scores,
                                               self.pair_scale(num_relevant, num_nonrelevant))
        return hinge, ops.logical_and(num_relevant > 0, num_nonrelevant > 0)

    def get_config(self):
        return {**super().get_config(), "relevance_threshold": self.relevance_threshold}


@keras.saving.register_keras_serializable(package="tfapprox")
class SVMMapLoss(_APStructuralHingeLoss):
    """SVM^map's structural hinge (Yue, Finley, Radlinski & Joachims, SIGIR 2007) as a loss.

        loss = max_y [Δ_AP(y) + F(y) − F(y*)],   Δ_AP(y) = 1 − AP(y),
        F(y) = Σ_{i rel, j nonrel} y_ij (s_i − s_j) / (|rel|·|nonrel|),

    y over the rankings, y_ij = +1 when y puts i above j and −1 otherwise, y* the rankings with
    every relevant document first. The most violated y is found exactly by Yue et al.'s greedy
    search (each non-relevant document placed on its own among the relevant ones sorted by
    score), without gradient; the loss is the hinge at that y, whose gradient flows through F.
    It bounds 1 − AP of the current ranking from above. Relevance is r = 1{label ≥
    relevance_threshold}; a list contributes when it has a relevant and a non-relevant document.
    """

    def __init__(self, relevance_threshold=1.0, reduction="sum_over_batch_size",
                 name="svm_map_loss", dtype=None):
        super().__init__(relevance_threshold, reduction, name, dtype)

    def pair_scale(self, num_relevant, num_nonrelevant):
        return rank_ops.safe_divide(1.0, num_relevant * num_nonrelevant)


@keras.saving.register_keras_serializable(package="tfapprox")
class PermuRankLoss(_APStructuralHingeLoss):
    """PermuRank (Xu, Liu, Lu, Li & Ma, SIGIR 2008) with AP: a hinge on the most violated pair of
    a perfect and an imperfect permutation.

    Xu et al. bound 1 − AP by their type-two bound, Σ over perfect π* and imperfect π of
    (E(π*) − E(π))·⟦F(π*) ≤ F(π)⟧, with F over all pairs of the n documents,

        F(π) = Σ_{k<l} z_kl (s_k − s_l) / (n(n − 1)),   z_kl = +1 if π puts k above l, else −1.

    This loss relaxes the indicator by a margin and takes the most violated pair at each step:

        loss = max_{π imperfect} [(1 − AP(π)) − (F(π*) − F(π))]_+,   π* = argmax_{π perfect} F(π),

    π* being the relevant documents in score order above the non-relevant ones in score order.
    Pairs within a class cancel at the maximiser, so it is found exactly by `SVMMapLoss`'s search
    with F scaled by 1/(n(n − 1)) in place of 1/(|rel|·|nonrel|). Where the paper differs:
    PermuRank (Fig. 2) keeps per-query working sets of (π*, π) pairs and re-solves a regularised
    SVM over all of them, while a gradient step here sees only the current most violated pair;
    and Liu's account (Learning to Rank for IR, 2011, §4.2.2) relaxes the indicator as a product,
    (E(π*) − E(π))·[1 − (F(π*) − F(π))]_+, whose maximiser has no such exact search. It bounds
    1 − AP of the current ranking from above. Relevance and contributing lists as `SVMMapLoss`.
    """

    def __init__(self, relevance_threshold=1.0, reduction="sum_over_batch_size",
                 name="permurank_loss", dtype=None):
        super().__init__(relevance_threshold, reduction, name, dtype)

    def pair_scale(self, num_relevant, num_nonrelevant):
        documents = num_relevant + num_nonrelevant
        return rank_ops.safe_divide(1.0, documents * (documents - 1.0))
