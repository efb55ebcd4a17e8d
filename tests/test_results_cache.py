"""The experiments' cache (benchmarks/results_cache.py): runs written as files, packed into one
compressed file per set and read from it as from the files, a report from a pack identical to
one from the files, damaged files and packs named, and the shared sets' cache committed packed."""

import dataclasses
import json
import lzma
import re
import subprocess

import numpy as np
import pytest

from benchmarks import experiments, results_cache
from benchmarks.experiment_runs import METRICS
from benchmarks.experiment_studies import runs_of, studies
from benchmarks.results_cache import PACK_SUFFIX, pack, read_cached, unpack, write_cached
from conftest import REPO

STUDIES = ["chen", "lightgbm", "gbdt", "dasalc_ensemble"]  # ensembles read their members too
FOLDS, SEEDS = [1, 2], [0, 1]


HISTORY_KEYS = ("ndcg@10", "approx_ndcg@10", "val_ndcg@10", "val_approx_ndcg@10")


def synthetic_result(run, rng, queries=6, lift=0.0):
    """Returns a result as `run` caches one, with random validation (plus `lift`) and per-query
    test values, a trainer's history of three epochs and an ensemble's members' validation (as
    JSON holds it: lists, not tuples)."""
    result = {"validation": {"ndcg@10": round(float(rng.uniform()) + lift, 6)},
              "qids": [f"q{run.fold}{i}" for i in range(queries)],
              "test": {"values": {name: np.round(rng.uniform(size=queries), 6).tolist()
                                  for name in METRICS},
                       "relevant": [bool(i % 5) for i in range(queries)]},
              "history": [{key: round(float(rng.uniform()), 6) for key in HISTORY_KEYS}
                          for _ in range(3)],
              "wall_seconds": round(float(rng.uniform(1, 30)), 1), "run": dataclasses.asdict(run)}
    if run.ensemble:
        result["members_validation"] = [round(float(rng.uniform()), 6) for _ in run.member_runs()]
    return json.loads(json.dumps(result))


def synthetic_cache(cache, dataset="OHSUMED", names=STUDIES, folds=FOLDS, seeds=SEEDS,
                    lifted=()):
    """Writes a result for every run (ensembles' members included) of the studies `names` on
    `dataset`, the validation of the settings `lifted` above every other's; returns the runs."""
    rng, runs = np.random.default_rng(0), {}
    for name in names:
        for setting in studies()[name]:
            for run in runs_of(setting, dataset, folds, seeds, 40):
                runs.update(dict.fromkeys((*run.member_runs(), run)))
    lifted = {run for setting in lifted for run in runs_of(setting, dataset, [0], [0], 40)}
    for run in runs:
        lift = float(dataclasses.replace(run, fold=0, seed=0) in lifted)
        write_cached(cache, run, synthetic_result(run, rng, lift=lift))
    return list(runs)


def report(cache, out):
    assert experiments.main(["report", "--study", *STUDIES, "--dataset", "OHSUMED", "--folds",
                             *map(str, FOLDS), "--seeds", *map(str, SEEDS), "--cache", str(cache),
                             "--out", str(out)]) == 0
    return (out / "results.md").read_bytes()


def files_under(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow  # two reports: TensorFlow's import and every table
def test_a_report_from_the_pack_is_the_report_from_the_files(tmp_path, capsys):
    cache = tmp_path / "cache"
    runs = synthetic_cache(cache)
    from_files = report(cache, tmp_path / "from_files")
    # every row from every seed, an ensemble's seconds from its members' results
    assert "| lightgbm lambdarank(num_leaves∈{15, 31, 63}) | 2 |" in from_files.decode()
    assert re.search(r"\| dasalc pairwise_soft_zero_one_loss\(\) ensemble of 3 seeds, \d+ s/fold "
                     r"\| 2 \| 0\.\d{4} ± ", from_files.decode())
    assert experiments.main(["pack", "--cache", str(cache)]) == 0
    assert f"packed {len(runs)} runs" in capsys.readouterr().out
    assert files_under(cache) == [f"OHSUMED{PACK_SUFFIX}"]  # the files and their folders gone
    assert report(cache, tmp_path / "from_pack") == from_files


def test_packed_runs_read_as_their_files_and_unpack_gives_the_files_back(tmp_path):
    cache, rng = tmp_path / "cache", np.random.default_rng(1)
    runs = [run for setting in studies()["lightgbm"] for run in runs_of(setting, "MQ2008",
                                                                        FOLDS, SEEDS, 40)]
    for run in runs:
        write_cached(cache, run, synthetic_result(run, rng))
    written = {p: (cache / p).read_bytes() for p in files_under(cache)}
    results = [read_cached(cache, run, print) for run in runs]
    assert pack(cache, print) == len(runs)
    packed = (cache / f"MQ2008{PACK_SUFFIX}").read_bytes()
    assert len(packed) < sum(map(len, written.values())) / 3
    assert [read_cached(cache, run, print) for run in runs] == results

    newer = synthetic_result(runs[0], rng)  # a run cached again: its file is read, then packed
    write_cached(cache, runs[0], newer)
    assert read_cached(cache, runs[0], print) == newer
    assert pack(cache, print) == 1 and read_cached(cache, runs[0], print) == newer

    write_cached(cache, runs[0], results[0])
    assert pack(cache, print) == 1  # the same runs give the same bytes
    assert (cache / f"MQ2008{PACK_SUFFIX}").read_bytes() == packed
    assert unpack(cache, print) == len(runs)
    assert {p: (cache / p).read_bytes() for p in files_under(cache)} == written


def test_an_unreadable_file_stays_and_a_damaged_pack_is_named_not_packed_over(tmp_path):
    cache, rng = tmp_path / "cache", np.random.default_rng(2)
    runs = runs_of(studies()["lightgbm"][0], "MQ2008", FOLDS, SEEDS, 40)
    for run in runs:
        write_cached(cache, run, synthetic_result(run, rng))
    broken = runs[0].cache_path(cache)
    broken.write_text('{"validation": {"ndc')
    said = []
    assert pack(cache, said.append) == len(runs) - 1
    assert broken.exists() and len(said) == 2 and str(broken) in said[0]

    target = cache / f"MQ2008{PACK_SUFFIX}"
    lines = lzma.decompress(target.read_bytes()).decode().splitlines(keepends=True)
    lines[1] = lines[1][:40] + "\n"  # one line cut short
    target.write_bytes(lzma.compress("".join(lines).encode()))
    said.clear()
    missing = [run for run in runs[1:] if read_cached(cache, run, said.append) is None]
    assert len(missing) == 1 and len(said) == 1  # named when a run is not found
    assert said[0].startswith(f"unreadable pack line, counted as not run: {target} line 2 (")
    broken.unlink()
    write_cached(cache, runs[0], synthetic_result(runs[0], rng))
    said.clear()
    assert pack(cache, said.append) == 0 and runs[0].cache_path(cache).exists()
    assert said[0].startswith(f"MQ2008 not packed: its pack {target} could not be read whole")


def test_a_pack_that_cannot_be_written_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    run = runs_of(studies()["lightgbm"][0], "MQ2008", [1], [0], 40)[0]
    write_cached(cache, run, synthetic_result(run, np.random.default_rng(3)))

    def refused(target, entries):
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(results_cache, "_write_pack", refused)
    assert experiments.main(["pack", "--cache", str(cache)]) == 1
    assert capsys.readouterr().err == (f"python -m benchmarks.experiments pack: error: [Errno 13] "
                                       f"Permission denied: '{cache / 'MQ2008'}{PACK_SUFFIX}'\n")
    assert run.cache_path(cache).exists()  # the file kept


def test_the_shared_sets_cache_is_committed_packed():
    listed = subprocess.run(["git", "ls-files", "-z", "benchmarks/results"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    files = [REPO / name for name in listed if name]
    assert files and all(f.name.endswith(PACK_SUFFIX) for f in files)
    assert len(files) <= 50 and sum(f.stat().st_size for f in files) <= 10 * 2**20
