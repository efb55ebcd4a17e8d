"""The experiments program's input checks: bad data stops it with the trainer's one-line error,
and a cache or work directory it cannot write is refused before any run."""

import pytest

from benchmarks import experiments
from test_experiments import LIGHTGBM, fold_tree

pytestmark = pytest.mark.slow  # imports the experiments' studies and the trainer


def run(tmp_path, data, *flags):
    return experiments.main(["run", "--data-dir", str(data), *LIGHTGBM, "--cache",
                             str(tmp_path / "cache"), "--work", str(tmp_path / "work"), *flags])


def replace_in_first_line(path, old, new):
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace(old, new, 1)
    path.write_text("".join(lines))


BAD_DATA = {
    "a word": (lambda train: replace_in_first_line(train, " 2:", " 2:x7 "),
             "train.txt:1: non-numeric feature value in token '2:x7'"),
    "repeated id": (lambda train: replace_in_first_line(train, " 2:", " 1:0.5 2:"),
                    "train.txt:1: feature index 1 repeated"),
    "id 0": (lambda train: replace_in_first_line(train, " 1:", " 0:0.5 1:"),
             "train.txt:1: feature index must be a positive integer, got token '0:0.5'"),
    "group sizes that do not add up": (
        lambda train: train.with_name("train.txt.query").write_text("3\n"),
        "documents, but the group sizes in "),
    "a group file beside qid: lines": (
        lambda train: train.with_name("train.txt.query").write_text(
            f"{len(train.read_text().splitlines())}\n"),
        "train.txt: the lines carry qid: ("),
}


@pytest.mark.parametrize("damage", BAD_DATA)
def test_bad_data_is_the_trainers_one_line_error(tmp_path, capsys, damage):
    data = fold_tree(tmp_path / "data", folds=1, lightgbm_format="group sizes" in damage)
    damage_file, message = BAD_DATA[damage]
    damage_file(data / "Fold1" / "train.txt")
    assert run(tmp_path, data) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m benchmarks.experiments run: error: "), err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flag", ["--cache", "--work"])
def test_a_directory_it_cannot_write_is_refused_before_any_run(tmp_path, capsys, flag):
    data = fold_tree(tmp_path / "data", folds=1)
    blocked = tmp_path / "a file"
    blocked.write_text("not a directory\n")
    with pytest.raises(SystemExit) as exit_:
        run(tmp_path, data, flag, str(blocked / "inside"))
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert err == (f"python -m benchmarks.experiments: error: {flag} {blocked / 'inside'}: "
                   "cannot write there (Not a directory)\n"), err
    assert "runs planned" not in out and "Traceback" not in err
    assert blocked.read_text() == "not a directory\n"
