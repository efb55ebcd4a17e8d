"""One run of the experiments: a model trained on one fold with one seed, evaluated per test query.

A run is a `Run` (a `DataSet`'s name, fold, seed, scorer or GBDT, loss and its parameters,
epochs, members). Neural and AdaRank runs go through the trainer (`trainer.train.train`,
resumable), the GBDTs through their own libraries (LightGBM lambdarank, XGBoost rank:ndcg,
CatBoost YetiRank, one thread each, early stopping on validation NDCG@10), an ensemble through
its members' checkpoints (single runs: of other seeds, or of other settings), whose scores it
combines (`ensemble_scores`); all are scored on the fold's test files by the
same code (`per_query_metrics`, built on `tfapprox.metrics`), so every model is measured alike.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

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
    model: str  # a scorer preset (linear, B64 ... B1024, dasalc), "adarank" or one of `GBDTS`
    loss: str  # a tfapprox loss name; AdaRank's measure (ndcg, map); a GBDT's objective
    params: tuple[tuple[str, Any], ...] = ()  # loss parameters (a GBDT: its parameters)
    epochs: int = 40  # a GBDT: its rounds at most
    precision: str = "float32"  # or "mixed_bfloat16": the trainer's --mixed-precision on CPU
    scorer: tuple[tuple[str, Any], ...] = ()  # the scorer's options (model.input_transform, ...)
    optimizer: tuple[tuple[str, Any], ...] = ()  # optimiser options (optimizer.learning_rate)
    data: str = ""  # `data_key` of the fold's files; "" for the shared sets (the published files)
    # A recipe scorer's own arguments (`recipe_arguments`): a changed recipe gets new keys, so it
    # never reads the results of the one before.
    recipe: tuple[tuple[str, Any], ...] = ()
    # An ensemble (`member_runs`): k > 1, the k runs of this configuration of seeds
    # k·seed ... k·seed + k − 1; or the single runs it combines, of other configurations, each
    # of this fold and seed (then `model` is "ensemble" and `loss` the ensemble's name).
    members: int | tuple["Run", ...] = 1

    @property
    def ensemble(self) -> bool:
        return self.members != 1

    def label(self) -> str:
        """Returns the configuration without fold and seed, e.g. `B64 approx_ndcg(alpha=10)`."""
        if isinstance(self.members, tuple):
            return ensemble_label([m.label() for m in self.members])
        mixed = "" if self.precision == "float32" else f" {self.precision}"
        optimizer = "".join(f" {k}={v}" for k, v in self.optimizer)
        return (f"{self.model}{scorer_label(self.scorer)} "
                f"{self.loss}({', '.join(f'{k}={v}' for k, v in self.params)}){optimizer}{mixed}"
                f"{ensemble_label(self.members)}")

    def member_runs(self) -> list["Run"]:
        """Returns the single runs an ensemble combines: the runs of other configurations it
        names, or this run with one member and each of the seeds k·seed ... k·seed + k − 1
        (k = `members`), so ensemble seed 0 is made of the single runs of seeds 0 ... k − 1; a
        single run's is itself."""
        if isinstance(self.members, tuple):
            return list(self.members)
        return [dataclasses.replace(self, members=1, seed=self.members * self.seed + i)
                for i in range(self.members)]

    def cache_path(self, cache: Path) -> Path:
        fields = dataclasses.asdict(self)
        # runs cached before a field existed keep their names while it holds its default
        for field, before in (("precision", "float32"), ("scorer", ()), ("data", ""),
                              ("recipe", ()), ("optimizer", ()), ("members", 1)):
            if getattr(self, field) == before:
                del fields[field]
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        params = ",".join(f"{k}={v}" for k, v in self.params) or "default"
        mixed = "" if self.precision == "float32" else f"-{self.precision}"
        model = self.model + "".join(f",{k}={v}" for k, v in self.scorer)
        optimizer = "".join(f"-{k}={v}" for k, v in self.optimizer)
        size = len(self.members) if isinstance(self.members, tuple) else self.members
        ensemble = f"-ensemble{size}" if self.ensemble else ""
        return (cache / self.dataset / model
                / f"{self.loss}-{params}{optimizer}-e{self.epochs}{mixed}{ensemble}"
                / f"Fold{self.fold}-seed{self.seed}-{digest}.json")


def data_key(files: dict[str, list[str]]) -> str:
    """Returns a digest of the trainer's fingerprint (name, size, modification time) of a fold's
    files and of the LightGBM group files beside them: another set, or this one edited in place,
    gets another key, so its runs never read this one's results."""
    from trainer.data import fingerprint

    paths = [p for split in SPLITS for path in files[split]
             for p in (path, path + ".query") if p == path or Path(p).is_file()]
    return hashlib.sha1(json.dumps(fingerprint(paths)).encode()).hexdigest()[:10]


GBDTS = ("lightgbm", "xgboost", "catboost")


def recipe_arguments(model: str) -> tuple[tuple[str, Any], ...]:
    """Returns the arguments of `model`'s recipe in `tfapprox.models.RECIPES`, sorted by name;
    () for a B-net, AdaRank or a GBDT."""
    if model in GBDTS or model == "adarank":
        return ()
    from tfapprox.models import RECIPES

    arguments = RECIPES.get(model.upper(), {})
    return tuple((k, tuple(v) if isinstance(v, (list, tuple)) else v)
                 for k, v in sorted(arguments.items()))


def scorer_label(scorer: tuple[tuple[str, Any], ...]) -> str:
    """Returns `[key=value, ...]` for scorer options, or "" for none."""
    return f"[{', '.join(f'{k}={v}' for k, v in scorer)}]" if scorer else ""


def ensemble_label(members: int | list[str]) -> str:
    """Returns ` ensemble of k seeds` for an ensemble of k seeds, `ensemble of a + b` for one of
    the configurations labelled a and b (each once in `members`), `ensemble of k seeds each of
    a + b` for one of k runs of each (each k times), or "" for a single run."""
    if isinstance(members, list):
        names = list(dict.fromkeys(members))
        each = len(members) // len(names)
        return f"ensemble of {f'{each} seeds each of ' if each > 1 else ''}" + " + ".join(names)
    return f" ensemble of {members} seeds" if members > 1 else ""


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
    if run.model in GBDTS:
        boosted = {"lightgbm": _lightgbm, "xgboost": _xgboost, "catboost": _catboost}[run.model]
        result = boosted(run, files, num_features)
    elif run.ensemble:
        result = _ensemble(run, files, num_features, scratch)
    else:
        result = _neural(run, files, num_features, scratch)
    result["run"] = dataclasses.asdict(run)
    result["code"] = code_version()
    # an ensemble's seconds leave out members it had to train again: their own runs count them
    result["wall_seconds"] = round(time.perf_counter() - started
                                   - result.get("members_trained_seconds", 0.0), 1)
    return result


@functools.lru_cache(maxsize=None)
def code_version() -> str | None:
    """Returns the commit of the code that runs (its abbreviated hash, never a tag's name, with
    "-dirty" where the files differ from it), None outside a git checkout: a cached run says
    what produced it, since a change of the code's numerics makes a rerun differ as another
    seed would."""
    import subprocess

    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12",
                               "--exclude=*"],
                              cwd=Path(__file__).resolve().parent, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


# A set whose queries are another's, with other features: its runs start from that set's preset.
SAME_QUERIES = {"MQ2008_AGG": "MQ2008"}


def trainer_config(dataset: str) -> dict[str, Any]:
    """Returns the trainer's configuration (a plain dict) that a neural run on `dataset` starts
    from: its preset named like the set (ohsumed, mq2008; MQ2008_AGG: mq2008's), else the
    trainer's defaults."""
    from trainer import config as config_lib

    name = SAME_QUERIES.get(dataset, dataset).lower()
    return config_lib.load_dict(name if name in config_lib.PRESETS else None)


def _run_config(run: Run, files: dict[str, list[str]], num_features: int, scratch: Path):
    """Returns the trainer's `Config` of a single neural run: its preset named like the set
    (ohsumed, mq2008) or else its defaults, and the protocol's epochs, patience and selection;
    its run directory (checkpoint) is `scratch` / the run's cache path without `.json`."""
    from trainer import config as config_lib

    preset = trainer_config(run.dataset)
    config_lib.apply_overrides(preset, {
        # the test files are scored here, query by query: the trainer needs only train and vali
        "data.train": files["train"], "data.vali": files["vali"], "data.num_features": num_features,
        "data.cache_dir": str(scratch / "data"),
        **({"model.kind": "adarank", "model.adarank_measure": run.loss}
           if run.model == "adarank" else
           {"model.preset": run.model, "loss.name": run.loss, "loss.params": dict(run.params),
            **{f"model.{key}": value for key, value in run.scorer},
            **{f"optimizer.{key}": value for key, value in run.optimizer}}),
        "train.seed": run.seed, "train.epochs": run.epochs,
        "runtime.mixed_precision": run.precision != "float32",
        "train.patience": max(run.epochs // 4, 2), "train.select_metric": SELECT_METRIC,
        "train.run_dir": str(scratch / run.cache_path(Path()).with_suffix("")),
        "export.enabled": False,
    })
    return config_lib.Config.from_dict(preset)


def _train(config) -> dict[str, Any]:
    """Trains (or resumes) the run of `config` through the trainer; returns its results.

    A run that an earlier invocation left unfinished resumes from its checkpoint, unless the
    trainer refuses that checkpoint (damaged, or its data files' modification times changed since,
    as when a data directory is copied again): the run then starts over in its scratch directory,
    which only this harness writes."""
    import keras

    from trainer import checkpoint, train

    keras.backend.clear_session()
    try:
        return train.train(config, print_fn=lambda _: None)
    except checkpoint.CheckpointError:
        keras.backend.clear_session()
        return train.train(config, fresh=True, print_fn=lambda _: None)


def _best_model(config, num_features: int):
    """Returns the evaluation model with the best weights of `config`'s checkpoint, its scorer
    as the run built it (`model.handles_missing`, which the trainer settles on the data, as its
    run directory's config.json keeps it)."""
    from trainer.build import restore_best

    saved = Path(config.train.run_dir) / "config.json"
    if saved.is_file():
        handles = json.loads(saved.read_text())["model"].get("handles_missing")
        config = dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                       handles_missing=handles))
    return restore_best(config, num_features).eval_model


def _neural(run: Run, files: dict[str, list[str]], num_features: int,
            scratch: Path) -> dict[str, Any]:
    """Trains through the trainer (`_run_config`) and scores the test files query by query."""
    config = _run_config(run, files, num_features, scratch)
    results = _train(config)
    test = _Split(files, "test", num_features)
    return {"validation": {SELECT_METRIC: results["validation"][SELECT_METRIC]},
            "qids": test.qids,
            "test": per_query_metrics(test.labels, _score(_best_model(config, num_features),
                                                          test.features)),
            "history": results["history"], "best_epoch": results["best_epoch"]}


def _member_model(member: Run, files: dict[str, list[str]], num_features: int, scratch: Path):
    """Returns an ensemble member's evaluation model: restored from the finished checkpoint in
    its run directory under `scratch` (`_run_config`), else trained (or resumed) there first.

    The runner caches a member's own result before its ensemble runs (`run_all`), so a member
    trained here is one whose result is cached but whose checkpoint is not in `scratch`.
    Returns (the model, the seconds spent training it here: 0 when restored)."""
    config = _run_config(member, files, num_features, scratch)
    started = time.perf_counter()
    if not finished(member, config):
        _train(config)
    trained = time.perf_counter() - started
    return _best_model(config, num_features), trained


def finished(run: Run, config) -> bool:
    """Whether the run directory of `config` (`_run_config` of `run`) holds `run`'s finished
    checkpoint: all its epochs trained, or stopped early."""
    from trainer import checkpoint

    state = checkpoint.load_state(config.train.run_dir)
    return state is not None and (state.stopped_early or state.epoch >= run.epochs)


def ensemble_scores(member_scores: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Returns the ensemble's score of each document of each list: the mean over the k members
    of each member's scores standardised within the list,

        s(x) = 1/k Σ_m (s_m(x) − μ_m) / σ_m,

    μ_m and σ_m the mean and standard deviation of member m's scores over the list's documents
    (a list whose scores from member m are all equal gets 0 from it: it says nothing of the
    order). Standardising puts the members' scores, each on its own scale, on one.
    `member_scores[m][q]`: member m's scores of list q's documents (no padding), float64 out.
    """
    def standardised(scores: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores, np.float64)
        if np.ptp(scores) == 0:
            return np.zeros_like(scores)
        return (scores - scores.mean()) / scores.std()

    return [np.mean([standardised(s) for s in lists], axis=0) for lists in zip(*member_scores)]


def _ensemble(run: Run, files: dict[str, list[str]], num_features: int,
              scratch: Path) -> dict[str, Any]:
    """Scores validation and test with each member of the ensemble `run` (`Run.member_runs`,
    `_member_model`) and combines their scores by `ensemble_scores`; `members_trained_seconds`
    is what training members whose checkpoints were missing took, `members_validation` each
    member's own validation NDCG@10 (a member trained again by changed code can differ from
    its cached run: the report compares them)."""
    vali, test = _Split(files, "vali", num_features), _Split(files, "test", num_features)
    scored, trained = {"vali": [], "test": []}, 0.0
    for member in run.member_runs():
        model, seconds = _member_model(member, files, num_features, scratch)
        trained += seconds
        scored["vali"].append(_score(model, vali.features))
        scored["test"].append(_score(model, test.features))
    return {**_measured(vali, ensemble_scores(scored["vali"]), test,
                        ensemble_scores(scored["test"])),
            "members_trained_seconds": round(trained, 1),
            "members_validation": [mean_over_relevant(per_query_metrics(vali.labels, s),
                                                      SELECT_METRIC) for s in scored["vali"]]}


def _num_features(files: dict[str, list[str]]) -> int:
    """Returns F as the trainer finds it: the largest feature index in the fold's files."""
    stats = [(path, os.stat(path)) for split in SPLITS for path in files[split]]
    return _largest_feature_index(tuple((path, stat.st_size, stat.st_mtime_ns)
                                        for path, stat in stats))


@functools.lru_cache(maxsize=16)  # the runs of a fold read the same files: scanned once
def _largest_feature_index(files: tuple[tuple[str, int, int], ...]) -> int:
    """`files`: (path, size, modification time) of each file, so an edited file is read again."""
    from tfapprox.data.letor import scan

    return scan([path for path, _, _ in files], with_features=True).num_features


def _score(model, features: list[np.ndarray]) -> list[np.ndarray]:
    x = padded(features, 0.0)
    mask = padded([np.ones(len(f)) for f in features], 0.0).astype(bool)
    scores = np.asarray(model.predict({"features": x, "mask": mask}, verbose=0, batch_size=64))
    return [scores[i, :len(f)] for i, f in enumerate(features)]


class _Split:
    """One split's queries: by query (to score) and, for a GBDT, stacked (to train)."""

    def __init__(self, files: dict[str, list[str]], split: str, num_features: int):
        self.qids, self.labels, self.features = read_split(files[split], num_features)
        self.groups = [len(y) for y in self.labels]

    @functools.cached_property
    def x(self) -> np.ndarray:
        return np.concatenate(self.features)

    @functools.cached_property
    def y(self) -> np.ndarray:
        return np.concatenate(self.labels)


def _measured(vali: _Split, vali_scores, test: _Split, test_scores) -> dict[str, Any]:
    """Returns what the cache keeps of scores given per query: the validation NDCG@10 in the
    trainer's convention (the mean over the queries with a relevant document, as
    `tfapprox.metrics.NDCG` averages whole lists) and the per-query test metrics."""
    measured = per_query_metrics(vali.labels, vali_scores)
    return {"validation": {SELECT_METRIC: mean_over_relevant(measured, SELECT_METRIC)},
            "qids": test.qids, "test": per_query_metrics(test.labels, test_scores)}


def _gbdt_result(files, num_features, vali: _Split, predict, best_round) -> dict[str, Any]:
    """Scores a trained GBDT (`predict`: [n, F] -> [n]) on validation and test, per query."""
    test = _Split(files, "test", num_features)
    return {**_measured(vali, [predict(f) for f in vali.features],
                        test, [predict(f) for f in test.features]), "best_epoch": best_round}


def _xgboost(run: Run, files: dict[str, list[str]], num_features: int) -> dict[str, Any]:
    """XGBoost rank:ndcg (LambdaMART), early stopping on validation NDCG@10."""
    import xgboost

    train, vali = _Split(files, "train", num_features), _Split(files, "vali", num_features)
    params = {"objective": run.loss, "eval_metric": "ndcg@10", "tree_method": "hist",
              "nthread": 1, "seed": run.seed, "subsample": 0.8, "colsample_bytree": 0.8,
              **dict(run.params)}
    booster = xgboost.train(params, xgboost.DMatrix(train.x, train.y, group=train.groups),
                            num_boost_round=run.epochs,
                            evals=[(xgboost.DMatrix(vali.x, vali.y, group=vali.groups), "vali")],
                            early_stopping_rounds=50, verbose_eval=False)
    best = booster.best_iteration + 1

    def predict(features):
        return booster.predict(xgboost.DMatrix(features), iteration_range=(0, best))

    return _gbdt_result(files, num_features, vali, predict, best)


def _catboost(run: Run, files: dict[str, list[str]], num_features: int) -> dict[str, Any]:
    """CatBoost with `run.loss` (YetiRank), early stopping on validation NDCG@10."""
    import catboost

    def pool(split: _Split):
        return catboost.Pool(split.x, split.y,
                             group_id=np.repeat(np.arange(len(split.groups)), split.groups))

    train, vali = _Split(files, "train", num_features), _Split(files, "vali", num_features)
    model = catboost.CatBoost({
        "loss_function": run.loss, "eval_metric": "NDCG:top=10", "iterations": run.epochs,
        "random_seed": run.seed, "thread_count": 1, "od_type": "Iter", "od_wait": 50,
        "use_best_model": True, "verbose": False, "allow_writing_files": False,
        **dict(run.params)})
    model.fit(pool(train), eval_set=pool(vali))
    return _gbdt_result(files, num_features, vali, model.predict, model.get_best_iteration() + 1)


def _lightgbm(run: Run, files: dict[str, list[str]], num_features: int) -> dict[str, Any]:
    """LightGBM lambdarank, early stopping on validation NDCG@10."""
    import lightgbm

    train, vali = _Split(files, "train", num_features), _Split(files, "vali", num_features)
    train_set = lightgbm.Dataset(train.x, train.y, group=train.groups)
    vali_set = lightgbm.Dataset(vali.x, vali.y, group=vali.groups, reference=train_set)
    params = {"objective": run.loss, "metric": "ndcg", "eval_at": [10], "verbose": -1,
              "num_threads": 1, "seed": run.seed, "deterministic": True,
              "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1,
              "learning_rate": 0.05, **dict(run.params)}
    boosting = time.perf_counter()
    round_ends = []  # seconds from the start of boosting to the end of each round
    booster = lightgbm.train(params, train_set, num_boost_round=run.epochs,
                             valid_sets=[vali_set],
                             callbacks=[lambda env: round_ends.append(time.perf_counter() - boosting),
                                        lightgbm.early_stopping(50, verbose=False)])
    result = _gbdt_result(files, num_features, vali, booster.predict, booster.best_iteration)
    result["seconds_to_best"] = round(round_ends[booster.best_iteration - 1], 2)
    return result
