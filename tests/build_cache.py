"""Files the suite builds once and keeps across runs and clones: the C++ loader's runner
(tests/cpp_loader.py, ~17 CPU seconds of compiling) and TF-Ranking's reference values
(tests/test_parity_tfranking.py, a TensorFlow 2.15 process). They live beside the TF-Ranking side
venv (.ci/tfranking-venv), which CI can cache, each named by a digest of everything it is made
from, so a changed input gets a new file and an old one is never read for it."""

import fcntl
import os

CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                         "tfapprox")


def built_once(path, build):
    """Returns `path`, calling `build(partial)` to write it first unless it exists.

    One builder at a time (pytest-xdist workers asking together wait for the first, then read what
    it built); `build` writes `partial` (named with `path`'s extension), which becomes `path` only
    when `build` returns.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(path):
            root, extension = os.path.splitext(path)
            partial = f"{root}.{os.getpid()}.partial{extension}"
            build(partial)
            os.replace(partial, path)
    return path
