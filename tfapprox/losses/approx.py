"""The Approx losses (Qin, Liu & Li 2010): IR measures fed smooth positions, and SoftRank.

T. Qin, T.-Y. Liu, H. Li. *A general approximation framework for direct optimization of
information retrieval measures*, Information Retrieval 13(4), 2010. M. Taylor, J. Guiver,
S. Robertson, T. Minka. *SoftRank: optimizing non-smooth rank metrics*, WSDM 2008.
"""

import keras
from keras import ops

from tfapprox import direct_ops
from tfapprox import measures
from tfapprox import neural_sort
from tfapprox import ops as rank_ops
from tfapprox.losses import base, sampling


@keras.saving.register_keras_serializable(package="tfapprox")
class ApproxNDCGLoss(base.RankingLoss):
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
            Blocked, in `tfapprox.pair_plan.PairPlan.pair_block` (256) columns at a time with a
            backward pass that recomputes each block: O(B·L·256) memory instead of O(B·L²).
            "auto" blocks lists longer than `PairPlan.blocked_above` (1024), at run time if L is
            None; on a GPU under JAX it is dense at every size (XLA writes no pair tensor there).
        temperature: TF-Ranking's name for 1/alpha (its default 0.1 is alpha 10); given, it
            sets alpha.
        lambda_weight: must be None (TF-Ranking takes and ignores it).
    A list contributes when it has a document with label > 0.
    """

    def __init__(self, alpha=10.0, topk=None, beta=10.0, pairwise="auto",
                 reduction="sum_over_batch_size", name="approx_ndcg_loss", dtype=None, *,
                 temperature=None, lambda_weight=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        if lambda_weight is not None:
            raise ValueError(f"{type(self).__name__} takes no `lambda_weight` (TF-Ranking "
                             f"ignores it); got {lambda_weight!r}")
        self.alpha = base.slope(alpha, temperature)
        self.topk = base.check_cutoff("topk", topk)
        self.beta = base.check_positive("beta", beta)
        self.pairwise = base.check_pairwise(pairwise)

    def per_list(self, labels, mask, scores):
        positions = measures.Positions.smooth(scores, mask, self.alpha, self.beta, self.pairwise)
        return -measures.ndcg(labels, positions, self.topk), None

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha, "topk": self.topk, "beta": self.beta,
                "pairwise": self.pairwise}


class _BinaryRelevanceLoss(base.RankingLoss):
    """Shared arguments of the losses over binary relevance r(x) = 1{label ≥ threshold}."""

    def __init__(self, alpha, beta, relevance_threshold, pairwise, reduction, name, dtype):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.alpha = base.check_positive("alpha", alpha)
        self.beta = base.check_positive("beta", beta)
        self.relevance_threshold = base.check_threshold(relevance_threshold)
        self.pairwise = base.check_pairwise(pairwise)

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
        self.k = base.check_cutoff("k", k, allow_none=False)

    def per_list(self, labels, mask, scores):
        relevance, positions, has_relevant = self.relevance_and_positions(labels, mask, scores)
        return -measures.precision_at_k(relevance, positions, self.k), has_relevant

    def get_config(self):
        return {**super().get_config(), "k": self.k}



@keras.saving.register_keras_serializable(package="tfapprox")
class SoftRankLoss(base.RankingLoss):
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
        self.sigma = base.check_positive("sigma", sigma)
        self.max_list_size = base.check_cutoff("max_list_size", max_list_size, allow_none=False)

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


@keras.saving.register_keras_serializable(package="tfapprox")
class ApproxMRRLoss(base.RankingLoss):
    """−ApproxMRR as TF-Ranking defines it: the label-weighted mean of the smooth reciprocal
    ranks,

        loss = −Σ_x l_x / π̂(x) / Σ_x l_x,   π̂ as in `ApproxNDCGLoss` (Qin et al. eq. 20),

    which for binary labels is the mean reciprocal smooth rank of the relevant documents (not the
    reciprocal rank of the first one). `alpha` = 1/`temperature` (TF-Ranking's default 0.1 is
    alpha 10); `pairwise` as in `ApproxNDCGLoss`. A list contributes when Σ l > 0.
    """

    def __init__(self, alpha=10.0, pairwise="auto", reduction="sum_over_batch_size",
                 name="approx_mrr_loss", dtype=None, *, temperature=None, lambda_weight=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        if lambda_weight is not None:
            raise ValueError(f"{type(self).__name__} takes no `lambda_weight` (TF-Ranking "
                             f"ignores it); got {lambda_weight!r}")
        self.alpha = base.slope(alpha, temperature)
        self.pairwise = base.check_pairwise(pairwise)

    def per_list(self, labels, mask, scores):
        ranks = rank_ops.approx_ranks(scores, mask, self.alpha, self.pairwise)
        weighted = ops.sum(ops.where(mask, labels / ranks, 0.0), axis=-1)
        total = ops.sum(labels, axis=-1)
        return -rank_ops.safe_divide(weighted, total), total > 0

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha, "pairwise": self.pairwise}




@keras.saving.register_keras_serializable(package="tfapprox")
class GumbelApproxNDCGLoss(sampling.GumbelSampled, ApproxNDCGLoss):
    __doc__ = ("""`ApproxNDCGLoss` over Gumbel samples of the scores (Bruch et al., WSDM 2020;
    TF-Ranking's `GumbelApproxNDCGLoss`): E_g[−ApproxNDCG(ln softmax((s + g)/τ))], estimated
    from the samples; `temperature` = 1/alpha as in `ApproxNDCGLoss`.
""" + sampling.ARGUMENTS)

    def __init__(self, alpha=10.0, topk=None, beta=10.0, pairwise="auto", sample_size=8,
                 gumbel_temperature=1.0, seed=None, reduction="sum_over_batch_size",
                 name="gumbel_approx_ndcg_loss", dtype=None, *, temperature=None,
                 lambda_weight=None):
        super().__init__(alpha=alpha, topk=topk, beta=beta, pairwise=pairwise,
                         reduction=reduction, name=name, dtype=dtype, temperature=temperature,
                         lambda_weight=lambda_weight)
        self._init_sampling(sample_size, gumbel_temperature, seed)


@keras.saving.register_keras_serializable(package="tfapprox")
class GumbelApproxAPLoss(sampling.GumbelSampled, ApproxAPLoss):
    __doc__ = ("""`ApproxAPLoss` over Gumbel samples of the scores: E_g[−ApproxAP(ln softmax((s +
    g)/τ))], estimated from the samples (Bruch et al.'s treatment, beyond TF-Ranking).
""" + sampling.ARGUMENTS)

    def __init__(self, alpha=10.0, beta=10.0, relevance_threshold=1.0, pairwise="auto",
                 sample_size=8, gumbel_temperature=1.0, seed=None,
                 reduction="sum_over_batch_size", name="gumbel_approx_ap_loss", dtype=None):
        super().__init__(alpha=alpha, beta=beta, relevance_threshold=relevance_threshold,
                         pairwise=pairwise, reduction=reduction, name=name, dtype=dtype)
        self._init_sampling(sample_size, gumbel_temperature, seed)


@keras.saving.register_keras_serializable(package="tfapprox")
class GumbelApproxPrecisionLoss(sampling.GumbelSampled, ApproxPrecisionLoss):
    __doc__ = ("""`ApproxPrecisionLoss` over Gumbel samples of the scores: E_g[−Approx P@k(ln
    softmax((s + g)/τ))], estimated from the samples (Bruch et al.'s treatment, beyond
    TF-Ranking).
""" + sampling.ARGUMENTS)

    def __init__(self, k, alpha=10.0, beta=10.0, relevance_threshold=1.0, pairwise="auto",
                 sample_size=8, gumbel_temperature=1.0, seed=None,
                 reduction="sum_over_batch_size", name="gumbel_approx_precision_loss",
                 dtype=None):
        super().__init__(k=k, alpha=alpha, beta=beta, relevance_threshold=relevance_threshold,
                         pairwise=pairwise, reduction=reduction, name=name, dtype=dtype)
        self._init_sampling(sample_size, gumbel_temperature, seed)


@keras.saving.register_keras_serializable(package="tfapprox")
class NeuralNDCGLoss(base.RankingLoss):
    """−NeuralNDCG (Pobrotyn & Białobrzeski, *NeuralNDCG: direct optimisation of a ranking
    metric via differentiable relaxation of sorting*, 2021, eq. 7; allRank's `neuralNDCG`): NDCG
    with the sort replaced by NeuralSort's relaxed permutation matrix P̂ (slope 1/τ), made doubly
    stochastic by Sinkhorn scaling (`tfapprox.neural_sort`),

        loss = −(1/N_k) Σ_{i ≤ k} D(i) · Σ_j P̂_ij·G(l_j),   G(l) = 2^l − 1, D(i) = 1/log2(1 + i),

    N_k the ideal DCG@k. As τ → 0, P̂ tends to the sorting permutation and the loss to −NDCG@k.

    Args:
        temperature: τ (allRank's default 1).
        topk: k, the cut-off (None: the whole list).
        sinkhorn_iterations: rounds of Sinkhorn scaling (allRank's `max_iter`, 50; it also stops
            early at a tolerance, which a compiled loop here does not).
    Cost per list of L documents, T = `sinkhorn_iterations`: time O(T·L²) forward and again
    backward (2T products of P̂ with a vector each way, and one [L, 2T+1]·[2T+1, L] product,
    formed a block of rows at a time); memory O(L²) under a gradient too, nothing per round: P̂'s
    softmax is kept, the logits it is made from live while it is made, and the backward pass and
    the pair sums take blocks of 1,024 rows, so about two [L, L] float32 tensors (4·L² bytes
    each). Measured above the framework for one list of 10,000 documents, forward and backward:
    608 MiB in a `tf.function`, 972 MiB under XLA, 931 MiB eager, 866 MiB under `jax.jit`
    (docs/benchmarks.md, "NeuralNDCG by list length"). A list contributes when it has a document
    with label > 0.
    """

    def __init__(self, temperature=1.0, topk=None, sinkhorn_iterations=50,
                 reduction="sum_over_batch_size", name="neural_ndcg_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.temperature = base.check_positive("temperature", temperature)
        self.topk = base.check_cutoff("topk", topk)
        self.sinkhorn_iterations = base.check_cutoff("sinkhorn_iterations", sinkhorn_iterations,
                                                     allow_none=False)

    def per_list(self, labels, mask, scores):
        placed_gains = neural_sort.sorted_gains(scores, mask, rank_ops.gains(labels),
                                                self.temperature, self.sinkhorn_iterations)
        positions = ops.cast(ops.arange(1, ops.shape(scores)[1] + 1), rank_ops.COMPUTE_DTYPE)
        weights = rank_ops.discounts(positions) * rank_ops.top_k_cutoff(positions, self.topk)
        dcg = ops.sum(placed_gains * weights, axis=-1)
        return -rank_ops.safe_divide(dcg, rank_ops.ideal_dcg(labels, self.topk)), None

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature, "topk": self.topk,
                "sinkhorn_iterations": self.sinkhorn_iterations}
