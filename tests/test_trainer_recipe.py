"""`python -m trainer train --recipe` and `cv --recipe`: members trained as runs of their own,
resumed after an interruption, trained in parallel processes, ensembled, scored and exported."""

import json
import os
import signal
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from tfapprox.data import write_splits
from trainer import checkpoint, interrupts, recipes, train
from trainer.__main__ import main

pytestmark = pytest.mark.slow  # trains and runs processes: `-m "not slow"` skips it

NUM_FEATURES = 8
MEMBERS = [m.name for m in recipes.RECIPES[recipes.RECOMMENDED].members]


def tiny_config(directory: Path) -> str:
    """A config file: 40 generated queries, small batches, only the selection metric; the recipe
    sets everything else."""
    path = directory / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "data": {"synthetic": {"num_queries": 40, "docs_per_query": 10,
                               "num_features": NUM_FEATURES},
                 "cache_dir": str(directory / "cache")},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "train": {"batch_size": 8, "metrics": []},
    }))
    return str(path)


def recipe_command(config: str, run_dir: Path, *extra: str) -> list[str]:
    return ["train", "--recipe", "recommended", "--config", config, "--run-dir", str(run_dir),
            *extra]


def member_state(run_dir: Path, name: str) -> checkpoint.RunState | None:
    return checkpoint.load_state(run_dir / "members" / name)


def test_interrupted_recipe_resumes_its_member_skips_finished_ones_and_ensembles_and_exports(
        tmp_path, monkeypatch, capsys):
    """Two epochs a member, one recipe run checked twice over (each member's training costs a
    trace of its model, so one run serves both checks):

    1. SIGTERM in the second member's second epoch stops the command; the rerun, two members at a
       time, leaves the finished first member as it was, resumes the second after its first epoch
       and trains the third.
    2. The finished recipe: each member's run with the recipe's settings, the summary of every
       member and the ensemble, and the export, which scores as the saved ensemble does."""
    config = tiny_config(tmp_path)
    run_dir = tmp_path / "run"
    command = recipe_command(config, run_dir, "--epochs", "2",
                             "--export-dir", str(tmp_path / "saved"))
    training = {}
    real_train, real_batch_end = train.train, interrupts.StopWhenRequested.on_train_batch_end

    def train_noting_the_member(member_config, **kwargs):
        training["member"] = Path(member_config.train.run_dir).name
        return real_train(member_config, **kwargs)

    def epoch_begin_noting_the_epoch(self, epoch, logs=None):
        training["epoch"] = epoch

    def batch_end_terminating_the_seconds_second_epoch(self, batch, logs=None):
        if (training["member"], training["epoch"]) == (MEMBERS[1], 1) and not training.get("sent"):
            training["sent"] = True
            os.kill(os.getpid(), signal.SIGTERM)
        real_batch_end(self, batch, logs)

    monkeypatch.setattr(train, "train", train_noting_the_member)
    monkeypatch.setattr(interrupts.StopWhenRequested, "on_epoch_begin",
                        epoch_begin_noting_the_epoch)
    monkeypatch.setattr(interrupts.StopWhenRequested, "on_train_batch_end",
                        batch_end_terminating_the_seconds_second_epoch)
    assert main(command) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM after epoch 1; rerun the same command" in capsys.readouterr().err
    assert [member_state(run_dir, MEMBERS[0]).epoch, member_state(run_dir, MEMBERS[1]).epoch,
            member_state(run_dir, MEMBERS[2])] == [2, 1, None]
    monkeypatch.undo()

    def trained_files(name):  # its checkpoint and TensorBoard logs (a rerun rescores it)
        member = run_dir / "members" / name
        return {p: p.stat().st_mtime_ns for p in [checkpoint.path_in(member),
                                                  *(member / "logs").rglob("*")]}

    untouched = trained_files(MEMBERS[0])
    status = main(command + ["--members-in-parallel", "2"])
    printed = capsys.readouterr().out
    assert status == 0, printed[-3000:]

    # 1. resumed in parallel: the finished member left as it was, the stopped one resumed
    assert trained_files(MEMBERS[0]) == untouched
    logs = {name: (run_dir / "members" / f"{name}.log").read_text() for name in MEMBERS}
    assert "is already trained (2 epochs)" in logs[MEMBERS[0]]
    assert "after epoch 1" in logs[MEMBERS[1]] and "Resuming" in logs[MEMBERS[1]]
    assert "Resuming" not in logs[MEMBERS[2]]
    assert [member_state(run_dir, name).epoch for name in MEMBERS] == [2, 2, 2]

    # 2. the recipe's members, ensemble, summary and export
    results = json.loads((run_dir / "results.json").read_text())
    assert results["recipe"] == recipes.RECOMMENDED
    assert list(results["member_runs"]) == MEMBERS
    for name in MEMBERS:
        member_config = json.loads((run_dir / "members" / name / "config.json").read_text())
        member = results["member_runs"][name]
        assert member["epochs_run"] == 2 and member["test"]["ndcg@10"] > 0
        assert member_config["model"]["input_transform"] == "quantile"
        assert member_config["model"]["list_standardize"] is True
        assert member_config["train"]["select_metric"] == "ndcg@10"
        assert not member_config["export"]["enabled"]
    assert [m["run_dir"] for m in results["members"]] == [
        str(run_dir / "members" / name) for name in MEMBERS]
    # the summary: a validation and a test row for each member and the ensemble, with seconds
    for name in MEMBERS + ["ensemble"]:
        assert f"| {name} | validation |" in printed and f"| {name} | test |" in printed
    ensemble_row = next(line for line in printed.splitlines()
                        if line.startswith("| ensemble | test |"))
    assert f"{results['test']['ndcg@10']:.4f}" in ensemble_row

    model = keras.saving.load_model(run_dir / "ensemble.keras")
    features = np.random.default_rng(0).normal(size=(2, 7, NUM_FEATURES)).astype("float32")
    served = tf.saved_model.load(results["export_path"]).signatures["score_features"]
    np.testing.assert_allclose(served(features=tf.constant(features))["scores"].numpy(),
                               keras.ops.convert_to_numpy(model(features)), rtol=1e-5, atol=1e-6)


def test_recipe_flags_that_would_change_a_member_are_refused(tmp_path, capsys):
    for flags, said in ((["--loss", "ranknet"], "sets loss.name for each member"),
                        (["--preset", "B128"], "sets model.preset for each member"),
                        (["--input-transform", "log1p"], "sets model.input_transform"),
                        (["--recipe", "mixed_quantile"], "given twice")):
        with pytest.raises(SystemExit) as exit_:
            main(recipe_command(tiny_config(tmp_path), tmp_path / "run", *flags))
        assert exit_.value.code == 2 and said in capsys.readouterr().err, flags
    with pytest.raises(SystemExit):
        main(["cv", "--recipe", "recommended", "--grid", "train.seed=1,2"])
    assert "--grid and --recipe" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_cv_recipe_reports_each_folds_ensemble(tmp_path, capsys):
    """`cv --recipe` on a one-fold set of generated data: members and the ensemble under
    OUT/Fold1, the ensemble's test metrics in cv_results."""
    write_splits(tmp_path / "set" / "Fold1", num_queries=40, docs_per_query=10,
                 num_features=NUM_FEATURES)
    assert main(["cv", "--recipe", "recommended", "--config", tiny_config(tmp_path),
                 "--epochs", "1", "--data-dir", str(tmp_path / "set"), "--folds", "1",
                 "--out", str(tmp_path / "cv")]) == 0
    summary = json.loads((tmp_path / "cv" / "cv_results.json").read_text())
    ensemble = json.loads((tmp_path / "cv" / "Fold1" / "results.json").read_text())
    assert summary["method"] == f"recipe {recipes.RECOMMENDED}"
    assert summary["folds"][0]["test"] == ensemble["test"]
    assert sorted(p.name for p in (tmp_path / "cv" / "Fold1" / "members").iterdir()) == sorted(
        MEMBERS)
    assert "export_path" not in ensemble
    assert "Test metrics, recipe" in capsys.readouterr().out
