"""What a run reports: results.json, the end-of-run summary and metric tables, TensorBoard scalars.

    results.json      history, best epoch, validation/test metrics of the selected model
    logs/train, logs/validation   TensorBoard scalars per epoch
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from trainer import checkpoint, distribute
from trainer.build import scorer_kwargs
from trainer.config import Config


def results(run_dir: Path, state: checkpoint.RunState, config: Config, policy: str,
            dist: distribute.Distribution, scores: dict[str, Any], started: float,
            **extra: Any) -> dict[str, Any]:
    """Returns results.json's content: the run's state and its best model's `scores` (validation
    and test metrics), with the wall time since `started` (a `time.perf_counter` value)."""
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
        **scores,
        "wall_seconds": time.perf_counter() - started,
    }


def finished_results(run_dir: Path, state: checkpoint.RunState) -> dict[str, Any] | None:
    """Returns the results.json of a finished run, if it belongs to the checkpoint's state."""
    path = run_dir / "results.json"
    if not path.exists():
        return None
    finished = json.loads(path.read_text())
    if finished.get("epochs_run") != state.epoch or finished.get("best_epoch") != state.best_epoch:
        return None
    return finished


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
    options = {k: v for k, v in scorer_kwargs(config).items() if k != "dropout"}
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
        cells = [fmt(results[c].get(name)) for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt(value: float | None) -> str:
    """Returns a metric value as reported: four decimals, "-" for none."""
    return "-" if value is None else f"{value:.4f}"


class Summaries:
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
