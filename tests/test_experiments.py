"""The experiments program (benchmarks/experiments.py): its command line, its cache, a set of the
user's own (fold trees, S1..S5 parts, LightGBM files) run end to end on tiny generated data, one
real run of each kind, and the report of every study, with every table and plot, over a synthetic
cache of every study's runs."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from benchmarks import experiment_runs, experiments
from benchmarks.experiment_runs import DataSet, data_key, ensemble_scores
from benchmarks.experiment_studies import Setting, ensemble_of, runs_of, studies
from benchmarks.results_cache import read_cached
from conftest import REPO
from tfapprox.data import write_letor, write_splits

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

LIGHTGBM = ["--study", "lightgbm", "--folds", "1", "--seeds", "0"]


def fold_tree(root, folds=2, lightgbm_format=False):
    """Writes Fold1..Fold`folds`/{train,vali,test}.txt of tiny generated data; returns `root`."""
    for fold in range(1, folds + 1):
        paths = write_splits(root / f"Fold{fold}", num_queries=30, docs_per_query=8,
                             num_features=5, seed=fold)
        if lightgbm_format:
            for path in paths.values():
                as_lightgbm(path)
    return root


def as_lightgbm(path):
    """Rewrites a LETOR file as LightGBM reads it: no qid:, the query sizes in `<file>.query`."""
    lines = path.read_text().splitlines()
    qids = [line.split()[1] for line in lines]
    sizes = [qids.count(q) for q in dict.fromkeys(qids)]
    path.write_text("".join(f"{line.split(' ', 2)[0]} {line.split(' ', 2)[2]}\n" for line in lines))
    path.with_name(path.name + ".query").write_text("".join(f"{n}\n" for n in sizes))


def five_parts(directory):
    """Writes S1.txt..S5.txt of tiny generated data, five queries each (qids 1..25)."""
    whole = directory / "whole.txt"
    write_letor(whole, num_queries=25, docs_per_query=8, num_features=5)
    parts = {}
    for line in whole.read_text().splitlines():
        qid = int(line.split()[1][4:])
        parts.setdefault((qid - 1) // 5 + 1, []).append(line + "\n")
    whole.unlink()
    for part, lines in parts.items():
        (directory / f"S{part}.txt").write_text("".join(lines))


def lightgbm_cache_paths(cache, dataset, data_dir=None):
    """Returns Fold1 seed 0's cache files; `data_dir`: a set of the user's, keyed by its data."""
    setting = studies()["lightgbm"][0]
    keys = data_dir and {1: data_key(DataSet(dataset, data_dir).folds()[1])}
    return [run.cache_path(cache) for run in runs_of(setting, dataset, [1], [0], 1, keys)]


@pytest.mark.parametrize("content", ["", '{"validation": {"ndcg@10": 0.5}, "qi', "[]"])
def test_report_names_an_unreadable_cache_file(tmp_path, capsys, content):
    broken = lightgbm_cache_paths(tmp_path / "cache", "OHSUMED")[0]
    broken.parent.mkdir(parents=True)
    broken.write_text(content)
    assert experiments.main(["report", *LIGHTGBM, "--dataset", "OHSUMED", "--cache",
                             str(tmp_path / "cache"), "--out", str(tmp_path / "docs")]) == 0
    named = [line for line in capsys.readouterr().out.splitlines() if str(broken) in line]
    assert len(named) == 1 and "unreadable" in named[0]
    assert "| not run" in (tmp_path / "docs" / "results.md").read_text()


def test_run_redoes_an_unreadable_cache_file(tmp_path, capsys):
    cache, data = tmp_path / "cache", fold_tree(tmp_path / "data")
    paths = lightgbm_cache_paths(cache, "mine", data)
    paths[0].parent.mkdir(parents=True)
    paths[0].write_text('{"validation": {"ndc')
    assert experiments.main(["run", *LIGHTGBM, "--data-dir", str(data),
                             "--name", "mine", "--cache", str(cache),
                             "--work", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    assert f"{len(paths)} to run" in out and str(paths[0]) in out
    assert json.loads(paths[0].read_text())["run"]["fold"] == 1


def _run_with_one_failing(tmp_path, monkeypatch, failing, error):
    """Runs the 3 LightGBM runs of a set of one's own with run number `failing` (1-based) raising
    `error`; returns (the exit status, whether each run is cached)."""
    cache, data = tmp_path / "cache", fold_tree(tmp_path / "data")
    paths = lightgbm_cache_paths(cache, "mine", data)
    real_execute, calls = experiments.execute, []

    def one_fails(run, files, scratch):
        calls.append(run)
        if len(calls) == failing:
            raise error
        return real_execute(run, files, scratch)

    monkeypatch.setattr(experiments, "execute", one_fails)
    status = experiments.main(["run", *LIGHTGBM, "--data-dir", str(data), "--name", "mine",
                               "--cache", str(cache), "--work", str(tmp_path / "work")])
    return status, [path.exists() for path in paths]


def test_a_diverged_run_is_reported_and_the_study_goes_on(tmp_path, capsys, monkeypatch):
    """The trainer's FloatingPointError in one run costs that run only: it is named, left
    uncached, the other runs are cached, and the exit status says a run diverged."""
    error = FloatingPointError("validation ndcg@10 is nan after epoch 3")
    assert _run_with_one_failing(tmp_path, monkeypatch, 2, error) == (1, [True, False, True])
    out, err = capsys.readouterr()
    assert "[2/3]" in out and "diverged, not cached: validation ndcg@10 is nan" in out
    assert "1 of 3 runs diverged" in err


def test_a_run_another_process_is_running_is_skipped(tmp_path, capsys, monkeypatch):
    """Two processes sharing a cache can reach the same run at once: the one that finds its run
    directory locked skips it (the other caches it) and goes on with the rest."""
    from trainer.run_lock import RunDirInUse

    error = RunDirInUse("run directory R is in use by another trainer")
    assert _run_with_one_failing(tmp_path, monkeypatch, 1, error) == (0, [False, True, True])
    assert "[1/3]" in capsys.readouterr().out.split("being run by another process, skipped")[0]


def test_a_run_cached_meanwhile_by_another_process_is_not_run_again(tmp_path, capsys,
                                                                      monkeypatch):
    cache, data = tmp_path / "cache", fold_tree(tmp_path / "data")
    paths = lightgbm_cache_paths(cache, "mine", data)
    real_execute, calls = experiments.execute, []

    def caches_the_next_one_too(run, files, scratch):  # as a second process would
        calls.append(run)
        result = real_execute(run, files, scratch)
        if len(calls) == 1:
            paths[1].parent.mkdir(parents=True, exist_ok=True)
            paths[1].write_text(json.dumps(result))
        return result

    monkeypatch.setattr(experiments, "execute", caches_the_next_one_too)
    assert experiments.main(["run", *LIGHTGBM, "--data-dir", str(data), "--name", "mine",
                             "--cache", str(cache), "--work", str(tmp_path / "work")]) == 0
    assert re.search(r"^\[2/3\] .*: cached meanwhile by another process$",
                     capsys.readouterr().out, re.MULTILINE)
    assert len(calls) == 2 and all(path.exists() for path in paths)


@pytest.mark.parametrize("flags, flag", [
    (["--folds", "7"], "--folds 7"), (["--folds", "0"], "--folds"), (["--epochs", "0"], "--epochs"),
    (["--seeds", "-1"], "--seeds"), (["--name", "../up"], "--name"), (["--name", ""], "--name"),
    (["--name", "n" * 300], "--name"),
    (["--dataset", "OHSUMED"], "--dataset"), (["--data-dir", "/nonexistent/set"], "--data-dir")])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, flags, flag):
    if "--data-dir" not in flags:
        flags = ["--data-dir", str(fold_tree(tmp_path / "data")), *flags]
    with pytest.raises(SystemExit) as exit_:
        experiments.main(["run", "--study", "lightgbm", "--cache", str(tmp_path / "cache"),
                          "--work", str(tmp_path / "work"), *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error: " in err[-1] and flag in err[-1] and "Traceback" not in "".join(err)
    assert not (tmp_path / "cache").exists()


def test_results_are_keyed_by_the_data_they_came_from(tmp_path, capsys):
    """Two sets under one name, or one set edited in place, never share a cached result."""
    first, second = fold_tree(tmp_path / "one", folds=1), fold_tree(tmp_path / "two", folds=1)
    flags = [*LIGHTGBM, "--name", "same", "--cache", str(tmp_path / "cache"),
             "--work", str(tmp_path / "work")]
    assert experiments.main(["run", "--data-dir", str(first), *flags]) == 0
    assert "3 runs planned, 0 cached, 3 to run" in capsys.readouterr().out

    def report(data):
        out = tmp_path / "report"
        assert experiments.main(["report", "--data-dir", str(data), *flags, "--out", str(out)]) == 0
        return (out / "results.md").read_text().split("### LightGBM")[1]

    assert "| not run" not in report(first)
    assert "| not run" in report(second)
    test_file = first / "Fold1" / "test.txt"
    test_file.write_text(test_file.read_text().replace("qid:", "qid:9", 1))  # edited in place
    assert "| not run" in report(first)
    capsys.readouterr()
    assert experiments.main(["run", "--data-dir", str(second), *flags]) == 0
    assert "3 runs planned, 0 cached, 3 to run" in capsys.readouterr().out


def test_missing_shared_data_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        experiments.main(["run", "--data", "/nonexistent/letor"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: --data: /nonexistent/letor/OHSUMED: expected S1.txt..S5.txt or Fold1..Fold5/ "
        "directories (/nonexistent/letor/OHSUMED: no Fold<N>/ directories with train/vali/test "
        "files)")


def test_shared_data_is_read_in_place_and_nothing_there_is_run(tmp_path, capsys):
    data = tmp_path / "data"
    (data / "OHSUMED").mkdir(parents=True)
    five_parts(data / "OHSUMED")
    script = data / "make_folds.sh"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\nexit 1\n")
    script.chmod(0o755)
    assert experiments.main(["run", *LIGHTGBM, "--dataset", "OHSUMED", "--data", str(data),
                             "--cache", str(tmp_path / "cache"),
                             "--work", str(tmp_path / "work")]) == 0
    assert not (tmp_path / "ran").exists()
    assert all(p.exists() for p in lightgbm_cache_paths(tmp_path / "cache", "OHSUMED"))
    with pytest.raises(SystemExit):
        experiments.main(["--help"])
    assert "read in place; nothing is run" in " ".join(capsys.readouterr().out.split())


def test_smoke_removes_its_temporary_directory(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    out = tmp_path / "docs"
    assert experiments.main(["run", "--smoke", "--study", "lightgbm", "--data-dir",
                             str(fold_tree(tmp_path / "data")), "--out", str(out)]) == 0
    assert list(temp.iterdir()) == []
    assert "LightGBM lambdarank" in (out / "results.md").read_text()


def test_own_lightgbm_format_set_runs_and_has_its_own_report(tmp_path, capsys):
    data = fold_tree(tmp_path / "data", folds=2, lightgbm_format=True)
    flags = ["--data-dir", str(data), "--name", "mine", "--study", "chen", "lightgbm",
             "--loss", "ranknet", "lambdarank", "--folds", "2", "--seeds", "0", "--epochs", "1",
             "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "report"),
             "--work", str(tmp_path / "work")]
    assert experiments.main(["run", *flags]) == 0
    assert "5 runs planned, 0 cached, 5 to run" in capsys.readouterr().out  # 2 neural, 3 LightGBM
    assert experiments.main(["report", *flags]) == 0
    text = (tmp_path / "report" / "results.md").read_text()
    assert f"on mine ({data})" in text and "## mine" in text
    assert f"--study chen --data-dir {data} --name mine`" in text
    chen = re.search(r"\| B64 ranknet\(\) \| 1 \| (\d\.\d{4}) ± 0\.0000 \|", text)
    assert chen and 0 < float(chen.group(1)) <= 1
    lightgbm = text[text.index("### LightGBM"):]
    assert re.search(r"\| ndcg@10 \| [+-]\d\.\d{4} \(p = \d\.\d{3}\) \|", lightgbm)
    assert "Qin et al." not in text and "Bruch" not in text and "| not run" in text  # weighted
    assert sorted(p.name for p in (data / "Fold1").iterdir()) == sorted(
        f"{split}.txt{suffix}" for split in ("train", "vali", "test") for suffix in ("", ".query"))


REPORT_TITLES = ("Chen et al. 2009", "Qin et al. 2010", "Yilmaz & Robertson", "SVM^map",
                 "Bruch et al. 2019", "LightGBM lambdarank", "tightness", "Tuned GBDTs",
                 "catboost YetiRank", "xgboost rank:ndcg", "Reference (best GBDT",
                 "dasalc approx_ndcg", "dasalc pairwise_soft_zero_one_loss() ensemble of 3 seeds",
                 "Training in bfloat16", "LETOR's convention", "Every loss of `tfapprox.losses`",
                 "## Summary", "| best DASALC | ", "| catboost (tuned) | ",
                 "| recommended recipe | ", "## Ensembles of different settings",
                 "The recommended recipe against the tuned GBDTs", "**On OHSUMED, in test NDCG@10",
                 "| mixed_quantile_list_standardized | OHSUMED | ",
                 "Recipe mixed_quantile_list_standardized: the rule's 3 best of the dasalc, "
                 "dasalc_quantile, losses, losses_quantile, list_standardized studies on OHSUMED. "
                 "From the cache, best first: ")


def test_the_report_of_every_study_writes_every_table_and_plot(tmp_path):
    """The report over a cache of every run of every study (synthetic results, one fold, two
    seeds; the recommended recipe's members best on validation, so its rule picks them)."""
    from test_results_cache import synthetic_cache

    synthetic_cache(tmp_path / "cache", "OHSUMED", names=list(studies()), folds=[1], seeds=[0, 1],
                    lifted=studies()["list_standardized"])
    assert experiments.main(["report", "--dataset", "OHSUMED", "--folds", "1", "--seeds", "0", "1",
                             "--cache", str(tmp_path / "cache"),
                             "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "results.md").read_text()
    for title in REPORT_TITLES:
        assert title in text, title
    assert "| not run" not in text and "Not run on" not in text, "every table should be full"
    assert "Its members are these.\n" in text.split("Recipe mixed_quantile_list_standardized")[1]
    assert re.search(r"\| recommended recipe \| \d\.\d{4} \([+-]\d\.\d{4}, p = \d\.\d{3}\) \|",
                     text)
    assert re.search(r"\(p = \d\.\d{3}\)", text)  # paired tests were computed
    plots = re.findall(r"\]\((results/\S+\.png)\)", text)
    assert len(plots) == 3 and all((tmp_path / "out" / plot).is_file() for plot in plots)


def test_a_set_still_running_is_reported_over_the_folds_it_has_run(tmp_path):
    """MQ2008_AGG with the recommended recipe and the GBDTs run on Fold1 only (of Folds 1-2):
    its tables are over Fold1, said so with the command that resumes the rest."""
    from test_results_cache import synthetic_cache

    synthetic_cache(tmp_path / "cache", "MQ2008_AGG", names=["gbdt", "recommended"], folds=[1],
                    seeds=[0, 1])
    assert experiments.main(["report", "--dataset", "MQ2008_AGG", "--folds", "1", "2", "--seeds",
                             "0", "1", "--cache", str(tmp_path / "cache"),
                             "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "results.md").read_text()
    assert ("**Partial**: the runs on MQ2008_AGG so far cover fold 1 of 1, 2, so its tables are "
            "over that fold only; `python -m benchmarks.experiments run --study gbdt recommended "
            "--dataset MQ2008_AGG` resumes them.") in text
    section = text.split("### The recommended recipe against the tuned GBDTs")[1]
    assert "not run" not in section and "**On MQ2008_AGG, in test NDCG@10, the recipe**" in section
    assert re.search(r"\| recommended recipe \| \d\.\d{4} \([+-]\d\.\d{4}, p = \d\.\d{3}\) \|",
                     text)  # over the folds run, all of whose runs are in
    assert "- MQ2008_AGG: fold 1 only, the runs so far (partial; see its section)." in text


def with_missing_values(root):
    """Rewrites every third line of each fold file under `root` with feature 2 missing (NULL,
    as LETOR 4.0's aggregation sets write it); returns `root`."""
    for path in root.rglob("*.txt"):
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(re.sub(r" 2:\S+", " 2:NULL", line) if i % 3 == 0 else line
                                for i, line in enumerate(lines)))
    return root


def test_one_real_run_of_each_kind_is_cached_and_read_by_the_report(tmp_path, monkeypatch):
    """Each kind of run the runner executes differently, trained for real on a tiny fold (the
    ensembles' runs: the tests of ensembles below): a neural run (its history plotted) and each
    GBDT on data with missing values, and AdaRank (5 rounds, not 100: each round measures every
    query eagerly, most of this test's time at 100)."""
    from benchmarks import experiment_report

    def few_adarank_rounds(dataset, real=experiment_runs.trainer_config):
        config = real(dataset)
        config["model"]["adarank_rounds"] = 5
        return config

    monkeypatch.setattr(experiment_runs, "trainer_config", few_adarank_rounds)

    every = studies()
    alpha_10 = next(s for s in every["bruch_alpha"] if dict(s.params)["alpha"] == 10.0)
    kinds = {"holes": [alpha_10, *(s.first_point_only() for s in every["gbdt"])],
             "mine": [next(s for s in every["direct"] if s.model == "adarank")]}
    cache, rows = tmp_path / "cache", []
    for name, settings in kinds.items():
        data = fold_tree(tmp_path / name, folds=1)
        if name == "holes":
            with_missing_values(data)
        files = DataSet(name, data).folds()
        keys = {1: data_key(files[1])}
        assert experiments.run_all(settings, {name: files}, [1], [0], 1, cache,
                                   tmp_path / "work", {name: keys}) == 0
        rows += [experiment_report.Selected(s, name, cache, [1], [0], 1, print, keys)
                 for s in settings]
    for row in rows:
        mean, _ = row.cell([1], "ndcg@10")
        assert 0 < mean <= 1 and row.seconds_per_fold([1]) > 0, row.setting.label()
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    text = experiment_report._tightness(rows[0], DataSet("holes", tmp_path / "holes"), [1], out)
    assert "over 1 runs" in text and (out / "results" / "holes_tightness.png").is_file()


def test_the_dasalc_study_compares_its_losses():
    assert {s.loss for s in studies()["dasalc"]} == {"approx_ndcg", "approx_ap", "softmax_loss",
                                                      "ranknet", "pairwise_soft_zero_one_loss"}


def test_a_changed_recipe_never_reads_the_old_recipes_results(monkeypatch):
    from tfapprox import models

    dasalc, b256 = studies()["dasalc"][0], studies()["dasalc_ablation"][-1]

    def paths():
        return [runs_of(s, "YAHOO", [1], [0], 40)[0].cache_path(Path("c")) for s in (dasalc, b256)]

    before = paths()
    monkeypatch.setitem(models.RECIPES, "DASALC", {**models.RECIPES["DASALC"], "noise_stddev": 9.0})
    after = paths()
    assert after[0] != before[0] and after[1] == before[1]  # the B-net's key is its own


def test_the_losses_study_has_every_registered_loss_and_get_builds_each():
    from tfapprox import losses

    settings = studies()["losses"]
    assert [s.loss for s in settings] == list(losses.LOSSES)
    assert {s.model for s in settings} == {"B64"}
    for setting in settings:
        built = losses.get(setting.loss, **dict(setting.params))
        assert type(built) is losses.LOSSES[setting.loss]


def test_the_losses_smoke_adds_one_run_to_the_others():
    def run_set(names):
        return {run for name, settings in studies(smoke=True).items() if name in names
                for setting in settings for run in runs_of(setting, "OHSUMED", [1], [0], 1)}

    others = set(studies()) - {"losses"}
    assert len(run_set({"losses"}) - run_set(others)) == 1


def test_ensemble_scores_average_each_members_scores_standardised_within_each_list():
    members = [[np.array([1.0, 2.0, 3.0]), np.array([5.0, 5.0]), np.array([7.0])],
               [np.array([10.0, 30.0, 20.0]), np.array([1.0, 2.0]), np.array([-3.0])]]
    z = np.sqrt(1.5)  # (3 − 2) / std(1, 2, 3)
    combined = ensemble_scores(members)
    np.testing.assert_allclose(combined[0], [(-z - z) / 2, (0 + z) / 2, (z + 0) / 2])
    np.testing.assert_allclose(combined[1], [-0.5, 0.5])  # all-equal scores give zeros
    np.testing.assert_array_equal(combined[2], [0.0])  # so does a one-document list
    # each member's own scale and shift are gone: only its order within each list counts
    rescaled = [members[0], [100.0 * s - 7.0 for s in members[1]]]
    for a, b in zip(ensemble_scores(rescaled), combined):
        np.testing.assert_allclose(a, b)


def test_single_runs_keep_their_cache_paths_and_an_ensemble_is_made_of_them():
    cache = REPO / "benchmarks" / "results"
    single = (cache / "MQ2008" / "dasalc" / "pairwise_soft_zero_one_loss-default-e40"
              / "Fold1-seed0-ef482690d4.json")
    setting = next(s for s in studies()["dasalc"] if s.loss == "pairwise_soft_zero_one_loss")
    assert runs_of(setting, "MQ2008", [1], [0], 40)[0].cache_path(cache) == single
    ensemble = runs_of(studies()["dasalc_ensemble"][0], "MQ2008", [1], [1], 40)[0]
    assert [m.seed for m in ensemble.member_runs()] == [3, 4, 5]
    assert (ensemble.cache_path(cache).parent.name
            == "pairwise_soft_zero_one_loss-default-e40-ensemble3")
    members = runs_of(studies()["dasalc_ensemble"][0], "MQ2008", [1], [0], 40)[0].member_runs()
    assert [m.cache_path(cache) for m in members] == [
        run.cache_path(cache) for run in runs_of(setting, "MQ2008", [1], [0, 1, 2], 40)]
    assert members[0].cache_path(cache) == single
    cached = read_cached(cache, members[0], print)["run"]  # the committed result
    assert (cached["model"], cached["loss"], cached["seed"]) == ("dasalc", setting.loss, 0)


def test_an_ensemble_restores_its_cached_members_and_trains_only_a_missing_one(mixed_ensemble,
                                                                               monkeypatch):
    from trainer import train

    files, cache, work, _ = mixed_ensemble
    setting = Setting("linear", "ranknet", members=2)

    def run_all():
        return experiments.run_all([setting], {"mine": files}, [1], [0], 1, cache, work, {})

    # its members are single runs: seed 0, the mixed ensemble's ranknet member, is restored from
    # the cache and its checkpoint; seed 1 is trained and cached; then the ensemble is scored
    assert run_all() == 0
    ensemble = runs_of(setting, "mine", [1], [0], 1)[0]
    first = read_cached(cache, ensemble, print)
    members = [read_cached(cache, m, print) for m in ensemble.member_runs()]
    assert [m["run"]["seed"] for m in members] == [0, 1]
    code = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip()
    assert code and all(m["code"].startswith(code) for m in [first, *members])  # what produced it
    num_features = experiment_runs._num_features(files[1])
    alone = experiment_runs._ensemble(ensemble.member_runs()[1], files[1], num_features, work)
    assert alone["test"] == members[1]["test"]  # restored and scored alone: the run as trained

    trained, real_train = [], train.train

    def counted_train(config, **kwargs):
        trained.append(config.train.seed)
        return real_train(config, **kwargs)

    monkeypatch.setattr(train, "train", counted_train)
    ensemble.cache_path(cache).unlink()
    assert run_all() == 0 and trained == []  # its members restored, none trained
    assert read_cached(cache, ensemble, print)["test"] == first["test"]
    ensemble.cache_path(cache).unlink()
    shutil.rmtree(work / ensemble.member_runs()[1].cache_path(Path()).with_suffix(""))
    assert run_all() == 0 and trained == [1]  # cached, but its checkpoint gone: trained again


def test_an_ensemble_of_seed_ensembles_combines_each_members_k_seeds_of_its_seed():
    import dataclasses

    ranknet, listmle = Setting("linear", "ranknet"), Setting("linear", "listmle")
    mixed = ensemble_of("pair3", *(dataclasses.replace(s, members=3) for s in (ranknet, listmle)))
    assert mixed.label() == "ensemble of 3 seeds each of linear ranknet() + linear listmle()"
    ensemble = runs_of(mixed, "mine", [1], [1], 1)[0]
    assert ensemble.label() == mixed.label()
    assert [(m.loss, m.seed, m.members) for m in ensemble.member_runs()] == [
        (loss, seed, 1) for loss in ("ranknet", "listmle") for seed in (3, 4, 5)]
    assert ensemble.cache_path(Path("c")).parent.name == "pair3-default-e1-ensemble6"
    with pytest.raises(ValueError, match="members of its own"):
        ensemble_of("nested", mixed)


@pytest.fixture(scope="module")
def mixed_ensemble(tmp_path_factory):
    """An ensemble of linear ranknet and linear listmle (seed 0) run by run_all on a tiny fold:
    (its data's folds, cache, work directory, the (loss, seed) of each run trained). The ensemble
    of ranknet's seeds below shares the fold, cache and work directory: its seed 0 is this
    ensemble's ranknet member, cached."""
    from trainer import train

    root = tmp_path_factory.mktemp("ensembles")
    data, cache, work = fold_tree(root / "data", folds=1), root / "cache", root / "work"
    files = DataSet("mine", data).folds()
    mixed = ensemble_of("pair", Setting("linear", "ranknet"), Setting("linear", "listmle"))
    trained, real_train = [], train.train

    def counted_train(config, **kwargs):
        trained.append((config.loss.name, config.train.seed))
        return real_train(config, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "train", counted_train)
        status = experiments.run_all([mixed], {"mine": files}, [1], [0], 1, cache, work, {})
    assert status == 0
    return files, cache, work, trained


def test_an_ensemble_of_different_settings_combines_their_runs_of_its_own_seed(mixed_ensemble):
    files, cache, work, trained = mixed_ensemble
    ranknet, listmle = Setting("linear", "ranknet"), Setting("linear", "listmle")
    mixed = ensemble_of("pair", ranknet, listmle)
    assert mixed.label() == "ensemble of linear ranknet() + linear listmle()"
    ensemble = runs_of(mixed, "mine", [1], [2], 1)[0]
    assert ensemble.member_runs() == [runs_of(s, "mine", [1], [2], 1)[0] for s in (ranknet,
                                                                                    listmle)]
    assert ensemble.cache_path(cache).parent.name == "pair-default-e1-ensemble2"
    with pytest.raises(ValueError, match="linear ranknet.*has a grid"):
        ensemble_of("gridded", Setting("linear", "ranknet", grid=(("alpha", (1.0, 2.0)),)))

    # run_all([mixed], seed 0): the fixture's
    assert sorted(trained) == [("listmle", 0), ("ranknet", 0)]  # each member once, as itself
    members = [read_cached(cache, m, print)
               for m in runs_of(mixed, "mine", [1], [0], 1)[0].member_runs()]
    assert [(m["run"]["loss"], m["run"]["seed"]) for m in members] == [("ranknet", 0),
                                                                       ("listmle", 0)]
    assert read_cached(cache, runs_of(mixed, "mine", [1], [0], 1)[0], print)


def test_a_checkpoint_the_trainer_refuses_starts_the_run_over(monkeypatch):
    """An unfinished run of an earlier invocation whose checkpoint the trainer refuses (its data
    files were copied again, so their modification times changed) trains afresh, not a
    traceback that stops every run after it."""
    from trainer import checkpoint, train

    calls = []

    def refusing_once(config, *, fresh=False, print_fn=print, dist=None):
        calls.append(fresh)
        if not fresh:
            raise checkpoint.CheckpointError("run holds a checkpoint trained on other data")
        return {"trained": config}

    monkeypatch.setattr(train, "train", refusing_once)
    assert experiment_runs._train("config") == {"trained": "config"}
    assert calls == [False, True]
