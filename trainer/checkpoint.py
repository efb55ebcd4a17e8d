"""Per-epoch training state in one file, replaced atomically, so a killed run resumes where it was.

`checkpoint.npz` in the run directory holds everything needed to continue as if never stopped:
the model's variables (weights, batch-norm moving averages, dropout seed state), the optimizer's
variables (step count, accumulators), the best weights so far, and `RunState` (epochs done, best
value and epoch, early-stopping counter, per-epoch history, fingerprints of the config and of the
training and validation data) as JSON.

It is written to a temporary file in the same directory, flushed to disk, then renamed over the
previous one: a kill at any instant leaves either the previous complete checkpoint or the new one.
Values are plain numpy arrays, so the format does not depend on the Keras backend or on the
distribution strategy that trained the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from trainer import run_files

FILENAME = "checkpoint.npz"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed: unreadable, or written for another configuration."""


@dataclasses.dataclass
class RunState:
    """Where a run stands after its last completed epoch."""

    epoch: int = 0  # completed epochs
    best_value: float | None = None  # best validation value of the selection metric
    best_epoch: int = 0  # 1-based epoch of best_value; 0 before the first epoch
    wait: int = 0  # epochs since the last improvement
    stopped_early: bool = False
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    fingerprint: str = ""  # of the training-relevant config; a resumed run must match it
    num_features: int | None = None  # the model's input width
    data: dict[str, list] = dataclasses.field(default_factory=dict)  # split -> data.fingerprint

    def finished(self, planned: int) -> bool:
        """Whether the run is over: its `planned` epochs done, or stopped early."""
        return self.stopped_early or self.epoch >= planned

    def record(self, logs: dict[str, float], value: float, patience: int) -> bool:
        """Appends one finished epoch; returns whether `value` is a new best (higher is better)."""
        self.epoch += 1
        self.history.append({k: float(v) for k, v in logs.items()})
        improved = self.best_value is None or value > self.best_value
        if improved:
            self.best_value, self.best_epoch, self.wait = float(value), self.epoch, 0
        else:
            self.wait += 1
            self.stopped_early = patience > 0 and self.wait >= patience
        return improved


@dataclasses.dataclass
class Checkpoint:
    """The arrays and state of one checkpoint file."""

    state: RunState
    model: list[np.ndarray]
    optimizer: list[np.ndarray]
    best: list[np.ndarray]


def path_in(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / FILENAME


def save(run_dir: str | os.PathLike, checkpoint: Checkpoint) -> Path:
    """Writes `checkpoint` to `run_dir/checkpoint.npz` atomically; returns the path."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {"state": np.array(json.dumps(dataclasses.asdict(checkpoint.state)))}
    for group in ("model", "optimizer", "best"):
        values = getattr(checkpoint, group)
        arrays[f"{group}/count"] = np.array(len(values))
        for i, value in enumerate(values):
            arrays[f"{group}/{i}"] = np.asarray(value)
    target = path_in(run_dir)
    run_files.replace_file(target, lambda f: np.savez(f, **arrays), prefix=".checkpoint-",
                           suffix=".npz.tmp")
    _fsync_dir(run_dir)
    return target


def load(run_dir: str | os.PathLike) -> Checkpoint | None:
    """Returns the checkpoint in `run_dir`, or None when there is none."""
    read = _read(run_dir, ("model", "optimizer", "best"))
    return None if read is None else Checkpoint(state=read[0], **read[1])


def load_state(run_dir: str | os.PathLike) -> RunState | None:
    """Returns the state of the checkpoint in `run_dir` (None when there is none) without reading
    its arrays."""
    read = _read(run_dir, ())
    return None if read is None else read[0]


def _read(run_dir: str | os.PathLike, groups: tuple[str, ...]):
    """Returns `(state, {group: arrays})` of the checkpoint in `run_dir`, or None without one."""
    path = path_in(run_dir)
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            state = RunState(**json.loads(str(data["state"])))
            arrays = {
                group: [data[f"{group}/{i}"] for i in range(int(data[f"{group}/count"]))]
                for group in groups
            }
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
        # EOFError: an empty file; BadZipFile: one cut short, or with a byte changed (CRC-32)
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({err}); delete it or pass --fresh to start over"
        ) from err
    return state, arrays


def remove_stale_temporaries(run_dir: str | os.PathLike) -> None:
    """Deletes temporary files left by a process killed while writing a checkpoint."""
    for tmp in Path(run_dir).glob(".checkpoint-*.npz.tmp"):
        tmp.unlink(missing_ok=True)


def assign(variables: list[Any], values: list[np.ndarray], what: str) -> None:
    """Assigns `values` to `variables` in order, after checking count and shapes match."""
    if len(variables) != len(values):
        raise CheckpointError(
            f"the checkpoint holds {len(values)} {what} variables but the current setup has "
            f"{len(variables)}; it was written by a different model/optimizer (pass --fresh or "
            "use another --run-dir)"
        )
    for variable, value in zip(variables, values):
        if tuple(variable.shape) != tuple(value.shape):
            raise CheckpointError(
                f"checkpoint {what} variable {variable.path} has shape "
                f"{tuple(value.shape)}, the current one {tuple(variable.shape)} (pass --fresh or use "
                "another --run-dir)"
            )
        variable.assign(value)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
