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
once, `[F, m]`, and each round then costs one ranking by f_t. The result is linear in the
features, f(x) = Σ_k w_k x_k: a Dense(1) scorer serves it.

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
        return metrics.get(name)
    except ValueError:
        raise ValueError(f"measure must be one of {MEASURES}; got {name!r}") from None


def per_query(metric: metrics.RankingMetric, scores, labels, mask) -> tuple[np.ndarray, np.ndarray]:
    """Returns `(E [N] float64, defined [N] bool)`: `metric` on each list ranked by `scores` [N, L].

    Lists are measured in blocks of at most `_PAIRS_PER_CALL` document pairs.
    """
    num_lists, list_size = np.shape(scores)
    block = max(1, _PAIRS_PER_CALL // max(list_size * list_size, 1))
    values, defined = [], []
    for start in range(0, num_lists, block):
        part = slice(start, start + block)
        value, counted = metric.per_list({"labels": labels[part], "mask": mask[part]}, scores[part])
        values.append(ops.convert_to_numpy(value))
        defined.append(ops.convert_to_numpy(counted))
    return np.concatenate(values).astype(np.float64), np.concatenate(defined).astype(bool)


def mean_measure(metric: metrics.RankingMetric, weights: np.ndarray, features, labels, mask) -> float:
    """Returns the mean of `metric` over the lists where it is defined, ranked by f = features·w."""
    values, defined = per_query(metric, linear_scores(features, weights), labels, mask)
    return float(values[defined].mean()) if defined.any() else 0.0


def linear_scores(features, weights: np.ndarray) -> np.ndarray:
    """Returns f(x) = Σ_k w_k x_k for features [N, L, F]: float32 [N, L], as a Dense(1) computes."""
    return np.asarray(features, np.float32) @ np.asarray(weights, np.float32)


def weak_ranker_measures(metric: metrics.RankingMetric, features, labels, mask) -> np.ndarray:
    """Returns E(π(q_i, d_i, h_k), y_i) of every feature k on every query i: float64 [F, Q]."""
    num_queries, list_size, num_features = np.shape(features)
    scores = np.moveaxis(np.asarray(features, np.float32), 2, 0).reshape(-1, list_size)
    values, _ = per_query(metric, scores, np.tile(labels, (num_features, 1)),
                          np.tile(mask, (num_features, 1)))
    return values.reshape(num_features, num_queries)


def fit_adarank(features, labels, mask, measure: str = "ndcg", rounds: int = 100,
                validation: tuple | None = None, select: str | None = None) -> AdaRankFit:
    """Runs up to `rounds` rounds of AdaRank on padded lists; returns the kept round's weights.

    Args:
        features: float [Q, L, F] documents' features (padded slots are ignored).
        labels: float [Q, L] graded relevance.
        mask: bool [Q, L], True on real documents.
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
    query_weights = np.full(len(labels), 1.0 / len(labels))
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
    """Returns the queries on which `metric` is defined (with a relevant document); raises
    ValueError if there is none."""
    labels = np.asarray(labels, np.float32)
    mask = np.asarray(mask, bool)
    _, defined = per_query(metric, np.zeros(labels.shape, np.float32), labels, mask)
    if not defined.any():
        raise ValueError(f"none of the {len(labels)} training queries has a relevant document: "
                         f"{metric.name} is undefined on all of them")
    return np.asarray(features, np.float32)[defined], labels[defined], mask[defined]
