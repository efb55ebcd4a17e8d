"""The scripts in examples/ run as a user runs them (a subprocess, tiny settings) and print results."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from tfapprox.data import write_named, write_splits

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

EXAMPLES = REPO / "examples"
TINY_DATA = ["--queries", "12", "--docs", "6", "--features", "5"]  # the generated set
TINY_TRAINING = ["--epochs", "1", "--batch-size", "4"]


def run_example(script, *args, cwd):
    """Runs examples/`script` with `args` in `cwd`; returns its stdout, failing with its stderr."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def measure(pattern, text):
    """Returns the number `pattern` captures in `text`, checked to be a measure in [0, 1]."""
    found = re.search(pattern, text)
    assert found, f"no match for {pattern!r} in:\n{text}"
    value = float(found.group(1))
    assert 0.0 <= value <= 1.0, text
    return value


def test_keras_fit_on_a_letor_fold_directory(tmp_path):
    write_splits(tmp_path / "Fold1", num_queries=12, docs_per_query=6, num_features=5)
    out = run_example("keras_fit_letor.py", "--data-dir", tmp_path / "Fold1", *TINY_TRAINING,
                      cwd=tmp_path)
    measure(r"test NDCG@5 ([0-9.]+) \(its smooth approximation ([0-9.]+)\)", out)


def test_custom_training_loop_reports_each_epoch(tmp_path):
    out = run_example("custom_training_loop.py", *TINY_DATA, "--epochs", "2", cwd=tmp_path)
    assert len(re.findall(r"^epoch \d: train loss -?[0-9.]+, validation MAP", out, re.M)) == 2, out
    measure(r"epoch 2: .* validation MAP ([0-9.]+)", out)


def test_export_then_score_it_through_both_signatures(tmp_path):
    out = run_example("deep_scorer_export.py", *TINY_DATA, *TINY_TRAINING,
                      "--export-dir", tmp_path / "exports", cwd=tmp_path)
    measure(r"test MAP ([0-9.]+)", out)
    version_dir = re.search(r"^exported (.+)$", out, re.M).group(1)
    assert version_dir == str(tmp_path / "exports" / "approx_ap_b64" / "1"), out

    out = run_example("score_with_export.py", version_dir, "--lengths", "4", "2", cwd=tmp_path)
    assert re.search(r"^list 0: scores \[(-?[0-9.]+, ){3}-?[0-9.]+\], ranking", out, re.M), out
    assert re.search(r"^list 1: scores \[-?[0-9.]+, -?[0-9.]+\], ranking", out, re.M), out
    assert "score_features and serving_default agree on every document" in out


def test_examples_refuse_to_train_on_a_fold_without_relevant_documents(tmp_path):
    """As the trainer does: with all labels 0 there is nothing to learn, and a test NDCG printed
    after training on it would mean nothing."""
    fold = write_splits(tmp_path / "Fold1", num_queries=12, docs_per_query=6, num_features=5)
    train = fold["train"]
    train.write_text(re.sub(r"^\d+ ", "0 ", train.read_text(), flags=re.M))
    done = subprocess.run([sys.executable, str(EXAMPLES / "keras_fit_letor.py"), "--data-dir",
                           str(tmp_path / "Fold1"), *TINY_TRAINING], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "NDCG" not in done.stdout, done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: the training split ({train}) has no relevant document (no label above 0): "
        "there is nothing to learn")


TINY_NAMED = ["--num-lists", "30", "--num-epochs", "1", "--train-batch-size", "8",
              "--hidden-layer-dims", "16"]
NAMED_RESULT = r"(?m)^test NDCG@1 [0-9.]+, NDCG@5 ([0-9.]+), NDCG@10 [0-9.]+, MAP [0-9.]+$"
RELOADED = r"(?m)^reloaded model\.keras: its scores on the (\d+) test lists equal the trained"


def test_keras_dnn_tfrecord_on_named_numeric_records(tmp_path):
    """TF-Ranking's numeric ELWC program: the user's records (--data-dir), log1p by the spec,
    training lists of 16, evaluated, saved to --model-dir and reloaded to score the 6 test
    lists."""
    write_named(tmp_path / "data", "numeric", num_lists=30)
    out = run_example("keras_dnn_tfrecord.py", "--data-dir", tmp_path / "data", "--use-log1p",
                      "--list-size", "16", "--model-dir", tmp_path / "model", *TINY_NAMED,
                      cwd=tmp_path)
    assert "spec: 136 document features, label 'utility'" in out, out
    measure(NAMED_RESULT, out)
    assert re.search(RELOADED, out).group(1) == "6", out
    assert (tmp_path / "model" / "model.keras").is_file()


def test_antique_kpl_din_on_generated_token_records(tmp_path):
    """TF-Ranking's antique program on generated query/document tokens and vocab.txt: lookup,
    shared embedding, ConcatFeatures, DocumentInteractionAttention; the saved model (lookup
    inside) scores raw tokens as the trained one scores their ids."""
    out = run_example("antique_kpl_din.py", *TINY_NAMED, "--head-size", "8",
                      "--num-attention-heads", "2", cwd=tmp_path)
    measure(NAMED_RESULT, out)
    assert re.search(RELOADED, out).group(1) == "6", out
