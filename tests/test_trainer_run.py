"""End-to-end trainer runs in this process, on tiny generated data (a few seconds each)."""

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from tfapprox import losses
from tfapprox.data import convert, synthetic
from trainer import build, checkpoint, config as config_lib, cv, data, run_files, run_lock, train
from trainer.config import DataConfig
from trainer.__main__ import main

from conftest import SHARED_DATA, SUITE_XLA_FLAGS
from test_quiet_command_lines import noise_in, quietly_run, user_environment

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

TINY_DATA = {"num_queries": 40, "docs_per_query": 10, "num_features": 8}


def tiny_config(tmp_path, cache_dir, **overrides):
    """Returns a config that trains B64 on 24 generated queries in about a second per epoch."""
    values = config_lib.load_dict("demo")
    config_lib.apply_overrides(values, {
        "data.synthetic": TINY_DATA,
        "data.cache_dir": str(cache_dir),
        "model.preset": "B64",
        "optimizer.name": "adam",
        "optimizer.learning_rate": 0.01,
        "train.batch_size": 8,
        "train.epochs": 2,
        "train.patience": 0,
        "train.run_dir": str(tmp_path / "run"),
        "export.base_dir": str(tmp_path / "saved_models"),
        **overrides,
    })
    return config_lib.Config.from_dict(values)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


# The run the module's tests read: dropout on, so that a resumed run must also restore its draws.
TRAINED = {"model.dropout": 0.3}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    """One finished two-epoch run: `(config, results, printed lines)`. What its run directory held
    when the first epoch's checkpoint was written is kept beside it (`after_first_epoch`)."""
    tmp_path = tmp_path_factory.mktemp("trained")
    config = tiny_config(tmp_path, cache_dir, **TRAINED)
    save = checkpoint.save

    def save_and_keep_the_first(run_dir, saved):
        save(run_dir, saved)
        if saved.state.epoch == 1:  # as a run stopped then leaves it, less its live lock
            shutil.copytree(run_dir, after_first_epoch(config),
                            ignore=shutil.ignore_patterns(run_lock.FILENAME))

    printed = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint, "save", save_and_keep_the_first)
        results = train.train(config, print_fn=printed.append)
    return config, results, printed


def after_first_epoch(config) -> Path:
    """Where `trained` keeps a copy of its run directory as it was after the first epoch."""
    return Path(config.train.run_dir).parent / "after_first_epoch"


# A second run, unlike `trained` in loss, seed, inputs and precision: the quantile test's, the mixed
# precision and XLA test's, the ensemble's other member.
OTHER = {"model.input_transform": "quantile", "loss.name": "ranknet", "train.seed": 3,
         "runtime.mixed_precision": True, "runtime.jit": True, "data.list_size": 12,
         "train.epochs": 1, "train.metrics": [], "export.enabled": False}


@pytest.fixture(scope="module")
def other_run(tmp_path_factory, cache_dir):
    """One finished one-epoch run of OTHER: `(config, results, printed lines)`."""
    config = tiny_config(tmp_path_factory.mktemp("other"), cache_dir, **OTHER)
    printed = []
    results = train.train(config, print_fn=printed.append)
    return config, results, printed


def without_timings(history):
    return [{k: v for k, v in logs.items() if k != "epoch_seconds"} for logs in history]


def test_a_run_reports_selects_and_exports(trained):
    config, results, printed = trained
    assert results["epochs_run"] == 2 and len(results["history"]) == 2
    expected = ["ndcg@5", "ndcg@1", "ndcg@10", "map", "p@10", "mrr", "approx_ndcg@5", "loss"]
    assert list(results["validation"]) == expected
    assert list(results["test"]) == expected
    for split in ("validation", "test"):
        assert all(np.isfinite(v) for v in results[split].values())
        assert 0.0 < results[split]["ndcg@5"] <= 1.0
    # the restored weights are the selected epoch's: same validation value as logged then
    best = results["history"][results["best_epoch"] - 1]
    assert results["validation"]["ndcg@5"] == pytest.approx(best["val_ndcg@5"], abs=1e-6)
    assert best["val_ndcg@5"] == max(h["val_ndcg@5"] for h in results["history"])
    for logs in results["history"]:
        assert logs["val_approx_gap"] == pytest.approx(logs["val_approx_ndcg@5"] - logs["val_ndcg@5"])

    run_dir = Path(config.train.run_dir)
    assert json.loads((run_dir / "results.json").read_text())["best_epoch"] == results["best_epoch"]
    assert checkpoint.load(run_dir).state.num_features == 8
    assert checkpoint.load(run_dir).state.epoch == 2
    export_path = Path(results["export_path"])
    assert export_path.parent == Path(config.export.base_dir) / "tfapprox_demo"
    assert (export_path / "saved_model.pb").is_file()

    summary = "\n".join(printed)
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    assert printed[0].startswith(f"Training on tensorflow: {device}")
    assert printed[0].endswith("| precision float32 | XLA off (--jit turns it on)")
    assert "best validation ndcg@5 at epoch" in summary
    assert "| ndcg@5 | " in summary and f"Exported {export_path}" in summary


def test_tensorboard_logs_hold_metrics_and_the_approximation_gap(trained):
    config, _, _ = trained
    tags = {}
    for split in ("train", "validation"):
        (event_file,) = (Path(config.train.run_dir) / "logs" / split).glob("events.out.tfevents.*")
        tags[split] = {(value.tag, event.step)
                       for event in tf.compat.v1.train.summary_iterator(str(event_file))
                       for value in event.summary.value}
    for tag in ("loss", "ndcg@5", "approx_ndcg@5", "approx_gap"):
        assert {(tag, 1), (tag, 2)} <= tags["train"]
    for tag in ("loss", "ndcg@5", "map", "mrr", "approx_ndcg@5", "approx_gap"):
        assert {(tag, 1), (tag, 2)} <= tags["validation"]


def test_resumed_run_equals_an_uninterrupted_one(trained, tmp_path, cache_dir):
    """One epoch, stop, one more: the same weights, optimizer state and history as the two epochs
    of `trained` at once. The stopped run is `trained`'s own directory as its first epoch left
    it, resumed by a new `train` call (new models and datasets, restored from the checkpoint)."""
    config, straight, _ = trained
    shutil.copytree(after_first_epoch(config), tmp_path / "run")
    assert not (tmp_path / "run" / "results.json").exists()
    printed = []
    resumed = train.train(tiny_config(tmp_path, cache_dir, **TRAINED, **{"export.enabled": False}),
                          print_fn=printed.append)
    assert any("Resuming" in line and "after epoch 1" in line for line in printed)

    assert without_timings(resumed["history"]) == without_timings(straight["history"])
    a = checkpoint.load(tmp_path / "run")
    b = checkpoint.load(config.train.run_dir)
    for group in ("model", "optimizer", "best"):
        for x, y in zip(getattr(a, group), getattr(b, group), strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_changed_config_does_not_resume(trained, cache_dir):
    config, _, _ = trained
    values = config.to_dict()
    config_lib.apply_overrides(values, {"loss.name": "ranknet", "loss.params": {}, "train.epochs": 3})
    with pytest.raises(RuntimeError, match=r"loss.name: 'approx_ndcg' -> 'ranknet'.*--fresh"):
        train.train(config_lib.Config.from_dict(values))


@pytest.mark.parametrize("damage", ["cut in half", "emptied", "one byte flipped"])
def test_a_damaged_checkpoint_is_a_one_line_error(trained, tmp_path, capsys, damage):
    config, _, _ = trained
    run_dir = tmp_path / "run"
    shutil.copytree(config.train.run_dir, run_dir)
    path = checkpoint.path_in(run_dir)
    data = bytearray(path.read_bytes())
    data = {"cut in half": data[: len(data) // 2], "emptied": b"",
            "one byte flipped": data[:1000] + bytes([data[1000] ^ 1]) + data[1001:]}[damage]
    path.write_bytes(bytes(data))
    resumed = dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                    run_dir=str(run_dir)))
    assert main(["train", "--config", config_file(resumed, tmp_path), "--epochs", "3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m trainer train: error: checkpoint {path} is unreadable (")
    assert err.endswith("; delete it or pass --fresh to start over\n") and err.count("\n") == 1


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """`python -m trainer export` of the trained run, as version 7 bound to 12 documents, into a
    model directory that holds four exports' staging directories: `(model directory, {whose:
    staging directory})`."""
    config, _, _ = trained
    export_dir = tmp_path_factory.mktemp("exported")
    model_dir = export_dir / "tfapprox_demo"
    host = socket.gethostname()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
    staging = {
        "killed": model_dir / f".tmp-1-{host}-{int(finished.stdout)}-{'0' * 32}",
        "running": model_dir / f".tmp-1-{host}-{os.getpid()}-{'1' * 32}",  # a live export's
        "elsewhere": model_dir / f".tmp-1-{host}x-1-{'2' * 32}",  # another host's, recent
        "old": model_dir / f".tmp-1-{'3' * 32}",  # two days old, its writer not named
    }
    for path in staging.values():
        path.mkdir(parents=True)
        (path / "saved_model.pb").write_bytes(b"half written")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(staging["old"], (two_days_ago, two_days_ago))
    assert main(["export", "--run-dir", config.train.run_dir, "--export-dir", str(export_dir),
                 "--version", "7", "--max-documents", "12"]) == 0
    return model_dir, staging


def test_evaluate_and_export_commands(trained, exported, capsys):
    config, results, _ = trained
    run_dir = config.train.run_dir
    assert main(["evaluate", "--run-dir", run_dir]) == 0
    evaluation = json.loads((Path(run_dir) / "evaluation.json").read_text())
    for split in ("validation", "test"):
        assert evaluation[split] == pytest.approx(results[split], abs=1e-6)
    assert "| ndcg@5 |" in capsys.readouterr().out

    model_dir, _ = exported
    score = tf.saved_model.load(str(model_dir / "7")).signatures["score_features"]
    assert score(features=tf.zeros([1, 12, TINY_DATA["num_features"]]))["scores"].shape == (1, 12)
    with pytest.raises(tf.errors.InvalidArgumentError, match="at most 12 documents"):
        score(features=tf.zeros([2, 7, TINY_DATA["num_features"]]))


def test_export_removes_what_killed_exports_left(exported):
    model_dir, staging = exported
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(
        ["7", staging["running"].name, staging["elsewhere"].name])


def test_ensemble_command_combines_runs_evaluates_saves_and_exports(trained, other_run, tmp_path,
                                                                    cache_dir, capsys):
    """`python -m trainer ensemble` of the module's run and one with another loss, seed and input
    transform: the members' metrics are their own runs', the saved model and the export score
    alike, the members' run directories are left as they were; an ensemble of one run ranks as
    that run."""
    config, results, _ = trained
    other, other_results, _ = other_run
    members = [config.train.run_dir, other.train.run_dir]
    before = {path: path.stat().st_mtime_ns for run in members for path in Path(run).rglob("*")}
    assert main(["ensemble", "--members", *members, "--run-dir", str(tmp_path / "ens"),
                 "--export-dir", str(tmp_path / "saved")]) == 0
    assert {path: path.stat().st_mtime_ns
            for run in members for path in Path(run).rglob("*")} == before
    assert "| ndcg@5 |" in capsys.readouterr().out
    ensemble = json.loads((tmp_path / "ens" / "results.json").read_text())
    for member, own in zip(ensemble["members"], (results, other_results)):
        for name, value in member["validation"].items():
            assert value == pytest.approx(own["validation"][name], abs=1e-6), name
    assert ensemble["test"]["ndcg@5"] > 0 and len(ensemble["scales"]) == 2

    model = keras.saving.load_model(tmp_path / "ens" / "ensemble.keras")
    features = np.random.default_rng(0).normal(size=(3, 9, TINY_DATA["num_features"]))
    features = features.astype("float32")
    served = tf.saved_model.load(ensemble["export_path"]).signatures["score_features"]
    np.testing.assert_allclose(served(features=tf.constant(features))["scores"].numpy(),
                               keras.ops.convert_to_numpy(model(features)), rtol=1e-5, atol=1e-6)

    trained_on = checkpoint.load(config.train.run_dir).state.data["train"][0][0]
    assert main(["ensemble", "--members", *members, "--run-dir", str(tmp_path / "leak"),
                 "--vali", str(next(Path(cache_dir).rglob(trained_on))), "--no-export"]) == 1
    assert f"was trained on {trained_on}, which the ensemble would use as validation data" in (
        capsys.readouterr().err)

    with pytest.raises(SystemExit):  # a training run's directory, not a member's
        main(["ensemble", "--members", config.train.run_dir, "--run-dir", other.train.run_dir])
    assert "holds a training run's checkpoint" in capsys.readouterr().err

    assert main(["ensemble", "--members", config.train.run_dir, "--run-dir",
                 str(tmp_path / "one"), "--no-export"]) == 0
    alone = json.loads((tmp_path / "one" / "results.json").read_text())
    for split in ("validation", "test"):
        for name, value in alone[split].items():
            assert value == pytest.approx(results[split][name], abs=1e-6), (split, name)


def test_ensemble_refuses_what_is_not_a_run_and_a_run_dir_holding_one(trained, tmp_path, capsys):
    """Members must be trained runs; the ensemble's run directory must not be a training run's
    (its results.json would be replaced), checked before anything is read or written."""
    config, _, _ = trained
    member = config.train.run_dir
    for members, run_dir, message in (
            ([str(tmp_path)], str(tmp_path / "ens"),
             f"{tmp_path / 'config.json'} not found: --members takes the run directories of "
             "`python -m trainer train`"),
            ([member], member, f"--run-dir {member} is a member's run directory"),
            ([member], str(Path(member).parent / "." / Path(member).name),
             "is a member's run directory")):
        with pytest.raises(SystemExit) as exited:
            main(["ensemble", "--members", *members, "--run-dir", run_dir])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m trainer ensemble: error: ") and message in err
        assert err.count("\n") == 1


def test_ensemble_refuses_a_member_named_twice_and_a_run_dir_inside_one(trained, tmp_path,
                                                                        capsys):
    """A run named twice (also through a trailing slash or a link) would count twice; a --run-dir
    inside a member would write into a directory the ensemble only reads. Refused in one line
    naming the member, before anything is written."""
    config, _, _ = trained
    member = config.train.run_dir
    link = tmp_path / "link"
    link.symlink_to(member)
    inside = Path(member) / "ens"
    for members, run_dir, message in (
            ([member, member + "/"], str(tmp_path / "ens"),
             f"--members names {member} twice (also as {member}/)"),
            ([member, str(link)], str(tmp_path / "ens"), f"--members names {member} twice"),
            ([member], str(inside), f"--run-dir {inside} is inside member {member}'s run"),
            ([str(link)], str(link / "logs" / "ens"), f"is inside member {link}'s run")):
        with pytest.raises(SystemExit) as exited:
            main(["ensemble", "--members", *members, "--run-dir", run_dir,
                  "--export-dir", str(tmp_path / "saved")])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m trainer ensemble: error: ") and message in err, err
        assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"] and not inside.exists()


def copy_run(config, directory, **changes):
    """Returns the run directory of a copy of `config`'s run in `directory`, its config.json
    changed by `changes` (dotted keys)."""
    shutil.copytree(config.train.run_dir, directory)
    values = json.loads((directory / "config.json").read_text())
    config_lib.apply_overrides(values, changes)
    (directory / "config.json").write_text(json.dumps(values))
    return str(directory)


def stopped_after_two_of_three_epochs(config, tmp_path):
    """What a run stopped (SIGTERM) after its second of three epochs leaves: a config of three
    epochs, a checkpoint of two, no results.json."""
    run_dir = copy_run(config, tmp_path / "stopped", **{"train.epochs": 3})
    (Path(run_dir) / "results.json").unlink()
    return run_dir, f"member {run_dir} did not finish training: 2 of its 3 epochs done"


def with_nan_weights(config, tmp_path):
    run_dir = copy_run(config, tmp_path / "nan")
    saved = checkpoint.load(run_dir)
    saved.best = [np.full_like(w, np.nan) for w in saved.best]
    checkpoint.save(run_dir, saved)
    return run_dir, f"member {run_dir} scores "


@pytest.mark.parametrize("member", [stopped_after_two_of_three_epochs, with_nan_weights,
                                    "still training", "trained on a renamed copy of --vali"])
def test_ensemble_refuses_a_member_before_writing_anything(trained, tmp_path, cache_dir, capsys,
                                                           member):
    """A member whose run did not finish or is still training (its best weights are not the
    run's choice), one whose validation scores are not finite (the export would answer every
    request with an error), or one trained on the bytes of the validation file under another name:
    one line naming it, status 1, and no run directory or export."""
    config, _, _ = trained
    args = ["--run-dir", str(tmp_path / "ens"), "--export-dir", str(tmp_path / "saved")]
    holding = contextlib.nullcontext()
    if member == "still training":
        holding = run_lock.hold(config.train.run_dir)
        member = config.train.run_dir
        message = f"member {member} is still being trained (pid {os.getpid()} on host "
    elif member == "trained on a renamed copy of --vali":
        trained_on = checkpoint.load_state(config.train.run_dir).data["train"][0][0]
        renamed = tmp_path / "copy" / "vali.txt"
        renamed.parent.mkdir()
        shutil.copy(next(Path(cache_dir).rglob(trained_on)), renamed)
        args += ["--vali", str(renamed)]
        member = config.train.run_dir
        message = (f"member {member} was trained on {trained_on} (the same data as {renamed}), "
                   "which the ensemble would use as validation data")
    else:
        member, message = member(config, tmp_path)
    members = dict.fromkeys([config.train.run_dir, member])  # the trained run, and the member
    with holding:
        assert main(["ensemble", "--members", *members, *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m trainer ensemble: error: {message}"), err
    assert err.count("\n") == 1
    assert not (tmp_path / "ens").exists() and not (tmp_path / "saved").exists()


def test_results_json_is_strict_json_without_nan_or_infinity(tmp_path):
    """JSON has no NaN or infinity: a metric that is not finite is written as null."""
    path = tmp_path / "results.json"
    run_files.write_json(path, {"test": {"ndcg@5": float("nan"), "loss": np.float32("inf")},
                                "history": [{"loss": -float("inf"), "ndcg@5": np.float64(0.5)}],
                                "epochs_run": np.int64(2)})

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "test": {"ndcg@5": None, "loss": None}, "history": [{"loss": None, "ndcg@5": 0.5}],
        "epochs_run": 2}


def test_evaluate_needs_a_trained_run(tmp_path):
    with pytest.raises(SystemExit):
        main(["evaluate", "--run-dir", str(tmp_path / "nothing")])


def config_file(config, directory):
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    return str(path)


def test_an_existing_export_version_is_refused_before_training(tmp_path, cache_dir, capsys):
    config = tiny_config(tmp_path, cache_dir)
    taken = Path(config.export.base_dir) / "tfapprox_demo" / "3"
    taken.mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", config_file(config, tmp_path), "--version", "3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m trainer train: error: export.version 3: ") and err.count("\n") == 1
    assert f"{taken} already exists" in err and "the next free one (4)" in err
    assert not Path(config.train.run_dir).exists()  # not one epoch trained


@pytest.mark.parametrize("argv, message", [
    (["--preset", "B7"], "preset must be one of"),
    (["--bn-momentum", "1.5"], "momentum must be in [0, 1)"),
    (["--preset", "dasalc", "--noise-stddev", "-1"], "noise_stddev must be >= 0"),
    (["--metrics", "ndcg@5,bpref"], "unknown metric 'bpref'"),
    (["--loss", "ordinal_loss", "--loss-param", "ordinal_size=3"],
     "with ordinal_size=3 needs 3 logits per document"),
    (["--data-dir", "no/such/fold"], "data directory no/such/fold does not exist"),
    (["--train", "t.txt", "--vali", "v.txt"], "no data files match 't.txt'"),
    (["--name", "a/b"], "export.name must be a directory name"),
    (["--version", "-1"], "export.version must be >= 0 or null, got -1"),
    (["--max-documents", "0"], "export.max_documents must be >= 1 or null, got 0"),
    (["--buckets", "-1"], "data.buckets must be >= 0, got -1"),
    (["--bucket-sizes", "32,16"], "data.bucket_sizes must be increasing positive integers or null"),
    (["--export-dir", "{file}"], "is not a writable directory"),
])
def test_bad_settings_are_one_line_errors_before_training(tmp_path, cache_dir, capsys, argv, message):
    (tmp_path / "a-file").write_text("")
    argv = [arg.format(file=tmp_path / "a-file") for arg in argv]
    config = tiny_config(tmp_path, cache_dir)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", config_file(config, tmp_path), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m trainer train: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not Path(config.train.run_dir).exists()


def fold_without_relevant_documents(directory, split):
    """Writes a generated fold (train/vali/test.txt) whose `split` file has every label 0."""
    paths = synthetic.write_splits(directory, 30, 6, 4, seed=3)
    lines = paths[split].read_text().splitlines(keepends=True)
    paths[split].write_text("".join("0" + line[line.index(" "):] for line in lines))
    return directory


def test_a_training_split_without_relevant_documents_is_refused(tmp_path):
    fold = fold_without_relevant_documents(tmp_path / "fold", "train")
    data_config = DataConfig(dir=str(fold), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=rf"training split \({fold / 'train.txt'}\) has no relevant "
                                         "document"):
        data.resolve(data_config, print_fn=lambda _: None)
    # the same from TFRecords without a spec.json, whose labels are read
    records = tmp_path / "records"
    convert([fold / "train.txt"], records)
    (records / "spec.json").unlink()
    data_config = DataConfig(train=[str(records)], vali=[str(fold / "vali.txt")], num_features=4,
                             cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=rf"training split \({records}\) has no relevant document"):
        data.resolve(data_config, print_fn=lambda _: None)


def test_a_validation_split_without_relevant_documents_is_warned_about(tmp_path):
    fold = fold_without_relevant_documents(tmp_path / "fold", "vali")
    printed = []
    data.resolve(DataConfig(dir=str(fold), cache_dir=str(tmp_path / "cache")), print_fn=printed.append)
    warnings = [line for line in printed if "no relevant document" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith("Warning: the validation split") and str(fold / "vali.txt") in warnings[0]


def test_mirrored_strategy_is_refused_on_one_device(tmp_path, cache_dir, capsys):
    """(Two replicas against one: test_trainer_process.py, on two logical CPU devices.)"""
    gpus = len(tf.config.list_logical_devices("GPU"))
    if gpus >= 2:
        pytest.skip("two GPUs: --strategy mirrored runs here")
    config = tiny_config(tmp_path, cache_dir)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", config_file(config, tmp_path), "--strategy", "mirrored"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m trainer train: error: --strategy mirrored replicates over GPUs, and TensorFlow "
        f"sees {gpus}: use --strategy default on one device\n")
    assert not Path(config.train.run_dir).exists()


def test_mixed_precision_and_jit(other_run):
    config, results, printed = other_run
    assert "| precision mixed_" in printed[0] and "| XLA on" in printed[0]
    expected = "mixed_float16" if tf.config.list_physical_devices("GPU") else "mixed_bfloat16"
    assert results["precision_policy"] == expected
    assert all(np.isfinite(v) for v in results["validation"].values())
    assert keras.config.dtype_policy().name == "float32"  # restored for whoever runs next


def test_quantile_inputs_are_fitted_to_the_training_documents(other_run):
    """`model.input_transform=quantile`: the trainer fits the quantiles to the training split's
    documents (padding left out) before the first step, and the best model keeps them."""
    config, _, printed = other_run
    splits = data.resolve(config.data, print_fn=lambda _: None)
    features, _, masks = data.padded_lists(splits.train, splits)
    documents = np.concatenate([f[m] for f, m in zip(features, masks)])
    assert f"Input quantiles fitted to {len(documents)} training documents" in printed
    quantiles = build.restore_best(config, splits.num_features).eval_model.quantile.quantiles
    np.testing.assert_allclose(keras.ops.convert_to_numpy(quantiles),
                               np.quantile(documents, np.linspace(0, 1, 128), axis=0), rtol=1e-6)


VARIED_LENGTHS = {"num_queries": 200, "docs_per_query": 20, "num_features": 8}  # lists of 10-30


def epoch_lists(batches):
    """Returns the lists of `batches` as bytes, padding stripped, in order."""
    found = []
    for inputs, labels in batches:
        for features, mask, list_labels in zip(np.asarray(inputs["features"]),
                                               np.asarray(inputs["mask"]), np.asarray(labels)):
            found.append(features[mask].tobytes() + list_labels[mask].tobytes())
    return found


def test_whole_training_lists_are_bucketed(tmp_path):
    assert DataConfig().buckets == 8 and DataConfig().list_size is None  # the default
    config = tiny_config(tmp_path, tmp_path, **{"data.synthetic": VARIED_LENGTHS,
                                                "train.batch_size": 8, "data.buckets": 3})
    printed = []
    splits = data.resolve(config.data, print_fn=printed.append)
    assert len(splits.train_buckets) == 3
    assert any(line.startswith("Training lists padded to") for line in printed)
    unbucketed = dataclasses.replace(splits, train_buckets=None)
    num_batches = -(-splits.num_train_lists // 8)
    shapes, unbucketed_shapes = set(), set()
    for epoch in range(2):
        bucketed = data.train_dataset(splits, 8, None, seed=(0, epoch))
        batches = list(bucketed)  # assert_cardinality fails on another number of batches
        lists = epoch_lists(batches)
        assert int(bucketed.cardinality()) == num_batches
        shapes |= {tuple(labels.shape) for _, labels in batches}
        assert lists == epoch_lists(data.train_dataset(splits, 8, None, seed=(0, epoch)))
        plain = list(data.train_dataset(unbucketed, 8, None, seed=(0, epoch)))
        assert sorted(lists) == sorted(epoch_lists(plain))
        unbucketed_shapes |= {tuple(labels.shape) for _, labels in plain}
        if epoch == 0:
            whole = lists
    assert len(shapes) <= len(splits.train_buckets) + 1
    assert len(unbucketed_shapes) > len(shapes)

    # Two workers of one replica each: their batches k together are the global batch k.
    shards = [list(data.train_dataset(splits, 4, None, seed=(0, 0), num_shards=2, shard_index=i,
                                      global_batch_size=8)) for i in range(2)]
    assert min(len(shard) for shard in shards) >= splits.num_train_lists // 8
    joined = [one for pair in zip(*shards) for batch in pair for one in epoch_lists([batch])]
    assert joined == whole[:len(joined)]


def epoch_digest(batches) -> str:
    """Returns a digest of the batches' features, masks and labels, in order."""
    digest = hashlib.sha256()
    for inputs, labels in batches:
        for array in (inputs["features"], inputs["mask"], labels):
            digest.update(np.asarray(array).tobytes())
    return digest.hexdigest()[:16]


# Digests of `data.train_dataset`'s epochs on the data of the test below, computed when seeded
# datasets stopped reshuffling on each iteration (Keras iterates the first epoch of a process
# twice: a resumed run's epoch then got other batches than an uninterrupted run's). A change
# must keep every epoch's batches, their order and their random subsets. Keys: (run seed, epoch).
EPOCH_DIGESTS = {
    (0, 0): {"buckets": "fe7c43efc7f987f8", "plain": "24e13d2c2cb74037",
             "list_size": "33f6b79df180474d", "shard 1 of 2": "e5a42c031118c79d",
             "three files": "990cf281231067a1"},
    (0, 1): {"buckets": "c6f64a734d01ef90", "plain": "388fcab8779d6a1f",
             "list_size": "fe8329221f113c96", "shard 1 of 2": "5a450c93b676a053",
             "three files": "c6f64a734d01ef90"},
    (3, 7): {"buckets": "a707b5f8bb37d41a", "plain": "423701b32cd3c342",
             "list_size": "92b311156c966e46", "shard 1 of 2": "62eabf2745b9b638",
             "three files": "96ad870428fb7fca"},
}


def test_each_epochs_batches_are_those_of_its_seed_and_epoch(tmp_path):
    """Epoch e of run seed s gets the batches it always got, whether its pipeline is new (a
    resumed run's first epoch) or was built for earlier epochs, and on every iteration of its
    dataset; two epochs differ."""
    keras.utils.set_random_seed(0)  # as the trainer does with train.seed 0
    config = tiny_config(tmp_path, tmp_path, **{
        "data.synthetic": {"num_queries": 60, "docs_per_query": 20, "num_features": 4},
        "data.buckets": 3})
    splits = data.resolve(config.data, print_fn=lambda _: None)
    convert(sorted(tmp_path.glob("demo-*/train.txt")), tmp_path / "three", num_shards=3)
    three = sorted(str(p) for p in (tmp_path / "three").glob("*.tfrecord"))
    kinds = {  # (split, lists per batch, list_size, shard); global batches of 4 lists
        "buckets": (splits, 4, None, {}),
        "plain": (dataclasses.replace(splits, train_buckets=None), 4, None, {}),
        "list_size": (splits, 4, 6, {}),
        "shard 1 of 2": (splits, 2, None, {"num_shards": 2, "shard_index": 1}),
        "three files": (dataclasses.replace(splits, train=three), 4, None, {}),
    }
    for kind, (split, batch_size, list_size, shard) in kinds.items():
        epochs = data.TrainingEpochs(split, list_size, seed=0, global_batch_size=4)
        datasets = {(0, epoch): epochs.dataset(epoch, batch_size, **shard) for epoch in (0, 1)}
        found = {key: epoch_digest(dataset) for key, dataset in datasets.items()}  # one pipeline
        assert epoch_digest(datasets[0, 0]) == found[0, 0], kind  # iterated again
        found[3, 7] = epoch_digest(data.train_dataset(  # a new one, as a resumed run's
            split, batch_size, list_size, seed=(3, 7), global_batch_size=4, **shard))
        assert found == {seed: digests[kind] for seed, digests in EPOCH_DIGESTS.items()}, kind
        assert found[0, 0] != found[0, 1], kind


def test_bucketed_training_equals_padding_each_batch_to_its_longest(tmp_path, cache_dir):
    """One batch, one step: bucketing changes only the padding and the lists' order in the batch."""
    results = {}
    for name, sizes in (("bucketed", [12, 40]), ("unbucketed", None)):
        config = tiny_config(tmp_path / name, cache_dir, **{
            "train.batch_size": 32, "train.epochs": 1, "train.metrics": [],
            "data.bucket_sizes": sizes, "data.buckets": 0, "export.enabled": False})
        results[name] = train.train(config)
    for bucketed, unbucketed in zip(results["bucketed"]["history"],
                                    results["unbucketed"]["history"], strict=True):
        for key, value in unbucketed.items():
            if key != "epoch_seconds":
                assert bucketed[key] == pytest.approx(value, abs=1e-5), key
    assert results["bucketed"]["test"] == pytest.approx(results["unbucketed"]["test"], abs=1e-5)


@pytest.fixture(scope="module")
def command_line_run(tmp_path_factory):
    """One `python -m trainer train --jit --buckets 3` process, from generating its data to its
    export, as in a user's shell (TF_CPP_MIN_LOG_LEVEL unset), XLA dumping what it compiles into
    `xla/`: `(its directory, the finished process)`."""
    tmp_path = tmp_path_factory.mktemp("command_line")
    values = config_lib.load_dict("demo")
    config_lib.apply_overrides(values, {
        "data.synthetic": VARIED_LENGTHS, "data.cache_dir": str(tmp_path / "cache"),
        "model.preset": "linear", "train.batch_size": 8, "train.epochs": 2,
        "export.base_dir": str(tmp_path / "export"), "export.name": "tiny"})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(values))
    env = {**user_environment(),
           "XLA_FLAGS": f"{SUITE_XLA_FLAGS} --xla_dump_to={tmp_path / 'xla'}"}
    done = quietly_run(["trainer", "train", "--config", str(tmp_path / "run.yaml"), "--jit",
                        "--buckets", "3", "--run-dir", str(tmp_path / "run")], tmp_path, env)
    return tmp_path, done


def test_jit_compiles_once_per_bucket_through_the_command_line(command_line_run):
    """XLA's dump holds one module family per compile of the training step."""
    tmp_path, done = command_line_run
    assert "Training lists padded to" in done.stdout and "| XLA on (--jit)" in done.stdout
    compiles = {path.name.split(".")[0] for path in (tmp_path / "xla").iterdir()
                if ".a_inference_one_step_on_data" in path.name}
    assert 1 <= len(compiles) <= 3 + 1


def test_the_trainer_says_nothing_of_tensorflow_from_start_to_export(command_line_run):
    """Not one of TensorFlow's start-up notices or deprecation warnings on stderr, from generating
    the data to the export; with XLA on, the training step is traced as without it and XLA logs
    too."""
    tmp_path, done = command_line_run
    assert (tmp_path / "export" / "tiny").is_dir()
    assert not noise_in(done.stderr), done.stderr[-3000:]


LOSS_PARAMS = {"approx_precision": {"k": 5}, "gumbel_approx_precision": {"k": 5},
               "approx_ndcg": {"alpha": 5.0, "beta": 2.0}}


def test_every_loss_builds_by_name_and_scores_the_trainers_model(tmp_path):
    """Every name `--loss` accepts, with its parameters, reaches the trainer's compiled model, whose
    scores it turns into a finite loss. (Each loss class trains through `model.fit` on lists of a
    `None` length, compiled and under XLA, in tests/test_fit_variable_lists.py.)"""
    from trainer import distribute

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, (4, 6)).astype("float32")
    labels[:, -1] = -1.0
    inputs = {"features": rng.random((4, 6, 4)).astype("float32"), "mask": labels >= 0}
    for name in sorted(losses.LOSSES):
        params = LOSS_PARAMS.get(name, {})
        config = tiny_config(tmp_path, tmp_path, **{"loss.name": name, "loss.params": params,
                                                    "model.preset": "linear"})
        model = build.build(config, 4, distribute.make("default")).model
        assert type(model.loss) is losses.LOSSES[name], name
        assert {param: model.loss.get_config()[param] for param in params} == params, name
        value = model.loss(labels, model(inputs, training=True))
        assert np.isfinite(keras.ops.convert_to_numpy(value)), name


def write_letor_parts(directory, num_queries=40, num_features=6):
    """Writes S1.txt..S5.txt: one generated set cut into five parts of whole queries."""
    directory.mkdir(parents=True, exist_ok=True)
    queries = list(synthetic.generate(num_queries, 8, num_features, seed=1))
    for part in range(5):
        lines = []
        for query in queries[part::5]:
            for label, row in zip(query.labels, query.features):
                values = " ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(row))
                lines.append(f"{int(label)} qid:{query.qid} {values}\n")
        (directory / f"S{part + 1}.txt").write_text("".join(lines))
    return directory


def test_cv_over_a_grid_selects_on_validation(tmp_path, cache_dir):
    data_dir = write_letor_parts(tmp_path / "letor")
    values = tiny_config(tmp_path, cache_dir, **{
        "train.epochs": 1, "model.preset": "linear", "train.metrics": []}).to_dict()
    config_lib.apply_overrides(values, {
        "data.synthetic": {}, "data.dir": str(data_dir), "cv.folds": [1, 2],
        "cv.grid": {"loss.params.alpha": [2.0, 20.0]}, "cv.out_dir": str(tmp_path / "cv"),
    })
    config = config_lib.Config.from_dict(values)
    printed = []
    summary = cv.run(config, print_fn=printed.append)

    assert [f["fold"] for f in summary["folds"]] == [1, 2]
    for fold in summary["folds"]:
        scores = {g["params"]["loss.params.alpha"]: g["validation_ndcg@5"] for g in fold["grid"]}
        assert fold["params"]["loss.params.alpha"] == max(scores, key=scores.get)
        assert fold["validation"]["ndcg@5"] == pytest.approx(max(scores.values()))
        assert Path(fold["run_dir"]).parent == tmp_path / "cv" / f"Fold{fold['fold']}"
    test_ndcg = [f["test"]["ndcg@5"] for f in summary["folds"]]
    assert summary["mean"]["ndcg@5"] == pytest.approx(np.mean(test_ndcg))
    assert summary["std"]["ndcg@5"] == pytest.approx(np.std(test_ndcg, ddof=1))

    written = json.loads((tmp_path / "cv" / "cv_results.json").read_text())
    assert written["mean"] == pytest.approx(summary["mean"])
    table = (tmp_path / "cv" / "cv_results.md").read_text()
    assert "| Fold1 |" in table and "| mean ± std |" in table

    # Rerunning finds every run trained and gives the same table.
    again = cv.run(config, print_fn=printed.append)
    assert again["mean"] == pytest.approx(summary["mean"])
    assert sum("already trained" in line for line in printed) == 4


@pytest.mark.data
def test_cv_on_ohsumed_fold1(tmp_path, cache_dir):
    values = config_lib.load_dict("ohsumed")
    config_lib.apply_overrides(values, {
        "data.dir": str(SHARED_DATA / "OHSUMED"), "data.cache_dir": str(cache_dir),
        "train.epochs": 1, "cv.folds": [1], "cv.out_dir": str(tmp_path / "cv"),
    })
    summary = cv.run(config_lib.Config.from_dict(values), print_fn=lambda _: None)
    (fold,) = summary["folds"]
    assert 0.0 < fold["test"]["ndcg@5"] < 1.0
    assert (tmp_path / "cv" / "cv_results.md").is_file()
