"""Streaming Keras ranking metrics: exact NDCG@k, DCG, MAP, P@k, recall, hits, MRR, ERR, ARP,
ordered pair accuracy, the diversity metrics α-DCG and Pre-IA, and approximation monitors.

Each metric is the weighted mean over lists of a measure from `tfapprox.measures`. Conventions:

- Gains 2^y − 1 and discounts 1/log2(1 + r) for (N)DCG; binary relevance r(x) = 1{label ≥
  `relevance_threshold`} (default 1) for MAP, P@k, recall, hits and MRR.
- Ties in scores are broken by list order (the earlier document is placed higher); ordered pair
  accuracy counts a pair of equal scores as not ordered.
- Lists with no relevant document are excluded from the mean by default
  (`empty_lists="exclude"`); `"zero"` counts them as 0, as LETOR's evaluation tool and
  TF-Ranking do. Lists with no real document at all are always excluded.
- A NaN score or a NaN label on a real document makes that list's value NaN, so the metric
  reports NaN instead of silently ranking the document somewhere (or taking it for padding).
- `sample_weight` is one weight per list (`[B]` or `[B, 1]`, ≥ 0), as for the losses
  (`tfapprox.ops.list_weights`). ARP and ordered pair accuracy also weigh each list by its sum of
  labels and its number of ordered pairs, as TF-Ranking does.
- `ragged=True` takes `tf.RaggedTensor` labels and scores `[B, (L)]` (TensorFlow backend), with
  the values of the padded form (`tfapprox.ops.dense_lists`).

The approximation monitors (`ApproxNDCGMetric`, `ApproxAPMetric`) report the smooth surrogate a
loss optimises — the same measure fed the positions π̂ of Qin et al. eq. 20 — so training can show
how tight the surrogate is beside the exact metric.
"""

import keras
from keras import ops

from tfapprox import measures
from tfapprox import ops as rank_ops

_EMPTY_LISTS = ("exclude", "zero")


def _check_topn(value, argument="topn"):
    """Returns a cut-off: None (the whole list) or an int ≥ 1, else raises naming `argument`."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"`{argument}` must be None or an int >= 1; got {value!r}")
    return value


class RankingMetric(keras.metrics.Metric):
    """Base class: the weighted mean over lists of `self.measure(...)`; `larger_is_better`
    says which way it improves.

    `alpha=None` evaluates the exact measure; a number evaluates its smooth approximation with
    position slope `alpha` and truncation slope `beta` (what the matching loss optimises).
    """

    def __init__(self, name, relevance_threshold=1.0, empty_lists="exclude", alpha=None,
                 beta=10.0, dtype=None, ragged=False):
        super().__init__(name=name, dtype=dtype)
        if empty_lists not in _EMPTY_LISTS:
            raise ValueError(f"`empty_lists` must be one of {_EMPTY_LISTS}; got {empty_lists!r}")
        self.relevance_threshold = float(relevance_threshold)
        self.empty_lists = empty_lists
        self.alpha = None if alpha is None else float(alpha)
        self.beta = float(beta)
        self.ragged = bool(ragged)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    larger_is_better = True

    def measure(self, labels, relevance, positions):
        """Returns the measure of each list, `[B]`, or `(measure, list weights)`, `[B]` each."""
        raise NotImplementedError

    def has_relevant(self, labels, relevance):
        """Returns whether each list has a relevant document (what the measure needs)."""
        return ops.sum(relevance, axis=-1) > 0

    def standardize(self, y_true, y_pred):
        """Returns `(labels, mask, scores)` (`tfapprox.ops.standardize`)."""
        return rank_ops.standardize(y_true, y_pred, ragged=self.ragged)

    def per_list(self, y_true, y_pred):
        """Returns `(values [B], counted [B] bool)`: the measure of each list, and whether the
        list counts towards the mean (it has real documents and, with `empty_lists="exclude"`, a
        relevant one). For per-query analyses such as paired significance tests."""
        values, counted, _ = self._per_list_and_weights(y_true, y_pred)
        return values, counted

    def _per_list_and_weights(self, y_true, y_pred):
        labels, mask, scores = self.standardize(y_true, y_pred)
        relevance = rank_ops.binary_relevance(labels, mask, self.relevance_threshold)
        if self.alpha is None:
            positions = measures.Positions.exact(scores, mask)
        else:
            positions = measures.Positions.smooth(scores, mask, self.alpha, self.beta)
        values, weights = self.measure(labels, relevance, positions), None
        if isinstance(values, tuple):
            values, weights = values
        nan_input = rank_ops.nan_input_lists(labels, scores)
        values = ops.where(nan_input, float("nan"), values)
        counted = ops.any(mask, axis=-1)
        if self.empty_lists == "exclude":
            counted = ops.logical_and(counted, self.has_relevant(labels, relevance))
        if weights is not None:
            counted = ops.logical_and(counted, weights > 0)
            weights = ops.where(nan_input, float("nan"), weights)
        return values, ops.logical_or(counted, nan_input), weights

    def update_state(self, y_true, y_pred, sample_weight=None):
        values, counted, list_weights = self._per_list_and_weights(y_true, y_pred)
        weights = ops.cast(counted, rank_ops.COMPUTE_DTYPE)
        if list_weights is not None:
            weights = weights * list_weights
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
                "empty_lists": self.empty_lists, "alpha": self.alpha, "beta": self.beta,
                "ragged": self.ragged}


def _name(base, k):
    return base if k is None else f"{base}@{k}"


class CutoffMetric(RankingMetric):
    """A metric of the top `topn` documents of each list (the whole list when None), named
    `{base}@{topn}` by default, with TF-Ranking's argument name."""

    def __init__(self, base_name, topn=None, name=None, **kwargs):
        self.topn = _check_topn(topn)
        super().__init__(name or _name(base_name, topn), **kwargs)

    def get_config(self):
        return {**super().get_config(), "topn": self.topn}


def _with_positive_gain(labels, relevance):
    """`has_relevant` of the graded metrics: a list counts when some label is > 0."""
    return ops.any(ops.greater(labels, 0.0), axis=-1)


class FunctionArguments:
    """Mixin: saves and restores a metric's `gain_fn` / `rank_discount_fn` (None or a function
    registered with `keras.saving.register_keras_serializable`) with its config."""

    FUNCTIONS = ("gain_fn", "rank_discount_fn")

    def get_config(self):
        return {**super().get_config(),
                **{key: None if getattr(self, key) is None
                   else keras.saving.serialize_keras_object(getattr(self, key))
                   for key in self.FUNCTIONS if hasattr(self, key)}}

    @classmethod
    def from_config(cls, config):
        return cls(**{**config, **{key: keras.saving.deserialize_keras_object(config[key])
                                   for key in cls.FUNCTIONS if config.get(key) is not None}})


@keras.saving.register_keras_serializable(package="tfapprox")
class NDCG(FunctionArguments, RankingMetric):
    """NDCG@k = Σ_x (2^{y_x} − 1)/log2(1 + π(x))·1{π(x) ≤ k} / ideal DCG@k (k=None: whole list).

    A list counts as having a relevant document when some label is > 0 (positive gain).
    TF-Ranking: `NDCGMetric(topn=k)`; `gain_fn` and `rank_discount_fn` as `DCG`'s, the ideal DCG
    then being that of the documents ordered by gain.
    """

    def __init__(self, k=None, name=None, relevance_threshold=1.0, empty_lists="exclude",
                 dtype=None, gain_fn=None, rank_discount_fn=None, **kwargs):
        super().__init__(name or _name("ndcg", k), relevance_threshold, empty_lists,
                         dtype=dtype, **kwargs)
        self.k = _check_topn(k, "k")
        self.gain_fn = gain_fn
        self.rank_discount_fn = rank_discount_fn

    has_relevant = staticmethod(_with_positive_gain)

    def measure(self, labels, relevance, positions):
        return measures.ndcg(labels, positions, self.k, self.gain_fn, self.rank_discount_fn)

    def get_config(self):
        return {**super().get_config(), "k": self.k}


@keras.saving.register_keras_serializable(package="tfapprox")
class DCG(FunctionArguments, CutoffMetric):
    """DCG@k = Σ_x G(y_x)·D(π(x))·1{π(x) ≤ k} (Järvelin & Kekäläinen, TOIS 2002), by default
    G(y) = 2^y − 1 and D(r) = 1/log2(1 + r) (Burges et al., ICML 2005), as TF-Ranking's DCGMetric.

    `gain_fn` (labels → gains, 0 for label 0) and `rank_discount_fn` (1-based positions →
    discounts) take and return tensors through `keras.ops`; registered with
    `keras.saving.register_keras_serializable` they are saved with the metric. A list counts
    when some label is > 0.

    >>> metric = DCG(topn=2)
    >>> float(metric([[2.0, 0.0, 1.0]], [[0.9, 0.8, 0.1]]))  # (2² − 1)/log2(2) + 0
    3.0
    """

    def __init__(self, topn=None, gain_fn=None, rank_discount_fn=None, name=None, **kwargs):
        super().__init__("dcg", topn, name, **kwargs)
        self.gain_fn = gain_fn
        self.rank_discount_fn = rank_discount_fn

    has_relevant = staticmethod(_with_positive_gain)

    def measure(self, labels, relevance, positions):
        return measures.dcg(labels, positions, self.topn, self.gain_fn, self.rank_discount_fn)


@keras.saving.register_keras_serializable(package="tfapprox")
class MeanAveragePrecision(CutoffMetric):
    """MAP(@k): the mean over lists of AP = 1/|D+| Σ_{y relevant, π(y) ≤ k} #{relevant x: π(x) ≤
    π(y)} / π(y), |D+| counting the whole list's relevant documents (TF-Ranking's
    `MeanAveragePrecisionMetric(topn=k)`)."""

    def __init__(self, name=None, relevance_threshold=1.0, empty_lists="exclude", dtype=None,
                 topn=None, **kwargs):
        super().__init__("map", topn, name, relevance_threshold=relevance_threshold,
                         empty_lists=empty_lists, dtype=dtype, **kwargs)

    def measure(self, labels, relevance, positions):
        return measures.average_precision(relevance, positions, self.topn)


@keras.saving.register_keras_serializable(package="tfapprox")
class PrecisionAtK(RankingMetric):
    """P@k = (1/k) Σ_x r(x)·1{π(x) ≤ k}; the divisor is k even for shorter lists (trec_eval).
    With k=None it is the share of relevant documents in the whole list. TF-Ranking's
    `PrecisionMetric(topn=k)` divides by min(k, list size)."""

    def __init__(self, k, name=None, relevance_threshold=1.0, empty_lists="exclude", dtype=None,
                 **kwargs):
        super().__init__(name or _name("p", k), relevance_threshold, empty_lists, dtype=dtype,
                         **kwargs)
        self.k = _check_topn(k, "k")

    def measure(self, labels, relevance, positions):
        return measures.precision_at_k(relevance, positions, self.k)

    def get_config(self):
        return {**super().get_config(), "k": self.k}


@keras.saving.register_keras_serializable(package="tfapprox")
class Recall(CutoffMetric):
    """Recall@k = Σ_x r(x)·1{π(x) ≤ k} / Σ_x r(x), the share of a list's relevant documents
    placed in the top k (TF-Ranking's RecallMetric).

    >>> float(Recall(topn=1)([[1.0, 0.0, 1.0]], [[0.9, 0.8, 0.1]]))
    0.5
    """

    def __init__(self, topn=None, name=None, **kwargs):
        super().__init__("recall", topn, name, **kwargs)

    def measure(self, labels, relevance, positions):
        return measures.recall_at_k(relevance, positions, self.topn)


@keras.saving.register_keras_serializable(package="tfapprox")
class Hits(CutoffMetric):
    """Hits@k = max_x r(x)·1{π(x) ≤ k}: 1 when some relevant document is in the top k, else 0
    (TF-Ranking's HitsMetric; trec_eval's success@k).

    >>> float(Hits(topn=1)([[0.0, 1.0], [1.0, 0.0]], [[0.9, 0.8], [0.9, 0.8]]))
    0.5
    """

    def __init__(self, topn=None, name=None, **kwargs):
        super().__init__("hits", topn, name, **kwargs)

    def measure(self, labels, relevance, positions):
        return measures.hits_at_k(relevance, positions, self.topn)


@keras.saving.register_keras_serializable(package="tfapprox")
class MeanReciprocalRank(CutoffMetric):
    """MRR(@k): the mean over lists of 1/π(first relevant document), 0 when it is below k
    (TF-Ranking's `MRRMetric(topn=k)`)."""

    def __init__(self, name=None, relevance_threshold=1.0, empty_lists="exclude", dtype=None,
                 topn=None, **kwargs):
        super().__init__("mrr", topn, name, relevance_threshold=relevance_threshold,
                         empty_lists=empty_lists, dtype=dtype, **kwargs)

    def measure(self, labels, relevance, positions):
        return measures.reciprocal_rank(relevance, positions, self.topn)


@keras.saving.register_keras_serializable(package="tfapprox")
class ERR(CutoffMetric):
    """ERR@k = Σ_{x: π(x) ≤ k} R(y_x)/π(x) · Π_{z: π(z) < π(x)} (1 − R(y_z)), R(y) = (2^y − 1) /
    2^{max_label}: expected reciprocal rank of the document that satisfies a user who scans down
    the list (Chapelle, Metzler, Zhang & Grinspan, CIKM 2009, eq. 4). TF-Ranking has no ERR.

    `max_label` is the top grade of the label scale (4, as the Yahoo! LTR challenge and
    TREC's gdeval; 2 for MQ2008); larger labels count as it. A list counts when some label is > 0.

    >>> float(ERR(max_label=1.0)([[1.0, 0.0, 1.0]], [[0.1, 0.9, 0.8]]))  # ½/2 + ½·½/3
    0.3333333432674408
    """

    def __init__(self, topn=None, max_label=4.0, name=None, **kwargs):
        super().__init__("err", topn, name, **kwargs)
        self.max_label = float(max_label)
        if not self.max_label > 0:
            raise ValueError(f"`max_label` must be > 0; got {max_label!r}")

    has_relevant = staticmethod(_with_positive_gain)

    def measure(self, labels, relevance, positions):
        return measures.expected_reciprocal_rank(labels, positions, self.topn, self.max_label)

    def get_config(self):
        return {**super().get_config(), "max_label": self.max_label}


@keras.saving.register_keras_serializable(package="tfapprox")
class ARP(RankingMetric):
    """ARP = Σ_x y_x·π(x) / Σ_x y_x, the average position of the documents weighted by their
    labels (lower is better), as TF-Ranking's ARPMetric: the mean over lists weighs each list by
    its sum of labels (times its `sample_weight`), so it is Σ_lists Σ_x y_x·π(x) / Σ_lists Σ_x y_x.

    >>> float(ARP()([[0.0, 1.0, 3.0]], [[0.9, 0.8, 0.1]]))  # (1·2 + 3·3) / 4
    2.75
    """

    larger_is_better = False

    def __init__(self, name="arp", **kwargs):
        super().__init__(name, **kwargs)

    has_relevant = staticmethod(_with_positive_gain)

    def measure(self, labels, relevance, positions):
        return (measures.average_relevance_position(labels, positions),
                ops.sum(labels, axis=-1))


@keras.saving.register_keras_serializable(package="tfapprox")
class OPA(RankingMetric):
    """Ordered pair accuracy: #{(i, j): y_i > y_j, s_i > s_j} / #{(i, j): y_i > y_j}, the share of
    a list's pairs of different labels that the scores order rightly (equal scores do not), as
    TF-Ranking's OPAMetric: the mean over lists weighs each list by its number of such pairs,
    so it is the share over all pairs of the batches. O(L²) comparisons, in blocks for long
    lists (`tfapprox.pair_plan.PairPlan.blocked_above`; dense on a GPU under JAX).

    >>> float(OPA()([[2.0, 1.0, 0.0]], [[0.9, 0.1, 0.5]]))  # (2,1) and (2,0) ordered, (1,0) not
    0.6666666865348816
    """

    def __init__(self, name="ordered_pair_accuracy", **kwargs):
        super().__init__(name, **kwargs)

    has_relevant = staticmethod(_with_positive_gain)

    def measure(self, labels, relevance, positions):
        return measures.ordered_pairs(labels, positions)


class SubtopicMetric(CutoffMetric):
    """A diversity metric: `y_true` holds one label per subtopic, `[B, L, T]` (a label ≥
    `relevance_threshold` means the document covers the subtopic), as TF-Ranking takes them. A
    document is padding when all its subtopic labels are < 0; a label < 0 on a real document is a
    padded subtopic (0). Labels `[B, L]` are one subtopic. A list counts when a document covers a
    subtopic."""

    def standardize(self, y_true, y_pred):
        labels, mask = ((y_true.get("labels"), y_true.get("mask")) if isinstance(y_true, dict)
                        else (y_true, None))
        if self.ragged:
            labels, mask, y_pred = rank_ops.dense_lists(labels, mask, y_pred)
        labels = ops.cast(ops.convert_to_tensor(labels), rank_ops.COMPUTE_DTYPE)
        if len(labels.shape) == 2:
            labels = ops.expand_dims(labels, -1)
        if len(labels.shape) != 3:
            raise ValueError(f"{type(self).__name__}: y_true must hold subtopic labels "
                             "[batch, list_size, subtopics] (or [batch, list_size] for one "
                             f"subtopic); got shape {tuple(labels.shape)}")
        document_labels = ops.max(labels, axis=-1, initial=float("-inf"))
        _, mask, scores = rank_ops.standardize({"labels": document_labels, "mask": mask}, y_pred)
        padded = ops.logical_or(ops.logical_not(ops.expand_dims(mask, -1)), labels < 0)
        return ops.where(padded, 0.0, labels), mask, scores

    def has_relevant(self, labels, relevance):
        return ops.any(relevance > 0, axis=(1, 2))


@keras.saving.register_keras_serializable(package="tfapprox")
class AlphaDCG(FunctionArguments, SubtopicMetric):
    """α-DCG@k = Σ_{x: π(x) ≤ k} D(π(x)) Σ_t y_{x,t}·(1 − α)^{c_{x,t}}, c_{x,t} the number of
    documents placed before x that cover subtopic t: a subtopic's gain decays each time it is
    covered again (Clarke et al., SIGIR 2008, eq. 7). Unnormalised, as TF-Ranking's
    AlphaDCGMetric (`alpha`, `rank_discount_fn` as there). Subtopic labels `[B, L, T]`.

    >>> labels = [[[1.0, 0.0], [1.0, 1.0]]]  # document 0 covers subtopic 0; document 1 both
    >>> float(AlphaDCG(alpha=0.5)(labels, [[0.9, 0.1]]))  # 1 + (0.5 + 1)/log2(3)
    1.946394681930542
    """

    def __init__(self, topn=None, alpha=0.5, rank_discount_fn=None, name=None, **kwargs):
        super().__init__("alpha_dcg", topn, name, **kwargs)
        self.novelty_alpha = float(alpha)
        if not 0.0 <= self.novelty_alpha <= 1.0:
            raise ValueError(f"`alpha` must be in [0, 1]; got {alpha!r}")
        self.rank_discount_fn = rank_discount_fn

    def measure(self, labels, relevance, positions):
        return measures.alpha_dcg(labels, positions, self.topn, self.novelty_alpha,
                                  self.rank_discount_fn)

    def get_config(self):
        # "alpha" is α of the gain here: the metric is always exact
        return {**super().get_config(), "alpha": self.novelty_alpha}


@keras.saving.register_keras_serializable(package="tfapprox")
class PrecisionIA(SubtopicMetric):
    """Intent-aware precision Pre-IA@k = 1/|T+| Σ_{t ∈ T+} (1/k) Σ_{x: π(x) ≤ k} r(x, t), T+ the
    subtopics some document of the list covers (Agrawal et al., WSDM 2009; Clarke et al., TREC
    2009 Web Track). The divisor is k, as `PrecisionAtK`'s (the number of real documents when
    `topn` is None); TF-Ranking's PrecisionIAMetric divides by min(k, list size). Subtopic labels
    `[B, L, T]`.

    >>> labels = [[[1.0, 0.0], [1.0, 1.0]]]
    >>> float(PrecisionIA(topn=1)(labels, [[0.9, 0.1]]))  # subtopic 0 in the top 1, of 2
    0.5
    """

    def __init__(self, topn=None, name=None, **kwargs):
        super().__init__("precision_ia", topn, name, **kwargs)

    def measure(self, labels, relevance, positions):
        return measures.precision_ia(relevance, positions, self.topn)


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


# TF-Ranking's `RankingMetricKey` strings (tfr.metrics and tfr.keras.metrics) and tfapprox's own
# names, each with the class it builds and that class's cut-off argument (None: it takes none).
METRICS = {
    "ndcg": (NDCG, "k"), "dcg": (DCG, "topn"), "map": (MeanAveragePrecision, "topn"),
    "mrr": (MeanReciprocalRank, "topn"), "precision": (PrecisionAtK, "k"),
    "p": (PrecisionAtK, "k"), "recall": (Recall, "topn"), "hits": (Hits, "topn"),
    "err": (ERR, "topn"), "arp": (ARP, None), "ordered_pair_accuracy": (OPA, None),
    "opa": (OPA, None), "alpha_dcg": (AlphaDCG, "topn"), "precision_ia": (PrecisionIA, "topn"),
    "approx_ndcg": (ApproxNDCGMetric, "k"), "approx_map": (ApproxAPMetric, None),
}


def get(key, topn=None, **params):
    """Returns the metric called `key`, built with `params` (e.g. `alpha=20.0`).

    `key` is a TF-Ranking `RankingMetricKey` string — "ndcg", "dcg", "map", "mrr", "precision",
    "recall", "hits", "arp", "ordered_pair_accuracy", "alpha_dcg", "precision_ia" — or "err",
    "opa", "p", "approx_ndcg", "approx_map"; a cut-off is `topn=k` (as TF-Ranking's `get`) or
    written in the key, "ndcg@5". The metric is named `key` as given (lower case) unless `name`
    says otherwise. "p" and "precision" need a cut-off; "arp", "ordered_pair_accuracy" and
    "approx_map" take none.
    """
    base, _, cutoff = key.lower().partition("@")
    if cutoff:
        if not cutoff.isdigit() or int(cutoff) < 1:
            raise ValueError(f"metric {key!r}: the cut-off after '@' must be an int >= 1")
        if topn is not None and topn != int(cutoff):
            raise ValueError(f"metric {key!r}: the cut-off is given twice, as @{cutoff} and "
                             f"topn={topn!r}")
        topn = int(cutoff)
    if base not in METRICS:
        raise ValueError(f"unknown metric {key!r}; expected one of {sorted(METRICS)}, "
                         "optionally with a cut-off: 'ndcg@5'")
    cls, cutoff_argument = METRICS[base]
    if topn is not None and cutoff_argument is None:
        raise ValueError(f"metric {key!r} takes no cut-off")
    if topn is None and base == "p":
        raise ValueError(f"metric {key!r} needs a cut-off: 'p@10'")
    params.setdefault("name", key.lower() if topn is None or cutoff else f"{base}@{topn}")
    if cutoff_argument is not None:
        params[cutoff_argument] = _check_topn(topn)
    return cls(**params)
