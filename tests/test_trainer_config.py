"""The trainer's configuration, command line, checkpoint file and cross-validation bookkeeping.

No training here: these run in well under a second each.
"""

import json

import numpy as np
import pytest
import yaml

from trainer import checkpoint
from trainer import config as config_lib
from trainer.__main__ import _resolve, main, parse_args


def resolve(argv):
    return _resolve(parse_args(argv))


# -- config ----------------------------------------------------------------------------------------


def test_default_config_is_the_demo():
    config = config_lib.load()
    assert config.train.select_metric == "ndcg@5"
    assert config.loss.name == "approx_ndcg"
    assert config.optimizer.name == "adagrad"
    assert config.export.name == "tfapprox_demo"
    assert config.data.dir is None and config.data.train is None  # generated data


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_then_flags(tmp_path, suffix):
    values = {"loss": {"name": "approx_ndcg", "params": {"alpha": 5.0}},
              "train": {"epochs": 7, "batch_size": 4}, "model": {"preset": "B64"}}
    path = tmp_path / f"c{suffix}"
    path.write_text(json.dumps(values) if suffix == ".json" else yaml.safe_dump(values))
    config = resolve(["train", "--config", str(path), "--epochs", "3", "--loss-param", "beta=2"])
    assert config.train.epochs == 3  # flag wins
    assert config.train.batch_size == 4  # file wins over default
    assert config.model.preset == "B64"
    assert config.loss.params == {"alpha": 5.0, "beta": 2}


def test_a_different_loss_drops_the_config_loss_params():
    config = resolve(["--config", "ohsumed", "--loss", "ranknet"])
    assert config.loss.name == "ranknet" and config.loss.params == {}
    config = resolve(["--config", "ohsumed", "--loss", "approx_ndcg", "--loss-param", "beta=3"])
    assert config.loss.params == {"alpha": 10.0, "beta": 3}


def test_every_flag_lands_in_its_field(tmp_path):
    config = resolve([
        "train", "--data-dir", "d", "--list-size", "50", "--preset", "B128", "--dropout", "0.1",
        "--bn-momentum", "0.9", "--optimizer", "adam", "--lr", "0.001", "--batch-size", "16",
        "--epochs", "4", "--seed", "3", "--select-metric", "map", "--patience", "2",
        "--metrics", "ndcg@10,mrr", "--run-dir", "r", "--export-dir", "e", "--name", "n",
        "--version", "7", "--strategy", "mirrored", "--mixed-precision", "--jit",
        "--backend", "tensorflow",
        "--input-transform", "log1p", "--noise-stddev", "0.2", "--attention-layers", "3",
    ])
    assert (config.data.dir, config.data.list_size) == ("d", 50)
    assert (config.model.preset, config.model.dropout, config.model.batch_norm_momentum) == ("B128", 0.1, 0.9)
    assert (config.model.input_transform, config.model.noise_stddev,
            config.model.attention_layers) == ("log1p", 0.2, 3)
    assert (config.optimizer.name, config.optimizer.learning_rate) == ("adam", 0.001)
    assert (config.train.batch_size, config.train.epochs, config.train.seed) == (16, 4, 3)
    assert (config.train.select_metric, config.train.patience) == ("map", 2)
    assert config.train.metrics == ["ndcg@10", "mrr"]
    assert (config.train.run_dir, config.export.base_dir, config.export.name) == ("r", "e", "n")
    assert config.export.version == 7
    assert (config.runtime.strategy, config.runtime.mixed_precision, config.runtime.jit) == (
        "mirrored", True, True)
    assert config.runtime.backend == "tensorflow"
    assert resolve(["--backend", "jax"]).runtime.backend == "jax"
    assert resolve(["--no-export"]).export.enabled is False
    assert resolve(["--list-size", "full"]).data.list_size is None


def test_a_split_file_named_on_the_command_line_wins_for_its_split(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"dir": "folds/Fold1", "test": ["old_test.txt"]}}))
    config = resolve(["--config", str(path), "--train", "a.txt", "--vali", "b.txt"])
    assert (config.data.dir, config.data.train, config.data.vali) == ("folds/Fold1", ["a.txt"], ["b.txt"])
    assert config.data.test == ["old_test.txt"]
    # --data-dir replaces the config's split files, but not the command line's own
    config = resolve(["--config", str(path), "--data-dir", "Fold2", "--test", "other.txt"])
    assert (config.data.dir, config.data.train, config.data.test) == ("Fold2", None, ["other.txt"])
    config = resolve(["--test", "other.txt", "--data-dir", "Fold2"])
    assert config.data.test == ["other.txt"]


def test_print_config_shows_the_test_file_that_will_be_read(capsys):
    assert main(["train", "--data-dir", "Fold1", "--test", "other.txt", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["dir"] == "Fold1" and printed["data"]["test"] == ["other.txt"]


def test_each_split_is_read_from_its_own_file_else_the_data_directory(tmp_path):
    from trainer import data

    fold = tmp_path / "Fold1"
    fold.mkdir()
    for name in ("train.txt", "vali.txt", "test.txt"):
        (fold / name).write_text("1 qid:1 1:0.5\n")
    (tmp_path / "other.txt").write_text("1 qid:1 1:0.5\n")
    config = config_lib.DataConfig(dir=str(fold), test=[str(tmp_path / "other.txt")])
    sources = data._sources(config, demo=lambda: pytest.fail("the demo set is not needed"))
    assert sources == {"train": [str(fold / "train.txt")], "vali": [str(fold / "vali.txt")],
                       "test": [str(tmp_path / "other.txt")]}


@pytest.mark.parametrize("text, expected", [
    ("1e-3", 0.001), ("1E5", 100000.0), ("-2.5e+2", -250.0), ("1.0e3", 1000.0), (".5e1", 5.0),
    ("10", 10), ("0.05", 0.05), ("1e", "1e"), ("abc", "abc"),
])
def test_numbers_are_read_as_users_write_them(tmp_path, text, expected):
    assert config_lib.parse_assignment(f"sigma={text}") == ("sigma", expected)
    assert config_lib.parse_grid_axis(f"optimizer.learning_rate={text},1e-2")[1] == [expected, 0.01]
    path = tmp_path / "c.yaml"
    path.write_text(f"loss:\n  params:\n    sigma: {text}\n")
    assert config_lib.load_dict(str(path))["loss"]["params"]["sigma"] == expected


def test_a_learning_rate_in_exponent_notation_trains(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  learning_rate: 1e-3\n")
    assert resolve(["--config", str(path)]).optimizer.learning_rate == 0.001
    assert resolve(["cv", "--grid", "optimizer.learning_rate=1e-3,1e-2"]).cv.grid == {
        "optimizer.learning_rate": [0.001, 0.01]}


@pytest.mark.parametrize("suffix, text", [
    (".yaml", "train:\n  epochs: 3\n  epochs: 5\n"),
    (".yaml", "train:\n  epochs: 3\ntrain:\n  seed: 1\n"),
    (".json", '{"train": {"epochs": 3, "epochs": 5}}'),
])
def test_a_key_given_twice_in_a_config_file_is_an_error(tmp_path, suffix, text):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}.*given twice"):
        config_lib.load_dict(str(path))


@pytest.mark.parametrize("overrides, message", [
    ({"train.epoch": 2}, "train.epoch"),
    ({"train.epochs": "two"}, "train.epochs must be an integer"),
    ({"optimizer.name": "sgd"}, "optimizer.name must be one of"),
    ({"model.dropout": 1.5}, "model.dropout must be in [0, 1)"),
    ({"runtime.strategy": "tpu"}, "runtime.strategy"),
    ({"runtime.backend": "torch"}, "runtime.backend"),
    ({"runtime.backend": "jax", "runtime.strategy": "mirrored"}, "runtime.strategy"),
    ({"data.train": ["t.txt"]}, "data.train needs data.vali"),
    ({"data.list_size": 1}, "data.list_size must be >= 2 .one document has nothing to rank"),
])
def test_bad_values_name_the_field(overrides, message):
    with pytest.raises((KeyError, ValueError), match=message.replace("[", r"\[").replace(")", r"\)")):
        config_lib.load(None, overrides)


def test_unknown_preset_or_file_is_named():
    with pytest.raises(ValueError, match="neither a file nor a preset"):
        config_lib.load("no-such-thing")


def test_cli_reports_config_errors_as_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--loss-param", "alpha"])
    assert exit_info.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_print_config_round_trips(capsys, tmp_path):
    assert main(["--print-config", "--epochs", "9", "--loss-param", "alpha=3"]) == 0
    printed = capsys.readouterr().out
    path = tmp_path / "printed.yaml"
    path.write_text(printed)
    config = config_lib.load(str(path))
    assert config.train.epochs == 9 and config.loss.params == {"alpha": 3}


def test_grid_flags():
    config = resolve(["cv", "--grid", "loss.params.alpha=1,10", "--grid", "model.preset=B64",
                      "--folds", "1,3"])
    assert config.cv.grid == {"loss.params.alpha": [1, 10], "model.preset": ["B64"]}
    assert config.cv.folds == [1, 3]


@pytest.mark.parametrize("text", ["0", "-3", "many"])
def test_list_size_must_be_positive_or_full(text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["train", "--list-size", text])
    assert exit_info.value.code == 2
    assert f"expected a positive integer or 'full', got {text!r}" in capsys.readouterr().err


def test_list_size_full_overrides_the_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"list_size": 50}}))
    assert resolve(["--config", str(path)]).data.list_size == 50
    assert resolve(["--config", str(path), "--list-size", "full"]).data.list_size is None


def test_repeated_list_flags_accumulate():
    config = resolve(["cv", "--metrics", "ndcg@1", "--metrics", "map,mrr", "--train", "a.txt",
                      "--train", "b.txt", "--vali", "c.txt", "--folds", "1", "--folds", "3,4"])
    assert config.train.metrics == ["ndcg@1", "map", "mrr"]
    assert config.data.train == ["a.txt", "b.txt"]
    assert config.cv.folds == [1, 3, 4]


@pytest.mark.parametrize("argv, flag", [
    (["--epochs", "3", "--epochs", "5"], "--epochs"),
    (["--list-size", "full", "--list-size", "8"], "--list-size"),
    (["--config", "demo", "--config", "mq2008"], "--config"),
    (["--lr", "0.1", "--learning-rate", "0.2"], "--learning-rate"),
])
def test_a_repeated_single_value_flag_is_refused(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["train", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m trainer train: error: argument {flag}") and err.count("\n") == 1
    assert "given twice" in err and err.rstrip().endswith("(see python -m trainer train --help)")


# -- checkpoint ------------------------------------------------------------------------------------


def _checkpoint(epoch):
    state = checkpoint.RunState(epoch=epoch, best_value=0.5, best_epoch=1, fingerprint="f",
                                history=[{"loss": 1.0}])
    return checkpoint.Checkpoint(
        state=state,
        model=[np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, dtype=np.uint32)],
        optimizer=[np.ones(3, np.float32)],
        best=[np.zeros((2, 3), np.float32)],
    )


def test_checkpoint_round_trip(tmp_path):
    checkpoint.save(tmp_path, _checkpoint(3))
    loaded = checkpoint.load(tmp_path)
    assert loaded.state == _checkpoint(3).state
    np.testing.assert_array_equal(loaded.model[0], np.arange(6).reshape(2, 3))
    assert loaded.model[1].dtype == np.uint32
    assert len(loaded.optimizer) == 1 and len(loaded.best) == 1
    assert checkpoint.load(tmp_path / "elsewhere") is None


def test_checkpoint_replacement_leaves_no_temporaries(tmp_path):
    checkpoint.save(tmp_path, _checkpoint(1))
    (tmp_path / ".checkpoint-dead.npz.tmp").write_bytes(b"half written")  # a killed writer's file
    checkpoint.remove_stale_temporaries(tmp_path)
    checkpoint.save(tmp_path, _checkpoint(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.FILENAME]
    assert checkpoint.load(tmp_path).state.epoch == 2


def test_unreadable_checkpoint_says_what_to_do(tmp_path):
    (tmp_path / checkpoint.FILENAME).write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match="--fresh"):
        checkpoint.load(tmp_path)


def test_assign_checks_count_and_shape():
    class Variable:
        def __init__(self, shape):
            self.shape, self.path, self.value = shape, "v", None

        def assign(self, value):
            self.value = value

    with pytest.raises(RuntimeError, match="holds 1 model variables but the current setup has 2"):
        checkpoint.assign([Variable((2,)), Variable((2,))], [np.zeros(2)], "model")
    with pytest.raises(RuntimeError, match=r"shape \(3,\), the current one \(2,\)"):
        checkpoint.assign([Variable((2,))], [np.zeros(3)], "model")


def test_run_state_early_stopping():
    state = checkpoint.RunState()
    improvements = [state.record({"v": v}, v, patience=2) for v in (0.5, 0.6, 0.6, 0.55)]
    assert improvements == [True, True, False, False]  # a tie is not an improvement
    assert (state.epoch, state.best_epoch, state.best_value) == (4, 2, 0.6)
    assert state.stopped_early and state.wait == 2
    never = checkpoint.RunState()
    for v in (0.5, 0.4, 0.3, 0.2):
        never.record({}, v, patience=0)
    assert not never.stopped_early and never.best_epoch == 1


# -- cross-validation bookkeeping ------------------------------------------------------------------


def test_grid_points_and_names():
    from trainer import cv

    assert cv.grid_points({}) == [{}]
    points = cv.grid_points({"loss.params.alpha": [1, 10], "loss.params.beta": [2]})
    assert points == [{"loss.params.alpha": 1, "loss.params.beta": 2},
                      {"loss.params.alpha": 10, "loss.params.beta": 2}]
    assert cv.point_name(points[1]) == "alpha=10,beta=2"
    assert cv.point_name({}) == "default"
    with pytest.raises(ValueError, match="non-empty list"):
        cv.grid_points({"loss.params.alpha": []})


def test_cv_summary_table():
    from trainer import cv

    folds = [{"fold": k, "params": {"loss.params.alpha": a}, "test": {"ndcg@5": v, "loss": -v}}
             for k, a, v in ((1, 1, 0.4), (2, 10, 0.6))]
    summary = {"data_dir": "d", "select_metric": "ndcg@5", "loss": {"name": "approx_ndcg", "params": {}},
               "method": "approx_ndcg()", "grid": {"loss.params.alpha": [1, 10]}, "folds": folds,
               "mean": cv._aggregate(folds, cv._mean), "std": cv._aggregate(folds, cv._std)}
    assert summary["mean"]["ndcg@5"] == pytest.approx(0.5)
    assert summary["std"]["ndcg@5"] == pytest.approx(np.std([0.4, 0.6], ddof=1))
    table = cv.markdown(summary)
    assert "| Fold2 | alpha=10 | 0.6000 |" in table
    assert "| mean ± std |  | 0.5000 ± 0.1414 |" in table


def test_letor_folds_from_parts(tmp_path):
    from trainer import data

    for k in range(1, 6):
        (tmp_path / f"S{k}.txt").write_text(f"0 qid:{k} 1:0.5\n")
    folds = data.letor_folds(tmp_path)
    names = {k: tuple([p.rsplit("/", 1)[-1] for p in split] for split in folds[k]) for k in folds}
    # ../shared/data/README.md: Fold1 = S1,S2,S3 | S4 | S5 ... Fold5 = S5,S1,S2 | S3 | S4
    assert names[1] == (["S1.txt", "S2.txt", "S3.txt"], ["S4.txt"], ["S5.txt"])
    assert names[2] == (["S2.txt", "S3.txt", "S4.txt"], ["S5.txt"], ["S1.txt"])
    assert names[5] == (["S5.txt", "S1.txt", "S2.txt"], ["S3.txt"], ["S4.txt"])
    with pytest.raises(FileNotFoundError, match="S1.txt..S5.txt or Fold1..Fold5"):
        data.letor_folds(tmp_path / "empty")
