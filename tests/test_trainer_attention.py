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
                    "--max-pairs", "1", "--metrics", "ndcg@5")
    assert status == 0, capsys.readouterr().err[-3000:]


def test_evaluation_batches_are_bounded_and_a_list_over_the_bound_is_refused(
        records_cache, tmp_path, monkeypatch, capsys, letor_folds):
    """Validation and test batches of an attending model hold at most --max-pairs pairs (fewer
    lists a batch, every list still scored); one list over the bound: one line, nothing trained."""
    import dataclasses

    from trainer import config as trainer_config, data

    fold = letor_folds / "MQ2008" / "Fold1"
    monkeypatch.chdir(records_cache)
    config = trainer_config.load("demo", {"data.dir": str(fold)})
    splits = data.resolve(config.data, print_fn=lambda _: None)
    with open(fold / "vali.txt") as lines:
        counts = collections.Counter(line.split()[1] for line in lines)
    longest = max(counts.values())
    bounded = dataclasses.replace(splits, eval_max_pairs=3 * longest * longest)
    sizes = [int(inputs["mask"].shape[0]) for inputs, _ in
             data.eval_dataset(splits.vali, bounded).as_numpy_iterator()]
    assert max(sizes) == 3 and sum(sizes) == len(counts)

    status = _train(records_cache, tmp_path, monkeypatch, fold, "--preset", "dasalc",
                    "--list-size", "8", "--batch-size", "1", "--max-pairs", str(longest ** 2 - 1))
    err = capsys.readouterr().err
    assert status == 1, err[-2000:]
    message = err.strip().splitlines()[-1]
    assert f"a list of {longest} documents" in message and "--max-pairs" in message, message
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def test_an_ensemble_takes_max_pairs():
    from trainer.__main__ import _ensemble_parser

    args = _ensemble_parser().parse_args(["--members", "m", "--max-pairs", "5"])
    assert args.max_pairs == 5
