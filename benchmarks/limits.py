"""Measures this machine's limits that the other benchmarks report their figures against.

    python benchmarks/limits.py [--round-seconds 0.3]

* matmul FLOP/s, float32 and bfloat16: a 2048 × 2048 by 2048 × 2048 product (2·2048³ FLOP), the
  faster of a `tf.function` (oneDNN kernels) and XLA — the ceiling of a scorer's dense layers
  (`benchmarks/train.py`);
* sigmoid pairs/s: Σ_j σ(v_j − v_k) for every k of 8 lists of 1,000 (8M pairs) under XLA, forward
  only, fused (no [B, L, L] tensor is written) — the ceiling of a pairwise loss that evaluates
  every pair's σ once (`benchmarks/losses.py`); `exp` pairs/s beside it.

Each figure is the fastest of `ROUNDS` rounds, on the TensorFlow backend, all cores.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROUNDS = 7
MATMUL_SIZE = 2048
PAIR_BATCH, PAIR_LIST = 8, 1000


def fastest_seconds(call, round_seconds):
    """Returns the fastest per-call time of `ROUNDS` rounds of about `round_seconds` each."""
    for _ in range(2):
        call()
    best = float("inf")
    for _ in range(ROUNDS):
        start, calls = time.perf_counter(), 0
        while calls == 0 or time.perf_counter() - start < round_seconds:
            call()
            calls += 1
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def matmul_flops(dtype="float32", round_seconds=0.3, jit_compile=None):
    """Returns the FLOP/s of a square matmul of `MATMUL_SIZE` in `dtype`: with or without XLA,
    or (None) the faster of the two."""
    if jit_compile is None:
        return max(matmul_flops(dtype, round_seconds, jit) for jit in (False, True))
    rng = np.random.default_rng(0)
    a, b = (tf.cast(rng.normal(size=(MATMUL_SIZE, MATMUL_SIZE)), dtype) for _ in range(2))
    product = tf.function(lambda x, y: tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1], "float32")),
                          jit_compile=jit_compile)
    seconds = fastest_seconds(lambda: product(a, b).numpy(), round_seconds)
    return 2.0 * MATMUL_SIZE ** 3 / seconds


def pairs_per_second(function="sigmoid", round_seconds=0.3):
    """Returns how many pairs/s `Σ_j function(v_j − v_k)` evaluates, fused under XLA."""
    values = tf.constant(np.random.default_rng(0).normal(size=(PAIR_BATCH, PAIR_LIST)),
                         "float32")
    apply = {"sigmoid": tf.sigmoid, "exp": tf.exp}[function]
    sums = tf.function(lambda v: tf.reduce_sum(apply(v[:, None, :] - v[:, :, None]), axis=-1),
                       jit_compile=True)
    seconds = fastest_seconds(lambda: sums(values).numpy(), round_seconds)
    return PAIR_BATCH * PAIR_LIST ** 2 / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-seconds", type=float, default=0.3)
    args = parser.parse_args()
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} cores, fastest of {ROUNDS} rounds")
    for dtype in ("float32", "bfloat16"):
        for jit_compile, how in ((False, "tf.function"), (True, "XLA")):
            flops = matmul_flops(dtype, args.round_seconds, jit_compile)
            print(f"matmul {MATMUL_SIZE}³ {dtype}, {how}: {flops / 1e9:,.0f} GFLOP/s")
    for function in ("sigmoid", "exp"):
        print(f"Σ {function}(v_j − v_k), {PAIR_BATCH} × {PAIR_LIST}²: "
              f"{pairs_per_second(function, args.round_seconds) / 1e9:.2f} G pairs/s")


if __name__ == "__main__":
    main()
