"""The experiments program (benchmarks/experiments.py): its command line, its cache, and (slow) its
smoke version, which trains one fold of every study, LightGBM included, and writes the report with
every table and plot."""

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO
from benchmarks import experiments

LIGHTGBM = ["--study", "lightgbm", "--folds", "1", "--seeds", "0"]


def lightgbm_cache_paths(cache, dataset="OHSUMED"):
    setting = experiments.studies()["lightgbm"][0]
    return [run.cache_path(cache) for run in experiments.runs_of(setting, dataset, [1], [0], 1)]


@pytest.mark.parametrize("content", ["", '{"validation": {"ndcg@10": 0.5}, "qi'])
def test_report_names_an_unreadable_cache_file(tmp_path, capsys, content):
    broken = lightgbm_cache_paths(tmp_path / "cache")[0]
    broken.parent.mkdir(parents=True)
    broken.write_text(content)
    assert experiments.main(["report", *LIGHTGBM, "--dataset", "OHSUMED", "--cache",
                             str(tmp_path / "cache"), "--out", str(tmp_path / "docs")]) == 0
    named = [line for line in capsys.readouterr().out.splitlines() if str(broken) in line]
    assert len(named) == 1 and "unreadable" in named[0]
    assert "| not run" in (tmp_path / "docs" / "results.md").read_text()


@pytest.mark.data
def test_run_redoes_an_unreadable_cache_file(tmp_path, capsys):
    cache = tmp_path / "cache"
    paths = lightgbm_cache_paths(cache)
    paths[0].parent.mkdir(parents=True)
    paths[0].write_text('{"validation": {"ndc')
    assert experiments.main(["run", *LIGHTGBM, "--dataset", "OHSUMED", "--cache", str(cache),
                             "--work", str(tmp_path / "work")]) == 0
    assert f"{len(paths)} to run" in capsys.readouterr().out
    assert json.loads(paths[0].read_text())["run"]["fold"] == 1


@pytest.mark.parametrize("flags, flag", [
    (["--folds", "7"], "--folds"), (["--folds", "0"], "--folds"), (["--epochs", "0"], "--epochs"),
    (["--seeds", "-1"], "--seeds"), (["--data", "/nonexistent/letor"], "--data")])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, flags, flag):
    with pytest.raises(SystemExit) as exit_:
        experiments.main(["run", "--study", "lightgbm", "--dataset", "OHSUMED", "--cache",
                          str(tmp_path / "cache"), "--work", str(tmp_path / "work"), *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error: " in err[-1] and flag in err[-1] and "Traceback" not in "".join(err)
    assert not (tmp_path / "cache").exists()


@pytest.mark.data
def test_smoke_removes_its_temporary_directory(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    out = tmp_path / "docs"
    assert experiments.main(["run", "--smoke", "--study", "lightgbm", "--out", str(out)]) == 0
    assert list(temp.iterdir()) == []
    assert "LightGBM lambdarank" in (out / "results.md").read_text()


@pytest.mark.data
@pytest.mark.slow
def test_smoke_run_writes_every_table_and_plot(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.experiments", "run", "--smoke",
                           "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = re.search(r"wrote (\S+results\.md)", done.stdout).group(1)
    text = open(report).read()
    for title in ("Chen et al. 2009", "Qin et al. 2010", "Yilmaz & Robertson", "SVM^map",
                  "Bruch et al. 2019", "LightGBM lambdarank", "tightness"):
        assert title in text
    assert "| not run" not in text, "the smoke run should fill every table"
    assert re.search(r"\(p = \d\.\d{3}\)", text)  # paired tests were computed
    plots = re.findall(r"\]\((results/\S+\.png)\)", text)
    assert len(plots) == 3  # alpha, depth, tightness
