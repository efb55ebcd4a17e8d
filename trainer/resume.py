"""Resuming a run: its checkpoint is taken up only by the same configuration on the same data.

A run's fingerprint hashes its configuration less the keys that may change between a run and its
resumption (`RESUMABLE_CHANGES`), and the content of its feature spec (`data.feature_spec`); the
checkpoint also holds fingerprints of the training and validation data themselves, so the data's
and the spec's paths may be spelled differently.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import keras
import numpy as np

from trainer import checkpoint, data, distribute, named_data, run_files
from trainer.build import Built
from trainer.config import Config
from trainer.report import fmt

Printer = Callable[[str], None]

# Config keys that may change between a run and its resumption; everything else must match.
RESUMABLE_CHANGES = (
    "train.epochs", "train.patience", "train.run_dir", "export", "runtime.strategy", "runtime.jit",
    "runtime.backend",
    "data.cache_dir", "data.num_features", "data.dir", "data.train", "data.vali", "data.test", "cv",
    "train.metrics", "train.max_pairs", "data.feature_spec",
)


def start_or_resume(config: Config, run_dir: Path, fresh: bool, built: Built,
                    splits: data.Splits, dist: distribute.Distribution, say: Printer):
    """Returns `(state, best_weights)`: restored from the run's checkpoint, or a new start."""
    restored = open_run(config, run_dir, fresh, splits, dist)
    if restored is None:
        return new_state(config, splits), None
    checkpoint.assign(model_state(built.model), restored.model, "model")
    checkpoint.assign(built.model.optimizer.variables, restored.optimizer, "optimizer")
    state = restored.state
    say(f"Resuming {run_dir} after epoch {state.epoch} (best {config.train.select_metric} "
        f"{fmt(state.best_value)} at epoch {state.best_epoch})")
    return state, restored.best


def open_run(config: Config, run_dir: Path, fresh: bool, splits: data.Splits,
             dist: distribute.Distribution) -> checkpoint.Checkpoint | None:
    """Returns the run directory's checkpoint (None: a new run, or `fresh`, which clears it) and
    writes config.json; raises CheckpointError for a checkpoint of another configuration or data."""
    if fresh and dist.is_chief:
        run_files.clear(run_dir)
    restored = None if fresh else checkpoint.load(run_dir)
    if restored is not None and restored.state.fingerprint != fingerprint(config):
        raise checkpoint.CheckpointError(_mismatch_message(run_dir, config))
    if restored is not None:
        _check_same_data(run_dir, restored.state, splits)
    dist.check_same("the epoch to resume from", restored.state.epoch if restored else 0)
    if dist.is_chief:
        checkpoint.remove_stale_temporaries(run_dir)
        run_files.write_json(run_dir / "config.json", config.to_dict())
    return restored


def new_state(config: Config, splits: data.Splits, **values: Any) -> checkpoint.RunState:
    """Returns the state of a run before its first epoch (`values`: fields already known)."""
    return checkpoint.RunState(fingerprint=fingerprint(config), num_features=splits.num_features,
                               data={split: splits.fingerprints[split] for split in ("train", "vali")},
                               **values)


def snapshot(model: keras.Model, state: checkpoint.RunState,
             best_weights: list[np.ndarray]) -> checkpoint.Checkpoint:
    """Returns the checkpoint of `model` (weights and optimiser) after `state`'s epoch."""
    def arrays(variables):
        return [np.asarray(keras.ops.convert_to_numpy(v)) for v in variables]

    return checkpoint.Checkpoint(state=state, model=arrays(model_state(model)),
                                 optimizer=arrays(model.optimizer.variables), best=best_weights)


def model_state(model: keras.Model) -> list[Any]:
    """Returns the variables a resumed run needs: weights, moving averages, seed generator states."""
    metric_ids = {id(v) for m in model.metrics for v in m.variables}
    return [v for v in model.variables if id(v) not in metric_ids]


def fingerprint(config: Config) -> str:
    """Returns a hash of `config` less `RESUMABLE_CHANGES`, with its feature spec's content."""
    values = _resumable_view(config.to_dict())
    if config.data.feature_spec is not None:
        values["feature_spec"] = named_data.load_spec(config.data.feature_spec).to_dict()
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


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


def _resumable_view(values: dict[str, Any]) -> dict[str, Any]:
    values = json.loads(json.dumps(values))
    for dotted in RESUMABLE_CHANGES:
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
    if differences:
        detail = "; ".join(differences)
    elif saved_path.exists() and config.data.feature_spec is not None:
        detail = f"the feature spec {config.data.feature_spec} describes other features"
    else:
        detail = "the saved config.json is missing"
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
