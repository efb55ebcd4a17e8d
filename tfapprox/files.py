"""Writing only what we create: new files and directories, never through a symbolic link.

Shared by the converter, the synthetic data writer, export and the trainer's caches.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import stat
import time
from pathlib import Path


def create_file(path: Path) -> int:
    """Creates the new regular file ``path`` for writing and returns its descriptor.

    Raises FileExistsError if anything is there already, a symbolic link included (not followed).
    """
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)


def fresh_name(parent: Path, prefix: str) -> Path:
    """Returns ``parent/<prefix><pid>-<random>``, a name no other file has (nor any other run uses)."""
    return parent / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"


def new_directory(parent: Path, prefix: str) -> Path:
    """Creates and returns a directory named by :func:`fresh_name`; never takes over an existing one."""
    path = fresh_name(parent, prefix)
    path.mkdir()
    return path


def refuse_symlink(path: Path, what: str) -> None:
    """Raises FileExistsError if ``path`` is a symbolic link: we never write through one."""
    if path.is_symlink():
        raise FileExistsError(
            f"{path} is a symbolic link (to {os.readlink(path)}); {what} never writes through a link: "
            "give its target or a new path"
        )


def is_running(pid: int) -> bool:
    """True if a process `pid` runs on this host (a staging directory's writer, say)."""
    if os.name != "posix":  # os.kill(pid, 0) would signal it there: assume it runs
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        pass
    return True


def remove_abandoned(directory: str | os.PathLike, name: re.Pattern,
                     max_age_seconds: float | None = None) -> None:
    """Deletes the staging directories in `directory` whose writer is gone.

    A staging directory is a real directory (not a link) whose whole name matches `name`; the
    pattern's groups `host` and `pid` name its writer. It is abandoned when that writer ran on this
    host and no longer runs, or, with `max_age_seconds`, when it is untouched for longer (another
    host's, or one that names no writer). Nothing else in `directory` is touched.
    """
    for entry in os.listdir(directory):
        match = name.fullmatch(entry)
        if match is None:
            continue
        path = os.path.join(directory, entry)
        try:
            status = os.lstat(path)
        except FileNotFoundError:  # its writer just finished
            continue
        if not stat.S_ISDIR(status.st_mode):
            continue
        writer_gone = (match["host"] == socket.gethostname()
                       and not is_running(int(match["pid"])))
        too_old = max_age_seconds is not None and time.time() - status.st_mtime > max_age_seconds
        if writer_gone or too_old:
            shutil.rmtree(path, ignore_errors=True)
