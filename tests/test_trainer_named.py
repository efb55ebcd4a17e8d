"""`python -m trainer train --feature-spec FILE --train ... --vali ... --test ...`: records with named
features (ELWC with a context feature, string token lists and an int64 label) through the trainer's
command line: selection, resume, --jit, evaluate, export, and one-line refusals of bad input."""

import contextlib
import io
import json
import shutil

import pytest
import yaml

import cpp_loader
from tfapprox.data import infer_spec, write_named
from trainer.__main__ import main

pytestmark = pytest.mark.slow  # trains


def run_main(argv):
    """Returns `(status, stdout, stderr)` of `python -m trainer ARGV`, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit_:
            status = exit_.code
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Generated token records (`write_named(kind="tokens")`) and their spec file."""
    directory = tmp_path_factory.mktemp("named")
    paths = write_named(directory, "tokens", num_lists=30, docs_per_list=6, seed=1)
    vocabulary = str(paths["vocabulary"])
    spec = infer_spec(paths["train"], "relevance", {"query_tokens": vocabulary,
                                                    "document_tokens": vocabulary},
                      spec_dir=directory)
    spec.save(directory / "spec.json")
    return {**{k: str(v) for k, v in paths.items()}, "spec": str(directory / "spec.json"),
            "dir": directory}


def named_flags(records, run_dir) -> dict:
    """The flags of a small run on `records` into `run_dir`, by flag."""
    return {"--feature-spec": records["spec"], "--train": records["train"],
            "--vali": records["vali"], "--test": records["test"], "--preset": "B64",
            "--batch-size": "6", "--optimizer": "adam", "--learning-rate": "0.01",
            "--metrics": "ndcg@1,map", "--run-dir": str(run_dir)}


def train_argv(flags: dict, *switches) -> list[str]:
    """`train` with `flags` and `switches`, without export."""
    return ["train", *[str(x) for pair in flags.items() for x in pair], "--no-export", *switches]


@pytest.fixture(scope="module")
def trained(records, tmp_path_factory):
    """One two-epoch run under XLA, lists of 8: `(run_dir, results, stdout)`."""
    run_dir = tmp_path_factory.mktemp("runs") / "named"
    status, out, err = run_main(train_argv(
        {**named_flags(records, run_dir), "--epochs": 2, "--list-size": 8}, "--jit"))
    assert status == 0, err
    return run_dir, json.loads((run_dir / "results.json").read_text()), out


def without_timings(history):
    return [{k: v for k, v in logs.items() if k != "epoch_seconds"} for logs in history]


def test_a_named_run_trains_selects_and_reports(trained):
    run_dir, results, out = trained
    assert "XLA on" in out.splitlines()[0]
    assert results["epochs_run"] == 2 and results["best_epoch"] in (1, 2)
    best = results["history"][results["best_epoch"] - 1]["val_ndcg@5"]
    assert results["validation"]["ndcg@5"] == pytest.approx(best, abs=1e-5)
    assert list(results["test"])[:3] == ["ndcg@5", "ndcg@1", "map"]
    assert 0.0 < results["test"]["ndcg@5"] <= 1.0
    assert f"Run {run_dir}: 2 epochs" in out and "| ndcg@5 |" in out


def test_a_named_run_resumes_and_refuses_another_spec(trained, records, tmp_path):
    run_dir, results, _ = trained
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    # without --jit, which a resumed run may change
    status, out, err = run_main(train_argv(
        {**named_flags(records, copy), "--epochs": 3, "--list-size": 8}))
    assert status == 0, err
    assert "Resuming" in out and "after epoch 2" in out
    resumed = json.loads((copy / "results.json").read_text())
    assert resumed["epochs_run"] == 3
    assert without_timings(resumed["history"][:2]) == without_timings(results["history"])

    spec = json.loads(open(records["spec"]).read())
    spec["document"][0]["embedding_dim"] = 4  # another model over the same records
    other = records["dir"] / "other_spec.json"
    other.write_text(json.dumps(spec))
    flags = {**named_flags(records, copy), "--feature-spec": other, "--epochs": 4,
             "--list-size": 8}
    status, _, err = run_main(train_argv(flags))
    assert status == 1 and err.count("\n") == 1
    assert "different configuration" in err and "feature spec" in err


def test_evaluate_scores_the_selected_model(trained):
    run_dir, results, _ = trained
    status, _, err = run_main(["evaluate", "--run-dir", str(run_dir)])
    assert status == 0, err
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    for split in ("validation", "test"):
        assert evaluation[split] == pytest.approx(results[split], abs=1e-5)


def test_export_serves_requests_by_name_as_the_trained_model_scores(trained, records):
    import numpy as np
    import tensorflow as tf

    from trainer import build, config as config_lib, named_data

    run_dir, _, _ = trained
    status, out, err = run_main(["export", "--run-dir", str(run_dir), "--export-dir",
                                 str(run_dir.parent / "exported"), "--name", "named"])
    assert status == 0, err
    path = out.strip().splitlines()[-1].removeprefix("Exported ")
    config = config_lib.load(str(run_dir / "config.json"))
    spec = named_data.load_spec(config.data.feature_spec)
    features, labels = next(iter(named_data.eval_dataset([records["test"]], spec, 4)))
    expected = np.asarray(build.restore_best(config).eval_model(features))
    requests = list(tf.data.TFRecordDataset(records["test"]).take(4).as_numpy_iterator())
    served = tf.saved_model.load(path).signatures["serving_default"](elwc=tf.constant(requests))
    (scores,) = served.values()
    valid = np.asarray(labels) >= 0
    np.testing.assert_allclose(np.asarray(scores)[valid], expected[valid], atol=1e-5)


@pytest.fixture(scope="module")
def sequence_examples(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sequence")
    return write_named(directory, "tokens", num_lists=5, record_format="sequence_example")


@pytest.mark.parametrize("change, status, message", [
    (lambda r, s: {"--feature-spec": r["dir"] / "missing.json"}, 2, "no such spec file"),
    (lambda r, s: {"--feature-spec": r["dir"] / "bad_key.json"}, 2, "unknown key(s) 'colour'"),
    (lambda r, s: {"--train": s["train"]}, 1, "SequenceExamples but"),
    (lambda r, s: {"--data-dir": r["dir"]}, 2, "not a LETOR data.dir"),
    (lambda r, s: {"--model": "adarank"}, 2, "AdaRank"),
])
def test_bad_input_is_one_line(records, sequence_examples, tmp_path, change, status, message):
    spec = json.loads(open(records["spec"]).read())
    (records["dir"] / "bad_key.json").write_text(json.dumps({**spec, "colour": "red"}))
    flags = {**named_flags(records, tmp_path / "run"), **change(records, sequence_examples)}
    code, _, err = run_main(train_argv(flags))
    assert code == status and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def test_a_recipe_plans_its_members_over_the_spec(records, tmp_path):
    flags = {flag: value for flag, value in named_flags(records, tmp_path / "recipe").items()
             if flag in ("--feature-spec", "--train", "--vali", "--test", "--run-dir")}
    status, out, err = run_main(train_argv(flags, "--recipe", "recommended", "--print-config"))
    assert status == 0, err
    members = yaml.safe_load(out)
    assert len(members) == 3
    assert {m["data"]["feature_spec"] for m in members.values()} == {records["spec"]}


def test_an_ensemble_of_named_runs_is_fitted_evaluated_and_served_by_name(trained, records,
                                                                         tmp_path):
    """Two members over one spec (the trained run and a copy of it: the ensemble of two equal
    members scores as one standardised member), then a member over another spec is refused."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer import named_data

    run_dir, _, _ = trained
    twin = tmp_path / "twin"
    shutil.copytree(run_dir, twin)
    status, out, err = run_main(["ensemble", "--members", str(run_dir), str(twin), "--run-dir",
                                 str(tmp_path / "ensemble"), "--export-dir", str(tmp_path / "sm"),
                                 "--name", "ensemble"])
    assert status == 0, err
    results = json.loads((tmp_path / "ensemble" / "results.json").read_text())
    assert [m["run_dir"] for m in results["members"]] == [str(run_dir), str(twin)]
    assert results["offsets"][0] == pytest.approx(results["offsets"][1])
    ensemble = keras.saving.load_model(tmp_path / "ensemble" / "ensemble.keras")
    spec = named_data.load_spec(records["spec"])
    features, labels = next(iter(named_data.eval_dataset([records["test"]], spec, 4)))
    expected = np.asarray(ensemble(features))
    requests = list(tf.data.TFRecordDataset(records["test"]).take(4).as_numpy_iterator())
    served = tf.saved_model.load(results["export_path"]).signatures["serving_default"](
        elwc=tf.constant(requests))
    (scores,) = served.values()
    valid = np.asarray(labels) >= 0
    assert np.ptp(expected[valid]) > 0
    np.testing.assert_allclose(np.asarray(scores)[valid], expected[valid], atol=1e-5)
    if cpp_loader.compiler() is not None:  # as TF Serving loads it: TensorFlow's C++ loader
        runner = cpp_loader.build(cpp_loader.CACHE_DIR)
        with cpp_loader.CppLoader(runner, results["export_path"]) as loader:
            outputs, _ = loader.run("serving_default",
                                    {"elwc": np.array(requests, dtype=object)})
        (served_in_cpp,) = outputs.values()
        np.testing.assert_allclose(served_in_cpp[valid], expected[valid], atol=1e-5)

    spec_file = json.loads(open(records["spec"]).read())
    spec_file["document"] = [{**f, "name": "renamed"} if f["name"] == "document_tokens" else f
                              for f in spec_file["document"]]
    (records["dir"] / "other_spec.json").write_text(json.dumps(spec_file))
    config = json.loads((twin / "config.json").read_text())
    config["data"]["feature_spec"] = str(records["dir"] / "other_spec.json")
    (twin / "config.json").write_text(json.dumps(config))
    status, _, err = run_main(["ensemble", "--members", str(run_dir), str(twin), "--run-dir",
                               str(tmp_path / "refused"), "--no-export"])
    assert status == 2 and err.count("\n") == 1 and "trained on other inputs" in err, err
    assert not (tmp_path / "refused").exists()
