"""The scripts in examples/ run as a user runs them (tiny settings) and print results.

Each would start TensorFlow on its own, 8-9 CPU seconds, more than most of them then train, so all
of them run in this test process, whose TensorFlow is started already, one after another, each as
`python examples/SCRIPT ARGS` runs it: as `__main__`, with examples/ first on sys.path, its own
arguments, working directory, stdout and stderr (Python's warnings printed there under Python's
default filters), a fresh Keras session, and its exit status as the interpreter would give it;
afterwards the process gets back its arguments, sys.path and working directory, and forgets the
modules it imported from examples/."""

import contextlib
import io
import os
import re
import runpy
import sys
import traceback
import warnings
from itertools import islice
from types import SimpleNamespace

import keras
import pytest

from conftest import REPO
from tfapprox.data import write_splits
from tfapprox.data.named_records import write_named_records
from tfapprox.data.synthetic import named_numeric_lists

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

EXAMPLES = REPO / "examples"
TINY_DATA = ["--queries", "12", "--docs", "6", "--features", "5"]  # the generated set
TINY_TRAINING = ["--epochs", "1", "--batch-size", "4"]
TINY_NAMED = ["--num-lists", "30", "--num-epochs", "1", "--train-batch-size", "8",
              "--hidden-layer-dims", "16"]
NAMED_RESULT = r"(?m)^test NDCG@1 [0-9.]+, NDCG@5 ([0-9.]+), NDCG@10 [0-9.]+, MAP [0-9.]+$"
# The numeric records hold this many of TF-Ranking's 136 features: what the program does with the
# user's records is the same at any width, and its tracing costs seconds per ten features.
NUMERIC_FEATURES = 8
RELOADED = r"(?m)^reloaded model\.keras: its scores on the (\d+) test lists equal the trained"

def write_numeric(directory, num_lists, num_features):
    """Writes `directory/{train,vali,test}.tfrecord` as `write_named(kind="numeric")` does (60/20/20
    of `num_lists` lists), each document holding only those of `custom_features_1` ..
    `custom_features_<num_features>` it holds there, and its label."""
    kept = {f"custom_features_{j}" for j in range(1, num_features + 1)} | {"utility"}
    lists = ((context, [{k: v for k, v in document.items() if k in kept} for document in documents])
             for context, documents in named_numeric_lists(num_lists))
    train, vali = round(num_lists * 0.6), round(num_lists * 0.2)
    for split, size in (("train", train), ("vali", vali), ("test", num_lists - train - vali)):
        write_named_records(directory / f"{split}.tfrecord", islice(lists, size))


def _print_warning(message, category, filename, lineno, file=None, line=None):
    """Prints a warning to sys.stderr, as the interpreter does."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_script(script, args, cwd):
    """Runs `script` with `args` in `cwd` as `python SCRIPT ARGS` does; returns {"status", "stdout",
    "stderr"}. This process's arguments, sys.path and working directory are given back after."""
    argv, path, here = sys.argv[:], sys.path[:], os.getcwd()
    keras.utils.clear_session()
    os.chdir(cwd)
    sys.argv, sys.path[0:0] = [str(script), *map(str, args)], [str(script.parent)]
    out, err, status = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.resetwarnings()  # Python's default filters, not pytest's
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            for category in (PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = _print_warning
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exit_:
                if isinstance(exit_.code, int) or exit_.code is None:
                    status = exit_.code or 0
                else:
                    print(exit_.code, file=sys.stderr)
                    status = 1
            except BaseException:
                traceback.print_exc()
                status = 1
    finally:
        sys.argv, sys.path[:] = argv, path
        os.chdir(here)
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def run_examples(runs):
    """Runs `runs` ({name: (script, args, cwd)}) in this process, in order; returns {name:
    {"status", "stdout", "stderr"}}. The modules they imported from examples/ are forgotten
    after."""
    modules = set(sys.modules)
    try:
        return {name: run_script(EXAMPLES / script, args, cwd)
                for name, (script, args, cwd) in runs.items()}
    finally:
        keras.utils.clear_session()
        for name in set(sys.modules) - modules:  # example_data, named_data
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(EXAMPLES)):
                del sys.modules[name]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every example's run (the data it reads written first): its status, stdout and stderr by name
    in `results`, the directory it ran in by name in `where`."""
    where = {name: tmp_path_factory.mktemp(name) for name in (
        "letor", "loop", "export", "refuse", "numeric", "tokens")}
    write_splits(where["letor"] / "Fold1", num_queries=12, docs_per_query=6, num_features=5)
    refused = write_splits(where["refuse"] / "Fold1", num_queries=12, docs_per_query=6,
                           num_features=5)["train"]
    refused.write_text(re.sub(r"^\d+ ", "0 ", refused.read_text(), flags=re.M))
    write_numeric(where["numeric"] / "data", num_lists=30, num_features=NUMERIC_FEATURES)
    exported = where["export"] / "exports" / "approx_ap_b64" / "1"
    runs = {
        "letor": ("keras_fit_letor.py", ["--data-dir", where["letor"] / "Fold1", *TINY_TRAINING]),
        "loop": ("custom_training_loop.py", [*TINY_DATA, "--epochs", "2"]),
        "export": ("deep_scorer_export.py", [*TINY_DATA, *TINY_TRAINING,
                                             "--export-dir", where["export"] / "exports"]),
        "score": ("score_with_export.py", [exported, "--lengths", "4", "2"]),
        "refuse": ("keras_fit_letor.py", ["--data-dir", where["refuse"] / "Fold1",
                                          *TINY_TRAINING]),
        "numeric": ("keras_dnn_tfrecord.py", [
            "--data-dir", where["numeric"] / "data", "--use-log1p", "--list-size", "16",
            "--model-dir", where["numeric"] / "model", *TINY_NAMED]),
        "tokens": ("antique_kpl_din.py", [*TINY_NAMED, "--head-size", "8",
                                          "--num-attention-heads", "2"]),
    }
    cwd = {"score": "export"}
    results = run_examples({name: (script, args, where[cwd.get(name, name)])
                            for name, (script, args) in runs.items()})
    return SimpleNamespace(results=results, where=where, exported=exported, refused=refused)


def succeeded(ran, name):
    """The stdout of run `name`, which must have exited 0."""
    result = ran.results[name]
    assert result["status"] == 0, f"{name} exited {result['status']}:\n{result['stderr'][-3000:]}"
    return result["stdout"]


def measure(pattern, text):
    """Returns the number `pattern` captures in `text`, checked to be a measure in [0, 1]."""
    found = re.search(pattern, text)
    assert found, f"no match for {pattern!r} in:\n{text}"
    value = float(found.group(1))
    assert 0.0 <= value <= 1.0, text
    return value


def test_keras_fit_on_a_letor_fold_directory(ran):
    measure(r"test NDCG@5 ([0-9.]+) \(its smooth approximation ([0-9.]+)\)", succeeded(ran, "letor"))


def test_custom_training_loop_reports_each_epoch(ran):
    out = succeeded(ran, "loop")
    assert len(re.findall(r"^epoch \d: train loss -?[0-9.]+, validation MAP", out, re.M)) == 2, out
    measure(r"epoch 2: .* validation MAP ([0-9.]+)", out)


def test_export_then_score_it_through_both_signatures(ran):
    out = succeeded(ran, "export")
    measure(r"test MAP ([0-9.]+)", out)
    assert re.search(r"^exported (.+)$", out, re.M).group(1) == str(ran.exported), out

    out = succeeded(ran, "score")
    assert re.search(r"^list 0: scores \[(-?[0-9.]+, ){3}-?[0-9.]+\], ranking", out, re.M), out
    assert re.search(r"^list 1: scores \[-?[0-9.]+, -?[0-9.]+\], ranking", out, re.M), out
    assert "score_features and serving_default agree on every document" in out


def test_examples_refuse_to_train_on_a_fold_without_relevant_documents(ran):
    """As the trainer does: with all labels 0 there is nothing to learn, and a test NDCG printed
    after training on it would mean nothing."""
    done = ran.results["refuse"]
    assert done["status"] != 0 and "NDCG" not in done["stdout"], done["stdout"]
    assert done["stderr"].strip().splitlines()[-1] == (
        f"error: the training split ({ran.refused}) has no relevant document (no label above "
        "0): there is nothing to learn")


def test_keras_dnn_tfrecord_on_named_numeric_records(ran):
    """TF-Ranking's numeric ELWC program: the user's records (--data-dir; their spec, inferred,
    names the features they hold), log1p by the spec, training lists of 16, evaluated, saved to
    --model-dir and reloaded to score the 6 test lists."""
    out = succeeded(ran, "numeric")
    assert f"spec: {NUMERIC_FEATURES} document features, label 'utility'" in out, out
    measure(NAMED_RESULT, out)
    assert re.search(RELOADED, out).group(1) == "6", out
    assert (ran.where["numeric"] / "model" / "model.keras").is_file()


def test_antique_kpl_din_on_generated_token_records(ran):
    """TF-Ranking's antique program on generated query/document tokens and vocab.txt: lookup,
    shared embedding, ConcatFeatures, DocumentInteractionAttention; the saved model (lookup
    inside) scores raw tokens as the trained one scores their ids."""
    out = succeeded(ran, "tokens")
    measure(NAMED_RESULT, out)
    assert re.search(RELOADED, out).group(1) == "6", out
