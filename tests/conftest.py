"""Shared test helpers: random ranking batches and backend-neutral conversion."""

import gc
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

# On JAX every jitted function compiles on its first call, and many tests (in every xdist worker)
# compile the same programs: a run shares them through JAX's compilation cache, in a temporary
# directory that the first pytest process makes before Keras imports JAX, its xdist workers inherit
# through the environment, and it removes at the end (about a third off the JAX pass on 2 cores).
# A cache directory the caller names is used and kept.
_OWN_JAX_CACHE = (os.environ.get("KERAS_BACKEND") == "jax"
                  and "JAX_COMPILATION_CACHE_DIR" not in os.environ)
if _OWN_JAX_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="tfapprox-jax-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

# The suite compiles hundreds of small programs and runs each a few times, so XLA's compile time
# is most of its XLA and JAX time: without LLVM's optimisations and with XLA's older CPU fusion
# emitters, a loss and its gradient compile 3-4x faster (0.8 s -> 0.2 s), the same HLO, the same
# results, the JAX pass 258 s -> 99 s on 2 cores. XLA_FLAGS set by the caller are kept (the
# trainer's XLA-dump test adds its dump directory to these flags).
SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", SUITE_XLA_FLAGS)
# pytest-xdist starts one worker per core, so each worker's TensorFlow runs one thread per pool
# instead of one per core each (the fit and trainer tests: a fifth less wall time on 2 cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from keras import ops  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# What TensorFlow logs at start-up on a machine without a GPU, though nothing is wrong: the command
# lines (`python -m trainer`, `python -m tfapprox.data`) keep it off the terminal.
START_UP_NOTICES = ("cuInit", "oneDNN", "cudart", "absl::InitializeLog", "cpu_feature_guard")


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def random_batch(rng, batch=4, list_size=8, max_label=4, pad_fraction=0.2, distinct=True):
    """Returns (labels, scores) as float32 [batch, list_size]; padded slots have label -1."""
    labels = rng.integers(0, max_label + 1, size=(batch, list_size)).astype(np.float32)
    labels[rng.random((batch, list_size)) < pad_fraction] = -1.0
    if distinct:
        scores = rng.permutation(batch * list_size).reshape(batch, list_size).astype(np.float32)
        scores = scores / list_size + rng.normal(0, 0.01, size=scores.shape).astype(np.float32)
    else:
        scores = rng.normal(size=(batch, list_size)).astype(np.float32)
    return labels, scores


def side_venv_python():
    """Returns the TF-Ranking side venv's python (.ci/tfranking-venv builds it once, or
    $TFAPPROX_TFR_PYTHON names it), or fails (CI) / skips (elsewhere) with the reason."""
    override = os.environ.get("TFAPPROX_TFR_PYTHON")
    if override:
        return override
    script = REPO / ".ci" / "tfranking-venv"
    try:
        built = subprocess.run([str(script)], capture_output=True, text=True, timeout=3600)
        reason = "\n".join(built.stderr.strip().splitlines()[-6:])
        ok = built.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as error:
        reason, ok = repr(error), False
    if ok:
        return built.stdout.strip().splitlines()[-1]
    message = f"the TF-Ranking 0.5.5 side venv could not be built by {script}: {reason}"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def side_venv_environment():
    """The environment for a process of the TF-Ranking side venv (TensorFlow 2.15): no Keras
    backend, no GPU, quiet, and without the suite's XLA flags, which its older XLA refuses."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("KERAS_BACKEND", None)
    if env.get("XLA_FLAGS") == SUITE_XLA_FLAGS:
        del env["XLA_FLAGS"]
    return env


@pytest.fixture(scope="session")
def letor_folds(tmp_path_factory):
    """MQ2008 and OHSUMED in the standard FoldN/{train,vali,test}.txt layout (make_folds.sh)."""
    root = tmp_path_factory.mktemp("letor")
    for name in ("MQ2008", "OHSUMED"):
        subprocess.run([str(SHARED_DATA / "make_folds.sh"), name, str(root / name)], check=True)
    return root


@pytest.fixture
def rng():
    return np.random.default_rng(20091207)


@pytest.fixture(autouse=True)
def _collect_what_a_slow_test_left():
    """Collects the garbage a test that ran over a second left, then freezes what survives.

    Keras leaves a trained model's tf.data iterators in reference cycles, so Python's cyclic
    collector destroys them, and destroying one waits on its autotuning thread (gdb: the collecting
    thread in `~LogicalThreadWrapper`, that thread asleep in `Model::OptimizeLoop`). Left to a full
    collection late in an xdist worker, that stalled single tests for 15-110 s, 100-170 s of one
    worker's time in all; collected right after the test that made them, none took over 3 s.
    Frozen, the survivors are not walked again by later collections.
    """
    started = time.perf_counter()
    yield
    if time.perf_counter() - started > 1.0:
        gc.collect()
        gc.freeze()


def pytest_unconfigure(config):
    if _OWN_JAX_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if not SHARED_DATA.is_dir():
        skip = pytest.mark.skip(reason=f"LETOR data not found at {SHARED_DATA}")
        for item in items:
            if "data" in item.keywords:
                item.add_marker(skip)
    _modules_with_slow_tests_first(items)


def _modules_with_slow_tests_first(items):
    """Runs the modules holding `slow` tests (training, exports, processes: most of the suite's
    time) before the quick ones, each module whole (its module fixtures built once), so that a
    run ends on quick tests, not with one core idle behind a long one (see below)."""
    slow = {item.nodeid.split("::")[0] for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a hook of pytest-xdist, when loaded
def pytest_xdist_make_scheduler(config, log):
    """`-n N` without `--dist` schedules by work stealing: each worker starts on half of the
    tests in order, and one that runs out takes the untaken half of the other's queue. (xdist's
    default `load` hands out fixed chunks up front, so the worker given the slow modules first
    kept them all while the other ran out.)"""
    if any(arg.startswith(("--dist", "-d")) for arg in config.invocation_params.args):
        return None  # the caller's choice
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


def backend():
    return os.environ.get("KERAS_BACKEND", "tensorflow")


# How a value and its gradient are computed on each backend: op by op, or compiled, the first
# being the default. On JAX only jitted: it is how Keras runs JAX, and JAX op by op runs the same
# primitives, each compiled on its own (three to four times slower, for nothing more checked).
COMPILE_MODES = {"tensorflow": ("eager", "graph", "xla"), "jax": ("jit",)}.get(
    backend(), ("eager",))


def compiled_on_jax(function):
    """`function` as it is; on JAX jitted, as Keras runs JAX (see COMPILE_MODES): op by op, JAX
    compiles each primitive on its own for every new shape, 10-30x the CPU of one jitted call
    (an empty batch's per-list values of ApproxNDCG 1.0 s -> 0.03 s), for nothing more checked.
    Checks of values that only an eager call makes are tested by calling the eager function."""
    if backend() != "jax":
        return function
    import jax

    return jax.jit(function)


def loss_and_grad(loss_fn, labels, scores, mode=None, unknown_shape=False):
    """Returns (value, d value / d scores) as numpy, on the active Keras backend.

    `loss_fn(labels, scores_tensor)` must return a scalar (it is summed otherwise). `mode` is one
    of `COMPILE_MODES` (default the first); compiled, the gradient is taken inside the compiled
    function, as in a Keras train step. `unknown_shape` traces a compiled TensorFlow function for
    `[None, None]` labels and scores (the shape whole lists have in the trainer); JAX always sees
    static shapes.
    """
    return value_and_grad_function(loss_fn, mode, unknown_shape)(labels, scores)


def value_and_grad_function(loss_fn, mode=None, unknown_shape=False):
    """`loss_and_grad` of `loss_fn` in `mode` as one function of (labels, scores), to call on many
    batches: compiled, it is traced (and compiled by XLA) once per shape, or on TensorFlow once
    for every shape if `unknown_shape`."""
    mode = mode or COMPILE_MODES[0]
    name = backend()
    if name == "tensorflow":
        import tensorflow as tf

        def value_and_grad(y, x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = tf.reduce_sum(loss_fn(y, x))
            return value, tape.gradient(value, x)

        if mode != "eager":
            signature = [tf.TensorSpec((None, None), tf.float32)] * 2 if unknown_shape else None
            value_and_grad = tf.function(value_and_grad, jit_compile=mode == "xla",
                                         input_signature=signature)

        def run(labels, scores):
            labels = None if labels is None else tf.convert_to_tensor(labels)
            value, grad = value_and_grad(labels, tf.convert_to_tensor(scores))
            return value.numpy(), grad.numpy()

        return run
    if name == "jax":
        import jax
        import jax.numpy as jnp

        value_and_grad = jax.value_and_grad(lambda s, y: jnp.sum(loss_fn(y, s)))
        if mode == "jit":
            value_and_grad = jax.jit(value_and_grad)
        return lambda labels, scores: tuple(
            np.asarray(t) for t in value_and_grad(jnp.asarray(scores), labels))

    def run_torch(labels, scores):
        import torch

        x = torch.tensor(scores, requires_grad=True)
        value = torch.sum(loss_fn(labels, x))
        value.backward()
        return value.detach().numpy(), x.grad.numpy()

    return run_torch


# Arguments a registered class cannot be built without; everything else takes its defaults.
REQUIRED_ARGS = {"ApproxPrecisionLoss": {"k": 3}, "GumbelApproxPrecisionLoss": {"k": 3},
                 "PrecisionAtK": {"k": 3}}


def registered(base):
    """Returns one default instance of every class registered under package `tfapprox` that
    subclasses `base` (a new loss or metric joins every test that uses this by registering)."""
    import keras

    import tfapprox.losses  # noqa: F401  (registration happens on import)
    import tfapprox.metrics  # noqa: F401
    import tfapprox.models  # noqa: F401

    classes = [cls for key, cls in keras.saving.get_custom_objects().items()  # functions too
               if key.startswith("tfapprox>") and isinstance(cls, type) and issubclass(cls, base)]
    return [cls(**REQUIRED_ARGS.get(cls.__name__, {})) for cls in classes]


# Variants of a loss skeleton that another registered loss takes through every compile mode (the
# pairwise pair function, softmax, the pointwise mean, the smooth ranks, Gumbel sampling): they run
# no code of their own in the other modes, so the mode-by-mode tests take them in fewer modes.
SKELETON_VARIANTS = {"CalibratedSoftmaxLoss", "PairwiseLogisticLoss", "PairwiseSoftZeroOneLoss",
                     "PairwiseMSELoss", "MeanSquaredLoss", "ApproxMRRLoss", "GumbelApproxAPLoss",
                     "GumbelApproxPrecisionLoss", "YetiLogisticLoss", "OrdinalLoss"}


def registered_losses_in_modes(modes, variant_modes):
    """pytest params `(loss, mode)`: every registered loss in each of `modes`, a loss of
    SKELETON_VARIANTS only in those of `variant_modes`."""
    import keras

    return [pytest.param(loss, mode, id=f"{type(loss).__name__}-{mode}")
            for loss in registered(keras.losses.Loss) for mode in modes
            if mode in variant_modes or type(loss).__name__ not in SKELETON_VARIANTS]
