"""What the trainer owns in a run directory, and how it writes there without following a link.

A run directory is the trainer's when the trainer made it: `claim` takes a directory that does not
exist or is empty and writes the marker file `.tfapprox-run` into it. A directory that already holds
something and has no marker is the user's, and is refused (`ForeignRunDir`): the trainer would
otherwise overwrite a `config.json` or `results.json` of theirs, or remove their `logs/`.

Inside a claimed directory the trainer writes, replaces and (`clear`, for `--fresh`) removes only its
own names: `OWN_FILES` and the TensorBoard event files under `logs/train` and `logs/validation`.
Everything else there is left alone. No write follows a symbolic link: files are replaced through a
new temporary file and a rename, which replaces a link instead of writing through it, and a
directory the trainer writes into must be a real directory.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from tfapprox import files

MARKER = ".tfapprox-run"
OWN_FILES = ("checkpoint.npz", "config.json", "results.json", "evaluation.json")
LOG_DIRS = ("train", "validation")  # under logs/
EVENT_FILE_PREFIX = "events.out.tfevents."


class ForeignRunDir(OSError):
    """A run directory that the trainer did not make, or a path in it that is not what it wrote."""


def claim(run_dir: str | os.PathLike) -> Path:
    """Returns `run_dir` as a directory of the trainer's: made (with its marker) if missing or
    empty, accepted if it has the marker; raises ForeignRunDir for anything else."""
    run_dir = check_claimable(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    real_directory(run_dir)
    if not (run_dir / MARKER).is_file():
        # Created in place, never through a temporary name: whoever looks meanwhile sees an empty
        # directory or a marked one.
        try:
            marker = files.create_file(run_dir / MARKER)
        except FileExistsError:
            check_claimed(run_dir)  # made meanwhile by another trainer, or a link: refused
        else:
            with os.fdopen(marker, "w") as handle:
                handle.write("a tfapprox trainer run directory\n")
    return run_dir


def check_claimable(run_dir: str | os.PathLike) -> Path:
    """Returns `run_dir` if `claim` would take it; raises ForeignRunDir naming what it holds if not.
    Writes nothing."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink():
        raise ForeignRunDir(
            f"run directory {run_dir} is a symbolic link; the trainer writes only into directories "
            f"it made: pass the directory itself ({os.path.realpath(run_dir)}) or a new one")
    if run_dir.exists() and not run_dir.is_dir():
        raise ForeignRunDir(f"run directory {run_dir} exists and is not a directory")
    if run_dir.is_dir() and not (run_dir / MARKER).is_file():
        entries = sorted(p.name for p in run_dir.iterdir())
        if entries:
            raise ForeignRunDir(
                f"run directory {run_dir} holds {', '.join(entries[:3])}"
                f"{f' and {len(entries) - 3} more' if len(entries) > 3 else ''}, which the trainer "
                "did not write (it has no .tfapprox-run marker); choose a new or empty --run-dir")
    return run_dir


def check_claimed(run_dir: str | os.PathLike) -> Path:
    """Returns `run_dir` if the trainer made it; raises ForeignRunDir otherwise."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink() or not (run_dir / MARKER).is_file():
        raise ForeignRunDir(
            f"{run_dir} is not a run directory the trainer made (no .tfapprox-run marker); pass the "
            "--run-dir of a trained run")
    return run_dir


def write_text(path: Path, text: str) -> None:
    """Replaces `path` with `text` (see `replace_file`)."""
    replace_file(path, lambda handle: handle.write(text.encode()))


def write_json(path: Path, values: Any) -> None:
    """Replaces `path` with `values` as JSON (see `write_text`), numpy numbers as numbers. JSON has
    no NaN or infinity (Python's `json` writes bare `NaN` tokens, which other readers refuse): such
    a value is written as null."""
    write_text(path, json.dumps(_json_values(values), indent=2, allow_nan=False) + "\n")


def _json_values(value: Any) -> Any:
    """Returns `value` with numpy scalars as Python ones and NaN or infinite floats as None, in
    nested dicts, lists and tuples too."""
    if isinstance(value, dict):
        return {key: _json_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_values(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


def replace_file(path: Path, write: Callable[[BinaryIO], object], *, prefix: str | None = None,
                 suffix: str = ".tmp") -> None:
    """Replaces `path` atomically with what `write` puts in a binary file: a new temporary file
    beside it (`<prefix>*<suffix>`, default `.<name>.*.tmp`), flushed to disk, then a rename (which
    replaces a symbolic link at `path` instead of writing through it)."""
    _replace(path, lambda handle, _: write(handle), prefix or f".{path.name}.", suffix)


def replace_by_saving(path: Path, save: Callable[[Path], object]) -> None:
    """Replaces `path` as `replace_file` does, with the file `save(temporary path)` writes, for
    writers that take a path (Keras's `model.save`, which rewrites that file in place); the
    temporary file is named `.<name>.*<suffix of path>`."""
    _replace(path, lambda _, tmp: save(tmp), f".{path.name}.", path.suffix)


def _replace(path: Path, fill: Callable[[BinaryIO, Path], object], prefix: str,
             suffix: str) -> None:
    """Makes a temporary file beside `path`, has `fill(its open handle, its path)` write it, makes
    it readable, flushes it to disk and renames it over `path`; removes it if anything fails."""
    real_directory(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "r+b") as handle:
            fill(handle, Path(tmp))
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def real_directory(path: Path) -> Path:
    """Returns `path`, made if missing, after checking it is a directory and not a symbolic link."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
        raise ForeignRunDir(f"{path} is {kind}; the trainer writes only into directories it made")
    return path


def log_dirs(run_dir: Path) -> dict[str, Path]:
    """Returns `{name: run_dir/logs/name}` for the TensorBoard writers, each a real directory."""
    logs = real_directory(run_dir / "logs")
    return {name: real_directory(logs / name) for name in LOG_DIRS}


def clear(run_dir: Path) -> None:
    """Removes the trainer's own files from a claimed `run_dir` (`--fresh`); leaves the rest."""
    for name in OWN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    logs = run_dir / "logs"
    for directory in [logs / name for name in LOG_DIRS] + [logs]:
        if directory.is_symlink() or not directory.is_dir():
            continue
        if directory != logs:
            for event_file in directory.glob(EVENT_FILE_PREFIX + "*"):
                if not event_file.is_symlink() and event_file.is_file():
                    event_file.unlink()
        try:
            directory.rmdir()
        except OSError:  # something of the user's is still in it
            pass
