"""The command lines keep TensorFlow's start-up notices and deprecation warnings off stderr (as in
a user's shell: TF_CPP_MIN_LOG_LEVEL unset). The experiments' command line here; the trainer's,
from start to export, in tests/test_trainer_run.py, whose process that test shares."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, START_UP_NOTICES
from tfapprox.data import write_splits

pytestmark = pytest.mark.slow  # runs the command lines as processes

NOISE = (*START_UP_NOTICES, "is deprecated", "Instructions for updating")


def user_environment():
    """This environment as in a user's shell: without TF_CPP_MIN_LOG_LEVEL."""
    return {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}


def quietly_run(command, cwd, env=None):
    """Runs `python -m *command` in `env` (a user's environment when None); returns the finished
    process, checking it succeeded."""
    done = subprocess.run([sys.executable, "-m", *command], cwd=cwd, env=env or user_environment(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def noise_in(stderr):
    """Returns the notices of NOISE that `stderr` holds."""
    return [notice for notice in NOISE if notice in stderr]


def test_the_experiments_say_nothing_of_tensorflow(tmp_path):
    write_splits(tmp_path / "data" / "Fold1", num_queries=30, docs_per_query=8, num_features=5)
    err = quietly_run(["benchmarks.experiments", "run", "--data-dir", str(tmp_path / "data"),
                       "--study", "lightgbm", "--folds", "1", "--seeds", "0", "--cache",
                       str(tmp_path / "cache"), "--work", str(tmp_path / "work")],
                      REPO).stderr
    assert not noise_in(err), err[-3000:]
