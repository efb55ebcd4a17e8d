"""Peak memory and time of NeuralNDCGLoss, forward and backward, by list length.

    python benchmarks/neural_ndcg_memory.py [--backend tensorflow|jax]
                                            [--compile graph|xla|jit|eager] [--repeats 1]
                                            [--list-sizes 1000 2000 5000 10000]

Protocol. One list of each length, the loss at its defaults (τ = 1, 50 Sinkhorn rounds), float32
labels 0..4 and N(0, 1) scores (seed 0), no padding; the gradient of the loss with respect to the
scores, compiled as `--compile` says, each case in a fresh subprocess with `long_lists.py`'s
protocol (peak RSS = `ru_maxrss` at the end; "before" = the same just before the first call).
"Added" is peak minus before, the memory the step itself took; "L² tensors" is that in units of
one `[L, L]` float32 tensor (4·L² bytes), which stays flat when the memory is O(L²).
"""

import argparse
import json
import os
import platform
import sys
import time

from long_lists import (COMPILE_CHOICES, cpu_model, gradient_step, memory_cells, peak_rss_mib,
                        print_load, run_subprocess, subprocess_env, versions)

LIST_SIZES = (1_000, 2_000, 5_000, 10_000)


def run_case(size, backend, compile_mode, repeats):
    """Runs one list of `size` documents in this process and prints its figures as JSON."""
    import numpy as np
    from keras import ops

    from tfapprox import losses

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


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=sorted(COMPILE_CHOICES), default="tensorflow")
    parser.add_argument("--compile", choices=("graph", "xla", "jit", "eager"),
                        help="how the step runs (default: graph on TensorFlow, jit on JAX)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed calls after the first (default 1; the fastest is reported)")
    parser.add_argument("--list-sizes", type=int, nargs="+", default=LIST_SIZES, metavar="SIZE")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)  # one list, in this process
    args = parser.parse_args()
    compile_mode = args.compile or COMPILE_CHOICES[args.backend][0]
    if compile_mode not in COMPILE_CHOICES[args.backend]:
        parser.error(f"--compile {compile_mode} is not a choice on {args.backend}; "
                     f"choose one of {COMPILE_CHOICES[args.backend]}")
    if args.case:
        run_case(args.case, args.backend, compile_mode, args.repeats)
        return

    env = subprocess_env(args.backend)
    load_before = os.getloadavg()
    print(f"{cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"{versions(args.backend)}; {compile_mode}", flush=True)
    print("\n| documents | first call s | best of next s | finite | RSS before MiB | "
          "peak RSS MiB | added MiB | L² tensors |\n|---:|---:|---:|---|---:|---:|---:|---:|",
          flush=True)
    for size in args.list_sizes:
        command = [sys.executable, __file__, "--backend", args.backend, "--compile",
                   compile_mode, "--repeats", str(args.repeats), "--case", str(size)]
        row, reason = run_subprocess(command, env)
        if row is None:
            print(f"| {size:,} | failed: {reason} | | | | | | |", flush=True)
            continue
        added = row["peak_rss_mib"] - row["rss_before_mib"]
        matrices = added * 2 ** 20 / (4 * size ** 2)
        print(f"| {size:,} | {memory_cells(row, 1)} | {added:,.0f} | {matrices:.1f} |",
              flush=True)
    print_load(load_before)


if __name__ == "__main__":
    main()
