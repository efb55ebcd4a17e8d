"""Streaming Keras ranking metrics: exact NDCG@k, MAP, P@k, MRR, and approximation monitors.

Each metric is the mean over lists of a measure from `tfapprox.measures`. Conventions:

- Gains 2^y − 1 and discounts 1/log2(1 + r) for NDCG; binary relevance r(x) = 1{label ≥
  `relevance_threshold`} (default 1) for MAP, P@k and MRR.
- Ties in scores are broken by list order (the earlier document is placed higher).
- Lists with no relevant document are excluded from the mean by default
  (`empty_lists="exclude"`); `"zero"` counts them as 0, as LETOR's evaluation tool does. Lists
  with no real document at all are always excluded.
- A NaN score or a NaN label on a real document makes that list's value NaN, so the metric
  reports NaN instead of silently ranking the document somewhere (or taking it for padding).
- `sample_weight` is one weight per list (`[B]` or `[B, 1]`, ≥ 0), as for the losses
  (`tfapprox.ops.list_weights`).

The approximation monitors (`ApproxNDCGMetric`, `ApproxAPMetric`) report the smooth surrogate a
loss optimises — the same measure fed the positions π̂ of Qin et al. eq. 20 — so training can show
how tight the surrogate is beside the exact metric.
"""

import keras
from keras import ops

from tfapprox import measures
from tfapprox import ops as rank_ops

_EMPTY_LISTS = ("exclude", "zero")


class RankingMetric(keras.metrics.Metric):
    """Base class: the weighted mean over lists of `self.measure(...)`.

    `alpha=None` evaluates the exact measure; a number evaluates its smooth approximation with
    position slope `alpha` and truncation slope `beta` (what the matching loss optimises).
    """

    def __init__(self, name, relevance_threshold=1.0, empty_lists="exclude", alpha=None,
                 beta=10.0, dtype=None):
        super().__init__(name=name, dtype=dtype)
        if empty_lists not in _EMPTY_LISTS:
            raise ValueError(f"`empty_lists` must be one of {_EMPTY_LISTS}; got {empty_lists!r}")
        self.relevance_threshold = float(relevance_threshold)
        self.empty_lists = empty_lists
        self.alpha = None if alpha is None else float(alpha)
        self.beta = float(beta)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def measure(self, labels, relevance, positions):
        """Returns the measure of each list, `[B]`."""
        raise NotImplementedError

    def has_relevant(self, labels, relevance):
        """Returns whether each list has a relevant document (what the measure needs)."""
        return ops.sum(relevance, axis=-1) > 0

    def per_list(self, y_true, y_pred):
        """Returns `(values [B], counted [B] bool)`: the measure of each list, and whether the
        list counts towards the mean (it has real documents and, with `empty_lists="exclude"`, a
        relevant one). For per-query analyses such as paired significance tests."""
        labels, mask, scores = rank_ops.standardize(y_true, y_pred)
        relevance = rank_ops.binary_relevance(labels, mask, self.relevance_threshold)
        if self.alpha is None:
            positions = measures.Positions.exact(scores, mask)
        else:
            positions = measures.Positions.smooth(scores, mask, self.alpha, self.beta)
        values = self.measure(labels, relevance, positions)
        nan_input = rank_ops.nan_input_lists(labels, scores)
        values = ops.where(nan_input, float("nan"), values)
        counted = ops.any(mask, axis=-1)
        if self.empty_lists == "exclude":
            counted = ops.logical_and(counted, self.has_relevant(labels, relevance))
        return values, ops.logical_or(counted, nan_input)

    def update_state(self, y_true, y_pred, sample_weight=None):
        values, counted = self.per_list(y_true, y_pred)
        weights = ops.cast(counted, rank_ops.COMPUTE_DTYPE)
        if sample_weight is not None:
            weights = weights * rank_ops.list_weights(sample_weight, values)
        self.total.assign_add(ops.cast(
            ops.sum(ops.where(counted, values, 0.0) * weights), self.total.dtype))
        self.count.assign_add(ops.cast(ops.sum(weights), self.count.dtype))

    def result(self):
        return ops.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype,
                "relevance_threshold": self.relevance_threshold,
                "empty_lists": self.empty_lists, "alpha": self.alpha, "beta": self.beta}


def _name(base, k):
    return base if k is None else f"{base}@{k}"


@keras.saving.register_keras_serializable(package="tfapprox")
class NDCG(RankingMetric):
    """NDCG@k = Σ_x (2^{y_x} − 1)/log2(1 + π(x))·1{π(x) ≤ k} / ideal DCG@k (k=None: whole list).

    A list counts as having a relevant document when some label is > 0 (positive gain).
    """

    def __init__(self, k=None, name=None, relevance_threshold=1.0, empty_lists="exclude",
                 dtype=None, **kwargs):
        super().__init__(name or _name("ndcg", k), relevance_threshold, empty_lists,
                         dtype=dtype, **kwargs)
        self.k = k

    def has_relevant(self, labels, relevance):
        return ops.any(ops.greater(labels, 0.0), axis=-1)

    def measure(self, labels, relevance, positions):
        return measures.ndcg(labels, positions, self.k)

    def get_config(self):
        return {**super().get_config(), "k": self.k}


@keras.saving.register_keras_serializable(package="tfapprox")
class MeanAveragePrecision(RankingMetric):
    """MAP: the mean over lists of AP = 1/|D+| Σ_{y relevant} #{relevant x: π(x) ≤ π(y)} / π(y)."""

    def __init__(self, name="map", relevance_threshold=1.0, empty_lists="exclude", dtype=None,
                 **kwargs):
        super().__init__(name, relevance_threshold, empty_lists, dtype=dtype, **kwargs)

    def measure(self, labels, relevance, positions):
        return measures.average_precision(relevance, positions)


@keras.saving.register_keras_serializable(package="tfapprox")
class PrecisionAtK(RankingMetric):
    """P@k = (1/k) Σ_x r(x)·1{π(x) ≤ k}; the divisor is k even for shorter lists (trec_eval)."""

    def __init__(self, k, name=None, relevance_threshold=1.0, empty_lists="exclude", dtype=None,
                 **kwargs):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be an int >= 1; got {k!r}")
        super().__init__(name or f"p@{k}", relevance_threshold, empty_lists, dtype=dtype,
                         **kwargs)
        self.k = k

    def measure(self, labels, relevance, positions):
        return measures.precision_at_k(relevance, positions, self.k)

    def get_config(self):
        return {**super().get_config(), "k": self.k}


@keras.saving.register_keras_serializable(package="tfapprox")
class MeanReciprocalRank(RankingMetric):
    """MRR: the mean over lists of 1/π(first relevant document)."""

    def __init__(self, name="mrr", relevance_threshold=1.0, empty_lists="exclude", dtype=None,
                 **kwargs):
        super().__init__(name, relevance_threshold, empty_lists, dtype=dtype, **kwargs)

    def measure(self, labels, relevance, positions):
        return measures.reciprocal_rank(relevance, positions)


@keras.saving.register_keras_serializable(package="tfapprox")
class ApproxNDCGMetric(NDCG):
    """Monitor: ApproxNDCG(@k), the value `ApproxNDCGLoss(alpha, topk=k, beta)` maximises."""

    def __init__(self, k=None, alpha=10.0, beta=10.0, name=None, **kwargs):
        super().__init__(k, name=name or _name("approx_ndcg", k), alpha=alpha, beta=beta,
                         **kwargs)


@keras.saving.register_keras_serializable(package="tfapprox")
class ApproxAPMetric(MeanAveragePrecision):
    """Monitor: ApproxAP averaged over lists, the value `ApproxAPLoss(alpha, beta)` maximises."""

    def __init__(self, alpha=10.0, beta=10.0, name="approx_map", **kwargs):
        super().__init__(name=name, alpha=alpha, beta=beta, **kwargs)


def get(name, **params):
    """Returns a metric from a short name — `ndcg`, `ndcg@k`, `map`, `p@k`, `mrr`,
    `approx_ndcg`, `approx_ndcg@k`, `approx_map` — built with `params` (e.g. `alpha=20.0`)."""
    base, _, cutoff = name.lower().partition("@")
    k = None
    if cutoff:
        if not cutoff.isdigit() or int(cutoff) < 1:
            raise ValueError(f"metric {name!r}: the cut-off after '@' must be an int >= 1")
        k = int(cutoff)
    with_cutoff = {"ndcg": NDCG, "approx_ndcg": ApproxNDCGMetric, "p": PrecisionAtK,
                   "precision": PrecisionAtK}
    without_cutoff = {"map": MeanAveragePrecision, "approx_map": ApproxAPMetric,
                      "mrr": MeanReciprocalRank}
    if base in with_cutoff and (k is not None or base not in ("p", "precision")):
        return with_cutoff[base](k, **params)
    if base in without_cutoff and k is None:
        return without_cutoff[base](**params)
    raise ValueError(
        f"unknown metric {name!r}; expected one of ndcg, ndcg@k, map, p@k, mrr, "
        "approx_ndcg, approx_ndcg@k, approx_map")
