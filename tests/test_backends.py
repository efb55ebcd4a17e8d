"""tfapprox off TensorFlow: the backend-neutral core (`tfapprox.ops`, `losses`, `metrics`, `models`)
and the device check `benchmarks/gpu.py` run on JAX in a process where TensorFlow cannot be
imported, as on a GPU machine that has JAX but no TensorFlow; the trainer trains on JAX
(`--backend jax`) and its export serves as the JAX model scores.

The checks on JAX share one process (`off_tensorflow`), each its own section of it (JAX and Keras
start once, not once a check); they run in the TensorFlow pass of the suite. The sections off
TensorFlow come first, with TensorFlow unimportable; the trainer's, which reads its data through
tf.data, comes last, the only one that may import TensorFlow.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cpp_loader
from conftest import REPO
from test_serving_cpp import runner  # noqa: F401  (the compiled C++ loader, a fixture)

# Installed first in the child process: any import of a package in BLOCKED (or a submodule) raises.
_BLOCK_PACKAGES = textwrap.dedent("""
    import sys

    class _Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked: this process runs without it")

    sys.meta_path.insert(0, _Blocked())
""")
TENSORFLOW = ("tensorflow", "tensorflow_serving", "tf_keras")

# Runs the sections of argv[1] (JSON: [name, code, also blocked]) in order, each with TensorFlow
# and its own packages blocked (also blocked None: nothing blocked) and its stdout and stderr
# captured (a SystemExit of 0 ends it well); prints {name: {"ok", "stdout", "error"}} as JSON, the
# error followed by the section's stderr.
_RUN_SECTIONS = textwrap.dedent("""
    import contextlib, io, json, textwrap, traceback

    results = {}
    for name, code, also_blocked in json.loads(sys.argv[1]):
        BLOCKED[:] = [] if also_blocked is None else [*TENSORFLOW, *also_blocked]
        out, err, ok, error = io.StringIO(), io.StringIO(), True, ""
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(compile(textwrap.dedent(code), name, "exec"), {"__name__": "__main__"})
            except SystemExit as exit_:
                ok = exit_.code in (0, None)
                error = "" if ok else f"SystemExit({exit_.code!r})"
            except BaseException:
                ok, error = False, traceback.format_exc()
        if not ok:
            error = f"{error}\\nstderr:\\n{err.getvalue()[-4000:]}"
        results[name] = {"ok": ok, "stdout": out.getvalue(), "error": error}
    print(json.dumps(results))
""")


def run_without_tensorflow(code, *, timeout=300, argv=()):
    """Runs `code` (`argv` its arguments) in a fresh Python with KERAS_BACKEND=jax and TensorFlow
    unimportable (and what BLOCKED lists besides); returns the CompletedProcess, and fails the test
    with its stderr if it exits non-zero."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO),
           "JAX_PLATFORMS": "cpu"}
    blocker = f"TENSORFLOW = {TENSORFLOW!r}\nBLOCKED = [*TENSORFLOW]\n" + _BLOCK_PACKAGES
    done = subprocess.run([sys.executable, "-c", blocker + textwrap.dedent(code), *argv],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


FIT_WITHOUT_TENSORFLOW = """
    import json
    import sys
    import keras
    import numpy as np
    import tfapprox
    import tfapprox.models
    import tfapprox.ops

    rng = np.random.default_rng(0)
    batch, list_size, num_features = 8, 6, 5
    features = rng.normal(size=(batch, list_size, num_features)).astype("float32")
    labels = rng.integers(0, 3, size=(batch, list_size)).astype("float32")
    labels[:, 4:] = -1.0  # the last two slots of every list are padding
    labels[0, 1:] = -1.0  # and one list holds a single document
    mask = labels >= 0
    features[~mask] = 1e6  # padded features must reach neither the loss nor batch norm

    keras.utils.set_random_seed(0)
    model = tfapprox.models.build_scorer("LINEAR")
    model.compile(optimizer=keras.optimizers.Adagrad(0.1),
                  loss=tfapprox.losses.ApproxNDCGLoss(alpha=10.0),
                  metrics=[tfapprox.metrics.NDCG(5)])
    history = model.fit({"features": features, "mask": mask}, labels, batch_size=4, epochs=3,
                        shuffle=False, verbose=0)
    scores = keras.ops.convert_to_numpy(model({"features": features, "mask": mask}))
    print(json.dumps({
        "backend": keras.backend.backend(),
        "loss": history.history["loss"],
        "ndcg": history.history["ndcg@5"],
        "padded_scores": scores[~mask].tolist(),
        "finite_scores": bool(np.isfinite(scores).all()),
        "tensorflow_loaded": any(m.partition(".")[0] == "tensorflow" for m in sys.modules),
    }))
"""


def gpu_benchmark_code(*args):
    """The code of `python -m benchmarks.gpu ARGS`, checking that TensorFlow stayed out."""
    return f"""
        import runpy
        import sys
        sys.argv = ["benchmarks/gpu.py", *{list(args)!r}]
        try:
            runpy.run_module("benchmarks.gpu", run_name="__main__")
        finally:
            assert "tensorflow" not in sys.modules
    """


WITH_RAX = importlib.util.find_spec("rax") is not None


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    """The directory of the trainer's run on JAX (the last section of `off_tensorflow`)."""
    return tmp_path_factory.mktemp("jax_run")


@pytest.fixture(scope="module")
def off_tensorflow(jax_run):
    """{section: its stdout} of the checks below, run in one JAX process, in this order: --help
    first, with Rax blocked too, before anything could have imported it; then the other checks
    without TensorFlow; last the trainer's run on JAX in `jax_run`, with TensorFlow importable."""
    sections = [
        ("gpu --help", gpu_benchmark_code("--help"), ["rax"]),
        ("fit", FIT_WITHOUT_TENSORFLOW, []),
        ("gpu --tiny", gpu_benchmark_code("--tiny", *(["--rax"] if WITH_RAX else [])), []),
        ("gpu --paths", gpu_benchmark_code("--tiny", "--paths", "--lists", "12x2"), []),
        ("gpu --scorers", gpu_benchmark_code("--tiny", "--scorers"), []),
        ("trainer on jax", train_on_jax_code(jax_run), None),
    ]
    done = run_without_tensorflow(_RUN_SECTIONS, argv=[json.dumps(sections)], timeout=900)
    return json.loads(done.stdout.strip().splitlines()[-1])


def section_output(off_tensorflow, name):
    """The stdout of section `name`, which must have ended well."""
    section = off_tensorflow[name]
    assert section["ok"], f"{name}:\n{section['error'][-4000:]}"
    return section["stdout"]


@pytest.mark.slow  # its section shares the process of the device check's tiny runs
def test_scorer_fits_on_jax_without_tensorflow(off_tensorflow):
    result = json.loads(section_output(off_tensorflow, "fit").strip().splitlines()[-1])
    assert result["backend"] == "jax"
    assert not result["tensorflow_loaded"]
    assert len(result["loss"]) == 3 and all(-1.0 <= value <= 0.0 for value in result["loss"])
    assert result["loss"][-1] < result["loss"][0]  # it learns
    assert all(0.0 <= value <= 1.0 for value in result["ndcg"])
    assert result["finite_scores"] and result["padded_scores"] == [0.0] * len(result["padded_scores"])


def test_blocker_really_blocks_tensorflow():
    """The guard above is only meaningful if TensorFlow (installed here) fails to import."""
    done = run_without_tensorflow("""
        try:
            import tensorflow
        except ImportError as error:
            print("blocked:", error)
    """)
    assert "blocked: tensorflow is blocked" in done.stdout


def test_the_trainer_takes_its_backend_before_keras_and_keeps_it(monkeypatch):
    """KERAS_BACKEND (or --backend) is honoured only before Keras is imported: in this process
    Keras runs on TensorFlow, so another backend is refused in one line; export is TensorFlow's."""
    import keras

    from trainer import backend

    if keras.backend.backend() != "tensorflow":
        pytest.skip("checks a process whose Keras runs on TensorFlow")
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    with pytest.raises(ValueError, match="^KERAS_BACKEND=jax needs Keras on jax, but this process "
                                         "already runs it on tensorflow"):
        backend.choose(None, "train")
    with pytest.raises(ValueError, match="^--backend jax needs Keras on jax"):
        backend.choose("jax", "evaluate")
    assert backend.choose(None, "export") == "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    with pytest.raises(ValueError, match="^KERAS_BACKEND=torch: the trainer runs on tensorflow or jax$"):
        backend.choose(None, "train")


# Trains a tiny run with the trainer's CLI on JAX (which exports it from a TensorFlow process),
# then scores fixed lists with the selected weights on JAX, as `evaluate` would. TensorFlow is not
# imported before the trainer imports it.
TRAIN_ON_JAX = """
    import json
    import os
    import sys
    import numpy as np
    assert "tensorflow" not in sys.modules
    from trainer.__main__ import main

    os.chdir(os.path.dirname(run_dir))
    assert main(["train", "--backend", "jax", "--config", config_file, "--run-dir", run_dir,
                 "--export-dir", export_dir, "--name", "jax_run"]) == 0
    from trainer import build, config as config_lib  # Keras, imported by main on JAX

    config = config_lib.load(f"{run_dir}/config.json")
    built = build.restore_best(config)
    features = np.random.default_rng(1).normal(size=(3, 7, 8)).astype("float32")
    scores = built.eval_model({"features": features, "mask": np.ones((3, 7), bool)})
    np.savez(out, features=features, scores=np.asarray(scores))
"""


def train_on_jax_code(directory):
    """The code of the trainer's run on JAX in `directory` (TINY_RUN, its data cached there)."""
    config_file = directory / "tiny.json"
    data = {**TINY_RUN["data"], "cache_dir": str(directory / "cache")}
    config_file.write_text(json.dumps({**TINY_RUN, "data": data}))
    paths = {"run_dir": directory / "run", "export_dir": directory / "saved_models",
             "config_file": config_file, "out": directory / "jax.npz"}
    return ("".join(f"{name} = {str(path)!r}\n" for name, path in paths.items())
            + textwrap.dedent(TRAIN_ON_JAX))


TINY_RUN = {
    "data": {"synthetic": {"num_queries": 24, "docs_per_query": 6, "num_features": 8},
             "list_size": 8},
    "model": {"preset": "linear"},
    "optimizer": {"name": "adam", "learning_rate": 0.01},
    "train": {"batch_size": 8, "epochs": 1, "patience": 0, "metrics": ["ndcg@5"]},
}


@pytest.mark.slow  # its section shares the process of the device check's tiny runs
def test_trainer_on_jax_exports_what_the_cpp_loader_serves(off_tensorflow, jax_run, runner):
    """`python -m trainer train --backend jax`: trains, checkpoints, selects, and its export (made on
    TensorFlow from the selected weights) scores in TensorFlow's C++ loader as the JAX model does."""
    out = section_output(off_tensorflow, "trainer on jax")
    assert "Training on jax: CPU:0" in out and "XLA on" in out
    results = json.loads((jax_run / "run" / "results.json").read_text())
    assert results["export_path"] == str(jax_run / "saved_models" / "jax_run" / "1")
    assert (jax_run / "run" / "checkpoint.npz").exists()

    on_jax = np.load(jax_run / "jax.npz")
    requests = cpp_loader.signature_requests(on_jax["features"])
    with cpp_loader.CppLoader(runner, results["export_path"]) as loader:
        for signature in ("score_features", "serving_default"):
            outputs, _ = loader.run(signature, requests[signature])
            np.testing.assert_allclose(outputs["scores"], on_jax["scores"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_gpu_benchmark_runs_tiny_on_the_cpu_without_tensorflow(off_tensorflow):
    """benchmarks/gpu.py, the device check, at sizes that take seconds (its figures mean nothing
    here): every section prints, beside Rax where Rax is installed."""
    out = section_output(off_tensorflow, "gpu --tiny")
    assert out.startswith("Device: CPU")
    assert "One list of 2,000 documents, ApproxNDCG forward+backward: peak device memory not " \
           "available, XLA's temporaries " in out
    assert re.search(r"Matmul peak \(256×256, measured\): float32 [\d.]+ TFLOP/s, bfloat16 ", out)
    number = re.compile(r"[\d,]+")
    table = {tuple(cells[:3]): cells[3:] for cells in _table_rows(out)}
    for row in ("ApproxNDCG", "ApproxAP", "RankNet", "ListMLE", "Softmax"):
        for list_size, batch in (("10", "4"), ("40", "2")):
            ours, rax, ratio, path = table[(row, list_size, batch)]
            assert number.fullmatch(ours) and path, (row, ours, path)
            assert bool(number.fullmatch(rax)) == WITH_RAX
            assert ratio.endswith("×") == WITH_RAX
    assert table[("ListMLE", "10", "4")][3].startswith("XLA: network order")  # jit's path
    for policy in ("float32", "mixed_bfloat16"):
        assert re.search(rf"\| 10 \| 4 \| {policy} \| [\d,]+ \| [\d.]+% \|", out)


@pytest.mark.slow
def test_gpu_benchmark_times_each_path_setting_tiny(off_tensorflow):
    """`--paths` times each pair-sum loss under every switch setting that applies to the list
    (the dense and 1024-column variants only above PairPlan.blocked_above, "no constants" only
    up to PairPlan.constant_free_above), each with its CPU time a step and XLA's temporaries."""
    out = section_output(off_tensorflow, "gpu --paths")
    rows = [cells for cells in _table_rows(out) if cells[1] == "12"]
    expected = ["default", "per-pair exps", "factored exps", "constants kept", "no constants",
                "per-pair exps, constants kept"]  # (benchmarks/gpu.py's PATH_VARIANTS)
    assert [(row[0], row[3]) for row in rows] == [(loss, name) for loss in
                                                  ("ApproxNDCG", "ApproxAP", "RankNet")
                                                  for name in expected]
    for row in rows:
        assert re.fullmatch(r"[\d,]+", row[4]) and row[5].endswith("×")
        assert re.fullmatch(r"[\d,]+", row[6]) and row[7].endswith("×") and row[8].endswith("MiB")
    for each_default in rows[::len(expected)]:  # each against its default
        assert each_default[5] == each_default[7] == "1.00×"


@pytest.mark.slow
def test_gpu_benchmark_times_each_scorer_tiny(off_tensorflow):
    """`--scorers` times the training step of B1024, DASALC and DASALC with quantile inputs, each
    with its milliseconds a step and XLA's temporaries."""
    out = section_output(off_tensorflow, "gpu --scorers")
    rows = [cells for cells in _table_rows(out) if cells[1:4] == ["10", "4", "float32"]]
    assert [row[0] for row in rows] == ["B1024", "dasalc", "dasalc input_transform=quantile"]
    for row in rows:
        assert re.fullmatch(r"[\d,]+", row[4]) and float(row[5]) > 0 and row[6].endswith("MiB")


def _table_rows(text):
    """Returns the cells of each markdown table row in `text` (header and rule lines too)."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]


@pytest.mark.slow  # its section shares the process of the device check's tiny runs
def test_gpu_benchmark_help_needs_neither_tensorflow_nor_rax(off_tensorflow):
    out = section_output(off_tensorflow, "gpu --help")
    assert "python -m benchmarks.gpu" in out and "--rax" in out and "--tiny" in out
