"""One run of the experiments: a model trained on one fold with one seed, evaluated per test query.

A run is a `Run` (dataset, fold, seed, scorer or LightGBM, loss and its parameters, epochs). Neural
and AdaRank runs go through the trainer (`trainer.train.train`, resumable), LightGBM runs through
`lightgbm.train`; both are scored on the fold's test file by the same code (`per_query_metrics`,
built on `tfapprox.metrics`), so every model is measured alike.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

# Metrics of every table: the exact metrics of tfapprox, by their short names.
METRICS = ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "ndcg", "map", "p@10")
SELECT_METRIC = "ndcg@10"  # validation metric for epochs, grid points and LightGBM's early stop


@dataclasses.dataclass(frozen=True)
class Run:
    """What one cached result is about."""

    dataset: str  # a set in ../shared/data: OHSUMED, MQ2008
    fold: int
    seed: int
    model: str  # a scorer preset (linear, B64 ... B1024), "adarank" or "lightgbm"
    loss: str  # a tfapprox loss name; AdaRank's measure (ndcg, map); "lambdarank" for LightGBM
    params: tuple[tuple[str, Any], ...] = ()  # loss parameters (LightGBM: its parameters)
    epochs: int = 40
    precision: str = "float32"  # or "mixed_bfloat16": the trainer's --mixed-precision on CPU

    def label(self) -> str:
        """Returns the configuration without fold and seed, e.g. `B64 approx_ndcg(alpha=10)`."""
        mixed = "" if self.precision == "float32" else f" {self.precision}"
        return f"{self.model} {self.loss}({', '.join(f'{k}={v}' for k, v in self.params)}){mixed}"

    def cache_path(self, cache: Path) -> Path:
        fields = dataclasses.asdict(self)
        if self.precision == "float32":  # runs cached before precision was a field keep their name
            del fields["precision"]
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        params = ",".join(f"{k}={v}" for k, v in self.params) or "default"
        mixed = "" if self.precision == "float32" else f"-{self.precision}"
        return (cache / self.dataset / self.model / f"{self.loss}-{params}-e{self.epochs}{mixed}"
                / f"Fold{self.fold}-seed{self.seed}-{digest}.json")


def read_cached(path: Path, say: Callable[[str], None]) -> dict[str, Any] | None:
    """Returns the result cached at `path`; None when there is none, or when the file holds no
    complete result (empty, cut short, not a result): then `say` gets one line naming it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        result = json.loads(text)
    except json.JSONDecodeError as err:
        problem = "empty" if not text.strip() else str(err)
    else:
        if isinstance(result, dict) and {"validation", "qids", "test"} <= result.keys():
            return result
        problem = "no validation, qids and test"
    say(f"unreadable cached run, counted as not run: {path} ({problem})")
    return None


def fold_files(folds_root: Path, run: Run) -> dict[str, Path]:
    fold = folds_root / run.dataset / f"Fold{run.fold}"
    return {split: fold / f"{split}.txt" for split in ("train", "vali", "test")}


def read_split(path: Path) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    """Returns the query ids, labels and features of a LETOR file, query by query."""
    from tfapprox.data import read_queries

    queries = list(read_queries(path))
    return ([q.qid for q in queries], [q.labels for q in queries],
            [q.features for q in queries])


def padded(arrays: list[np.ndarray], fill: float) -> np.ndarray:
    """Stacks lists of different lengths into [Q, longest, ...], padding with `fill`."""
    longest = max(len(a) for a in arrays)
    out = np.full((len(arrays), longest) + arrays[0].shape[1:], fill, np.float32)
    for i, a in enumerate(arrays):
        out[i, :len(a)] = a
    return out


def per_query_metrics(labels: list[np.ndarray], scores: list[np.ndarray]) -> dict[str, Any]:
    """Returns every metric of `METRICS` for each query, with `tfapprox.metrics`.

    `values[name]` is the measure of each query (0 where undefined) and `relevant` tells which
    queries have a relevant document: the default convention averages over those, LETOR's
    evaluation tool counts the others as 0.
    """
    from tfapprox import metrics

    y, s = padded(labels, -1.0), padded(scores, 0.0)
    values = {name: np.round(np.asarray(metrics.get(name).per_list(y, s)[0], np.float64),
                             6).tolist() for name in METRICS}
    relevant = np.asarray(metrics.get("map").per_list(y, s)[1]).tolist()  # a label >= 1
    return {"values": values, "relevant": relevant}


def mean_over_relevant(result: dict[str, Any], name: str) -> float:
    values = np.asarray(result["values"][name])
    return float(values[np.asarray(result["relevant"])].mean())


def execute(run: Run, folds_root: Path, scratch: Path) -> dict[str, Any]:
    """Trains and evaluates `run`; returns what the cache keeps of it."""
    started = time.perf_counter()
    files = fold_files(folds_root, run)
    if run.model == "lightgbm":
        result = _lightgbm(run, files)
    else:
        result = _neural(run, files, scratch)
    result["run"] = dataclasses.asdict(run)
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    return result


def _neural(run: Run, files: dict[str, Path], scratch: Path) -> dict[str, Any]:
    import keras

    from trainer import config as config_lib
    from trainer import train

    preset = config_lib.load(run.dataset.lower()).to_dict()
    config_lib.apply_overrides(preset, {
        "data.train": [str(files["train"])], "data.vali": [str(files["vali"])],
        "data.test": [str(files["test"])], "data.cache_dir": str(scratch / "data"),
        **({"model.kind": "adarank", "model.adarank_measure": run.loss}
           if run.model == "adarank" else
           {"model.preset": run.model, "loss.name": run.loss, "loss.params": dict(run.params)}),
        "train.seed": run.seed, "train.epochs": run.epochs,
        "runtime.mixed_precision": run.precision != "float32",
        "train.patience": max(run.epochs // 4, 2), "train.select_metric": SELECT_METRIC,
        "train.run_dir": str(scratch / run.cache_path(Path()).with_suffix("")),
        "export.enabled": False,
    })
    config = config_lib.Config.from_dict(preset)
    keras.backend.clear_session()
    results = train.train(config, print_fn=lambda _: None)
    model = train.restore_best(config, _num_features(files["train"])).eval_model
    qids, labels, features = read_split(files["test"])
    scores = _score(model, features)
    return {"validation": {SELECT_METRIC: results["validation"][SELECT_METRIC]},
            "qids": qids, "test": per_query_metrics(labels, scores),
            "history": results["history"], "best_epoch": results["best_epoch"]}


def _num_features(path: Path) -> int:
    from tfapprox.data.letor import peek_num_features

    return peek_num_features(path)


def _score(model, features: list[np.ndarray]) -> list[np.ndarray]:
    x = padded(features, 0.0)
    mask = padded([np.ones(len(f)) for f in features], 0.0).astype(bool)
    scores = np.asarray(model.predict({"features": x, "mask": mask}, verbose=0, batch_size=64))
    return [scores[i, :len(f)] for i, f in enumerate(features)]


def _lightgbm(run: Run, files: dict[str, Path]) -> dict[str, Any]:
    import lightgbm

    def dataset(split, reference=None):
        _, labels, features = read_split(files[split])
        return (lightgbm.Dataset(np.concatenate(features), np.concatenate(labels),
                                 group=[len(y) for y in labels], reference=reference),
                labels, features)

    train_set, _, _ = dataset("train")
    vali_set, vali_labels, vali_features = dataset("vali", train_set)
    params = {"objective": "lambdarank", "metric": "ndcg", "eval_at": [10], "verbose": -1,
              "num_threads": 1, "seed": run.seed, "deterministic": True,
              "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
              "learning_rate": 0.05, **dict(run.params)}
    booster = lightgbm.train(params, train_set, num_boost_round=run.epochs,
                             valid_sets=[vali_set],
                             callbacks=[lightgbm.early_stopping(50, verbose=False)])
    vali = per_query_metrics(vali_labels, [booster.predict(f) for f in vali_features])
    qids, labels, features = read_split(files["test"])
    return {"validation": {SELECT_METRIC: mean_over_relevant(vali, SELECT_METRIC)},
            "qids": qids, "test": per_query_metrics(labels, [booster.predict(f) for f in features]),
            "best_epoch": booster.best_iteration}
