"""One trainer per run directory: an flock'd `.lock` file inside it names the trainer holding it.

Two trainers on one run directory would both train, checkpoint and export, and could leave a
config.json that does not describe the checkpoint. `hold(run_dir)` takes an exclusive
`fcntl.flock` on `run_dir/.lock` for as long as a run lasts and writes the holder's pid, host and
start time into the file; a second trainer is refused with `RunDirInUse` naming that holder.
`holder(run_dir)` names it without taking the lock (an ensemble refuses a member still training).

The kernel drops the lock when the holder's file is closed, also when the process is killed, so a
dead trainer never blocks the next one. The file stays behind: deleting it on release would let a
third trainer lock a new file while a second one is still waiting on the old one. It is opened
without following a symbolic link and must be a regular file, so a link planted at `.lock` cannot
make the trainer overwrite the file it points to.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Iterator

from trainer.run_files import ForeignRunDir

FILENAME = ".lock"


class RunDirInUse(RuntimeError):
    """Another live process holds the run directory's lock."""


@contextlib.contextmanager
def hold(run_dir: str | os.PathLike) -> Iterator[None]:
    """Holds `run_dir`'s lock (creating the directory) for the block; raises RunDirInUse if taken."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _open_lock_file(run_dir / FILENAME) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirInUse(_in_use_message(run_dir, handle)) from None
        handle.truncate(0)
        handle.write(json.dumps(_holder()) + "\n")
        handle.flush()
        yield


def holder(run_dir: str | os.PathLike) -> str | None:
    """Returns who holds `run_dir`'s lock (pid, host, start time), or None when no live process
    does. Creates and writes nothing: it takes a shared lock on the file for an instant, so a
    trainer starting at that very instant is refused as if the directory were in use."""
    path = Path(run_dir) / FILENAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # none (never trained here), or a link no trainer would lock through
        return None
    with os.fdopen(fd) as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe_holder(run_dir, handle)
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _open_lock_file(path: Path):
    """Opens (creating) the lock file for reading and writing; refuses a link or a non-regular file."""
    try:  # O_NONBLOCK: a FIFO planted at the name must not block the open
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError:
        if os.path.islink(path):
            raise ForeignRunDir(f"{path} is a symbolic link; the trainer does not write through "
                                "one: remove it, or choose another --run-dir") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ForeignRunDir(f"{path} is not a regular file; remove it, or choose another --run-dir")
    return os.fdopen(fd, "r+")


def _holder() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}


def _describe_holder(run_dir: Path, handle) -> str:
    """Returns the holder's details as the lock file `handle` names them."""
    handle.seek(0)
    try:
        holder = json.loads(handle.read())
        return f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):  # the holder has not written its details yet
        return f"details not yet written to {Path(run_dir) / FILENAME}"


def _in_use_message(run_dir: Path, handle) -> str:
    who = _describe_holder(run_dir, handle)
    return (
        f"run directory {run_dir} is in use by another trainer ({who}); wait for it to finish, "
        "or choose another --run-dir"
    )
