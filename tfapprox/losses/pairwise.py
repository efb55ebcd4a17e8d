"""Pairwise losses: RankNet, Chen et al.'s weighted RankNet and LambdaRank.

C. Burges et al. *Learning to rank using gradient descent*, ICML 2005. W. Chen, T.-Y. Liu, Y. Lan,
Z. Ma, H. Li. *Ranking measures and loss functions in learning to rank*, NIPS 2009.
C. J. C. Burges, R. Ragno, Q. V. Le. *Learning to rank with nonsmooth cost functions*, NIPS 2006.
"""

import keras
from keras import ops

from tfapprox import direct_ops
from tfapprox import ops as rank_ops
from tfapprox import pair_sums
from tfapprox.losses import base, lambda_weights, sampling


@keras.saving.register_keras_serializable(package="tfapprox")
class RankNetLoss(base.RankingLoss):
    """RankNet: Σ_{l_i > l_j} ln(1 + e^{−(s_i − s_j)}) per list (Burges et al. 2005).

    Summed over the pairs of a list, this equals the per-list sum of TF-Ranking's unreduced
    `PairwiseLogisticLoss` (its default reduction instead divides by batch × list size). The
    pair sums are dense or blocked as `pairwise` says (see `ApproxNDCGLoss`). A list contributes
    when it has a pair with different labels.
    """

    def __init__(self, pairwise="auto", reduction="sum_over_batch_size", name="ranknet_loss",
                 dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.pairwise = base.check_pairwise(pairwise)

    def pair_weights(self, labels, mask):
        """Returns the weight of each pair's upper document and the list normaliser."""
        return ops.ones_like(labels), ops.ones(ops.shape(labels)[:1])

    def per_list(self, labels, mask, scores):
        as_upper = pair_sums.logistic_pair_sums(scores, labels, mask, self.pairwise)
        weights, normaliser = self.pair_weights(labels, mask)
        total = ops.sum(as_upper * weights, axis=-1)
        return rank_ops.safe_divide(total, normaliser), None

    def get_config(self):
        return {**super().get_config(), "pairwise": self.pairwise}


@keras.saving.register_keras_serializable(package="tfapprox")
class WeightedRankNetLoss(RankNetLoss):
    """Weighted RankNet (Chen et al. 2009, §4): a tighter upper bound of 1 − NDCG@C.

        loss = (1/N_C) Σ_{l_i > l_j} G(l_i)·D(p_i) · ln(1 + e^{−(s_i − s_j)}),
        p_i = 1 + #{documents with label > l_i},  G(l) = 2^l − 1,  D(p) = 1/log2(1 + p)·1{p ≤ C}.

    The weights come from the ground truth (the best position a document can hold), never from the
    model's current ranking. Chen's Theorem 1 gives 1 − NDCG@C ≤ loss / ln 2. `topk` is C
    (None: the whole list); N_C is the ideal DCG@C.
    """

    def __init__(self, topk=None, pairwise="auto", reduction="sum_over_batch_size",
                 name="weighted_ranknet_loss", dtype=None):
        super().__init__(pairwise=pairwise, reduction=reduction, name=name, dtype=dtype)
        self.topk = base.check_cutoff("topk", topk)

    def pair_weights(self, labels, mask):
        positions = rank_ops.ideal_positions(labels, mask, self.pairwise)
        return lambda_weights.chen_weights(labels, positions, self.topk)

    def get_config(self):
        return {**super().get_config(), "topk": self.topk}


@keras.saving.register_keras_serializable(package="tfapprox")
class LambdaRankLoss(base.RankingLoss):
    """LambdaRank (Burges et al., NIPS 2006): pairwise logistic losses weighted by |ΔNDCG|.

        loss = Σ_{l_i > l_j} |ΔNDCG@k_ij| · ln(1 + e^{−(s_i − s_j)}),
        |ΔNDCG@k_ij| = |G(l_i) − G(l_j)| · |D_k(π_i) − D_k(π_j)| / N_k,

    the change of NDCG@k when i and j swap places in the current ranking: π are the exact
    positions of the current scores, G(l) = 2^l − 1, D_k(r) = 1{r ≤ k}/log2(1 + r), N_k the ideal
    DCG@k. The weights are held fixed (no gradient), so ∂loss/∂s_i sums Burges' lambdas
    −|ΔNDCG_ij|/(1 + e^{s_i − s_j}). `topk` is k (None: the whole list).

    Per list, this is TF-Ranking's unreduced `PairwiseLogisticLoss(lambda_weight=
    NDCGLambdaWeight(topn=k, smooth_fraction=1.0))` summed over the list and divided by the padded
    list size, by which TF-Ranking scales its weights. (`NDCGLambdaWeight()`'s default
    smooth_fraction=0 gives LambdaLoss' weight |D(|π_i − π_j|) − D(|π_i − π_j| + 1)| instead of
    |ΔNDCG|.) A list contributes when it has a pair with different labels.
    """

    def __init__(self, topk=None, reduction="sum_over_batch_size", name="lambdarank_loss",
                 dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.topk = base.check_cutoff("topk", topk)

    def per_list(self, labels, mask, scores):
        pairs = ops.logical_and(direct_ops.real_pairs(mask),
                                direct_ops.pair_differences(labels) > 0)  # l_i > l_j
        weights = direct_ops.ndcg_swap_weights(labels, mask, scores, self.topk)
        logistic = ops.softplus(-direct_ops.pair_differences(scores))
        return ops.sum(ops.where(pairs, weights * logistic, 0.0), axis=(1, 2)), None

    def get_config(self):
        return {**super().get_config(), "topk": self.topk}


def _check_temperature(temperature):
    return base.check_positive("temperature", temperature)


class PairwiseLoss(base.RankingLoss):
    """The pairwise skeleton (TF-Ranking's `_PairwiseLoss`, Rax's `pairwise_loss`): one pair
    function f of the score difference over the pairs a label order defines, times optional
    lambda weights,

        loss = Σ_{i, j real: l_i > l_j} λ_ij · f((s_i − s_j)/T),

    λ from `lambda_weight` (`tfapprox.losses.lambda_weights`; 1 without one) over the ranks of the
    current scores, T = `temperature`. A subclass gives f as `pair_loss`. Per list this is the sum
    over the list of TF-Ranking's unreduced [B, L] loss (whose default reduction divides the
    batch's total by B·L; ours averages the lists that have a pair); TF-Ranking's DCG-family
    weights are scaled by the padded list size, ours by the real documents'. Per-document
    `sample_weight`s are not taken: one weight per list. A list contributes when it has a pair
    with different labels.
    """

    default_name = None  # the subclass's snake-case name, TF-Ranking's key

    def __init__(self, lambda_weight=None, temperature=1.0, reduction="sum_over_batch_size",
                 name=None, dtype=None):
        super().__init__(reduction=reduction, name=name or self.default_name, dtype=dtype)
        self.lambda_weight = lambda_weights.deserialize(lambda_weight, "pair",
                                                        type(self).__name__)
        self.temperature = _check_temperature(temperature)

    @staticmethod
    def pair_loss(differences):
        """Returns f(d) of each pair's scaled score difference d = (s_i − s_j)/T."""
        raise NotImplementedError

    def pair_losses(self, labels, scores):
        """Returns f((s_i − s_j)/T), `[B, L, L]`; PairwiseMSELoss also reads the labels."""
        return self.pair_loss(direct_ops.pair_differences(scores))

    def ordered_pairs(self, labels, mask):
        """Returns bool `[B, L, L]`: the pairs the loss sums over (l_i > l_j, so i ≠ j, both
        real)."""
        return ops.logical_and(direct_ops.both_real(mask), direct_ops.pair_differences(labels) > 0)

    def per_list(self, labels, mask, scores):
        if self.temperature != 1.0:
            scores = scores / self.temperature
        pairs = self.ordered_pairs(labels, mask)
        losses = self.pair_losses(labels, scores)
        if self.lambda_weight is None:  # one select: no [B, L, L] weights to build and multiply
            return ops.sum(ops.where(pairs, losses, 0.0), axis=(1, 2)), None
        ranks = lambda_weights.current_ranks(scores, mask)
        weights = ops.where(pairs, self.lambda_weight.pair_weights(labels, mask, ranks), 0.0)
        return ops.sum(ops.where(weights > 0, weights * losses, 0.0), axis=(1, 2)), None

    def get_config(self):
        return {**super().get_config(),
                "lambda_weight": lambda_weights.serialize(self.lambda_weight),
                "temperature": self.temperature}


@keras.saving.register_keras_serializable(package="tfapprox")
class PairwiseLogisticLoss(PairwiseLoss):
    """Pairwise logistic loss (TF-Ranking's name for RankNet, Burges et al. 2005):
    f(d) = ln(1 + e^{−d}) in `PairwiseLoss`. Without a lambda weight it is `RankNetLoss` of the
    scores over T, and its pairs are summed as RankNet's are (`pairwise`, dense or blocked).
    """

    def __init__(self, lambda_weight=None, temperature=1.0, pairwise="auto",
                 reduction="sum_over_batch_size", name="pairwise_logistic_loss", dtype=None):
        super().__init__(lambda_weight=lambda_weight, temperature=temperature,
                         reduction=reduction, name=name, dtype=dtype)
        self.pairwise = base.check_pairwise(pairwise)

    @staticmethod
    def pair_loss(differences):
        return ops.softplus(-differences)

    def per_list(self, labels, mask, scores):
        if self.lambda_weight is not None:
            return super().per_list(labels, mask, scores)
        as_upper = pair_sums.logistic_pair_sums(scores / self.temperature, labels, mask,
                                                self.pairwise)
        return ops.sum(as_upper, axis=-1), None

    def get_config(self):
        return {**super().get_config(), "pairwise": self.pairwise}


@keras.saving.register_keras_serializable(package="tfapprox")
class PairwiseHingeLoss(PairwiseLoss):
    """Pairwise hinge loss (RankSVM, Herbrich et al. 2000; Joachims 2002):
    f(d) = max(0, 1 − d) in `PairwiseLoss`."""

    default_name = "pairwise_hinge_loss"

    @staticmethod
    def pair_loss(differences):
        return ops.relu(1.0 - differences)


@keras.saving.register_keras_serializable(package="tfapprox")
class PairwiseSoftZeroOneLoss(PairwiseLoss):
    """Pairwise soft 0-1 loss: f(d) = 1 − σ(d) = σ(−d) in `PairwiseLoss`, a smooth count of the
    misordered pairs."""

    default_name = "pairwise_soft_zero_one_loss"

    @staticmethod
    def pair_loss(differences):
        return ops.sigmoid(-differences)


@keras.saving.register_keras_serializable(package="tfapprox")
class PairwiseMSELoss(PairwiseLoss):
    """Pairwise squared error: loss = Σ_{i ≠ j real} λ_ij·((s_i − s_j)/T − (l_i − l_j))², over
    every ordered pair of real documents, equal labels included (so both (i, j) and (j, i)),
    as TF-Ranking's `PairwiseMSELoss`."""

    default_name = "pairwise_mse_loss"

    def pair_losses(self, labels, scores):
        return ops.square(direct_ops.pair_differences(scores)
                          - direct_ops.pair_differences(labels))

    def ordered_pairs(self, labels, mask):
        return direct_ops.real_pairs(mask)


@keras.saving.register_keras_serializable(package="tfapprox")
class YetiLogisticLoss(sampling.GumbelSampled, PairwiseLogisticLoss):
    __doc__ = ("""YetiRank's loss for neural rankers (Lyzhin, Ustimenko, Gulin & Prokhorenkova,
    *Which tricks are important for learning to rank?*, 2022; TF-Ranking's `YetiLogisticLoss`):
    `PairwiseLogisticLoss` over Gumbel samples of the scores, weighted by
    `YetiDCGLambdaWeight` (the default `lambda_weight`), which keeps the pairs neighbouring in
    each sampled ranking:

        loss = E_g[ Σ_{i, j: l_i > l_j, |r^g_i − r^g_j| = 1} λ_ij·ln(1 + e^{−(s^g_i − s^g_j)/T}) ],

    s^g = ln softmax((s + g)/τ), r^g its ranks, estimated from the samples.
""" + sampling.ARGUMENTS)

    def __init__(self, lambda_weight=None, temperature=1.0, sample_size=8,
                 gumbel_temperature=1.0, seed=None, reduction="sum_over_batch_size",
                 name="yeti_logistic_loss", dtype=None):
        super().__init__(lambda_weight=lambda_weight or lambda_weights.YetiDCGLambdaWeight(),
                         temperature=temperature, reduction=reduction, name=name, dtype=dtype)
        self._init_sampling(sample_size, gumbel_temperature, seed)

    def get_config(self):
        config = super().get_config()
        del config["pairwise"]  # weighted pairs are dense
        return config
