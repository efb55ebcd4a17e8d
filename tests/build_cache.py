"""Files the suite builds once and keeps across runs and clones: the C++ loader's runner
(tests/cpp_loader.py, ~17 CPU seconds of compiling) and what TF-Ranking computes in its side venv
(tests/test_parity_tfranking.py, tests/test_data_records.py: a TensorFlow 2.15 process). They live beside the TF-Ranking side
venv (.ci/tfranking-venv), which CI can cache, each named by a digest of everything it is made
from, so a changed input gets a new file and an old one is never read for it."""

import fcntl
import hashlib
import os
import shutil

CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                         "tfapprox")


def built_once(path, build):
    """Returns `path`, calling `build(partial)` to write it first unless it exists.

    One builder at a time (pytest-xdist workers asking together wait for the first, then read what
    it built); `build` writes `partial` (a file named with `path`'s extension, or a directory),
    which becomes `path` only when `build` returns, and is removed if it raises.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(path):
            root, extension = os.path.splitext(path)
            partial = f"{root}.{os.getpid()}.partial{extension}"
            try:
                build(partial)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                if os.path.isfile(partial):
                    os.remove(partial)
                raise
            os.replace(partial, path)
    return path


def digest(*parts):
    """Returns a 16-hex-digit digest of `parts`: bytes, strings, numpy arrays (with their dtype
    and shape) and dicts of these (by sorted key)."""
    import numpy as np

    found = hashlib.sha256()

    def add(part):
        if isinstance(part, dict):
            for key in sorted(part):
                add(key)
                add(part[key])
        elif isinstance(part, (bytes, str)):
            found.update(repr(len(part)).encode())
            found.update(part.encode() if isinstance(part, str) else part)
        else:
            value = np.asarray(part)
            add(repr((value.dtype.str, value.shape)))
            found.update(value.tobytes())

    for part in parts:
        add(part)
    return found.hexdigest()[:16]


def venv_identity(python):
    """Returns what names a side venv's build: its interpreter's path and the time its pyvenv.cfg
    was written (a rebuilt venv gets a new one)."""
    config = os.path.join(os.path.dirname(os.path.dirname(python)), "pyvenv.cfg")
    return f"{python} {os.stat(config).st_mtime_ns if os.path.exists(config) else None}"
