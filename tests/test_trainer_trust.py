"""The trainer touches only what it wrote and reads exactly the data it was given.

Run directories the user made are refused, `--fresh` removes only the trainer's files, no write
follows a symbolic link, a changed split is not resumed, an explicit split file is never ignored,
and splits of different widths are refused.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from tfapprox.data import synthetic
from trainer import checkpoint, config as config_lib, data, run_files, run_lock, train
from trainer.__main__ import main
from trainer.config import DataConfig

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

TINY = {"num_queries": 30, "docs_per_query": 6, "num_features": 5}


def fold(directory, **params):
    synthetic.write_splits(directory, **{**TINY, **params})
    return directory


def fold_config(tmp_path, fold_dir, run_dir=None, **overrides):
    values = config_lib.load_dict("demo")
    config_lib.apply_overrides(values, {
        "data.dir": str(fold_dir), "data.cache_dir": str(tmp_path / "cache"),
        "model.preset": "linear", "optimizer.name": "adam", "optimizer.learning_rate": 0.01,
        "train.batch_size": 8, "train.epochs": 1, "train.patience": 0, "train.metrics": [],
        "train.run_dir": str(run_dir or tmp_path / "run"), "export.enabled": False, **overrides,
    })
    return config_lib.Config.from_dict(values)


def quiet(_):
    pass


@pytest.fixture(scope="module")
def shared_fold(tmp_path_factory):
    return fold(tmp_path_factory.mktemp("fold"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shared_fold):
    """One finished one-epoch run on `shared_fold`: `(its run directory, its results)`. Tests that
    change a run work on a copy (`copy_of`)."""
    tmp_path = tmp_path_factory.mktemp("trained")
    run_dir = tmp_path / "run"
    return run_dir, train.train(fold_config(tmp_path, shared_fold, run_dir), print_fn=quiet)


def copy_of(trained, run_dir):
    """Copies the trained run to `run_dir` and returns it: a run there resumes from the copy, whose
    checkpoint names its data by file name, size and time, not by path."""
    shutil.copytree(trained[0], run_dir)
    return run_dir


# -- run directories -------------------------------------------------------------------------------


def test_a_run_directory_the_user_made_is_refused_and_left_alone(tmp_path, shared_fold):
    project = tmp_path / "proj"
    (project / "logs").mkdir(parents=True)
    (project / "logs" / "app.log").write_text("precious")
    (project / "config.json").write_text('{"mine": true}')
    for fresh in (False, True):
        with pytest.raises(run_files.ForeignRunDir, match=r"holds config.json, logs.*did not write"):
            train.train(fold_config(tmp_path, shared_fold, project), fresh=fresh, print_fn=quiet)
    assert (project / "logs" / "app.log").read_text() == "precious"
    assert (project / "config.json").read_text() == '{"mine": true}'
    assert sorted(p.name for p in project.iterdir()) == ["config.json", "logs"]


def test_the_cli_refuses_the_users_config_file_as_a_run_directory(tmp_path, shared_fold, capsys):
    project = tmp_path / "proj"
    project.mkdir()
    user_config = project / "config.json"
    user_config.write_text(json.dumps(fold_config(tmp_path, shared_fold, project).to_dict()))
    before = user_config.read_text()
    with pytest.raises(SystemExit) as exit_info:  # refused before anything loads or trains
        main(["train", "--config", str(user_config), "--run-dir", str(project)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds config.json, which the trainer did not write" in err
    assert user_config.read_text() == before and not (project / "results.json").exists()


def test_the_lock_does_not_follow_a_symbolic_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    run_dir = tmp_path / "run"
    run_files.claim(run_dir)
    (run_dir / run_lock.FILENAME).symlink_to(victim)
    with pytest.raises(run_files.ForeignRunDir, match="symbolic link"):
        with run_lock.hold(run_dir):
            pass
    assert victim.read_text() == "keep me"


def test_run_files_are_replaced_not_written_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    run_dir = run_files.claim(tmp_path / "run")
    (run_dir / "results.json").symlink_to(victim)
    run_files.write_json(run_dir / "results.json", {"a": 1})
    assert victim.read_text() == "keep me"
    assert json.loads((run_dir / "results.json").read_text()) == {"a": 1}
    assert not (run_dir / "results.json").is_symlink()


def test_claiming_shows_no_temporary_name_and_workers_leave_the_check_to_the_chief(
        tmp_path, monkeypatch):
    """Other workers of a cluster start beside the chief as it claims the run directory: the
    marker appears under its own name at once, and only the chief checks the directory."""
    run_dir = tmp_path / "run"
    seen = []
    create_file = run_files.files.create_file
    monkeypatch.setattr(run_files.files, "create_file",
                        lambda path: (seen.append(sorted(os.listdir(run_dir))), create_file(path))[1])
    run_files.claim(run_dir)
    assert seen == [[]] and sorted(os.listdir(run_dir)) == [run_files.MARKER]

    from trainer import __main__ as cli, distribute

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / ".tfapprox-run.abc.tmp").write_text("")  # as if a chief were writing its marker
    config = config_lib.Config.from_dict(config_lib.load_dict(None))
    config.train.run_dir, config.export.enabled = str(foreign), False
    worker = distribute.Distribution(None, "multi_worker", False, 1, 2)
    monkeypatch.setattr(worker, "check_batch_size", lambda _: None)
    cli._check("train", config, worker)
    chief = distribute.Distribution(None, "multi_worker", True, 0, 2)
    monkeypatch.setattr(chief, "check_batch_size", lambda _: None)
    with pytest.raises(run_files.ForeignRunDir, match="did not write"):
        cli._check("train", config, chief)


def test_logs_and_run_directories_that_are_links_are_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = run_files.claim(tmp_path / "run")
    (run_dir / "logs").symlink_to(elsewhere)
    with pytest.raises(run_files.ForeignRunDir, match="logs is a symbolic link"):
        run_files.log_dirs(run_dir)
    assert list(elsewhere.iterdir()) == []
    linked = tmp_path / "linked"
    linked.symlink_to(run_dir)
    with pytest.raises(run_files.ForeignRunDir, match="is a symbolic link"):
        run_files.claim(linked)


def test_fresh_does_not_follow_links_in_logs(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "events.out.tfevents.1").write_text("theirs")
    run_dir = run_files.claim(tmp_path / "run")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "train").symlink_to(elsewhere)
    run_files.clear(run_dir)
    assert (elsewhere / "events.out.tfevents.1").read_text() == "theirs"


def test_evaluate_writes_only_into_a_trainers_run_directory(tmp_path, capsys):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "config.json").write_text(json.dumps(config_lib.Config().to_dict()))
    assert main(["evaluate", "--run-dir", str(project)]) == 1
    assert "not a run directory the trainer made" in capsys.readouterr().err
    assert not (project / "evaluation.json").exists()


# -- the data a run reads --------------------------------------------------------------------------


def test_evaluate_reads_the_test_file_it_is_given(tmp_path, shared_fold, trained, capsys):
    run_dir = copy_of(trained, tmp_path / "run")
    results = trained[1]
    other = fold(tmp_path / "other", seed=11)
    assert main(["evaluate", "--run-dir", str(run_dir), "--test", str(other / "test.txt")]) == 0
    out = capsys.readouterr().out
    assert f"test {other / 'test.txt'}" in out
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    assert evaluation["validation"] == pytest.approx(results["validation"], abs=1e-6)
    assert evaluation["test"]["ndcg@5"] != pytest.approx(results["test"]["ndcg@5"], abs=1e-6)

    # train with --test reads it too, also when the run is already trained
    config = fold_config(tmp_path, shared_fold, run_dir, **{"data.test": [str(other / "test.txt")]})
    again = train.train(config, print_fn=quiet)
    assert again["test"] == pytest.approx(evaluation["test"], abs=1e-6)


def test_a_changed_training_split_is_not_resumed_and_fresh_removes_only_the_trainers_files(
        tmp_path, shared_fold, trained):
    """A run whose training file changed under the same path is refused; `--fresh` then trains
    it again from the start (one run for both checks), removing only the files the trainer
    wrote."""
    fold_dir = shutil.copytree(shared_fold, tmp_path / "fold")
    run_dir = copy_of(trained, tmp_path / "run")
    (run_dir / "notes.txt").write_text("mine")
    (run_dir / "logs" / "app.log").write_text("mine too")
    own_events = sorted((run_dir / "logs").glob("*/events.out.tfevents.*"))
    assert len(own_events) == 2
    (fold_dir / "train.txt").unlink()
    synthetic.write_letor(fold_dir / "train.txt", 25, 7, 5, seed=5)  # other queries, same path
    config = fold_config(tmp_path, fold_dir, run_dir, **{"train.epochs": 2})
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"other training data: train.txt \(\d+ bytes.*then, train.txt"):
        train.train(config, print_fn=quiet)

    printed = []
    train.train(config, fresh=True, print_fn=printed.append)
    assert not any("Resuming" in line for line in printed)
    assert (run_dir / "notes.txt").read_text() == "mine"
    assert (run_dir / "logs" / "app.log").read_text() == "mine too"
    assert not any(path.exists() for path in own_events)  # replaced by the new run's
    assert len(list((run_dir / "logs").glob("*/events.out.tfevents.*"))) == 2


def test_the_same_data_under_another_spelling_resumes(tmp_path, shared_fold, trained, monkeypatch):
    run_dir = copy_of(trained, tmp_path / "run")
    monkeypatch.chdir(shared_fold.parent)
    printed = []
    train.train(fold_config(tmp_path, Path(shared_fold.name), run_dir, **{"train.epochs": 2}),
                print_fn=printed.append)
    assert any("Resuming" in line and "after epoch 1" in line for line in printed)


def test_splits_of_different_widths_are_refused_naming_both(tmp_path):
    fold_dir = fold(tmp_path / "fold", num_features=8)
    narrow = tmp_path / "narrow.txt"
    synthetic.write_letor(narrow, 10, 6, 3, seed=2)
    config = DataConfig(dir=str(fold_dir), test=[str(narrow)], cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=rf"training \({fold_dir / 'train.txt'}\) 8.*test "
                                         rf"\({narrow}\) 3.*--num-features"):
        data.resolve(config, print_fn=quiet)
    # a stated width pads sparse files on purpose
    config.num_features = 8
    assert data.resolve(config, print_fn=quiet).num_features == 8


def test_evaluate_refuses_data_of_another_width_than_the_model(tmp_path, trained, capsys):
    wide = fold(tmp_path / "wide", num_features=9)
    assert main(["evaluate", "--run-dir", str(trained[0]), "--data-dir", str(wide)]) == 1
    assert "was trained on 5 features, the data given has 9" in capsys.readouterr().err


def test_a_killed_conversions_temporary_directory_is_removed(tmp_path):
    import socket
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
    records = tmp_path / "cache" / "records"
    host = socket.gethostname()
    dead = records / f".0123456789ab.tmp-{host}-{int(finished.stdout)}"
    alive = records / f".0123456789ab.tmp-{host}-{os.getpid()}"
    other_host = records / f".0123456789ab.tmp-{host}x-{int(finished.stdout)}"
    for path in (dead, alive, other_host):
        path.mkdir(parents=True)
        (path / "part.tfrecord").write_bytes(b"half")
    data.resolve(DataConfig(dir=str(fold(tmp_path / "fold")), cache_dir=str(tmp_path / "cache")),
                 print_fn=quiet)
    assert not dead.exists() and alive.exists() and other_host.exists()
