"""The command lines keep TensorFlow's start-up notices and deprecation warnings off stderr (as in
a user's shell: TF_CPP_MIN_LOG_LEVEL unset), from start to export."""

import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, START_UP_NOTICES
from tfapprox.data import write_splits

pytestmark = pytest.mark.slow  # runs the command lines as processes

NOISE = (*START_UP_NOTICES, "is deprecated", "Instructions for updating")


def quietly_run(command, cwd):
    """Runs `command` in a user's environment; returns its stderr, checking it succeeded."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", *command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_the_trainer_says_nothing_of_tensorflow_from_start_to_export(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"synthetic": {"num_queries": 40, "docs_per_query": 6, "num_features": 5},
                 "cache_dir": str(tmp_path / "cache")},
        "model": {"preset": "linear"}, "train": {"epochs": 1, "batch_size": 8},
        "export": {"base_dir": str(tmp_path / "export"), "name": "tiny"}}))
    err = quietly_run(["trainer", "train", "--config", str(config), "--run-dir",
                       str(tmp_path / "run")], tmp_path)
    assert (tmp_path / "export" / "tiny").is_dir()
    assert not [notice for notice in NOISE if notice in err], err[-3000:]


def test_the_experiments_say_nothing_of_tensorflow(tmp_path):
    write_splits(tmp_path / "data" / "Fold1", num_queries=30, docs_per_query=8, num_features=5)
    err = quietly_run(["benchmarks.experiments", "run", "--data-dir", str(tmp_path / "data"),
                       "--study", "lightgbm", "--folds", "1", "--seeds", "0", "--cache",
                       str(tmp_path / "cache"), "--work", str(tmp_path / "work")],
                      REPO)
    assert not [notice for notice in NOISE if notice in err], err[-3000:]
