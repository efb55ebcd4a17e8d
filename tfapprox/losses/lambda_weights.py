"""Weights of documents and pairs that make a loss follow an IR measure: the LambdaLoss framework
(Wang, Li, Golbandi, Bendersky & Najork, *The LambdaLoss framework for ranking metric
optimization*, CIKM 2018) under TF-Ranking's class and argument names, and Chen et al.'s weights.

A lambda weight knows nothing of the loss it weighs. From standardised `labels` and `mask` `[B, L]`
and `ranks`, the 1-based positions of the documents in the current ranking (by score, padded slots
last: `tfapprox.ops.exact_ranks`), it gives

- `pair_weights` `[B, L, L]`, the weight of pair (i, j), used by the pairwise losses;
- `individual_weights` `[B, L]`, one weight per document, used by `SoftmaxLoss` in place of the
  labels (the DCG family only);
- `position_weights` `[B, L]`, the weight of each position of the label order, used by
  `ListMLELoss` (`ListMLELambdaWeight` only).

A loss given a weight without the kind it needs raises ValueError (TF-Ranking ignores it).
Weights are 0 on every pair or document with a padded slot, and carry no gradient.

Where tfapprox differs from TF-Ranking 0.5.5: the DCG family's pair weights are scaled by the
number of real documents n of the list, where TF-Ranking multiplies by the padded list size L (so
its values change with padding); and its ideal DCG counts real documents only.
"""

import keras
from keras import ops

from tfapprox import direct_ops
from tfapprox import ops as rank_ops

_register = keras.saving.register_keras_serializable(package="tfapprox")


@_register
def identity(labels):
    """G(l) = l: the gain of `DCGLambdaWeight` (TF-Ranking's `utils.identity`)."""
    return labels


@_register
def pow_minus_1(labels):
    """G(l) = 2^l − 1: the NDCG gain (TF-Ranking's `utils.pow_minus_1`)."""
    return ops.power(2.0, labels) - 1.0


@_register
def inverse(ranks):
    """D(r) = 1/r: the discount of `DCGLambdaWeight` (TF-Ranking's `utils.inverse`)."""
    return 1.0 / ranks


@_register
def log2_inverse(ranks):
    """D(r) = 1/log2(1 + r): the NDCG discount (TF-Ranking's `utils.log2_inverse`)."""
    return rank_ops.discounts(ranks)


@_register
def is_greater_equal_1(labels):
    """Whether l ≥ 1: the relevance of `PrecisionLambdaWeight` (TF-Ranking's default)."""
    return ops.greater_equal(labels, 1.0)


def _serialize(function):
    return keras.saving.serialize_keras_object(function)


def _deserialize(config):
    return keras.saving.deserialize_keras_object(config) if isinstance(config, dict) else config


def _check_topn(topn, allow_none=True):
    if topn is None and allow_none:
        return None
    if isinstance(topn, bool) or not isinstance(topn, int) or topn < 1:
        raise ValueError(f"`topn` must be {'None or ' if allow_none else ''}an int >= 1; "
                         f"got {topn!r}")
    return topn


class LambdaWeight:
    """Base class: `kinds` names the weights a lambda weight gives ("pair", "individual",
    "position"; module docstring), each a method of that name + "_weights"."""

    kinds = ()

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash(type(self).__name__)


def _valid_pairs(mask):
    return ops.cast(direct_ops.real_pairs(mask), rank_ops.COMPUTE_DTYPE)


class _DCGFamily(LambdaWeight):
    """The DCG lambda weights: |G(l_i) − G(l_j)| (over the ideal DCG when normalised) times a
    discount of the pair's ranks (`pair_discounts`), times n."""

    kinds = ("pair", "individual")

    def __init__(self, topn, gain_fn, rank_discount_fn, normalized):
        self.topn = _check_topn(topn)
        self.gain_fn = _deserialize(gain_fn)
        self.rank_discount_fn = _deserialize(rank_discount_fn)
        self.normalized = bool(normalized)

    def _gains(self, labels, mask):
        """G(l) on real documents (0 on padded ones), over the ideal DCG@topn if normalised."""
        gains = ops.where(mask, self.gain_fn(labels), 0.0)
        if not self.normalized:
            return gains
        best_first = ops.top_k(ops.where(mask, labels, float("-inf")), ops.shape(labels)[1])[0]
        real = ops.isfinite(best_first)
        positions = ops.cast(ops.arange(1, ops.shape(labels)[1] + 1), rank_ops.COMPUTE_DTYPE)
        ideal = ops.sum(ops.where(real, self.gain_fn(ops.where(real, best_first, 0.0)), 0.0)
                        * self.rank_discount_fn(positions)
                        * rank_ops.top_k_cutoff(positions, self.topn), axis=-1, keepdims=True)
        return rank_ops.safe_divide(gains, ideal)

    def pair_discounts(self, ranks):
        raise NotImplementedError

    def pair_weights(self, labels, mask, ranks):
        gains = self._gains(labels, mask)
        size = ops.reshape(rank_ops.count_per_list(mask), (-1, 1, 1))
        weights = (ops.abs(direct_ops.pair_differences(gains)) * self.pair_discounts(ranks)
                   * _valid_pairs(mask) * size)
        return ops.stop_gradient(weights)

    def individual_weights(self, labels, mask, ranks):
        return ops.stop_gradient(self._gains(labels, mask) * self.rank_discount_fn(ranks))

    def _rank_gap_discounts(self, ranks):
        """|D(|r_i − r_j|) − D(|r_i − r_j| + 1)| where r_i ≠ r_j, else 0 (LambdaLoss eq. 11)."""
        gap = ops.abs(direct_ops.pair_differences(ranks))
        apart = gap > 0
        safe = ops.where(apart, gap, 1.0)
        return ops.where(apart, ops.abs(self.rank_discount_fn(safe)
                                        - self.rank_discount_fn(safe + 1.0)), 0.0)

    def get_config(self):
        return {"topn": self.topn, "gain_fn": _serialize(self.gain_fn),
                "rank_discount_fn": _serialize(self.rank_discount_fn)}


@_register
class DCGLambdaWeight(_DCGFamily):
    """LambdaLoss' DCG weight (Wang et al. 2018, eq. 11 and LambdaMART's |ΔDCG|):

        w_ij = n·|G(l_i) − G(l_j)|·((1 − f)·u_ij + f·v_ij)·1{r_i ≤ k or r_j ≤ k},
        u_ij = |D(|r_i − r_j|) − D(|r_i − r_j| + 1)|,   v_ij = |D_k(r_i) − D_k(r_j)|,

    D_k(r) = D(r)·1{r ≤ k}, k = `topn` (None: the whole list), f = `smooth_fraction`, r the
    ranks by current score, n the real documents of the list; G and D are `gain_fn` (default
    G(l) = l) and `rank_discount_fn` (default D(r) = 1/r), G over the ideal DCG@k when
    `normalized`. Document weights (`SoftmaxLoss`): G(l_i)·D(r_i).
    """

    def __init__(self, topn=None, gain_fn=None, rank_discount_fn=None, normalized=False,
                 smooth_fraction=0.0):
        super().__init__(topn, gain_fn or identity, rank_discount_fn or inverse, normalized)
        if (isinstance(smooth_fraction, bool) or not isinstance(smooth_fraction, (int, float))
                or not 0.0 <= smooth_fraction <= 1.0):
            raise ValueError(f"`smooth_fraction` must be a number in [0, 1]; got "
                             f"{smooth_fraction!r}")
        self.smooth_fraction = float(smooth_fraction)

    def pair_discounts(self, ranks):
        in_top = rank_ops.top_k_cutoff(ranks, self.topn)
        either_in_top = ops.maximum(ops.expand_dims(in_top, 2), ops.expand_dims(in_top, 1))
        swap = ops.abs(direct_ops.pair_differences(self.rank_discount_fn(ranks) * in_top))
        return (((1.0 - self.smooth_fraction) * self._rank_gap_discounts(ranks)
                 + self.smooth_fraction * swap) * either_in_top)

    def get_config(self):
        return {**super().get_config(), "normalized": self.normalized,
                "smooth_fraction": self.smooth_fraction}


@_register
class NDCGLambdaWeight(DCGLambdaWeight):
    """`DCGLambdaWeight` with NDCG's G(l) = 2^l − 1 and D(r) = 1/log2(1 + r), normalised by the
    ideal DCG@topn: LambdaLoss' NDCG-Loss2 (smooth_fraction 0) or LambdaRank's |ΔNDCG|
    (smooth_fraction 1)."""

    def __init__(self, topn=None, gain_fn=None, rank_discount_fn=None, smooth_fraction=0.0):
        super().__init__(topn, gain_fn or pow_minus_1, rank_discount_fn or log2_inverse,
                         normalized=True, smooth_fraction=smooth_fraction)

    def get_config(self):
        config = super().get_config()
        del config["normalized"]
        return config


@_register
class NDCGLambdaWeightV2(_DCGFamily):
    """LambdaLoss' NDCG-Loss2++ weight for NDCG@k (Wang et al. 2018, §4.3; TF-Ranking's
    `DCGLambdaWeightV2`):

        w_ij = n·|G(l_i) − G(l_j)|/N_k · |D(|r_i − r_j|) − D(|r_i − r_j| + 1)| · m_ij,
        m_ij = 1/(1 − D(max(r_i, r_j))) if max(r_i, r_j) > k, else 1,

    G(l) = 2^l − 1, D(r) = 1/log2(1 + r) by default, N_k the ideal DCG@k (k = `topn`).
    """

    def __init__(self, topn=None, gain_fn=None, rank_discount_fn=None):
        super().__init__(topn, gain_fn or pow_minus_1, rank_discount_fn or log2_inverse,
                         normalized=True)

    def pair_discounts(self, ranks):
        gaps = self._rank_gap_discounts(ranks)
        if self.topn is None:
            return gaps
        lower = ops.maximum(ops.expand_dims(ranks, 2), ops.expand_dims(ranks, 1))
        beyond = lower > float(self.topn)
        return gaps * ops.where(beyond, 1.0 / (1.0 - self.rank_discount_fn(
            ops.where(beyond, lower, 2.0))), 1.0)


@_register
class YetiDCGLambdaWeight(NDCGLambdaWeightV2):
    """`NDCGLambdaWeightV2`'s weight on neighbouring pairs only (|r_i − r_j| = 1), as YetiRank
    (Gulin et al. 2011; Lyzhin et al. 2022) weighs them; `normalized` (default False, as
    TF-Ranking) divides the gains by the ideal DCG@topn."""

    def __init__(self, topn=None, gain_fn=None, rank_discount_fn=None, normalized=False):
        super().__init__(topn, gain_fn, rank_discount_fn)
        self.normalized = bool(normalized)

    def pair_discounts(self, ranks):
        neighbours = ops.equal(ops.abs(direct_ops.pair_differences(ranks)), 1.0)
        return super().pair_discounts(ranks) * ops.cast(neighbours, rank_ops.COMPUTE_DTYPE)

    def get_config(self):
        return {**super().get_config(), "normalized": self.normalized}


@_register
class LabelDiffLambdaWeight(LambdaWeight):
    """w_ij = |l_i − l_j|: the label difference of the pair (TF-Ranking's)."""

    kinds = ("pair",)

    def pair_weights(self, labels, mask, ranks):
        return ops.stop_gradient(ops.abs(direct_ops.pair_differences(labels))
                                 * _valid_pairs(mask))


@_register
class PrecisionLambdaWeight(LambdaWeight):
    """LambdaRank's weight for P@k: w_ij = |r(l_i) − r(l_j)|·1{exactly one of r_i, r_j ≤ k},
    the change of k·P@k when i and j swap; relevance r = `positive_fn` (default l ≥ 1),
    k = `topn` (required: TF-Ranking's default None fails when used)."""

    kinds = ("pair",)

    def __init__(self, topn=None, positive_fn=None):
        self.topn = _check_topn(topn, allow_none=False)
        self.positive_fn = _deserialize(positive_fn) or is_greater_equal_1

    def pair_weights(self, labels, mask, ranks):
        relevant = ops.cast(self.positive_fn(labels), rank_ops.COMPUTE_DTYPE)
        in_top = rank_ops.top_k_cutoff(ranks, self.topn)
        crosses = ops.abs(direct_ops.pair_differences(in_top))
        return ops.stop_gradient(ops.abs(direct_ops.pair_differences(relevant)) * crosses
                                 * _valid_pairs(mask))

    def get_config(self):
        return {"topn": self.topn, "positive_fn": _serialize(self.positive_fn)}


@_register
class ListMLELambdaWeight(LambdaWeight):
    """Position-aware ListMLE (Lan, Zhu, Guo, Niu & Cheng, IJCAI 2014): the term of position s of
    the label order weighs D(s), `rank_discount_fn` (default 1/log2(1 + s); TF-Ranking's default
    None fails when used)."""

    kinds = ("position",)

    def __init__(self, rank_discount_fn=None):
        self.rank_discount_fn = _deserialize(rank_discount_fn) or log2_inverse

    def position_weights(self, positions):
        return self.rank_discount_fn(positions)

    def get_config(self):
        return {"rank_discount_fn": _serialize(self.rank_discount_fn)}


def serialize(lambda_weight):
    """Returns a lambda weight's Keras config (None for None)."""
    return None if lambda_weight is None else keras.saving.serialize_keras_object(lambda_weight)


# The lambda weights that give each kind of weight, for error messages.
_GIVING = {"pair": "DCGLambdaWeight, NDCGLambdaWeight, NDCGLambdaWeightV2, YetiDCGLambdaWeight, "
                   "LabelDiffLambdaWeight or PrecisionLambdaWeight",
           "individual": "DCGLambdaWeight, NDCGLambdaWeight, NDCGLambdaWeightV2 or "
                         "YetiDCGLambdaWeight",
           "position": "ListMLELambdaWeight"}


def deserialize(config, kind, loss):
    """Returns the lambda weight of a config from `serialize` (or the weight itself, or None),
    checked to give weights of `kind` to `loss` (a class name): ValueError otherwise, where
    TF-Ranking would ignore the weight or fail when it is used."""
    if config is None:
        return None
    weight = config if isinstance(config, LambdaWeight) else (
        keras.saving.deserialize_keras_object(config))
    if not isinstance(weight, LambdaWeight):
        raise ValueError(f"`lambda_weight` must be a tfapprox lambda weight; got {config!r}")
    if kind not in weight.kinds:
        raise ValueError(f"{loss} takes {_GIVING[kind]} as `lambda_weight`; got "
                         f"{type(weight).__name__}")
    return weight


def current_ranks(scores, mask):
    """Returns the 1-based positions of the ranking by the current scores, without gradient."""
    return rank_ops.exact_ranks(ops.stop_gradient(scores), mask)


def chen_weights(labels, positions, topk):
    """Returns Chen et al.'s β(x) = G(l_x)·D(pos_x)·1{pos_x ≤ C} and the normaliser N_C."""
    weights = (rank_ops.gains(labels) * rank_ops.discounts(positions)
               * rank_ops.top_k_cutoff(positions, topk))
    return weights, rank_ops.ideal_dcg(labels, topk)
