"""`python -m trainer train` refuses training batches whose attention would exceed --max-pairs."""

import collections
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the trainer: `-m "not slow"` skips it


def _train(tmp_path, fold, *args):
    """Runs the trainer in `tmp_path` (its data cache and run directory go there)."""
    command = [sys.executable, "-m", "trainer", "train", "--data-dir", str(fold),
               "--run-dir", "run", "--epochs", "1", "--no-export", *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("list_size, batch_size, max_pairs", [
    ("40", 8, 12_799),    # lists cut/padded to 40: 8 x 40² = 12,800 pairs a batch
    ("full", 4, 1_000),   # whole lists: the longest training list of MQ2008's Fold1 counts
])
def test_lists_whose_attention_exceeds_the_bound_are_refused(tmp_path, letor_folds, list_size,
                                                            batch_size, max_pairs):
    fold = letor_folds / "MQ2008" / "Fold1"
    with open(fold / "train.txt") as lines:
        longest = max(collections.Counter(line.split()[1] for line in lines).values())
    length = longest if list_size == "full" else int(list_size)
    done = _train(tmp_path, fold, "--preset", "dasalc", "--list-size", list_size,
                  "--batch-size", str(batch_size), "--max-pairs", str(max_pairs))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("python -m trainer train: error: training: lists of "), message
    assert f"lists of {length} documents, {batch_size} at a time, " in message
    assert f"above the bound of {max_pairs} pairs" in message and "--max-pairs" in message
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def test_models_without_attention_are_not_bounded_by_pairs(tmp_path, letor_folds):
    done = _train(tmp_path, letor_folds / "MQ2008" / "Fold1", "--preset", "linear",
                  "--list-size", "40", "--batch-size", "8", "--max-pairs", "1")
    assert done.returncode == 0, done.stderr[-3000:]
