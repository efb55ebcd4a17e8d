"""AdaRank (Xu & Li, SIGIR 2007): boosting single features on a per-query IR measure E.

The algorithm of the paper's Fig. 1, with one feature per weak ranker, h_k(x) = x_k, as in its
experiments:

    P_1(i) = 1/m
    for t = 1..T:
        h_t  = argmax_h  Σ_i P_t(i)·E(π(q_i, d_i, h), y_i)          (the maximum is φ(t))
        α_t  = ½ ln( Σ_i P_t(i)(1 + E(π(q_i, d_i, h_t), y_i))
                     / Σ_i P_t(i)(1 − E(π(q_i, d_i, h_t), y_i)) )
             = ½ ln((1 + φ(t)) / (1 − φ(t)))                         (Σ_i P_t(i) = 1)
        f_t  = Σ_{s≤t} α_s h_s
        P_{t+1}(i) = exp(−E(π(q_i, d_i, f_t), y_i)) / Σ_j exp(−E(π(q_j, d_j, f_t), y_j))

E is AP (AdaRank.MAP), NDCG (AdaRank.NDCG) or another exact `tfapprox.metrics` measure, always
computed by that metric's `per_list`, so ties keep list order as in every tfapprox metric. A weak
ranker's ranking does not change between rounds: E of every feature on every query is computed
once, `[F, m]`, and each round then costs one ranking by f_t. Lists of different lengths are
measured in length buckets, each padded only to its own longest list (`per_query`; the trainer
also holds them so, `length_buckets`), so one long list pads no other. The result is linear in
the features, f(x) = Σ_k w_k x_k: a Dense(1) scorer serves it.

Where Fig. 1 leaves things open this module decides as follows. A round whose f_t measures
exactly as f_{t−1} on every query leaves P_{t+1} = P_t, so h_t would be chosen again in every
later round (on OHSUMED this happens in round 2: f_1 = α_1 h_1, and h_1 stays the best under
P_2). Such a round is undone and h_t set aside until another round is taken; when every feature is
set aside, training stops before T. Queries on which E is undefined (no relevant document) are left
out: every ranker scores 0 there. φ(t) is clipped at `MAX_PHI` in α_t, so a weak ranker perfect
on every query gets a large finite weight, not an infinite one. With validation lists the round
with the best validation value is kept, not necessarily the last.

Reference: J. Xu, H. Li. "AdaRank: A Boosting Algorithm for Information Retrieval". SIGIR 2007.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from keras import ops

from tfapprox import metrics

MEASURES = ("map", "ndcg", "ndcg@k", "p@k", "mrr")
MAX_PHI = 1.0 - 1e-6  # φ(t) is clipped here in α_t (α_t ≈ 7.25)
_PAIRS_PER_CALL = 1 << 24  # lists × L² per metric call: bounds the [N, L, L] exact-rank tensors


@dataclasses.dataclass
class AdaRankFit:
    """What `fit_adarank` returns."""

    weights: np.ndarray  # float64 [F]: w of the kept round's f(x) = Σ_k w_k x_k
    best_round: int  # 1-based round whose f is kept
    history: list[dict[str, float]]  # per round: feature (column), alpha, phi, measures


def measure_metric(name: str) -> metrics.RankingMetric:
    """Returns the exact tfapprox metric called `name` (one of `MEASURES`), which computes E."""
    if name.lower().startswith("approx"):
        raise ValueError(f"measure must be an exact measure, one of {MEASURES}; got {name!r}")
    try:
        if name.lower().partition("@")[0] not in ("map", "ndcg", "p", "mrr"):  # E in [0, 1]
            raise ValueError(name)
        return metrics.get(name)
    except ValueError:
        raise ValueError(f"measure must be one of {MEASURES}; got {name!r}") from None


def per_query(metric: metrics.RankingMetric, scores, labels, mask) -> tuple[np.ndarray, np.ndarray]:
    """Returns `(E [N] float64, defined [N] bool)`: `metric` on each list ranked by `scores`.

    `scores` [N, L], `labels` and `mask` are padded lists, or lists of such arrays (groups of
    lists of different widths, as `length_buckets` gives); the values follow the lists in that
    order. Each group is measured in length buckets (`_length_buckets`), each bucket cut to its
    own longest list, in blocks of at most `_PAIRS_PER_CALL` document pairs.
    """
    values, defined = [], []
    for group_scores, group_labels, group_mask in _groups(scores, labels, mask):
        value = np.zeros(len(group_mask), np.float64)
        counted = np.zeros(len(group_mask), bool)
        for rows, width in _length_buckets(group_mask):
            block = max(1, _PAIRS_PER_CALL // max(width * width, 1))
            for part in np.array_split(rows, -(-len(rows) // block)):
                measured, counts = metric.per_list(
                    {"labels": group_labels[part, :width], "mask": group_mask[part, :width]},
                    group_scores[part, :width])
                value[part] = ops.convert_to_numpy(measured)
                counted[part] = ops.convert_to_numpy(counts)
        values.append(value)
        defined.append(counted)
    return np.concatenate(values), np.concatenate(defined)


def mean_measure(metric: metrics.RankingMetric, weights: np.ndarray, features, labels, mask) -> float:
    """Returns the mean of `metric` over the lists where it is defined, ranked by f = features·w."""
    values, defined = per_query(metric, linear_scores(features, weights), labels, mask)
    return float(values[defined].mean()) if defined.any() else 0.0


def linear_scores(features, weights: np.ndarray):
    """Returns f(x) = Σ_k w_k x_k for features [N, L, F]: float32 [N, L], as a Dense(1) computes
    (for a list of such arrays, a list of the scores of each)."""
    if isinstance(features, list):
        return [linear_scores(group, weights) for group in features]
    return np.asarray(features, np.float32) @ np.asarray(weights, np.float32)


def weak_ranker_measures(metric: metrics.RankingMetric, features, labels, mask) -> np.ndarray:
    """Returns E(π(q_i, d_i, h_k), y_i) of every feature k on every query i: float64 [F, Q], with
    the queries in the order `per_query` gives."""
    measured = []
    for group_features, group_labels, group_mask in _groups(features, labels, mask):
        values = np.zeros((group_features.shape[-1], len(group_mask)))
        for rows, width in _length_buckets(group_mask):
            bucket = np.moveaxis(group_features[rows, :width], 2, 0)  # [F, Qb, W]
            repeats = (len(bucket), 1)
            bucket_values, _ = per_query(
                metric, bucket.reshape(-1, width), np.tile(group_labels[rows, :width], repeats),
                np.tile(group_mask[rows, :width], repeats))
            values[:, rows] = bucket_values.reshape(len(bucket), len(rows))
        measured.append(values)
    return np.concatenate(measured, axis=1)


def length_buckets(features, labels, mask) -> tuple[list, list, list]:
    """Returns the lists of `features` [Q, L, F], `labels` [Q, L] and `mask` [Q, L] (or lists of
    such arrays) regrouped in length buckets (`_length_buckets`): one array per bucket, from the
    shortest lists to the longest, each padded to its own longest list (label −1, mask False).
    Within a bucket the lists keep their order."""
    groups = _groups(features, labels, mask)
    keys = [_bucket_keys(group_mask) for _, _, group_mask in groups]
    buckets = ([], [], [])
    for key in np.unique(np.concatenate(keys)):
        members = [(group, np.flatnonzero(group_keys == key))
                   for group, group_keys in zip(groups, keys)]
        width = max(int(_list_lengths(group[2][rows]).max(initial=0)) for group, rows in members)
        for index, (padding, bucket) in enumerate(zip((0.0, -1.0, False), buckets)):
            bucket.append(np.concatenate([_padded_to(group[index][rows, :width], width, padding)
                                          for group, rows in members if len(rows)]))
    return buckets


def _padded_to(lists: np.ndarray, width: int, value) -> np.ndarray:
    """Returns `lists` [N, L, ...] with L ≤ `width` padded with `value` to [N, width, ...]."""
    widths = [(0, 0), (0, width - lists.shape[1])] + [(0, 0)] * (lists.ndim - 2)
    return np.pad(lists, widths, constant_values=value)


def _groups(*arrays) -> list[tuple[np.ndarray, ...]]:
    """Returns `[(a, ..., mask)]` for padded arrays (float32, the last one a bool mask): one
    tuple, or one per group when they are Python lists of arrays (groups of lists, each group
    of one width)."""
    if not isinstance(arrays[0], list):
        arrays = tuple([array] for array in arrays)
    if len({len(groups) for groups in arrays}) != 1:
        raise ValueError(f"expected as many arrays of each input, got {[len(a) for a in arrays]}")
    return [tuple(np.asarray(a, bool if i == len(group) - 1 else np.float32)
                  for i, a in enumerate(group)) for group in zip(*arrays)]


def _list_lengths(mask: np.ndarray) -> np.ndarray:
    """Returns each list's length: 1 + the index of its last real slot (0 without any)."""
    last = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), last, 0)


def _bucket_keys(mask: np.ndarray) -> np.ndarray:
    """Returns each list's length bucket ⌈log2 n⌉ (n its length, at least 1): a list is padded to
    less than twice its length in its bucket."""
    return np.ceil(np.log2(np.maximum(_list_lengths(mask), 1))).astype(int)


def _length_buckets(mask: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """Returns `(rows, width)` of each length bucket of the lists [N, L]: the lists in it and
    its longest list's length."""
    keys, lengths = _bucket_keys(mask), _list_lengths(mask)
    return [(np.flatnonzero(keys == key), int(lengths[keys == key].max()))
            for key in np.unique(keys)]


def fit_adarank(features, labels, mask, measure: str = "ndcg", rounds: int = 100,
                validation: tuple | None = None, select: str | None = None) -> AdaRankFit:
    """Runs up to `rounds` rounds of AdaRank on padded lists; returns the kept round's weights.

    Args:
        features: float [Q, L, F] documents' features (padded slots are ignored), or a list of
            such arrays, groups of lists each padded to its own width (`length_buckets`).
        labels: float [Q, L] graded relevance (or a list, as `features`).
        mask: bool [Q, L], True on real documents (or a list, as `features`).
        measure: E, the name of an exact tfapprox metric: `map` (AdaRank.MAP), `ndcg`
            (AdaRank.NDCG, whole list), `ndcg@k`, `p@k` or `mrr`.
        rounds: T ≥ 1.
        validation: `(features, labels, mask)` of validation lists: the round with the best mean
            `select` on them is kept (the earliest of equals). Without, the last round is kept.
        select: metric name for the choice of round (default `measure`).

    Each history entry holds `round`, `feature` (the column k of h_t), `alpha`, `phi` (φ(t), before
    clipping), `<measure>` (mean E(f_t) on the training queries) and, with validation,
    `val_<select>`.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    metric = measure_metric(measure)
    select = select or measure
    select_metric = measure_metric(select)
    features, labels, mask = _queries_with_measure(metric, features, labels, mask)
    weak = weak_ranker_measures(metric, features, labels, mask)
    query_weights = np.full(weak.shape[1], 1.0 / weak.shape[1])
    weights, ensemble = np.zeros(weak.shape[0]), None
    stalled = np.zeros(weak.shape[0], bool)
    path, history = [], []
    while len(history) < rounds and not stalled.all():
        weighted = np.where(stalled, -np.inf, weak @ query_weights)
        feature = int(np.argmax(weighted))
        phi = float(weighted[feature])
        alpha = _alpha(phi)
        candidate = weights.copy()
        candidate[feature] += alpha
        measured, _ = per_query(metric, linear_scores(features, candidate), labels, mask)
        if ensemble is not None and np.array_equal(measured, ensemble):
            stalled[feature] = True  # P_{t+1} = P_t: h_t would be chosen again, for ever
            continue
        stalled[:] = False
        weights, ensemble = candidate, measured
        query_weights = np.exp(-ensemble) / np.exp(-ensemble).sum()
        entry = {"round": len(history) + 1, "feature": feature, "alpha": alpha, "phi": phi,
                 measure: float(ensemble.mean())}
        if validation is not None:
            entry[f"val_{select}"] = mean_measure(select_metric, weights, *validation)
        path.append(weights)
        history.append(entry)
    best_round = len(history)
    if validation is not None:
        best_round = 1 + int(np.argmax([entry[f"val_{select}"] for entry in history]))
    return AdaRankFit(weights=path[best_round - 1], best_round=best_round, history=history)


def _alpha(phi: float) -> float:
    """α = ½ ln((1 + φ) / (1 − φ)), φ clipped at `MAX_PHI` (Xu & Li Fig. 1 with Σ_i P_t(i) = 1)."""
    phi = min(phi, MAX_PHI)
    return 0.5 * float(np.log((1.0 + phi) / (1.0 - phi)))


def _queries_with_measure(metric, features, labels, mask):
    """Returns the queries on which `metric` is defined (with a relevant document), as lists of
    groups (`_groups`); raises ValueError if there is none."""
    groups = _groups(features, labels, mask)
    _, defined = per_query(metric, [np.zeros(group[1].shape, np.float32) for group in groups],
                           *[[group[i] for group in groups] for i in (1, 2)])
    if not defined.any():
        raise ValueError(f"none of the {len(defined)} training queries has a relevant document: "
                         f"{metric.name} is undefined on all of them")
    kept = np.split(defined, np.cumsum([len(group[2]) for group in groups])[:-1])
    return tuple([group[i][keep] for group, keep in zip(groups, kept)] for i in range(3))
