"""Training and evaluation of one run: the loop behind `python -m trainer train|evaluate`.

A run lives in `train.run_dir`, a directory the trainer made (see trainer.run_files):

    config.json       the resolved configuration (evaluate/export rebuild the model from it)
    checkpoint.npz    state after the last completed epoch (see trainer.checkpoint), with the
                      fingerprint of the training and validation data it was trained on
                      (trainer.resume)
    logs/train, logs/validation, results.json   what the run reports (trainer.report)

The models come from trainer.build, the export from trainer.export.

Each epoch is one `model.fit` call over a training dataset shuffled with seed `(seed, epoch)`, so a
resumed run sees the same data order, weights and dropout draws as one that was never stopped.
After each epoch the weights are copied into a separate evaluation model, built outside any
distribution strategy in float32, that scores the whole validation set exactly; every worker of a
multi-worker run computes the same numbers, so all of them take the same early-stopping decision.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from trainer import (backend, checkpoint, data, distribute, interrupts, report, resume, run_files,
                     run_lock)
from trainer.build import (Built, adapt_inputs, bound_evaluation, build, check_attention_fits,
                           evaluate_on, restore_best, with_missing_values)
from trainer.config import Config
from trainer.export import export
from trainer.metric_names import add_gaps

Printer = Callable[[str], None]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (`signum` SIGINT) or SIGTERM during a run, after `epochs_done` epochs, each of them
    checkpointed."""

    def __init__(self, epochs_done: int, signum: int = signal.SIGINT):
        super().__init__(epochs_done, signum)
        self.epochs_done, self.signum = epochs_done, signum


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
    config = with_missing_values(config, splits, say)
    if config.runtime.jit and config.data.list_size is None and not splits.train_buckets:
        say("Note: with --jit, whole lists and --buckets 0, XLA compiles once per padded list length")
    run_dir = Path(config.train.run_dir)
    built = build(config, splits.num_features, dist)
    check_attention_fits(config, built.model, splits)
    splits = bound_evaluation(config, built.eval_model, splits)
    state, best_weights = resume.start_or_resume(config, run_dir, fresh, built, splits, dist, say)
    if best_weights is None:  # a new run: a resumed one restored its input quantiles
        adapt_inputs(built, splits, say)

    if state.stopped_early or state.epoch >= config.train.epochs:
        say(f"{run_dir} is already trained ({state.epoch} epochs"
            f"{', stopped early' if state.stopped_early else ''}); pass --fresh to train again")
        finished = report.finished_results(run_dir, state)
        if finished is not None:
            built.eval_model.set_weights(best_weights)
            return _finish({**finished, **_scores(built, splits)}, config, built, splits, dist, say)

    vali = data.eval_dataset(splits.vali, splits)
    epochs = data.TrainingEpochs(splits, config.data.list_size, seed=config.train.seed,
                                 global_batch_size=config.train.batch_size)
    summaries = report.Summaries(run_files.log_dirs(run_dir)) if dist.is_chief else None
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
                add_gaps(logs, built.eval_metrics)
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
                    checkpoint.save(run_dir, resume.snapshot(built.model, state, best_weights))
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
    results = report.results(run_dir, state, config, policy, dist, _scores(built, splits),
                             started)
    return _finish(results, config, built, splits, dist, say)


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
        say(report.summary_table(results, config))
    return results


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
    built = build(config, splits.num_features, dist, with_training_model=False)
    restored = resume.open_run(config, run_dir, fresh, splits, dist)
    finished = report.finished_results(run_dir, restored.state) if restored else None
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
    state = resume.new_state(
        config, splits, epoch=len(fit.history),
        best_value=fit.history[fit.best_round - 1][f"val_{select}"], best_epoch=fit.best_round,
        stopped_early=len(fit.history) < config.model.adarank_rounds, history=fit.history)
    checkpoint.save(run_dir, checkpoint.Checkpoint(state=state, model=[], optimizer=[],
                                                   best=best_weights))
    built.eval_model.set_weights(best_weights)
    results = report.results(run_dir, state, config, policy, dist, _scores(built, splits),
                             started, feature_weights=best_weights[0][:, 0].tolist())
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


def evaluate(config: Config, splits: data.Splits, print_fn: Printer = print) -> dict[str, Any]:
    """Scores the best weights of `config`'s run on `splits`' validation and test sets."""
    built = restore_best(config, data_width=splits.num_features)
    splits = bound_evaluation(config, built.eval_model, splits)
    results = {"run_dir": config.train.run_dir}
    for name, paths in (("validation", splits.vali), ("test", splits.test)):
        if paths:
            results[name] = evaluate_on(built, data.eval_dataset(paths, splits))
    print_fn(report.metrics_table(results))
    return results


def _steps_per_epoch(num_lists: int, batch_size: int, dist: distribute.Distribution) -> int:
    """Returns the steps of one pass over the training lists.

    Distributed, every replica must take the same number of steps, so the last, partial global
    batch is dropped; otherwise it is kept.
    """
    if dist.distributed:
        return max(num_lists // batch_size, 1)
    return max(math.ceil(num_lists / batch_size), 1)


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
