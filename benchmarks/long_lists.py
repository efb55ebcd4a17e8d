"""Time, finiteness and peak memory of ApproxNDCGLoss and ApproxAPLoss, and of DASALC's
self-attention, on long lists.

    python benchmarks/long_lists.py [--backend tensorflow|jax] [--compile graph|xla|jit|eager]
                                    [--pairwise auto|blocked|dense] [--repeats 2]
                                    [--list-sizes 60000 10000]
    python benchmarks/long_lists.py --dasalc [--repeats 2] [--list-sizes 1000 2000 4000 8000]

Protocol. Six cases: each loss (defaults: alpha 10, beta 10) on one list of 60,000 documents,
on a batch of 4 lists of 10,000 and on one list of 10,000 (`--list-sizes` keeps the cases of the
sizes named); float32 labels 0..4 and N(0, 1) scores (seed 0), no padding.
A case is the gradient of the reduced loss with respect to the scores, forward and backward, as
in a train step: in a `tf.function` (`--compile graph`, the default; `xla` adds jit_compile) on
TensorFlow, under `jax.jit` (`jit`) on JAX, or op by op (`eager`: under an eager
`tf.GradientTape`, as in a custom training loop, `run_eagerly=True` or a notebook, or
`jax.value_and_grad` without jit). The pairwise sums are chosen
by `--pairwise` (default "auto": lists this long are summed in blocks of `tfapprox.pair_plan`'s
`pair_block` columns; "dense" builds the [B, L, L] pairs, tens of GB here).

`--dasalc`: the DASALC recipe (`tfapprox.models.RECIPES`: a B256 tower, two blocks of 2-head
self-attention over the list, 64 units) on one list of each `--list-sizes` length (default 1,000,
2,000, 4,000 and 8,000), F = 46 N(0, 1) features (seed 0), in a `tf.function` on TensorFlow, two
cases per length: "serve", the inference call an export makes (`training=False`), and "train",
the gradient of the mean squared score with respect to every trainable weight (`training=True`,
forward and backward, as in a train step). Each attention block holds [lists, heads, L, L] grids,
so memory grows with the L² document pairs; the table gives the growth of peak RSS per pair.

Each case runs in a fresh Python subprocess, so its peak resident memory is its own: peak RSS is
`resource.getrusage(RUSAGE_SELF).ru_maxrss` at the end, "before" the same just before the first
call (framework, model-free inputs). Reported: the first call (tracing and compiling included),
the fastest of the next `--repeats` calls, whether the value and every gradient entry are finite,
and both RSS figures. The header gives the machine, the load average before and after (the
machine may be shared: times scale with load, peak memory does not), and the versions.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

CASES = [(loss, batch, size) for loss in ("ApproxNDCGLoss", "ApproxAPLoss")
         for batch, size in ((1, 60_000), (4, 10_000), (1, 10_000))]
COMPILE_CHOICES = {"tensorflow": ("graph", "xla", "eager"), "jax": ("jit", "eager")}
DASALC_SIZES = (1_000, 2_000, 4_000, 8_000)
DASALC_MODES = ("serve", "train")
DASALC_FEATURES = 46


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def gradient_step(loss, backend, compile_mode):
    """Returns `step(labels, scores) -> (value, gradient)` as numpy, compiled as asked."""
    if backend == "tensorflow":
        import tensorflow as tf

        def step(labels, scores):
            with tf.GradientTape() as tape:
                tape.watch(scores)
                value = loss(labels, scores)
            return value, tape.gradient(value, scores)

        if compile_mode != "eager":
            step = tf.function(step, jit_compile=compile_mode == "xla")
        return lambda labels, scores: [x.numpy() for x in step(labels, scores)]
    import jax

    step = jax.value_and_grad(lambda scores, labels: loss(labels, scores))
    if compile_mode == "jit":
        step = jax.jit(step)
    return lambda labels, scores: [jax.device_get(x) for x in step(scores, labels)]


def run_case(loss_name, batch, size, backend, compile_mode, pairwise, repeats):
    """Runs one case in this process and prints its figures as one JSON line."""
    import numpy as np
    from keras import ops

    from tfapprox import losses

    rng = np.random.default_rng(0)
    labels = ops.convert_to_tensor(rng.integers(0, 5, size=(batch, size)).astype(np.float32))
    scores = ops.convert_to_tensor(rng.normal(size=(batch, size)).astype(np.float32))
    step = gradient_step(getattr(losses, loss_name)(pairwise=pairwise), backend, compile_mode)
    rss_before = peak_rss_mib()
    start = time.perf_counter()
    value, gradient = step(labels, scores)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        value, gradient = step(labels, scores)
        times.append(time.perf_counter() - start)
    print(json.dumps({
        "first_s": first, "best_s": min(times) if times else None, "value": float(value),
        "finite": bool(np.isfinite(value) and np.all(np.isfinite(gradient))),
        "rss_before_mib": rss_before, "peak_rss_mib": peak_rss_mib()}))


def dasalc_step(mode, size):
    """Returns `(step, inputs)`: DASALC's inference call ("serve") or the gradient of its mean
    squared score with respect to its weights ("train"), in a tf.function, and one list of `size`
    documents to run it on."""
    import numpy as np
    import tensorflow as tf

    from tfapprox.models import build_scorer

    model = build_scorer("dasalc")
    features = np.random.default_rng(0).normal(size=(1, size, DASALC_FEATURES))
    inputs = {"features": tf.constant(features, tf.float32), "mask": tf.ones([1, size], tf.bool)}
    model({"features": inputs["features"][:, :2], "mask": inputs["mask"][:, :2]})

    @tf.function
    def step(inputs):
        if mode == "serve":
            return model(inputs, training=False)
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(tf.square(model(inputs, training=True)))
        return tape.gradient(value, model.trainable_variables)

    return step, inputs


def run_dasalc_case(mode, size, repeats):
    """Runs one DASALC case in this process and prints its figures as one JSON line."""
    import numpy as np

    step, inputs = dasalc_step(mode, size)
    rss_before = peak_rss_mib()
    start = time.perf_counter()
    outputs = step(inputs)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = step(inputs)
        times.append(time.perf_counter() - start)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    print(json.dumps({
        "first_s": first, "best_s": min(times) if times else None,
        "finite": all(bool(np.all(np.isfinite(x.numpy()))) for x in outputs),
        "rss_before_mib": rss_before, "peak_rss_mib": peak_rss_mib()}))


def versions(backend):
    import keras

    names = {"keras": keras.__version__}
    if backend == "tensorflow":
        import tensorflow as tf

        names["tensorflow"] = tf.__version__
    else:
        import jax

        names["jax"] = jax.__version__
    return ", ".join(f"{name} {version}" for name, version in names.items())


def cpu_model():
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=sorted(COMPILE_CHOICES), default="tensorflow")
    parser.add_argument("--compile", choices=("graph", "xla", "jit", "eager"),
                        help="how the step runs (default: graph on TensorFlow, jit on JAX)")
    parser.add_argument("--pairwise", choices=("auto", "blocked", "dense"), default="auto")
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed calls after the first (default 2; the fastest is reported)")
    parser.add_argument("--list-sizes", type=int, nargs="+", metavar="SIZE",
                        help="run only the cases of these list sizes (default: all; with "
                        "--dasalc: 1000 2000 4000 8000)")
    parser.add_argument("--dasalc", action="store_true",
                        help="DASALC's memory by list length instead of the losses' (TensorFlow)")
    parser.add_argument("--case", nargs=3, metavar=("LOSS", "BATCH", "LIST_SIZE"),
                        help=argparse.SUPPRESS)  # one case, in this process (the subprocesses)
    parser.add_argument("--dasalc-case", nargs=2, metavar=("MODE", "LIST_SIZE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dasalc or args.dasalc_case:
        if args.backend != "tensorflow":
            parser.error("--dasalc runs on the tensorflow backend (the export's)")
        if args.dasalc_case:
            run_dasalc_case(args.dasalc_case[0], int(args.dasalc_case[1]), args.repeats)
        else:
            run_dasalc(args.list_sizes or DASALC_SIZES, args.repeats)
        return
    args.list_sizes = args.list_sizes or sorted({size for _, _, size in CASES}, reverse=True)
    compile_mode = args.compile or COMPILE_CHOICES[args.backend][0]
    if compile_mode not in COMPILE_CHOICES[args.backend]:
        parser.error(f"--compile {compile_mode} is not a choice on {args.backend}; "
                     f"choose one of {COMPILE_CHOICES[args.backend]}")
    if args.case:
        loss_name, batch, size = args.case[0], int(args.case[1]), int(args.case[2])
        run_case(loss_name, batch, size, args.backend, compile_mode, args.pairwise, args.repeats)
        return

    env = subprocess_env(args.backend)
    load_before = os.getloadavg()
    print(f"{cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"{versions(args.backend)}; {compile_mode}, pairwise={args.pairwise}", flush=True)
    print("\n| loss | lists × documents | first call s | best of next s | finite | "
          "RSS before MiB | peak RSS MiB |\n|---|---|---:|---:|---|---:|---:|", flush=True)
    for loss_name, batch, size in [case for case in CASES if case[2] in args.list_sizes]:
        command = [sys.executable, __file__, "--backend", args.backend, "--compile",
                   compile_mode, "--pairwise", args.pairwise, "--repeats", str(args.repeats),
                   "--case", loss_name, str(batch), str(size)]
        row, reason = run_subprocess(command, env)
        if row is None:
            print(f"| {loss_name} | {batch} × {size:,} | failed: {reason} | | | | |", flush=True)
            continue
        best = "" if row["best_s"] is None else f"{row['best_s']:.1f}"
        print(f"| {loss_name} | {batch} × {size:,} | {row['first_s']:.1f} | {best} | "
              f"{'yes' if row['finite'] else 'NO'} | {row['rss_before_mib']:,.0f} | "
              f"{row['peak_rss_mib']:,.0f} |", flush=True)
    print_load(load_before)


def subprocess_env(backend):
    """Returns (and sets in this process) the cases' environment: `backend`, CPU only, quiet."""
    env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": "",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    os.environ.update(env)
    return env


def run_subprocess(command, env):
    """Returns `(figures, None)` from a case's last output line, or `(None, reason)` if it failed."""
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1]), None


def memory_cells(row, digits):
    """A memory case's table cells: first call s | best of next s | finite | RSS before MiB | peak
    RSS MiB."""
    best = "" if row["best_s"] is None else f"{row['best_s']:.{digits}f}"
    return (f"{row['first_s']:.{digits}f} | {best} | {'yes' if row['finite'] else 'NO'} | "
            f"{row['rss_before_mib']:,.0f} | {row['peak_rss_mib']:,.0f}")


def print_load(load_before):
    load_after = os.getloadavg()
    print(f"\nLoad average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
          f"after: {', '.join(f'{x:.2f}' for x in load_after)}")


def run_dasalc(sizes, repeats):
    """Prints DASALC's table: each mode on one list of each of `sizes` documents."""
    env = subprocess_env("tensorflow")
    load_before = os.getloadavg()
    print(f"{cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"{versions('tensorflow')}; DASALC (tfapprox.models.RECIPES), F = {DASALC_FEATURES}, "
          "tf.function", flush=True)
    print("\n| mode | documents (1 list) | pairs L² | first call s | best of next s | finite | "
          "RSS before MiB | peak RSS MiB | growth bytes per pair |\n"
          "|---|---:|---:|---:|---:|---|---:|---:|---:|", flush=True)
    for mode in DASALC_MODES:
        for size in sizes:
            command = [sys.executable, __file__, "--repeats", str(repeats),
                       "--dasalc-case", mode, str(size)]
            row, reason = run_subprocess(command, env)
            if row is None:
                print(f"| {mode} | {size:,} | {size**2:,} | failed: {reason} | | | | | |",
                      flush=True)
                continue
            growth = (row["peak_rss_mib"] - row["rss_before_mib"]) * 2**20 / size**2
            print(f"| {mode} | {size:,} | {size**2:,} | {memory_cells(row, 2)} | {growth:.1f} |",
                  flush=True)
    print_load(load_before)


if __name__ == "__main__":
    main()
