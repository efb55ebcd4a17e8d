"""Quiet TensorFlow for the command lines `python -m trainer`, `python -m tfapprox.data` and
`python -m benchmarks.experiments`.

On a machine without a GPU, TensorFlow logs "oneDNN custom operations are on", "Could not find cuda
drivers" and, as an error, "failed call to cuInit" while it starts, although nothing is wrong. Some
of these lines are written before TensorFlow's logging reads TF_CPP_MIN_LOG_LEVEL, so that variable
alone does not silence them.

`quiet_tensorflow_start()` wraps the imports of TensorFlow (tfapprox's, and on JAX the trainer's).
When the process runs one of the command lines without `--verbose`, and the user has not set
TF_CPP_MIN_LOG_LEVEL (this module may have: later blocks are quiet too), it sets
TF_CPP_MIN_LOG_LEVEL=3 (TensorFlow's C++ code then logs fatal errors only) and drops the
informational lines TensorFlow writes to stderr during the import; anything else written there
meanwhile is passed on. It also keeps TensorFlow's deprecation notices (logged the first time a
deprecated function runs, e.g. `parse_example_dataset`, which serving uses on purpose) out of the
command lines' output: their reader cannot act on them. When tfapprox is imported as a library it
does nothing.

Standard library only: this runs before TensorFlow is imported.
"""

import contextlib
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

COMMAND_LINES = ("trainer", "tfapprox.data", "benchmarks.experiments")
_quieted = False  # whether this module set TF_CPP_MIN_LOG_LEVEL (later blocks are quiet too)

# absl's banner and its info/warning lines, e.g. "I0000 00:00:1795572760.867635    2943 port.cc:153] "
_START_UP_LINE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "
)


@contextlib.contextmanager
def quiet_tensorflow_start():
    """Keeps TensorFlow's start-up notices off stderr during the block, for a quiet command line."""
    global _quieted
    if not _quiet_wanted():
        yield
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if not _quieted:
        logging.getLogger("tensorflow").addFilter(_not_a_deprecation_notice)
    _quieted = True
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        stderr = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(stderr, 2)
            os.close(stderr)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.writelines(line for line in lines if not _START_UP_LINE.match(line))


def _not_a_deprecation_notice(record: logging.LogRecord) -> bool:
    """False for a notice of TensorFlow's deprecation decorators (tensorflow/python/util/)."""
    return Path(record.pathname).parts[-4:] != ("tensorflow", "python", "util", "deprecation.py")


def _quiet_wanted() -> bool:
    return (
        _module_run() in COMMAND_LINES
        and "--verbose" not in sys.argv
        and (_quieted or "TF_CPP_MIN_LOG_LEVEL" not in os.environ)
    )


def _module_run() -> str | None:
    """Returns MODULE of `python [options] -m MODULE ...`, or None."""
    args = sys.orig_argv[1:]
    if "-m" not in args[:-1]:
        return None
    return args[args.index("-m") + 1]
