"""Peak memory and time of NeuralNDCGLoss, forward and backward, by list length, in every mode a
user trains in, against a memory bound.

    python benchmarks/neural_ndcg_memory.py [--modes tf-graph tf-xla tf-eager jax-jit]
                                            [--list-sizes 1000 2000 5000 10000] [--repeats 1]
                                            [--bound-mb 2000] [--jobs 1]

Protocol. One list of each length, the loss at its defaults (τ = 1, 50 Sinkhorn rounds), float32
labels 0..4 and N(0, 1) scores (seed 0), no padding; the gradient of the loss with respect to the
scores in each mode: TensorFlow in a `tf.function` (tf-graph), with jit_compile=True (tf-xla,
Keras' default train step on TensorFlow), op by op under a `tf.GradientTape` (tf-eager), and
`jax.jit(jax.value_and_grad)` (jax-jit; jax-eager runs it without jit). Each case runs in a
fresh subprocess with `long_lists.py`'s protocol (peak RSS = `ru_maxrss` at the end; "before" =
the same just before the first call, which traces and compiles). "Added" is peak minus before,
the memory the step itself took; "L² tensors" is that in units of one `[L, L]` float32 tensor
(4·L² bytes). The last lines say, for each mode, whether every list stayed within `--bound-mb`
(decimal megabytes, 10^6 bytes) added. `--jobs` runs that many cases at once: peak memory is
per process and unchanged, times then are not comparable.
"""

import argparse
import concurrent.futures
import json
import os
import platform
import sys
import time

from long_lists import (cpu_model, gradient_step, memory_cells, peak_rss_mib, print_load,
                        run_subprocess, subprocess_env, versions)

LIST_SIZES = (1_000, 2_000, 5_000, 10_000)
MODES = {"tf-graph": ("tensorflow", "graph"), "tf-xla": ("tensorflow", "xla"),
         "tf-eager": ("tensorflow", "eager"), "jax-jit": ("jax", "jit"),
         "jax-eager": ("jax", "eager")}
DEFAULT_MODES = ("tf-graph", "tf-xla", "tf-eager", "jax-jit")


def run_case(size, mode, repeats):
    """Runs one list of `size` documents in this process and prints its figures as JSON."""
    import numpy as np
    from keras import ops

    from tfapprox import losses

    backend, compile_mode = MODES[mode]
    rng = np.random.default_rng(0)
    labels = ops.convert_to_tensor(rng.integers(0, 5, size=(1, size)).astype(np.float32))
    scores = ops.convert_to_tensor(rng.normal(size=(1, size)).astype(np.float32))
    step = gradient_step(losses.NeuralNDCGLoss(), backend, compile_mode)
    rss_before = peak_rss_mib()
    seconds = []
    for _ in range(1 + repeats):  # the first call traces and compiles
        start = time.perf_counter()
        value, gradient = step(labels, scores)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({
        "first_s": seconds[0], "best_s": min(seconds[1:], default=None),
        "finite": bool(np.isfinite(value) and np.all(np.isfinite(gradient))),
        "rss_before_mib": rss_before, "peak_rss_mib": peak_rss_mib()}))


def run_in_subprocess(size, mode, repeats):
    """Returns `(figures, None)` or `(None, reason)` of one case run in a fresh subprocess."""
    command = [sys.executable, __file__, "--repeats", str(repeats), "--case", mode, str(size)]
    return run_subprocess(command, subprocess_env(MODES[mode][0]))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=DEFAULT_MODES,
                        help="how the step runs (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed calls after the first (default 1; the fastest is reported)")
    parser.add_argument("--list-sizes", type=int, nargs="+", default=LIST_SIZES, metavar="SIZE")
    parser.add_argument("--bound-mb", type=float, default=2000.0,
                        help="memory added per list to check, in 10^6 bytes (default 2000)")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    parser.add_argument("--case", nargs=2, metavar=("MODE", "SIZE"),
                        help=argparse.SUPPRESS)  # one list, in this process
    args = parser.parse_args()
    if args.case:
        run_case(int(args.case[1]), args.case[0], args.repeats)
        return

    load_before = os.getloadavg()
    backends = sorted({MODES[mode][0] for mode in args.modes})
    print(f"{cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"{'; '.join(versions(backend) for backend in backends)}", flush=True)
    print("\n| mode | documents | first call s | best of next s | finite | RSS before MiB | "
          "peak RSS MiB | added MiB | L² tensors |\n"
          "|---|---:|---:|---:|---|---:|---:|---:|---:|", flush=True)
    cases = [(mode, size) for mode in args.modes for size in args.list_sizes]
    worst = {mode: 0.0 for mode in args.modes}
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = pool.map(lambda case: run_in_subprocess(case[1], case[0], args.repeats), cases)
        for (mode, size), (row, reason) in zip(cases, results):
            if row is None:
                worst[mode] = float("inf")
                print(f"| {mode} | {size:,} | failed: {reason} | | | | | | |", flush=True)
                continue
            added = row["peak_rss_mib"] - row["rss_before_mib"]
            worst[mode] = max(worst[mode], added)
            print(f"| {mode} | {size:,} | {memory_cells(row, 1)} | {added:,.0f} | "
                  f"{added * 2 ** 20 / (4 * size ** 2):.1f} |", flush=True)
    bound_mib = args.bound_mb * 1e6 / 2 ** 20
    print(f"\nBound: {args.bound_mb:,.0f} MB ({bound_mib:,.0f} MiB) added per list, up to "
          f"{max(args.list_sizes):,} documents:")
    for mode, added in worst.items():
        verdict = "within" if added <= bound_mib else "OVER"
        print(f"  {mode}: {verdict} (largest {added:,.0f} MiB)")
    print_load(load_before)


if __name__ == "__main__":
    main()
