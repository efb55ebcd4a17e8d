"""One run of the experiments: a model trained on one fold with one seed, evaluated per test query.

A run is a `Run` (a `DataSet`'s name, fold, seed, scorer or LightGBM, loss and its parameters,
epochs). Neural and AdaRank runs go through the trainer (`trainer.train.train`, resumable), LightGBM
runs through `lightgbm.train`; both are scored on the fold's test files by the same code
(`per_query_metrics`, built on `tfapprox.metrics`), so every model is measured alike.
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


SPLITS = ("train", "vali", "test")


@dataclasses.dataclass(frozen=True)
class DataSet:
    """A LETOR set the runs read: its name (its folder in the cache) and its directory, which holds
    Fold1..FoldN/ with train/vali/test files (LETOR text with qid:, or LightGBM files with a .query
    file beside each) or the five parts S1..S5.txt that the standard folds are made of."""

    name: str
    directory: Path
    shared: bool = False  # one of the shared sets (--dataset), else the user's (--data-dir)

    def flags(self) -> str:
        """Returns the command-line flags that choose this set."""
        if self.shared:
            return f"--dataset {self.name}"
        return f"--data-dir {self.directory} --name {self.name}"

    def folds(self) -> dict[int, dict[str, list[str]]]:
        """Returns `{fold: {split: files}}`; FileNotFoundError names a directory without folds."""
        from trainer.data import letor_folds

        return {fold: dict(zip(SPLITS, files))
                for fold, files in letor_folds(self.directory).items()}


@dataclasses.dataclass(frozen=True)
class Run:
    """What one cached result is about."""

    dataset: str  # a `DataSet`'s name: OHSUMED, MQ2008, or the --name of the user's set
    fold: int
    seed: int
    model: str  # a scorer preset (linear, B64 ... B1024), "adarank" or "lightgbm"
    loss: str  # a tfapprox loss name; AdaRank's measure (ndcg, map); "lambdarank" for LightGBM
    params: tuple[tuple[str, Any], ...] = ()  # loss parameters (LightGBM: its parameters)
    epochs: int = 40
    precision: str = "float32"  # or "mixed_bfloat16": the trainer's --mixed-precision on CPU
    data: str = ""  # `data_key` of the fold's files; "" for the shared sets (the published files)

    def label(self) -> str:
        """Returns the configuration without fold and seed, e.g. `B64 approx_ndcg(alpha=10)`."""
        mixed = "" if self.precision == "float32" else f" {self.precision}"
        return f"{self.model} {self.loss}({', '.join(f'{k}={v}' for k, v in self.params)}){mixed}"

    def cache_path(self, cache: Path) -> Path:
        fields = dataclasses.asdict(self)
        for field, before in (("precision", "float32"), ("data", "")):
            if fields[field] == before:  # runs cached before the field existed keep their name
                del fields[field]
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        params = ",".join(f"{k}={v}" for k, v in self.params) or "default"
        mixed = "" if self.precision == "float32" else f"-{self.precision}"
        return (cache / self.dataset / self.model / f"{self.loss}-{params}-e{self.epochs}{mixed}"
                / f"Fold{self.fold}-seed{self.seed}-{digest}.json")


def data_key(files: dict[str, list[str]]) -> str:
    """Returns a digest of the trainer's fingerprint (name, size, modification time) of a fold's
    files and of the LightGBM group files beside them: another set, or this one edited in place,
    gets another key, so its runs never read this one's results."""
    from trainer.data import fingerprint

    paths = [p for split in SPLITS for path in files[split]
             for p in (path, path + ".query") if p == path or Path(p).is_file()]
    return hashlib.sha1(json.dumps(fingerprint(paths)).encode()).hexdigest()[:10]


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


def read_split(paths: list[str], num_features: int
               ) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    """Returns the query ids, labels and [n, num_features] features of LETOR files, by query."""
    from tfapprox.data import read_queries

    queries = list(read_queries(paths, num_features))
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


def execute(run: Run, files: dict[str, list[str]], scratch: Path) -> dict[str, Any]:
    """Trains and evaluates `run` on its fold's `files` ({split: files}); returns what the cache
    keeps of it."""
    started = time.perf_counter()
    num_features = _num_features(files)
    if run.model == "lightgbm":
        result = _lightgbm(run, files, num_features)
    else:
        result = _neural(run, files, num_features, scratch)
    result["run"] = dataclasses.asdict(run)
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    return result


def _neural(run: Run, files: dict[str, list[str]], num_features: int,
            scratch: Path) -> dict[str, Any]:
    """Trains through the trainer, with its preset named like the set (ohsumed, mq2008) or else
    its defaults, and the protocol's epochs, patience and selection."""
    import keras

    from trainer import config as config_lib
    from trainer import train

    name = run.dataset.lower()
    preset = config_lib.load_dict(name if name in config_lib.PRESETS else None)
    config_lib.apply_overrides(preset, {
        "data.train": files["train"], "data.vali": files["vali"], "data.test": files["test"],
        "data.cache_dir": str(scratch / "data"),
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
    model = train.restore_best(config, num_features).eval_model
    qids, labels, features = read_split(files["test"], num_features)
    scores = _score(model, features)
    return {"validation": {SELECT_METRIC: results["validation"][SELECT_METRIC]},
            "qids": qids, "test": per_query_metrics(labels, scores),
            "history": results["history"], "best_epoch": results["best_epoch"]}


def _num_features(files: dict[str, list[str]]) -> int:
    """Returns F as the trainer finds it: the largest feature index in the fold's files."""
    from tfapprox.data.letor import scan

    paths = [path for split in SPLITS for path in files[split]]
    return scan(paths, with_features=True).num_features


def _score(model, features: list[np.ndarray]) -> list[np.ndarray]:
    x = padded(features, 0.0)
    mask = padded([np.ones(len(f)) for f in features], 0.0).astype(bool)
    scores = np.asarray(model.predict({"features": x, "mask": mask}, verbose=0, batch_size=64))
    return [scores[i, :len(f)] for i, f in enumerate(features)]


def _lightgbm(run: Run, files: dict[str, list[str]], num_features: int) -> dict[str, Any]:
    import lightgbm

    def dataset(split, reference=None):
        _, labels, features = read_split(files[split], num_features)
        return (lightgbm.Dataset(np.concatenate(features), np.concatenate(labels),
                                 group=[len(y) for y in labels], reference=reference),
                labels, features)

    train_set, _, _ = dataset("train")
    vali_set, vali_labels, vali_features = dataset("vali", train_set)
    params = {"objective": "lambdarank", "metric": "ndcg", "eval_at": [10], "verbose": -1,
              "num_threads": 1, "seed": run.seed, "deterministic": True,
              "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
              "learning_rate": 0.05, **dict(run.params)}
    boosting = time.perf_counter()
    round_ends = []  # seconds from the start of boosting to the end of each round
    booster = lightgbm.train(params, train_set, num_boost_round=run.epochs,
                             valid_sets=[vali_set],
                             callbacks=[lambda env: round_ends.append(time.perf_counter() - boosting),
                                        lightgbm.early_stopping(50, verbose=False)])
    vali = per_query_metrics(vali_labels, [booster.predict(f) for f in vali_features])
    qids, labels, features = read_split(files["test"], num_features)
    return {"validation": {SELECT_METRIC: mean_over_relevant(vali, SELECT_METRIC)},
            "qids": qids, "test": per_query_metrics(labels, [booster.predict(f) for f in features]),
            "best_epoch": booster.best_iteration,
            "seconds_to_best": round(round_ends[booster.best_iteration - 1], 2)}
