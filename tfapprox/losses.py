"""Keras ranking losses: the approximation framework (Qin et al.), Chen et al.'s weighted losses,
LambdaRank, SoftRank, SVM^map and PermuRank.

Inputs, for every loss: `y_true` is `[B, L]` graded labels (a label < 0 marks a padded slot) or a
dict `{"labels": [B, L], "mask": [B, L]}`; `y_pred` is `[B, L]` or `[B, L, 1]` scores. Padded slots
never influence a value or a gradient, and may hold anything, NaN included.

Each loss first computes one value per list. A list for which the loss is undefined — no relevant
document, or fewer than two comparable documents for a pairwise loss — contributes 0 and a zero
gradient; so does a list whose real documents all have the same label, for every loss: each order
of it is ideal, so it has nothing to teach (the smooth losses — ApproxNDCG, ApproxAP, Approx P@k,
SoftRank — would otherwise push its scores apart, and ListMLE toward an arbitrary order); and so
does a batch of no lists or of empty lists. A NaN label or a NaN score on a real document makes
its list's loss NaN (the label is not taken for padding), so `keras.callbacks.TerminateOnNaN`
stops training. Labels of 128 and more (2^128 overflows float32) are fine: see
`tfapprox.ops.gains`. Reductions:

- `"sum_over_batch_size"` (default; `"mean"` is the same): the mean over the lists that *have* a
  loss, weighted by `sample_weight` (one weight ≥ 0 per list, `tfapprox.ops.list_weights`) when
  given. Lists without a loss do not dilute the mean, unlike TF-Ranking's default. Under a
  tf.distribute strategy with N replicas each replica's mean is divided by N, as Keras' own mean
  reductions do.
- `"sum"`: the weighted sum over lists.
- `None` or `"none"`: one value per list, `[B]`.

References: T. Qin, T.-Y. Liu, H. Li. *A general approximation framework for direct optimization
of information retrieval measures*, Information Retrieval 13(4), 2010. W. Chen, T.-Y. Liu, Y. Lan,
Z. Ma, H. Li. *Ranking measures and loss functions in learning to rank*, NIPS 2009.
C. J. C. Burges, R. Ragno, Q. V. Le. *Learning to rank with nonsmooth cost functions*, NIPS
2006.
M. Taylor, J. Guiver, S. Robertson, T. Minka. *SoftRank: optimizing non-smooth rank
metrics*, WSDM 2008.
Y. Yue, T. Finley, F. Radlinski, T. Joachims. *A support vector method for optimizing
average precision*, SIGIR 2007. J. Xu, T.-Y. Liu, M. Lu, H. Li, W.-Y. Ma. *Directly optimizing
evaluation measures in learning to rank*, SIGIR 2008.
"""

import math

import keras
from keras import ops

from tfapprox import direct_ops
from tfapprox import measures
from tfapprox import ops as rank_ops
from tfapprox import pair_sums

_REDUCTIONS = ("sum_over_batch_size", "mean", "sum", "none", None)


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be a finite number > 0; got {value!r}")
    return float(value)


def _check_cutoff(name, value, allow_none=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "None or an int >= 1" if allow_none else "an int >= 1"
        raise ValueError(f"`{name}` must be {expected}; got {value!r}")
    return value


def _check_pairwise(value):
    if value not in pair_sums.PAIRWISE_MODES:
        raise ValueError(f"`pairwise` must be one of {pair_sums.PAIRWISE_MODES}; got {value!r}")
    return value


def _check_threshold(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"`relevance_threshold` must be a finite number; got {value!r}")
    return float(value)


class RankingLoss(keras.losses.Loss):
    """Base class: standardises inputs, asks the subclass for per-list values, reduces them.
    `ragged=True` takes `tf.RaggedTensor` labels and scores `[B, (L)]`, as TF-Ranking's losses do
    (`tfapprox.ops.dense_lists`)."""

    def __init__(self, reduction="sum_over_batch_size", name=None, dtype=None, ragged=False):
        if reduction not in _REDUCTIONS:
            raise ValueError(f"`reduction` must be one of {_REDUCTIONS}; got {reduction!r}")
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.ragged = bool(ragged)

    def get_config(self):
        # only when set: a subclass that does not pass `ragged` on must still rebuild from it
        return {**super().get_config(), **({"ragged": True} if self.ragged else {})}

    def per_list(self, labels, mask, scores):
        """Returns `(loss [B], has_loss [B] bool)` from standardised inputs; `has_loss` None
        means every list with two different labels (`has_label_pairs`) has a loss: real labels
        being ≥ 0, such a list also has a document with label > 0."""
        raise NotImplementedError

    def losses_and_flags(self, y_true, y_pred):
        """Returns the loss of each list (0 where it has none, NaN where a real document's label
        or score is NaN) and whether it has one, `[B]`. A list whose real documents all share
        one label has none, whatever `per_list` says: every order of it is ideal."""
        labels, mask, scores = rank_ops.standardize(y_true, y_pred, ragged=self.ragged)
        loss, has_loss = self.per_list(labels, mask, scores)
        has_pairs = rank_ops.has_label_pairs(labels, mask)
        has_loss = has_pairs if has_loss is None else ops.logical_and(has_loss, has_pairs)
        nan_input = rank_ops.nan_input_lists(labels, scores)
        loss = ops.where(nan_input, float("nan"), ops.where(has_loss, loss, 0.0))
        return loss, ops.logical_or(has_loss, nan_input)

    def call(self, y_true, y_pred):
        """Returns the loss of each list, `[B]`: 0 where the list has no loss."""
        return self.losses_and_flags(y_true, y_pred)[0]

    def __call__(self, y_true, y_pred, sample_weight=None):
        loss, has_loss = self.losses_and_flags(y_true, y_pred)
        weights = ops.cast(has_loss, rank_ops.COMPUTE_DTYPE)
        if sample_weight is not None:
            weights = weights * rank_ops.list_weights(sample_weight, loss)
        if self.reduction in (None, "none"):
            result = loss if sample_weight is None else loss * weights
        elif self.reduction == "sum":
            result = ops.sum(loss * weights)
        elif sample_weight is None:  # a count of lists, and loss is 0 where it has none
            result = _share_of_replica(ops.sum(loss) / ops.maximum(ops.sum(weights), 1.0))
        else:
            result = rank_ops.safe_divide(ops.sum(loss * weights), ops.sum(weights))
            result = _share_of_replica(result)
        return ops.cast(result, self.dtype)


def _share_of_replica(mean):
    """Divides a per-replica mean by the replica count under tf.distribute, as Keras' own mean
    reductions do, so that the gradients summed over replicas are those of the global mean."""
    if keras.backend.backend() != "tensorflow":
        return mean
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return mean if replicas == 1 else mean / replicas


@keras.saving.register_keras_serializable(package="tfapprox")
class ApproxNDCGLoss(RankingLoss):
    """−ApproxNDCG (Qin et al. eq. 21): NDCG with the smooth positions of eq. 20.

        loss = −(1/N) Σ_x (2^{y_x} − 1) / log2(1 + π̂(x)),
        π̂(x) = 1 + Σ_{y≠x} σ(α(s_y − s_x)),   N = ideal DCG.

    With `topk`, the loss is −ApproxNDCG@k: each term is multiplied by the smooth truncation
    σ(β(k + ½ − π̂(x))) and N is the ideal DCG@k. Without `topk` it equals TF-Ranking's
    `ApproxNDCGLoss(temperature=1/alpha)` on every list with a relevant document and two
    different labels (TF-Ranking also gives a list whose labels are all equal a loss).

    Args:
        alpha: slope α of the position sigmoid, = 1/temperature (Bruch et al. use 10; Qin et al.
            search 10…100). Larger is tighter (Qin Thm 3) but harder to optimise.
        topk: optional cut-off k.
        beta: slope β of the truncation sigmoid (Qin et al. search 1…100); used with `topk` only.
        pairwise: "auto" (default), "dense" or "blocked": how the sums over pairs are computed.
            Blocked, in `tfapprox.pair_sums.PAIR_BLOCK` (256) columns at a time with a backward
            pass that recomputes each block: O(B·L·256) memory instead of O(B·L²). "auto" blocks
            lists longer than `tfapprox.pair_sums.BLOCKED_ABOVE` (1024), at run time if L is
            None.
    A list contributes when it has a document with label > 0.
    """

    def __init__(self, alpha=10.0, topk=None, beta=10.0, pairwise="auto",
                 reduction="sum_over_batch_size", name="approx_ndcg_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.alpha = _check_positive("alpha", alpha)
        self.topk = _check_cutoff("topk", topk)
        self.beta = _check_positive("beta", beta)
        self.pairwise = _check_pairwise(pairwise)

    def per_list(self, labels, mask, scores):
        positions = measures.Positions.smooth(scores, mask, self.alpha, self.beta, self.pairwise)
        return -measures.ndcg(labels, positions, self.topk), None

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha, "topk": self.topk, "beta": self.beta,
                "pairwise": self.pairwise}


class _BinaryRelevanceLoss(RankingLoss):
    """Shared arguments of the losses over binary relevance r(x) = 1{label ≥ threshold}."""

    def __init__(self, alpha, beta, relevance_threshold, pairwise, reduction, name, dtype):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.alpha = _check_positive("alpha", alpha)
        self.beta = _check_positive("beta", beta)
        self.relevance_threshold = _check_threshold(relevance_threshold)
        self.pairwise = _check_pairwise(pairwise)

    def relevance_and_positions(self, labels, mask, scores):
        relevance = rank_ops.binary_relevance(labels, mask, self.relevance_threshold)
        positions = measures.Positions.smooth(scores, mask, self.alpha, self.beta, self.pairwise)
        return relevance, positions, ops.sum(relevance, axis=-1) > 0

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha, "beta": self.beta,
                "relevance_threshold": self.relevance_threshold, "pairwise": self.pairwise}


@keras.saving.register_keras_serializable(package="tfapprox")
class ApproxAPLoss(_BinaryRelevanceLoss):
    """−ApproxAP (Qin et al. eq. 22): average precision with smooth positions and truncations.

        loss = −(1/|D+|) Σ_y r(y)/π̂(y) · (1 + Σ_{x≠y} r(x)·σ(β(π̂(y) − π̂(x)))),

    with π̂ from eq. 20 (slope α) and r(x) = 1{label ≥ relevance_threshold}. Both 1/π̂(y) and the
    pairwise truncation are smooth and carry gradient; both pairwise sums are dense or blocked as
    `pairwise` says (see `ApproxNDCGLoss`). A list contributes when it has a relevant document.
    """

    def __init__(self, alpha=10.0, beta=10.0, relevance_threshold=1.0, pairwise="auto",
                 reduction="sum_over_batch_size", name="approx_ap_loss", dtype=None):
        super().__init__(alpha, beta, relevance_threshold, pairwise, reduction, name, dtype)

    def per_list(self, labels, mask, scores):
        relevance, positions, has_relevant = self.relevance_and_positions(labels, mask, scores)
        return -measures.average_precision(relevance, positions), has_relevant


@keras.saving.register_keras_serializable(package="tfapprox")
class ApproxPrecisionLoss(_BinaryRelevanceLoss):
    """−Approx P@k (Qin et al. eq. 13 with the smooth truncation of §4.2).

        loss = −(1/k) Σ_x r(x)·σ(β(k + ½ − π̂(x))),   r(x) = 1{label ≥ relevance_threshold}.

    `pairwise` as in `ApproxNDCGLoss`. A list contributes when it has a relevant document.
    """

    def __init__(self, k, alpha=10.0, beta=10.0, relevance_threshold=1.0, pairwise="auto",
                 reduction="sum_over_batch_size", name="approx_precision_loss", dtype=None):
        super().__init__(alpha, beta, relevance_threshold, pairwise, reduction, name, dtype)
        self.k = _check_cutoff("k", k, allow_none=False)

    def per_list(self, labels, mask, scores):
        relevance, positions, has_relevant = self.relevance_and_positions(labels, mask, scores)
        return -measures.precision_at_k(relevance, positions, self.k), has_relevant

    def get_config(self):
        return {**super().get_config(), "k": self.k}


def _chen_weights(labels, positions, topk):
    """Returns Chen et al.'s β(x) = G(l_x)·D(pos_x)·1{pos_x ≤ C} and the normaliser N_C."""
    weights = (rank_ops.gains(labels) * rank_ops.discounts(positions)
               * rank_ops.top_k_cutoff(positions, topk))
    return weights, rank_ops.ideal_dcg(labels, topk)


@keras.saving.register_keras_serializable(package="tfapprox")
class RankNetLoss(RankingLoss):
    """RankNet: Σ_{l_i > l_j} ln(1 + e^{−(s_i − s_j)}) per list (Burges et al. 2005).

    Summed over the pairs of a list, this equals the per-list sum of TF-Ranking's unreduced
    `PairwiseLogisticLoss` (its default reduction instead divides by batch × list size). The
    pair sums are dense or blocked as `pairwise` says (see `ApproxNDCGLoss`). A list contributes
    when it has a pair with different labels.
    """

    def __init__(self, pairwise="auto", reduction="sum_over_batch_size", name="ranknet_loss",
                 dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.pairwise = _check_pairwise(pairwise)

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
        self.topk = _check_cutoff("topk", topk)

    def pair_weights(self, labels, mask):
        return _chen_weights(labels, rank_ops.ideal_positions(labels, mask, self.pairwise),
                             self.topk)

    def get_config(self):
        return {**super().get_config(), "topk": self.topk}


@keras.saving.register_keras_serializable(package="tfapprox")
class LambdaRankLoss(RankingLoss):
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
        self.topk = _check_cutoff("topk", topk)

    def per_list(self, labels, mask, scores):
        pairs = ops.logical_and(direct_ops.real_pairs(mask),
                                direct_ops.pair_differences(labels) > 0)  # l_i > l_j
        weights = direct_ops.ndcg_swap_weights(labels, mask, scores, self.topk)
        logistic = ops.softplus(-direct_ops.pair_differences(scores))
        return ops.sum(ops.where(pairs, weights * logistic, 0.0), axis=(1, 2)), None

    def get_config(self):
        return {**super().get_config(), "topk": self.topk}


@keras.saving.register_keras_serializable(package="tfapprox")
class ListMLELoss(RankingLoss):
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
        self.topk = _check_cutoff("topk", topk)

    def position_weights(self, labels, positions):
        return _chen_weights(labels, positions, self.topk)

    def get_config(self):
        return {**super().get_config(), "topk": self.topk}


@keras.saving.register_keras_serializable(package="tfapprox")
class SoftRankLoss(RankingLoss):
    """−SoftNDCG (Taylor, Guiver, Robertson & Minka, WSDM 2008): NDCG in expectation over noisy
    scores.

    Each score is a Gaussian S_j ~ N(s_j, σ²), so document i beats j with probability
    π_ij = Φ((s_i − s_j)/(√2·σ)). Adding the documents one at a time gives each document's rank
    distribution, p_j^(i)(r) = p_j^(i−1)(r − 1)·π_ij + p_j^(i−1)(r)·(1 − π_ij), and

        loss = −SoftNDCG = −(1/N) Σ_j G(l_j) Σ_r D(r)·p_j(r),

    with G(l) = 2^l − 1, D(r) = 1/log2(1 + r) at positions r = 1, 2, ..., N the ideal DCG. As
    σ → 0 it tends to −NDCG of the current ranking.

    Cost, as published: O(L³) time per list, and the gradient keeps one [B, L, L] tensor per
    document added, 4·B·L³ bytes (2.1 GB for 32 lists of 256 documents, which a TensorFlow graph
    trains at about 3 s a step on 2 CPU cores). It serves lists of up to a few hundred
    documents: a list with more than `max_list_size` real documents is cut to its
    `max_list_size` highest-scored ones, and the others are left out (they push no kept document
    down and add nothing to the SoftDCG; N stays the whole list's). The cut needs no check on the
    list size, so it is the same eagerly, in a graph with a `None` list dimension, under XLA and
    on JAX.

    Args:
        sigma: σ, the standard deviation of the score noise, in score units (Taylor et al. tune
            it); larger is smoother and further from NDCG.
        max_list_size: the most documents of a list that take part (default 256).
    A list contributes when it has a document with label > 0.
    """

    def __init__(self, sigma=1.0, max_list_size=256, reduction="sum_over_batch_size",
                 name="softrank_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.sigma = _check_positive("sigma", sigma)
        self.max_list_size = _check_cutoff("max_list_size", max_list_size, allow_none=False)

    def per_list(self, labels, mask, scores):
        kept = ops.argsort(-ops.where(mask, ops.stop_gradient(scores), float("-inf")),
                           axis=-1)[:, :self.max_list_size]
        gains, kept_mask, kept_scores = (
            ops.take_along_axis(x, kept, axis=-1)
            for x in (rank_ops.gains(labels), mask, scores))
        distributions = direct_ops.rank_distributions(
            direct_ops.beat_probabilities(kept_scores, kept_mask, self.sigma))
        soft_dcg = ops.sum(gains * direct_ops.expected_discounts(distributions), axis=-1)
        return -rank_ops.safe_divide(soft_dcg, rank_ops.ideal_dcg(labels)), None

    def get_config(self):
        return {**super().get_config(), "sigma": self.sigma, "max_list_size": self.max_list_size}


class _APStructuralHingeLoss(RankingLoss):
    """The hinge of 1 − AP at the most violated ranking; subclasses give F's scale per list."""

    def __init__(self, relevance_threshold, reduction, name, dtype):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.relevance_threshold = _check_threshold(relevance_threshold)

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


LOSSES = {
    "approx_ndcg": ApproxNDCGLoss,
    "approx_ap": ApproxAPLoss,
    "approx_precision": ApproxPrecisionLoss,
    "ranknet": RankNetLoss,
    "weighted_ranknet": WeightedRankNetLoss,
    "listmle": ListMLELoss,
    "weighted_listmle": WeightedListMLELoss,
    "lambdarank": LambdaRankLoss,
    "softrank": SoftRankLoss,
    "svm_map": SVMMapLoss,
    "permurank": PermuRankLoss,
}


def get(name, **params):
    """Returns the loss called `name` (a key of `LOSSES`), built with `params`."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name](**params)
