"""The device check: tfapprox on whatever accelerator JAX sees, beside Rax, against the card's limits.

    python -m benchmarks.gpu [--rax] [--tiny] [--paths] [--round-seconds 0.2] [--rounds 5]

Keras runs on JAX and TensorFlow is never imported, so this needs numpy, Keras and JAX only (and
Rax with `--rax`): it runs on a GPU machine that has no TensorFlow. It prints, in one run:

1. The device, and its matmul peak measured here: the best FLOP/s of a jitted n×n matmul
   (n = 8192), in float32 (JAX's default precision: TF32 on the tensor cores of cards that have
   them) and in bfloat16.
2. The peak device memory of one forward+backward pass of ApproxNDCG over one list of 60,000
   documents (`jax.Device.memory_stats()`, "not available" where the device keeps none, as the
   CPU), and the temporary memory XLA planned for it (`memory_analysis()` of the compiled step).
   Measured first, before anything else has raised the device's peak.
3. Forward+backward throughput (lists/s) of the ApproxNDCG, ApproxAP, RankNet, ListMLE and Softmax
   losses at lists of 10, 100, 1000 and 10,000 documents (batch 4096, 1024, 64, 4; labels 0..4, no
   padding), each the mean loss and its gradient with respect to the scores, jitted and warmed up;
   with `--rax`, beside Rax's `approx_t12n(ndcg_metric)` and `approx_t12n(ap_metric)` (temperature
   1/alpha = 0.1, as ours), `pairwise_logistic_loss`, `listmle_loss` and `softmax_loss`, timed in
   alternating rounds (best of `--rounds`), and the ratio ours / Rax. The path column says which
   of `tfapprox.pair_plan`'s choices each loss took (benchmarks/pair_paths.py).
4. A training step of the B1024 scorer (`build_scorer("B1024")`, 136 features as MSLR-WEB30K, Adagrad,
   ApproxNDCG; a jitted stateless Keras step on device-resident batches) at lists of 100 (320 lists
   a step) and 1000 (32 lists), in float32 and mixed bfloat16: documents/s, and the share of the
   matmul peak of (1) in the same precision that the scorer's dense layers reach (6 FLOPs per
   weight per document: forward, and the two matmuls of the backward pass).

`--paths` prints, instead of 1-4, the pair-sum losses (ApproxNDCG, ApproxAP, RankNet) at the same
sizes under each of several `tfapprox.pair_plan.PairPlan`s, timed in alternating rounds with each
other (and Rax's, with `--rax`): the default; one exp per pair instead of per-document factors
(`factored_exponentials=False`); the factors wherever the lists fit them
(`per_pair_exps_on_gpu_up_to` and `per_pair_sigmoid_exps_on_cpu_up_to` 0); the backward passes
with their constants at every list size (`constant_free_above` unbounded); per-pair exps with
constants; for lists up to `constant_free_above`, the backward passes without constants; and for
lists above `blocked_above`, dense pairs and blocks of 1024 columns. Beside the best lists/s it
prints the median CPU time a step over the rounds (`time.process_time`, steadier than wall time
where other work shares the machine). It shows which path is fastest on the device at hand.

`--scorers` prints, instead of 1-4, the training step of (4) for B1024, DASALC (`build_scorer(
"dasalc")`: log1p inputs, two self-attention blocks over the list) and DASALC with quantile inputs
(fitted to the batch), at lists of 100 (320 a step), 1000 (32) and 10,000 (4), in float32 and mixed
bfloat16: documents/s, milliseconds a step, and the temporary memory XLA planned for the step
(self-attention's `[lists, heads, L, L]` arrays grow as L² a list).

`--tiny` runs the same code at small sizes on any device in seconds (the suite runs it on CPU so
that it cannot rot); its figures mean nothing.
"""

import argparse
import dataclasses
import functools
import importlib.metadata
import os
import pathlib
import statistics
import sys
import time
import types

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfapprox import losses, pair_plan  # noqa: E402
from tfapprox.models import PRESETS, build_scorer  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import pair_paths  # noqa: E402  (benchmarks/pair_paths.py)

ALPHA = 10.0  # our losses' default smoothing; Rax's temperature is 1 / ALPHA
SIZES = {"full": ((10, 4096), (100, 1024), (1000, 64), (10000, 4)), "tiny": ((10, 4), (40, 2))}
TRAIN = {"full": {"lists": ((100, 320), (1000, 32)), "features": 136, "preset": "B1024"},
         "tiny": {"lists": ((10, 4),), "features": 8, "preset": "B64"}}
# `--scorers`: the scorers (a preset and `build_scorer` options) and list sizes × lists a step
SCORERS = (("B1024", {}), ("dasalc", {}), ("dasalc", {"input_transform": "quantile"}))
SCORER_LISTS = {"full": ((100, 320), (1000, 32), (10000, 4)), "tiny": ((10, 4),)}
SCORER_POLICIES = {"full": ("float32", "mixed_bfloat16"), "tiny": ("float32",)}
MATMUL_SIZE = {"full": 8192, "tiny": 256}
LONG_LIST = {"full": 60_000, "tiny": 2_000}


def _rax_losses(rax):
    """Returns {row: Rax's loss function(scores, labels)}."""
    return {
        "ApproxNDCG": rax.approx_t12n(rax.ndcg_metric, temperature=1.0 / ALPHA),
        "ApproxAP": rax.approx_t12n(rax.ap_metric, temperature=1.0 / ALPHA),
        "RankNet": rax.pairwise_logistic_loss,
        "ListMLE": rax.listmle_loss,
        "Softmax": rax.softmax_loss,
    }


# row -> the tfapprox loss's name for `tfapprox.losses.get`
OUR_LOSSES = {"ApproxNDCG": "approx_ndcg", "ApproxAP": "approx_ap", "RankNet": "ranknet",
              "ListMLE": "listmle", "Softmax": "softmax_loss"}


def import_rax():
    """Imports Rax 0.4, which decorates with `jax.util.wraps`, gone from current JAX: a stand-in
    that only copies the wrapped function's name and docstring is put there first."""
    util = getattr(jax, "util", None) or types.ModuleType("jax.util")
    if not hasattr(util, "wraps"):
        def wraps(wrapped, namestr=None, docstr=None, **kwargs):
            return lambda function: functools.update_wrapper(function, wrapped)

        util.wraps = wraps
        jax.util = util
    import rax

    return rax


def lists(list_size, batch, seed=0):
    """Returns device arrays (labels 0..4, scores N(0, 1)), float32 `[batch, list_size]`."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=(batch, list_size)).astype(np.float32)
    scores = rng.normal(size=(batch, list_size)).astype(np.float32)
    return jnp.asarray(labels), jnp.asarray(scores)


def best_rate(steps, seconds, rounds):
    """Returns the best units/s of each of `steps` (`timed_rounds`)."""
    return [rate for rate, _ in timed_rounds(steps, seconds, rounds)]


def timed_rounds(steps, seconds, rounds):
    """Times each of `steps` (callables that run one unit of work and block) in alternating
    rounds of at least `seconds`; returns (best units/s, median CPU seconds per unit) of each,
    the CPU time being this process's over a round (`time.process_time`, all its threads: on a
    machine that other work shares, steadier than wall time)."""
    repeats = []
    for step in steps:
        step()  # compiled and warm
        started, count = time.perf_counter(), 0
        while time.perf_counter() - started < seconds / 4 or count == 0:
            step()
            count += 1
        repeats.append(max(1, int(count / (time.perf_counter() - started) * seconds)))
    best = [0.0] * len(steps)
    cpu = [[] for _ in steps]
    for _ in range(rounds):
        for i, step in enumerate(steps):
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(repeats[i]):
                step()
            best[i] = max(best[i], repeats[i] / (time.perf_counter() - started))
            cpu[i].append((time.process_time() - cpu_started) / repeats[i])
    return [(rate, statistics.median(times)) for rate, times in zip(best, cpu)]


def blocking(function, *args):
    """Returns a callable that runs the jitted `function(*args)` and waits for its result."""
    return lambda: jax.block_until_ready(function(*args))


def gradient_of(loss, labels_first):
    """Returns jit(mean loss, ∂ mean loss / ∂ scores) as a function of (labels, scores).

    The value too, as a training step takes it: with the gradient alone, XLA drops the forward
    pass of a loss whose custom gradient does not need it (RankNet's), and Rax's cannot."""
    if labels_first:
        value = lambda labels, scores: loss(labels, scores)  # noqa: E731  (a Keras loss)
    else:
        value = lambda labels, scores: loss(scores, labels)  # noqa: E731  (a Rax loss)
    return jax.jit(jax.value_and_grad(value, argnums=1))


def matmul_peaks(size, seconds, rounds):
    """Returns {dtype: FLOP/s} of the best jitted size×size matmul."""
    peaks = {}
    for dtype in ("float32", "bfloat16"):
        a = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), dtype)
        matmul = jax.jit(jnp.matmul)
        (rate,) = best_rate([blocking(matmul, a, a)], seconds, rounds)
        peaks[dtype] = rate * 2 * size ** 3
    return peaks


def long_list_memory(list_size):
    """Returns (peak device bytes or None, XLA's temporary bytes or None) of one forward+backward
    pass of ApproxNDCG over one list of `list_size` documents."""
    device = jax.devices()[0]
    labels, scores = lists(list_size, 1)
    gradient = gradient_of(losses.ApproxNDCGLoss(alpha=ALPHA), True)
    compiled = gradient.lower(labels, scores).compile()
    temporary = temporary_bytes(compiled)
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    before = stats.get("bytes_in_use") if stats else None
    jax.block_until_ready(compiled(labels, scores))
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "peak_bytes_in_use" not in stats or before is None:
        return None, temporary
    return stats["peak_bytes_in_use"] - before, temporary


def loss_rows(sizes, seconds, rounds, rax_losses):
    """Returns [(row, list size, batch, ours lists/s or None, Rax lists/s or None, path)]."""
    rows = []
    for row in OUR_LOSSES:
        ours = losses.get(OUR_LOSSES[row])
        for list_size, batch in sizes:
            labels, scores = lists(list_size, batch)
            steps = [blocking(gradient_of(ours, True), labels, scores)]
            path = pair_paths.describe(pair_paths.traced_on_jax(ours, labels, scores))
            if rax_losses:
                steps.append(blocking(gradient_of(rax_losses[row], False), labels, scores))
            rates = [rate * batch for rate in best_rate(steps, seconds, rounds)]
            mine = rates.pop(0)
            theirs = rates.pop(0) if rax_losses else None
            rows.append((row, list_size, batch, mine, theirs, path))
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


# --paths: (name, {PairPlan field: value}, applies to lists of this size)
DEFAULT = pair_plan.DEFAULT
PATH_VARIANTS = (
    ("default", {}, lambda size: True),
    ("per-pair exps", {"factored_exponentials": False}, lambda size: True),
    ("factored exps", {"per_pair_exps_on_gpu_up_to": 0, "per_pair_sigmoid_exps_on_cpu_up_to": 0},
     lambda size: True),
    ("constants kept", {"constant_free_above": 2 ** 31}, lambda size: True),
    ("no constants", {"constant_free_above": 0},
     lambda size: size <= DEFAULT.constant_free_above),
    ("per-pair exps, constants kept", {"factored_exponentials": False,
                                       "constant_free_above": 2 ** 31}, lambda size: True),
    ("dense pairs", {"blocked_above": 2 ** 31}, lambda size: size > DEFAULT.blocked_above),
    ("blocks of 1024", {"pair_block": 1024}, lambda size: size > DEFAULT.blocked_above),
)
PATH_LOSSES = ("ApproxNDCG", "ApproxAP", "RankNet")


def path_rows(sizes, seconds, rounds, rax_losses):
    """Returns [(row, list size, batch, variant, lists/s, median CPU seconds a step, XLA's
    temporary bytes, path)] of `--paths`: each variant compiled under its switches, then all
    timed in alternating rounds (Rax's last, as "Rax")."""
    rows = []
    for row in PATH_LOSSES:
        ours = losses.get(OUR_LOSSES[row])
        for list_size, batch in sizes:
            labels, scores = lists(list_size, batch)
            names, steps, temporaries, paths = [], [], [], []
            for name, settings, applies in PATH_VARIANTS:
                if not applies(list_size):
                    continue
                with pair_plan.using(dataclasses.replace(DEFAULT, **settings)):
                    compiled = gradient_of(ours, True).lower(labels, scores).compile()
                    paths.append(pair_paths.describe(pair_paths.traced_on_jax(ours, labels,
                                                                              scores)))
                names.append(name)
                steps.append(blocking(compiled, labels, scores))
                temporaries.append(temporary_bytes(compiled))
            if rax_losses:
                compiled = gradient_of(rax_losses[row], False).lower(labels, scores).compile()
                names.append("Rax")
                steps.append(blocking(compiled, labels, scores))
                temporaries.append(temporary_bytes(compiled))
                paths.append("")
            timed = timed_rounds(steps, seconds, rounds)
            for name, (rate, cpu), temporary, path in zip(names, timed, temporaries, paths):
                rows.append((row, list_size, batch, name, rate * batch, cpu, temporary, path))
                print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def temporary_bytes(compiled):
    """Returns the temporary memory XLA planned for a compiled function, or None."""
    analysis = compiled.memory_analysis()
    return getattr(analysis, "temp_size_in_bytes", None) if analysis is not None else None


def path_table(rows):
    lines = [("| loss | list size | batch | path setting | lists/s | / default | CPU µs a step "
              "| default / this (CPU) | XLA's temporaries | path |"),
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    default = {}
    for row, list_size, batch, name, rate, cpu, temporary, path in rows:
        default.setdefault((row, list_size, batch), (rate, cpu))  # the first variant is the default
        default_rate, default_cpu = default[(row, list_size, batch)]
        lines.append(f"| {row} | {list_size} | {batch} | {name} | {rate:,.0f} "
                     f"| {rate / default_rate:.2f}× | {cpu * 1e6:,.0f} "
                     f"| {default_cpu / cpu:.2f}× | {megabytes(temporary)} | {path} |")
    return "\n".join(lines)


def dense_weights_per_document(preset, num_features):
    """Returns the multiply-adds per document of the scorer's dense layers (Σ in·out)."""
    widths = [num_features, *PRESETS[preset.upper()], 1]
    return sum(a * b for a, b in zip(widths, widths[1:]))


def training_rate(preset, num_features, list_size, batch, policy, seconds, rounds, **options):
    """Returns documents/s of one jitted Adagrad step of ApproxNDCG on the scorer
    (`build_scorer(preset, **options)`, its input quantiles fitted to the batch where it has
    them), and XLA's temporary bytes for that step (None where the backend plans none)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = build_scorer(preset, **options)  # (set_random_seed would import TensorFlow)
        rng = np.random.default_rng(0)
        features = jnp.asarray(rng.normal(size=(batch, list_size, num_features)), "float32")
        mask = jnp.ones((batch, list_size), bool)
        labels, _ = lists(list_size, batch)
        model({"features": features[:1], "mask": mask[:1]})
        model.adapt(np.asarray(features))
        optimizer = keras.optimizers.Adagrad(0.05)
        optimizer.build(model.trainable_variables)
        loss = losses.ApproxNDCGLoss(alpha=ALPHA)
    finally:
        keras.config.set_dtype_policy(previous)

    def value(trainable, non_trainable, features, mask, labels):
        scores, non_trainable = model.stateless_call(
            trainable, non_trainable, {"features": features, "mask": mask}, training=True)
        return loss(labels, scores), non_trainable

    gradient = jax.value_and_grad(value, has_aux=True)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, features, mask, labels):
        trainable, non_trainable, optimizer_variables = state
        (_, non_trainable), grads = gradient(trainable, non_trainable, features, mask, labels)
        trainable, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable)
        return trainable, non_trainable, optimizer_variables

    state = [[v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables]]

    compiled = step.lower(tuple(state), features, mask, labels).compile()

    def one_step():
        state[:] = jax.block_until_ready(compiled(tuple(state), features, mask, labels))

    (rate,) = best_rate([one_step], seconds, rounds)
    return rate * batch * list_size, temporary_bytes(compiled)


def scorer_table(num_features, sizes, policies, seconds, rounds):
    """Times the training step of each of `SCORERS` at `sizes` ((list size, lists a step), ...)
    in each dtype policy, printing each row as it is measured; returns the table."""
    lines = [f"Training step ({num_features} features, Adagrad, ApproxNDCG) of each scorer:",
             "| scorer | list size | lists a step | precision | documents/s | ms a step "
             "| XLA's temporaries |", "|---|---:|---:|---|---:|---:|---:|"]
    for list_size, batch in sizes:
        for preset, options in SCORERS:
            name = preset + "".join(f" {k}={v}" for k, v in options.items())
            for policy in policies:
                documents, temporary = training_rate(preset, num_features, list_size, batch,
                                                     policy, seconds, rounds, **options)
                lines.append(f"| {name} | {list_size} | {batch} | {policy} | {documents:,.0f} "
                             f"| {batch * list_size / documents * 1e3:,.2f} "
                             f"| {megabytes(temporary)} |")
                print(f"  {lines[-1]}", file=sys.stderr, flush=True)
    return "\n".join(lines)


def describe_device():
    device = jax.devices()[0]
    versions = []
    for package in ("jax", "jaxlib", "keras", "numpy", "rax"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return (f"Device: {device.platform.upper()} {device.device_kind} ({len(jax.devices())} "
            f"visible) | {', '.join(versions)} | Python {sys.version.split()[0]}")


def loss_table(rows, with_rax):
    lines = ["| loss | list size | batch | tfapprox lists/s | Rax lists/s | tfapprox / Rax | path |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for row, list_size, batch, ours, theirs, path in rows:
        theirs_text = f"{theirs:,.0f}" if theirs is not None else ("" if not with_rax else "-")
        ratio = f"{ours / theirs:.2f}×" if theirs else ""
        lines.append(f"| {row} | {list_size} | {batch} | {ours:,.0f} | {theirs_text} | {ratio} "
                     f"| {path} |")
    return "\n".join(lines)


def megabytes(value):
    return "not available" if value is None else f"{value / 2 ** 20:,.0f} MiB"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rax", action="store_true", help="time Rax's losses beside ours")
    parser.add_argument("--tiny", action="store_true",
                        help="small sizes: seconds on a CPU, figures meaningless (the suite's check)")
    parser.add_argument("--paths", action="store_true",
                        help="time the pair-sum losses under each compiled-mode switch instead")
    parser.add_argument("--scorers", action="store_true",
                        help="time the training step of B1024 and DASALC (log1p, quantile) instead")
    parser.add_argument("--lists", default=None,
                        help="list sizes and batches to time, as 300x256,60000x1 (default: "
                             "10x4096,100x1024,1000x64,10000x4; --tiny 10x4,40x2)")
    parser.add_argument("--round-seconds", type=float, default=None,
                        help="seconds per timed round (default 0.2; --tiny 0.01)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; --tiny 1)")
    args = parser.parse_args(argv)
    scale = "tiny" if args.tiny else "full"
    seconds = args.round_seconds or (0.01 if args.tiny else 0.2)
    rounds = args.rounds or (1 if args.tiny else 5)
    sizes = (tuple(tuple(int(n) for n in pair.split("x")) for pair in args.lists.split(","))
             if args.lists else SIZES[scale])
    started = time.perf_counter()
    rax_losses = _rax_losses(import_rax()) if args.rax else None

    print(describe_device(), flush=True)
    if args.paths:
        print("\nForward+backward of the pair-sum losses under each path setting:")
        print(path_table(path_rows(sizes, seconds, rounds, rax_losses)), flush=True)
        print(f"\nWall time {time.perf_counter() - started:.0f} s")
        return
    if args.scorers:
        print(scorer_table(TRAIN[scale]["features"], SCORER_LISTS[scale], SCORER_POLICIES[scale],
                           seconds, rounds))
        print(f"\nWall time {time.perf_counter() - started:.0f} s")
        return
    peak, temporary = long_list_memory(LONG_LIST[scale])
    print(f"\nOne list of {LONG_LIST[scale]:,} documents, ApproxNDCG forward+backward: peak device "
          f"memory {megabytes(peak)}, XLA's temporaries {megabytes(temporary)}", flush=True)

    size = MATMUL_SIZE[scale]
    peaks = matmul_peaks(size, seconds, rounds)
    print(f"\nMatmul peak ({size}×{size}, measured): " + ", ".join(
        f"{dtype} {flops / 1e12:,.2f} TFLOP/s" for dtype, flops in peaks.items()), flush=True)

    print("\nForward+backward of each loss (the mean loss and its gradient w.r.t. the scores):")
    print(loss_table(loss_rows(sizes, seconds, rounds, rax_losses), args.rax), flush=True)

    train = TRAIN[scale]
    weights = dense_weights_per_document(train["preset"], train["features"])
    print(f"\nTraining step: {train['preset']} scorer, {train['features']} features, Adagrad, "
          "ApproxNDCG (share: dense-layer FLOP/s over the matmul peak of the same dtype)")
    print("| list size | lists a step | precision | documents/s | share of matmul peak |")
    print("|---:|---:|---|---:|---:|")
    for list_size, batch in train["lists"]:
        for policy, dtype in (("float32", "float32"), ("mixed_bfloat16", "bfloat16")):
            documents, _ = training_rate(train["preset"], train["features"], list_size, batch,
                                         policy, seconds, rounds)
            share = documents * 6 * weights / peaks[dtype]
            print(f"| {list_size} | {batch} | {policy} | {documents:,.0f} | {share:.1%} |",
                  flush=True)
    print(f"\nWall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
