"""benchmarks/scale.py: its --help, its work directory, and a tiny run end to end, resumed."""

import json
import re

import pytest

from benchmarks import scale

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

# The script's stages and tables do not depend on the scorer or the data's size: the cheapest.
TINY = ["--queries", "20", "--epochs", "1", "--presets", "linear", "--jit", "off",
        "--lightgbm-rounds", "10"]
STAGES = ["generate", "convert", "train-linear", "evaluate-linear", "export-linear", "lightgbm"]


def test_help_states_the_protocol(capsys):
    with pytest.raises(SystemExit) as exit_:
        scale.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for needed in ("31,531", "3:1:1", "--list-size full", "--jit", "peak RSS", "70k docs/s",
                   "LightGBM lambdarank", "WORK/stages/STAGE.json", "time to best"):
        assert needed.lower() in text.lower(), needed


def test_a_directory_not_made_by_the_script_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("the user's\n")
    with pytest.raises(SystemExit, match="was not made by this script"):
        scale.main(["--work", str(tmp_path), *TINY])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


@pytest.mark.slow  # two processes that import TensorFlow, the second forking five stages
def test_tiny_run_end_to_end_then_resumed(tmp_path, capsys):
    """A child started afresh spends 5-9 CPU-s importing TensorFlow, then 1-8 CPU-s of work at
    these sizes: the run stops after its first stage (--stages), run as a child started afresh
    (the default), and the rerun that resumes it forks the other five from one process that has
    imported TensorFlow (--preload)."""
    work = tmp_path / "work"
    assert scale.main(["--work", str(work), *TINY, "--stages", "generate"]) == 0
    first = capsys.readouterr().out
    assert re.findall(r"^\[[\d:]+\] (\S+):", first, re.M) == STAGES[:1]
    assert re.search(rf"^Not run: {', '.join(STAGES[1:])}\.$", first, re.M)
    before = {name: json.loads((work / "stages" / f"{name}.json").read_text())
              for name in STAGES[:1]}

    assert scale.main(["--work", str(work), *TINY, "--preload"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^\[[\d:]+\] (\S+):", out, re.M) == STAGES[1:]  # generate resumed
    results = {name: json.loads((work / "stages" / f"{name}.json").read_text()) for name in STAGES}
    assert {name: results[name] for name in before} == before
    for name, result in results.items():
        assert result["wall_seconds"] > 0 and result["peak_rss_mib"] > 100, result
        assert result["cpu_seconds"] > 0, result
        assert re.search(rf"^\| {name} \| [\d.]+ \| [\d,]+ \| [\d.]+ \| ", out, re.M), name
    convert = results["convert"]
    assert convert["lists"] == {"train": 12, "vali": 4, "test": 4}  # 3:1:1 by query
    docs = {split: len((work / "text" / f"{split}.txt").read_text().splitlines())
            for split in ("train", "vali", "test")}
    assert convert["docs"] == docs and convert["docs_per_second"] > 0
    assert re.search(r"^\| convert \|.* docs/s, [\d,]+ docs per CPU second \|$", out, re.M)
    for model in (results["train-linear"], results["lightgbm"]):
        assert 0 < model["validation"] <= 1 and 0 < model["test"] <= 1, model
        assert 0 < model["seconds_to_best"] and model["best_epoch"] >= 1
    assert results["evaluate-linear"]["test"] == pytest.approx(results["train-linear"]["test"],
                                                              abs=1e-6)
    assert (work / results["export-linear"]["path"] / "saved_model.pb").is_file()
    assert re.search(r"^\| linear \| [\d.]+ \| epoch 1 of 1 \| 0\.\d{4} \| 0\.\d{4} \|$", out,
                     re.M)
    assert re.search(r"^\| LightGBM lambdarank \| [\d.]+ \| round \d+ of 10 \|", out, re.M)
    assert "Not run" not in out and (work / "table.md").read_text() in out

    with pytest.raises(SystemExit, match="was made with"):
        scale.main(["--work", str(work), *TINY[:-2], "--lightgbm-rounds", "11"])
