"""Training, evaluation and export of one run: the work behind `python -m trainer train|evaluate|export`.

A run lives in `train.run_dir`, a directory the trainer made (see trainer.run_files):

    config.json       the resolved configuration (evaluate/export rebuild the model from it)
    checkpoint.npz    state after the last completed epoch (see trainer.checkpoint), with the
                      fingerprint of the training and validation data it was trained on
    logs/train, logs/validation   TensorBoard scalars per epoch
    results.json      history, best epoch, validation/test metrics of the selected model

Each epoch is one `model.fit` call over a training dataset shuffled with seed `(seed, epoch)`, so a
resumed run sees the same data order, weights and dropout draws as one that was never stopped.
After each epoch the weights are copied into a separate evaluation model, built outside any
distribution strategy in float32, that scores the whole validation set exactly; every worker of a
multi-worker run computes the same numbers, so all of them take the same early-stopping decision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from trainer import backend, checkpoint, data, distribute, interrupts, run_files, run_lock
from trainer.config import Config

Printer = Callable[[str], None]

# Config keys that may change between a run and its resumption; everything else must match. The
# data's paths may be spelled differently: the checkpoint holds a fingerprint of the data itself.
_RESUMABLE_CHANGES = (
    "train.epochs", "train.patience", "train.run_dir", "export", "runtime.strategy", "runtime.jit",
    "runtime.backend",
    "data.cache_dir", "data.num_features", "data.dir", "data.train", "data.vali", "data.test", "cv",
    "train.metrics", "train.max_pairs",
)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (`signum` SIGINT) or SIGTERM during a run, after `epochs_done` epochs, each of them
    checkpointed."""

    def __init__(self, epochs_done: int, signum: int = signal.SIGINT):
        super().__init__(epochs_done, signum)
        self.epochs_done, self.signum = epochs_done, signum


@dataclasses.dataclass
class Built:
    """What a run trains and evaluates with."""

    model: keras.Model  # trained, under the distribution strategy
    eval_model: keras.Model  # float32, outside any strategy: validation, test, export
    eval_metrics: list[str]  # metric names the evaluation model reports
    num_features: int  # the models' input width
    reports_loss: bool = True  # False for AdaRank, which is fitted on no loss


def train(config: Config, *, fresh: bool = False, print_fn: Printer = print,
          dist: distribute.Distribution | None = None) -> dict[str, Any]:
    """Trains (or resumes) the run of `config`; returns its results (also written to results.json).

    `dist` is made from `config.runtime.strategy` when None (cv passes one: a process can create
    a multi-worker strategy only once). The chief holds the run directory's lock throughout
    (`run_lock.RunDirInUse` if another trainer has it); the other workers write nothing there.
    """
    dist = dist or distribute.make(config.runtime.strategy)
    previous_policy = keras.config.dtype_policy()
    if dist.is_chief:
        run_files.claim(config.train.run_dir)
    lock = run_lock.hold(config.train.run_dir) if dist.is_chief else contextlib.nullcontext()
    try:
        with lock:
            fit = _train_adarank if config.model.kind == "adarank" else _train
            return fit(config, fresh, print_fn, dist)
    finally:
        keras.config.set_dtype_policy(previous_policy)


def _train(config: Config, fresh: bool, print_fn: Printer,
           dist: distribute.Distribution) -> dict[str, Any]:
    started = time.perf_counter()
    say = print_fn if dist.is_chief else (lambda _: None)
    policy = _set_precision(config.runtime.mixed_precision)
    say(backend.describe(dist.strategy, policy, backend.jit_compile(config.runtime.jit)))
    keras.utils.set_random_seed(config.train.seed)
    splits = data.resolve(config.data, print_fn=say)
    if config.runtime.jit and config.data.list_size is None and not splits.train_buckets:
        say("Note: with --jit, whole lists and --buckets 0, XLA compiles once per padded list length")
    run_dir = Path(config.train.run_dir)
    built = _build(config, splits.num_features, dist)
    _check_attention_fits(config, built.model, splits)
    state, best_weights = _start_or_resume(config, run_dir, fresh, built, splits, dist, say)
    if best_weights is None:  # a new run: a resumed one restored its input quantiles
        _adapt_inputs(built, splits, say)

    if state.stopped_early or state.epoch >= config.train.epochs:
        say(f"{run_dir} is already trained ({state.epoch} epochs"
            f"{', stopped early' if state.stopped_early else ''}); pass --fresh to train again")
        finished = _finished_results(run_dir, state)
        if finished is not None:
            built.eval_model.set_weights(best_weights)
            return _finish({**finished, **_scores(built, splits)}, config, built, splits, dist, say)

    vali = data.eval_dataset(splits.vali, splits)
    epochs = data.TrainingEpochs(splits, config.data.list_size, seed=config.train.seed,
                                 global_batch_size=config.train.batch_size)
    summaries = _Summaries(run_files.log_dirs(run_dir)) if dist.is_chief else None
    # Workers of one cluster must take the same steps: there Ctrl-C interrupts where it lands.
    with interrupts.deferred(enabled=dist.name != "multi_worker") as stop:
        callbacks = [interrupts.StopWhenRequested(stop), _ValidationCallback(built, vali),
                     _Progbar(config.train.epochs)]
        try:
            while state.epoch < config.train.epochs and not state.stopped_early:
                logs = _train_one_epoch(config, built.model, splits, epochs, dist, state.epoch,
                                        callbacks)
                if stop.is_set():
                    raise KeyboardInterrupt  # the epoch was cut short: neither recorded nor saved
                _add_gaps(logs, built.eval_metrics)
                value = logs[f"val_{config.train.select_metric}"]
                if not math.isfinite(value):
                    raise FloatingPointError(
                        f"validation {config.train.select_metric} is {value} after epoch "
                        f"{state.epoch + 1}; lower optimizer.learning_rate or check the data"
                    )
                if state.record(logs, value, config.train.patience):
                    best_weights = [np.array(w) for w in built.model.get_weights()]
                if dist.is_chief:
                    summaries.write(state.epoch, logs)
                    checkpoint.save(run_dir, _snapshot(built.model, state, best_weights))
                if stop.is_set():
                    raise KeyboardInterrupt
                if state.stopped_early:
                    say(f"Early stopping after epoch {state.epoch}: no {config.train.select_metric} "
                        f"improvement for {config.train.patience} epochs")
        except KeyboardInterrupt as interrupt:  # report what a rerun resumes from: the checkpoint
            saved = checkpoint.load_state(run_dir) if dist.is_chief else None
            signum = stop.signum or (signal.SIGTERM if isinstance(interrupt, interrupts.Terminated)
                                     else signal.SIGINT)
            raise Interrupted(saved.epoch if saved else 0, signum) from None
        finally:
            if summaries is not None:
                summaries.close()

    built.eval_model.set_weights(best_weights)
    results = _results(run_dir, state, config, policy, dist, built, splits, started)
    return _finish(results, config, built, splits, dist, say)


def _results(run_dir: Path, state: checkpoint.RunState, config: Config, policy: str,
             dist: distribute.Distribution, built: Built, splits: data.Splits,
             started: float, **extra: Any) -> dict[str, Any]:
    """Returns results.json's content: the run's state and its best model's metrics."""
    return {
        "run_dir": str(run_dir),
        "epochs_run": state.epoch,
        "stopped_early": state.stopped_early,
        "best_epoch": state.best_epoch,
        "select_metric": config.train.select_metric,
        "precision_policy": policy,
        "strategy": config.runtime.strategy,
        "num_replicas": dist.num_replicas,
        "history": state.history,
        **extra,
        **_scores(built, splits),
        "wall_seconds": time.perf_counter() - started,
    }


def _scores(built: Built, splits: data.Splits) -> dict[str, Any]:
    """Returns the evaluation model's validation and test metrics (test None without a test split)."""
    return {"validation": evaluate_on(built, data.eval_dataset(splits.vali, splits)),
            "test": evaluate_on(built, data.eval_dataset(splits.test, splits)) if splits.test else None}


def _finish(results: dict[str, Any], config: Config, built: Built, splits: data.Splits,
            dist: distribute.Distribution, say: Printer) -> dict[str, Any]:
    """Exports the selected model (chief, if enabled), writes results.json, prints the summary."""
    if dist.is_chief:
        results.pop("export_path", None)
        if config.export.enabled and keras.backend.backend() != "tensorflow":
            results["export_path"] = str(backend.export_in_tensorflow_process(config.train.run_dir))
        elif config.export.enabled:
            results["export_path"] = str(export(built.eval_model, config, splits.num_features))
        run_files.write_json(Path(config.train.run_dir) / "results.json", results)
        say(summary_table(results, config))
    return results


def _finished_results(run_dir: Path, state: checkpoint.RunState) -> dict[str, Any] | None:
    """Returns the results.json of a finished run, if it belongs to the checkpoint's state."""
    path = run_dir / "results.json"
    if not path.exists():
        return None
    results = json.loads(path.read_text())
    if results.get("epochs_run") != state.epoch or results.get("best_epoch") != state.best_epoch:
        return None
    return results


def _start_or_resume(config: Config, run_dir: Path, fresh: bool, built: Built,
                     splits: data.Splits, dist: distribute.Distribution, say: Printer):
    """Returns `(state, best_weights)`: restored from the run's checkpoint, or a new start."""
    restored = _open_run(config, run_dir, fresh, splits, dist)
    if restored is None:
        return _new_state(config, splits), None
    checkpoint.assign(_model_state(built.model), restored.model, "model")
    checkpoint.assign(built.model.optimizer.variables, restored.optimizer, "optimizer")
    state = restored.state
    say(f"Resuming {run_dir} after epoch {state.epoch} (best {config.train.select_metric} "
        f"{_fmt(state.best_value)} at epoch {state.best_epoch})")
    return state, restored.best


def _open_run(config: Config, run_dir: Path, fresh: bool, splits: data.Splits,
              dist: distribute.Distribution) -> checkpoint.Checkpoint | None:
    """Returns the run directory's checkpoint (None: a new run, or `fresh`, which clears it) and
    writes config.json; raises CheckpointError for a checkpoint of another configuration or data."""
    if fresh and dist.is_chief:
        run_files.clear(run_dir)
    restored = None if fresh else checkpoint.load(run_dir)
    if restored is not None and restored.state.fingerprint != _fingerprint(config):
        raise checkpoint.CheckpointError(_mismatch_message(run_dir, config))
    if restored is not None:
        _check_same_data(run_dir, restored.state, splits)
    dist.check_same("the epoch to resume from", restored.state.epoch if restored else 0)
    if dist.is_chief:
        checkpoint.remove_stale_temporaries(run_dir)
        run_files.write_json(run_dir / "config.json", config.to_dict())
    return restored


def _new_state(config: Config, splits: data.Splits, **values: Any) -> checkpoint.RunState:
    """Returns the state of a run before its first epoch (`values`: fields already known)."""
    return checkpoint.RunState(fingerprint=_fingerprint(config), num_features=splits.num_features,
                               data={split: splits.fingerprints[split] for split in ("train", "vali")},
                               **values)


def _check_same_data(run_dir: Path, state: checkpoint.RunState, splits: data.Splits) -> None:
    """Raises CheckpointError when the training or validation data differ from the checkpoint's."""
    for split, before in state.data.items():
        now = splits.fingerprints[split]
        if now != before:
            raise checkpoint.CheckpointError(
                f"{run_dir} holds a checkpoint trained on other {data.SPLIT_NAMES[split]} data: "
                f"{data.describe_fingerprint(before)} then, {data.describe_fingerprint(now)} now. "
                "Give the original data to resume, pass --fresh to start over, or choose another "
                "--run-dir.")


def _train_adarank(config: Config, fresh: bool, say: Printer,
                   dist: distribute.Distribution) -> dict[str, Any]:
    """Fits AdaRank (`tfapprox.adarank`) on the whole training split, keeping the round with the
    best validation `train.select_metric`. Its weights are stored as the best weights of a linear
    scorer, so evaluate, export and cv read the run as they read a neural one. A finished run is
    not refitted; an unfinished one is fitted from round 1 (rounds are cheap)."""
    from tfapprox import adarank

    started = time.perf_counter()
    policy = _set_precision(False)
    splits = data.resolve(config.data, print_fn=say)
    run_dir = Path(config.train.run_dir)
    built = _build(config, splits.num_features, dist, with_training_model=False)
    restored = _open_run(config, run_dir, fresh, splits, dist)
    finished = _finished_results(run_dir, restored.state) if restored else None
    if finished is not None:
        say(f"{run_dir} is already trained ({restored.state.epoch} AdaRank rounds); pass --fresh "
            "to train again")
        built.eval_model.set_weights(restored.best)
        return _finish({**finished, **_scores(built, splits)}, config, built, splits, dist, say)

    select = config.train.select_metric
    fit = adarank.fit_adarank(
        *data.padded_lists(splits.train, splits), measure=config.model.adarank_measure,
        rounds=config.model.adarank_rounds, validation=data.padded_lists(splits.vali, splits),
        select=select)
    best_weights = [fit.weights.astype(np.float32)[:, None], np.zeros([1], np.float32)]
    state = _new_state(
        config, splits, epoch=len(fit.history),
        best_value=fit.history[fit.best_round - 1][f"val_{select}"], best_epoch=fit.best_round,
        stopped_early=len(fit.history) < config.model.adarank_rounds, history=fit.history)
    checkpoint.save(run_dir, checkpoint.Checkpoint(state=state, model=[], optimizer=[],
                                                   best=best_weights))
    built.eval_model.set_weights(best_weights)
    results = _results(run_dir, state, config, policy, dist, built, splits, started,
                       feature_weights=best_weights[0][:, 0].tolist())
    return _finish(results, config, built, splits, dist, say)


def _train_one_epoch(config: Config, model: keras.Model, splits: data.Splits,
                     epochs: data.TrainingEpochs, dist: distribute.Distribution, epoch: int,
                     callbacks: list[keras.callbacks.Callback]) -> dict[str, float]:
    """Runs `fit` over epoch `epoch`'s training batches (from `epochs`); returns the epoch's
    logs."""
    started = time.perf_counter()
    train_input = dist.distribute(
        lambda batch, shards, index: epochs.dataset(epoch, batch, num_shards=shards,
                                                    shard_index=index),
        config.train.batch_size,
    )
    history = model.fit(
        train_input, initial_epoch=epoch, epochs=epoch + 1,
        steps_per_epoch=_steps_per_epoch(splits.num_train_lists, config.train.batch_size, dist),
        callbacks=callbacks, verbose=_verbosity(dist), shuffle=False,
    )
    logs = {k: v[-1] for k, v in history.history.items()}
    logs["epoch_seconds"] = time.perf_counter() - started
    logs["learning_rate"] = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    return logs


def _snapshot(model: keras.Model, state: checkpoint.RunState,
              best_weights: list[np.ndarray]) -> checkpoint.Checkpoint:
    def arrays(variables):
        return [np.asarray(keras.ops.convert_to_numpy(v)) for v in variables]

    return checkpoint.Checkpoint(state=state, model=arrays(_model_state(model)),
                                 optimizer=arrays(model.optimizer.variables), best=best_weights)


def evaluate(config: Config, splits: data.Splits, print_fn: Printer = print) -> dict[str, Any]:
    """Scores the best weights of `config`'s run on `splits`' validation and test sets."""
    built = restore_best(config, data_width=splits.num_features)
    results = {"run_dir": config.train.run_dir}
    for name, paths in (("validation", splits.vali), ("test", splits.test)):
        if paths:
            results[name] = evaluate_on(built, data.eval_dataset(paths, splits))
    print_fn(metrics_table(results))
    return results


def restore_best(config: Config, data_width: int | None = None) -> Built:
    """Returns the run's models with the best weights of its checkpoint in the evaluation model.

    The models take the feature count the run was trained on; data of another `data_width` is
    refused (ValueError)."""
    restored = checkpoint.load(config.train.run_dir)
    if restored is None or restored.state.epoch == 0:
        raise FileNotFoundError(
            f"no trained checkpoint in {config.train.run_dir}; run `python -m trainer train` first"
        )
    width = restored.state.num_features or config.data.num_features  # the latter: older runs
    if data_width is not None and data_width != width:
        raise ValueError(
            f"the run in {config.train.run_dir} was trained on {width} features, the data given "
            f"has {data_width}")
    built = _build(config, width, distribute.make("default"), with_training_model=False)
    built.eval_model.set_weights(restored.best)
    return built


def export(eval_model: keras.Model, config: Config, num_features: int) -> Path:
    """Writes `eval_model` as a TF Serving SavedModel; returns `base_dir/name/version`."""
    from tfapprox.export import export_saved_model

    bound = {key: value for key, value in (("max_documents", config.export.max_documents),
                                           ("max_pairs", config.train.max_pairs))
             if value is not None}
    return Path(export_saved_model(
        eval_model, config.export.base_dir, config.export.name, num_features,
        version=config.export.version, **bound,
    ))


def check_components(config: Config) -> None:
    """Builds the configured scorer, loss and metrics once; raises ValueError naming a bad name or
    parameter."""
    from tfapprox import adarank, losses, models

    select = metrics_named([config.train.select_metric], config)[0]
    if not getattr(select, "larger_is_better", True):
        raise ValueError(f"select_metric {config.train.select_metric!r} is better when lower; "
                         "selection and early stopping keep the largest value: choose another")
    if config.model.kind == "adarank":
        adarank.measure_metric(config.model.adarank_measure)
        adarank.measure_metric(config.train.select_metric)
        metrics_named(_eval_metric_names(config), config)
        return
    models.build_scorer(config.model.preset, **_scorer_kwargs(config))
    try:
        loss = losses.get(config.loss.name, **config.loss.params)
    except TypeError as err:
        raise ValueError(f"loss {config.loss.name!r} does not take {config.loss.params}: {err}") from None
    if getattr(loss, "ordinal_size", 1) > 1:
        raise ValueError(
            f"loss {config.loss.name!r} with ordinal_size={loss.ordinal_size} needs "
            f"{loss.ordinal_size} logits per document, and the trainer's scorer, metrics and "
            "export have one score per document: use ordinal_size=1 here, or OrdinalLoss in your "
            "own Keras model (docs/migrating.md)")
    metrics_named(_eval_metric_names(config), config)


def check_export_target(config: Config) -> None:
    """Raises ValueError if exporting `config`'s model would fail, so that it fails before training.

    The version directory must not exist (versions are never overwritten) and the model directory
    must be creatable.
    """
    from tfapprox.export import next_version

    model_dir = Path(config.export.base_dir) / config.export.name
    version = config.export.version
    if version is not None and os.path.lexists(model_dir / str(version)):
        raise ValueError(
            f"export.version {version}: {model_dir / str(version)} already exists and an export "
            f"never overwrites one; pass another --version, or none for the next free one "
            f"({next_version(model_dir)})"
        )
    existing = next(p for p in (model_dir, *model_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"export.base_dir {config.export.base_dir}: cannot create {model_dir}: {existing} is "
            "not a writable directory"
        )


def summary_table(results: dict[str, Any], config: Config) -> str:
    """Returns the end-of-run summary: selection, validation/test metrics, export, wall time."""
    unit = "round" if config.model.kind == "adarank" else "epoch"
    how = "early stopped" if results["stopped_early"] else f"all {unit}s"
    lines = [
        "",
        f"Run {results['run_dir']}: {results['epochs_run']} {unit}s ({how}); best validation "
        f"{results['select_metric']} at {unit} {results['best_epoch']}",
        f"{describe_method(config)} | {results['strategy']} x{results['num_replicas']} | "
        f"{results['precision_policy']}",
        metrics_table(results),
    ]
    if "export_path" in results:
        lines.append(f"Exported {results['export_path']}")
    lines.append(f"Wall time {results['wall_seconds']:.1f} s")
    return "\n".join(lines)


def describe_method(config: Config) -> str:
    """Returns one line naming what trains: the loss, scorer and optimiser, or AdaRank's measure."""
    if config.model.kind == "adarank":
        return (f"AdaRank (Xu & Li 2007) on {config.model.adarank_measure}, at most "
                f"{config.model.adarank_rounds} rounds | linear scorer")
    return (f"loss {_describe_loss(config)} | model {_describe_model(config)} | "
            f"{config.optimizer.name} lr {config.optimizer.learning_rate} | batch "
            f"{config.train.batch_size} lists")


def _describe_model(config: Config) -> str:
    options = {k: v for k, v in _scorer_kwargs(config).items() if k != "dropout"}
    return config.model.preset + (f"({', '.join(f'{k}={v}' for k, v in options.items())})"
                                  if options else "")


def _describe_loss(config: Config) -> str:
    params = ", ".join(f"{k}={v}" for k, v in config.loss.params.items())
    return f"{config.loss.name}({params})"


def metrics_table(results: dict[str, Any]) -> str:
    """Returns a markdown table of the metrics (rows) on validation and test (columns)."""
    columns = [c for c in ("validation", "test") if results.get(c)]
    names = [n for n in results[columns[0]] if n != "loss"] if columns else []
    names += ["loss"] if columns and "loss" in results[columns[0]] else []
    lines = ["| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name in names:
        cells = [_fmt(results[c].get(name)) for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------


def _check_attention_fits(config: Config, model: keras.Model, splits: data.Splits) -> None:
    """Raises ValueError if `model` attends over lists and a training batch of the longest lists
    would exceed `train.max_pairs` document pairs (lists × L²)."""
    from tfapprox import models
    from tfapprox.data.dataset import list_lengths

    if not models.attends_within_lists(model):
        return
    length = config.data.list_size or int(
        max(list_lengths(splits.train, splits.num_features), default=0))
    models.check_attention_pairs(
        model, min(config.train.batch_size, splits.num_train_lists), length,
        config.train.max_pairs or models.MAX_ATTENTION_PAIRS,
        where="training", advice="shorter lists (--list-size), a smaller --batch-size or a larger "
        "--max-pairs")


def _build(config: Config, num_features: int, dist: distribute.Distribution,
           with_training_model: bool = True) -> Built:
    from tfapprox import losses, models

    eval_names = _eval_metric_names(config)

    def scorer():
        if config.model.kind == "adarank":
            model = models.DNNScorer(hidden_units=(), input_batch_norm=False, name="adarank_scorer")
        else:
            model = models.build_scorer(config.model.preset, **_scorer_kwargs(config))
        model({"features": np.zeros([1, 2, num_features], "float32"), "mask": np.ones([1, 2], bool)})
        return model

    model = None
    if with_training_model:
        with dist.strategy.scope():
            model = scorer()
            model.compile(
                optimizer=_optimizer(config),
                loss=losses.get(config.loss.name, **config.loss.params),
                metrics=metrics_named(_train_metric_names(config), config),
                jit_compile=backend.jit_compile(config.runtime.jit),
            )
            model.optimizer.build(model.trainable_variables)
            if dist.distributed:
                _build_compiled_state(model, num_features)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        eval_model = scorer()
        eval_model.compile(  # AdaRank's too: Keras's evaluate needs a loss (not reported then)
            loss=losses.get(config.loss.name, **config.loss.params),
            metrics=metrics_named(eval_names, config),
        )
    finally:
        keras.config.set_dtype_policy(previous)
    return Built(model=model, eval_model=eval_model, eval_metrics=eval_names,
                 num_features=num_features, reports_loss=config.model.kind != "adarank")


# The most training documents `_adapt_inputs` reads, in file order: quantiles need a sample, not
# a web-scale split.
ADAPT_DOCUMENTS = 200_000


def _adapt_inputs(built: Built, splits: data.Splits, say: Printer) -> None:
    """Fits the scorer's input transform to the training documents (`DNNScorer.adapt`: the
    quantiles of `model.input_transform=quantile`), at most `ADAPT_DOCUMENTS` of them in file
    order; does nothing for the other transforms. The evaluation model takes them with the
    model's weights (each validation, the checkpoint), so a resumed run restores them and is not
    fitted again."""
    if getattr(built.model, "quantile", None) is None:
        return
    rows, count = [], 0
    for inputs, _ in data.eval_dataset(splits.train, splits).as_numpy_iterator():
        rows.append(inputs["features"][inputs["mask"]])
        count += len(rows[-1])
        if count >= ADAPT_DOCUMENTS:
            break
    documents = np.concatenate(rows)[:ADAPT_DOCUMENTS]
    built.model.adapt(documents)
    say(f"Input quantiles fitted to {len(documents)} training documents")


def _scorer_kwargs(config: Config) -> dict[str, Any]:
    kwargs = {"dropout": config.model.dropout}
    for key in ("batch_norm_momentum", "input_transform", "list_standardize", "noise_stddev",
                "attention_layers"):
        if getattr(config.model, key) is not None:
            kwargs[key] = getattr(config.model, key)
    return kwargs


def _steps_per_epoch(num_lists: int, batch_size: int, dist: distribute.Distribution) -> int:
    """Returns the steps of one pass over the training lists.

    Distributed, every replica must take the same number of steps, so the last, partial global
    batch is dropped; otherwise it is kept.
    """
    if dist.distributed:
        return max(num_lists // batch_size, 1)
    return max(math.ceil(num_lists / batch_size), 1)


def _build_compiled_state(model: keras.Model, num_features: int) -> None:
    """Builds the compiled loss and metrics from a plain batch, and skips Keras's per-fit build.

    Under a distribution strategy Keras 3's `fit` first all-reduces an input batch to build the
    model symbolically; that reduce fails for dict inputs under MultiWorkerMirroredStrategy
    (keras-team/keras#20329) and would average a boolean mask. Everything it would build is built
    here, in the strategy's scope, so the per-fit step has nothing left to do.
    """
    sample = (
        {"features": tf.zeros([1, 2, num_features]), "mask": tf.ones([1, 2], tf.bool)},
        tf.zeros([1, 2]),
    )
    model._symbolic_build(data_batch=sample)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def _optimizer(config: Config) -> keras.optimizers.Optimizer:
    lr = config.optimizer.learning_rate
    if config.optimizer.name == "adagrad":
        return keras.optimizers.Adagrad(learning_rate=lr)
    return keras.optimizers.Adam(learning_rate=lr)


def _monitor_name(config: Config) -> str:
    """Returns the approximation monitor: the smooth twin of the selection metric."""
    select = config.train.select_metric
    if select == "map" or config.loss.name == "approx_ap":
        return "approx_map"
    _, _, k = select.partition("@")
    return f"approx_ndcg@{k}" if select.startswith("ndcg") and k else "approx_ndcg"


def _train_metric_names(config: Config) -> list[str]:
    return list(dict.fromkeys([config.train.select_metric, _monitor_name(config)]))


def _eval_metric_names(config: Config) -> list[str]:
    names = [config.train.select_metric, *config.train.metrics]
    if config.model.kind != "adarank":
        names.append(_monitor_name(config))
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


def _add_gaps(logs: dict[str, float], names: list[str]) -> None:
    """Adds `approx_gap` (smooth surrogate minus exact metric) beside each approximation monitor."""
    for prefix in ("", "val_"):
        for name in names:
            if name.startswith("approx_"):
                exact = name[len("approx_"):]
                if prefix + name in logs and prefix + exact in logs:
                    logs[prefix + "approx_gap"] = logs[prefix + name] - logs[prefix + exact]


def _model_state(model: keras.Model) -> list[Any]:
    """Returns the variables a resumed run needs: weights, moving averages, seed generator states."""
    metric_ids = {id(v) for m in model.metrics for v in m.variables}
    return [v for v in model.variables if id(v) not in metric_ids]


def evaluate_on(built: Built, dataset: tf.data.Dataset) -> dict[str, float]:
    """Returns the evaluation model's metrics on `dataset`, in configured order, then the loss."""
    values = built.eval_model.evaluate(dataset, verbose=0, return_dict=True)
    order = [*built.eval_metrics, *(["loss"] if built.reports_loss else [])]
    return {k: float(values[k]) for k in order if k in values}


class _ValidationCallback(keras.callbacks.Callback):
    """Adds `val_<metric>` of the whole validation set to the epoch's logs (before the progbar)."""

    def __init__(self, built: Built, dataset: tf.data.Dataset):
        super().__init__()
        self._built = built
        self._dataset = dataset

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training:  # interrupted: the epoch is dropped, so is its validation
            return
        self._built.eval_model.set_weights(self.model.get_weights())
        values = evaluate_on(self._built, self._dataset)
        if logs is not None:
            logs.update({f"val_{k}": v for k, v in values.items()})


class _Progbar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar, headed `Epoch e/total` although each `fit` call runs one epoch."""

    def __init__(self, total_epochs: int):
        super().__init__()
        self._total_epochs = total_epochs

    def set_params(self, params):
        super().set_params(params)
        self.epochs = self._total_epochs


class _Summaries:
    """TensorBoard scalars: training values under logs/train, validation under logs/validation.

    Written with `tf.summary.write` and the scalars plugin's metadata, which is what
    `tf.summary.scalar` does, minus its import of the `tensorboard` package (not a dependency).
    """

    _METADATA = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    )

    def __init__(self, log_dirs: dict[str, Path]):
        self._train = tf.summary.create_file_writer(str(log_dirs["train"]))
        self._validation = tf.summary.create_file_writer(str(log_dirs["validation"]))

    def write(self, step: int, logs: dict[str, float]) -> None:
        for writer, is_validation in ((self._train, False), (self._validation, True)):
            with writer.as_default():
                for key, value in logs.items():
                    if key.startswith("val_") == is_validation:
                        tf.summary.write(
                            tag=key.removeprefix("val_"), tensor=tf.constant(value, tf.float32),
                            step=step, metadata=self._METADATA,
                        )
            writer.flush()

    def close(self) -> None:
        self._train.close()
        self._validation.close()


def _set_precision(mixed: bool) -> str:
    """Sets Keras's global dtype policy; mixed precision is float16 on GPU and bfloat16 on CPU."""
    if not mixed:
        policy = "float32"
    else:
        policy = "mixed_float16" if backend.has_gpu() else "mixed_bfloat16"
    keras.config.set_dtype_policy(policy)
    return policy


def _verbosity(dist: distribute.Distribution) -> int | str:
    if not dist.is_chief:
        return 0
    return 1 if sys.stdout.isatty() else 2


def _fingerprint(config: Config) -> str:
    values = _resumable_view(config.to_dict())
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def _resumable_view(values: dict[str, Any]) -> dict[str, Any]:
    values = json.loads(json.dumps(values))
    for dotted in _RESUMABLE_CHANGES:
        *parents, leaf = dotted.split(".")
        node = values
        for part in parents:
            node = node.get(part, {})
        node.pop(leaf, None)
    return values


def _mismatch_message(run_dir: Path, config: Config) -> str:
    saved_path = run_dir / "config.json"
    differences = []
    if saved_path.exists():
        saved = _flatten(_resumable_view(json.loads(saved_path.read_text())))
        current = _flatten(_resumable_view(config.to_dict()))
        differences = [
            f"{key}: {saved.get(key)!r} -> {current.get(key)!r}"
            for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)
        ]
    detail = "; ".join(differences) if differences else "the saved config.json is missing"
    return (
        f"{run_dir} holds a checkpoint of a different configuration ({detail}). Rerun with the "
        "original settings to resume, pass --fresh to start over, or choose another --run-dir."
    )


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and value and prefix.count(".") < 1:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
