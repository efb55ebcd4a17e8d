"""`python -m trainer train` refuses training batches whose attention would exceed --max-pairs."""

import collections

import pytest

from trainer.__main__ import main

pytestmark = pytest.mark.slow  # runs the trainer: `-m "not slow"` skips it


@pytest.fixture(scope="module")
def records_cache(tmp_path_factory):
    """A working directory whose runs/data holds MQ2008 Fold1's TFRecords once converted."""
    return tmp_path_factory.mktemp("trainer_cwd")


def _train(records_cache, tmp_path, monkeypatch, fold, *args):
    """Runs the command line in this process from `records_cache` (the conversion of the fold,
    made once, is its runs/data), training into tmp_path/run; returns its exit status."""
    monkeypatch.chdir(records_cache)
    return main(["train", "--data-dir", str(fold), "--run-dir", str(tmp_path / "run"),
                 "--epochs", "1", "--no-export", *args])


@pytest.mark.parametrize("list_size, batch_size, max_pairs", [
    ("40", 8, 12_799),    # lists cut/padded to 40: 8 x 40² = 12,800 pairs a batch
    ("full", 4, 1_000),   # whole lists: the longest training list of MQ2008's Fold1 counts
])
def test_lists_whose_attention_exceeds_the_bound_are_refused(records_cache, tmp_path, monkeypatch,
                                                            capsys, letor_folds, list_size,
                                                            batch_size, max_pairs):
    fold = letor_folds / "MQ2008" / "Fold1"
    with open(fold / "train.txt") as lines:
        longest = max(collections.Counter(line.split()[1] for line in lines).values())
    length = longest if list_size == "full" else int(list_size)
    status = _train(records_cache, tmp_path, monkeypatch, fold, "--preset", "dasalc",
                    "--list-size", list_size, "--batch-size", str(batch_size),
                    "--max-pairs", str(max_pairs))
    err = capsys.readouterr().err
    assert status == 1, err[-2000:]
    assert "Traceback" not in err
    message = err.strip().splitlines()[-1]
    assert message.startswith("python -m trainer train: error: training: lists of "), message
    assert f"lists of {length} documents, {batch_size} at a time, " in message
    assert f"above the bound of {max_pairs} pairs" in message and "--max-pairs" in message
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def test_models_without_attention_are_not_bounded_by_pairs(records_cache, tmp_path, monkeypatch,
                                                          capsys, letor_folds):
    status = _train(records_cache, tmp_path, monkeypatch, letor_folds / "MQ2008" / "Fold1",
                    "--preset", "linear", "--list-size", "40", "--batch-size", "8",
                    "--max-pairs", "1")
    assert status == 0, capsys.readouterr().err[-3000:]
