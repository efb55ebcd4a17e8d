"""The metrics a run reports, by name: the selection metric, its approximation monitor and the gap.

An approximation monitor is the smooth surrogate of the selection metric (`approx_ndcg@k`,
`approx_map`), computed with the loss's `alpha` and `beta`; `approx_gap` = monitor − exact metric
shows how closely the loss follows what selection measures.
"""

from __future__ import annotations

import keras

from trainer.config import Config


def monitor_name(config: Config) -> str:
    """Returns the approximation monitor: the smooth twin of the selection metric."""
    select = config.train.select_metric
    if select == "map" or config.loss.name == "approx_ap":
        return "approx_map"
    _, _, k = select.partition("@")
    return f"approx_ndcg@{k}" if select.startswith("ndcg") and k else "approx_ndcg"


def train_metric_names(config: Config) -> list[str]:
    """Returns the metrics the training model reports each epoch: selection metric, monitor."""
    return list(dict.fromkeys([config.train.select_metric, monitor_name(config)]))


def eval_metric_names(config: Config) -> list[str]:
    """Returns the evaluation model's metrics: selection, `train.metrics`, monitor (not AdaRank's)."""
    names = [config.train.select_metric, *config.train.metrics]
    if config.model.kind != "adarank":
        names.append(monitor_name(config))
    return list(dict.fromkeys(names))


def metrics_named(names: list[str], config: Config) -> list[keras.metrics.Metric]:
    """Returns tfapprox metrics; approximation monitors take the loss's alpha and beta."""
    from tfapprox import metrics

    smoothing = {p: float(config.loss.params[p]) for p in ("alpha", "beta") if p in config.loss.params}
    built = []
    for name in names:
        if name == "approx_map":
            built.append(metrics.ApproxAPMetric(**smoothing))
        elif name.startswith("approx_ndcg"):
            k = name.partition("@")[2]
            built.append(metrics.ApproxNDCGMetric(int(k) if k else None, **smoothing))
        else:
            built.append(metrics.get(name))
    return built


def add_gaps(logs: dict[str, float], names: list[str]) -> None:
    """Adds `approx_gap` (smooth surrogate minus exact metric) beside each approximation monitor."""
    for prefix in ("", "val_"):
        for name in names:
            if name.startswith("approx_"):
                exact = name[len("approx_"):]
                if prefix + name in logs and prefix + exact in logs:
                    logs[prefix + "approx_gap"] = logs[prefix + name] - logs[prefix + exact]
