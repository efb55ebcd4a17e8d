"""Listwise losses over permutation probabilities: ListMLE and Chen et al.'s weighted ListMLE.

F. Xia, T.-Y. Liu, J. Wang, W. Zhang, H. Li. *Listwise approach to learning to rank: theory and
algorithm*, ICML 2008. W. Chen et al., NIPS 2009.
"""

import keras
from keras import ops

from tfapprox import direct_ops
from tfapprox import ops as rank_ops
from tfapprox.losses import base, lambda_weights, sampling


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

    TF-Ranking's arguments: `temperature` T divides the scores; `lambda_weight` (a
    `ListMLELambdaWeight`) weighs the term of position s by D(s) (position-aware ListMLE, Lan et
    al. 2014). TF-Ranking gives each of a list's P padded slots a term too, adding ln P! to its
    value (so it changes with padding); ours has none.
    """

    def __init__(self, seed=0, reduction="sum_over_batch_size", name="listmle_loss",
                 dtype=None, *, lambda_weight=None, temperature=1.0):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.seed = base.check_seed(seed)
        self.lambda_weight = lambda_weights.deserialize(lambda_weight, "position",
                                                        type(self).__name__)
        self.temperature = base.check_positive("temperature", temperature)

    def position_weights(self, labels, positions):
        """Returns the weight of each position's term and the list normaliser, inputs in y order;
        a normaliser None divides nothing, and weights None weigh every term 1 (fewer ops than
        ones)."""
        if self.lambda_weight is None:
            return None, None
        return self.lambda_weight.position_weights(positions), None

    def per_list(self, labels, mask, scores):
        scores = scores / self.temperature
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
        if normaliser is None:
            return ops.sum(terms * weights, axis=-1), None
        return rank_ops.safe_divide(ops.sum(terms * weights, axis=-1), normaliser), None

    def get_config(self):
        return {**super().get_config(), "seed": self.seed,
                "lambda_weight": lambda_weights.serialize(self.lambda_weight),
                "temperature": self.temperature}


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
        config = {**super().get_config(), "topk": self.topk}
        del config["lambda_weight"], config["temperature"]  # Chen's weights, on the raw scores
        return config


def _log_softmax(scores, mask):
    """Returns ln softmax(s)_i over the real documents of each list (0 on padded slots): s_i
    minus the list's log-sum-exp, taken from its largest real score so nothing overflows."""
    shifted = ops.where(mask, scores - rank_ops.real_maximum(scores, mask), 0.0)
    total = ops.sum(ops.where(mask, ops.exp(shifted), 0.0), axis=-1, keepdims=True)
    return ops.where(mask, shifted - ops.log(ops.where(total > 0, total, 1.0)), 0.0)


@keras.saving.register_keras_serializable(package="tfapprox")
class SoftmaxLoss(base.RankingLoss):
    """Listwise softmax cross-entropy (Cao et al., ICML 2007, ListNet's top-one form; TF-Ranking's
    `SoftmaxLoss`, the loss of DASALC, Qin et al. ICLR 2021):

        loss = −Σ_i p_i · ln( e^{s_i/T} / Σ_{j real} e^{s_j/T} ),   p_i = w_i / Σ_j w_j,

    with w the labels, or with `lambda_weight` (a DCG-family weight of
    `tfapprox.losses.lambda_weights`) its document weights G(l_i)·D(r_i) at the current ranks
    (Wang et al. 2018's softmax LambdaLoss), and T = `temperature`. A list contributes when
    Σ w > 0. Where TF-Ranking differs: its reduction weighs each list by Σ w (the labels' sum),
    ours by 1 (or `sample_weight`); it gives padded slots the logit ln 1e-10 instead of leaving
    them out; and it ignores `NDCGLambdaWeightV2` and `YetiDCGLambdaWeight`, which we apply.
    """

    def __init__(self, lambda_weight=None, temperature=1.0, reduction="sum_over_batch_size",
                 name="softmax_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.lambda_weight = lambda_weights.deserialize(lambda_weight, "individual",
                                                        type(self).__name__)
        self.temperature = base.check_positive("temperature", temperature)

    def label_weights(self, labels, mask, scores):
        """Returns w `[B, L]`: the labels, or the lambda weight's document weights."""
        if self.lambda_weight is None:
            return labels
        ranks = lambda_weights.current_ranks(scores, mask)
        return self.lambda_weight.individual_weights(labels, mask, ranks)

    def per_list(self, labels, mask, scores):
        if self.temperature != 1.0:
            scores = scores / self.temperature
        weights = self.label_weights(labels, mask, scores)  # labels: 0 on padded slots already
        if self.lambda_weight is not None:
            weights = ops.where(mask, weights, 0.0)
        total = ops.sum(weights, axis=-1)
        cross_entropy = -ops.sum(weights * _log_softmax(scores, mask), axis=-1)
        return rank_ops.safe_divide(cross_entropy, total), total > 0

    def get_config(self):
        return {**super().get_config(),
                "lambda_weight": lambda_weights.serialize(self.lambda_weight),
                "temperature": self.temperature}


@keras.saving.register_keras_serializable(package="tfapprox")
class UniqueSoftmaxLoss(base.RankingLoss):
    """Unique-rating softmax (Zhu & Klabjan, *Listwise learning to rank by exploring unique
    ratings*, WSDM 2020; TF-Ranking's `UniqueSoftmaxLoss`): each document against only those with
    a lower label,

        loss = −Σ_i G(l_i) · ln( e^{s_i/T} / (e^{s_i/T} + Σ_{j real: l_j < l_i} e^{s_j/T}) ),

    G(l) = 2^l − 1, T = `temperature`. O(L²) per list. A list contributes when it has a pair with
    different labels.
    """

    def __init__(self, temperature=1.0, reduction="sum_over_batch_size",
                 name="unique_softmax_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.temperature = base.check_positive("temperature", temperature)

    def per_list(self, labels, mask, scores):
        scores = scores / self.temperature
        below = ops.logical_and(direct_ops.real_pairs(mask),
                                direct_ops.pair_differences(labels) > 0)  # [b, i, j]: l_j < l_i
        # row i: s_j − s_i over j below i and 0 for i itself, so the row's top is ≥ 0
        gaps = ops.where(below, -direct_ops.pair_differences(scores), float("-inf"))
        top = ops.stop_gradient(ops.maximum(ops.max(gaps, axis=-1, initial=float("-inf")), 0.0))
        total = ops.exp(-top) + ops.sum(
            ops.exp(gaps - ops.expand_dims(top, -1)), axis=-1)
        terms = ops.where(mask, top + ops.log(total), 0.0)
        return ops.sum(rank_ops.gains(labels) * terms, axis=-1), None

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


@keras.saving.register_keras_serializable(package="tfapprox")
class CalibratedSoftmaxLoss(SoftmaxLoss):
    """Calibrated softmax (Yan, Qin, Zhuang, Jagerman, Wang, Bendersky & Najork, *Scale
    calibration of deep ranking models*, KDD 2022; TF-Ranking's `CalibratedSoftmaxLoss`):
    `SoftmaxLoss` over each list plus one virtual document of score 0 and label y₀ =
    `virtual_label`,

        loss = −Σ_i p_i·ln(e^{s_i/T} / (1 + Σ_j e^{s_j/T})) − p₀·ln(1 / (1 + Σ_j e^{s_j/T})),

    p = (w, y₀)/(Σ w + y₀), which anchors the scores' scale at 0. A list whose real labels are
    all equal has no loss here either (`tfapprox.losses.base`), though the virtual document
    would give it one in TF-Ranking.
    """

    def __init__(self, lambda_weight=None, temperature=1.0, virtual_label=0.0,
                 reduction="sum_over_batch_size", name="calibrated_softmax_loss", dtype=None):
        super().__init__(lambda_weight=lambda_weight, temperature=temperature,
                         reduction=reduction, name=name, dtype=dtype)
        self.virtual_label = base.check_nonnegative("virtual_label", virtual_label)

    def per_list(self, labels, mask, scores):
        column = ops.ones_like(labels[:, :1])
        return super().per_list(ops.concatenate([labels, self.virtual_label * column], axis=1),
                                ops.concatenate([mask, ops.cast(column, "bool")], axis=1),
                                ops.concatenate([scores, 0.0 * column], axis=1))

    def get_config(self):
        return {**super().get_config(), "virtual_label": self.virtual_label}


@keras.saving.register_keras_serializable(package="tfapprox")
class CoupledRankDistilLoss(base.RankingLoss):
    """Coupled-RankDistil (Reddi, Pasumarthi, Menon, Rawat, Yu, Kim, Veit & Kumar, *RankDistil:
    knowledge distillation for ranking*, AISTATS 2021; TF-Ranking's `CoupledRankDistilLoss`): the
    cross-entropy between the teacher's Plackett–Luce distribution over permutations, with the
    labels as the teacher's scores, and the student's top-k Plackett–Luce likelihood,

        loss = E_{π ~ PL(l)} [ Σ_{p=1}^{k} ( ln Σ_{q ≥ p} e^{s_{π(q)}/T} − s_{π(p)}/T ) ],

    estimated from `sample_size` permutations π, each the order of l + g, g ~ Gumbel(0, 1) (the
    Gumbel-max trick), k = `topk` (None: the whole list), T = `temperature`. The noise is hashed
    from the scores, the labels and `seed` (`tfapprox.losses.sampling`; TF-Ranking's from
    `tf.random`), so documents with equal scores and labels draw equal noise.
    TF-Ranking's padded slots add a ln P! term when k reaches them (as in `ListMLELoss`); ours
    have none. A list contributes when Σ l > 0.
    """

    def __init__(self, sample_size=8, topk=None, temperature=1.0, seed=None,
                 reduction="sum_over_batch_size", name="coupled_rankdistil_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.sample_size = base.check_cutoff("sample_size", sample_size, allow_none=False)
        self.topk = base.check_cutoff("topk", topk)
        self.temperature = base.check_positive("temperature", temperature)
        self.seed = base.check_seed(seed, allow_none=True)

    def per_list(self, labels, mask, scores):
        # salted with the labels: documents of equal scores and different labels draw apart
        uniforms = sampling.uniforms(scores, self.sample_size, self.seed, salt=labels)
        noise = -ops.log(-ops.log(uniforms))
        keys = ops.where(ops.expand_dims(mask, 1), ops.expand_dims(labels, 1) + noise,
                         float("-inf"))
        batch_size, list_size = ops.shape(labels)[0], ops.shape(labels)[1]
        # the shape spelt out: a -1 beside a list size of 0 divides by 0 in TensorFlow's kernel
        order = rank_ops.descending_order(
            ops.reshape(keys, (batch_size * self.sample_size, list_size)))
        placed = rank_ops.gather_in_lists(
            sampling.repeat_lists(scores / self.temperature, self.sample_size), order)
        positions = ops.expand_dims(ops.arange(list_size), 0)
        count = sampling.repeat_lists(ops.expand_dims(ops.sum(ops.cast(mask, "int32"), axis=-1),
                                                      1), self.sample_size)
        placed_mask = positions < count  # π puts the real documents first
        terms = rank_ops.suffix_logsumexp_minus_self(placed, placed_mask)
        if self.topk is not None:
            terms = ops.where(positions < self.topk, terms, 0.0)
        samples = ops.reshape(ops.sum(terms, axis=-1), (-1, self.sample_size))
        return ops.mean(samples, axis=-1), ops.sum(labels, axis=-1) > 0

    def get_config(self):
        return {**super().get_config(), "sample_size": self.sample_size, "topk": self.topk,
                "temperature": self.temperature, "seed": self.seed}
