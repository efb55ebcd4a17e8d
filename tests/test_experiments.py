"""The experiments program (benchmarks/experiments.py) runs end to end: its smoke version trains one
fold of every study, LightGBM included, and writes the report with every table and plot."""

import re
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = [pytest.mark.data, pytest.mark.slow]


def test_smoke_run_writes_every_table_and_plot(tmp_path):
    env_python = sys.executable
    done = subprocess.run([env_python, "-m", "benchmarks.experiments", "run", "--smoke"],
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
