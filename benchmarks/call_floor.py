"""Prints the CPU cost of one forward+backward call of `benchmarks/losses.py`'s timed step for
SoftmaxLoss and PairwiseHingeLoss beside the floors of that step: a trivial loss (Σ l·s) and bare
losses written with `tf.nn` ops (no padding, NaN or empty-list handling, no reduction rules).

    python benchmarks/call_floor.py [--jit]                            # tfapprox, this venv
    SIDE_VENV_PYTHON benchmarks/call_floor.py [--jit]                  # TF-Ranking 0.5.5

With the side venv's python (`.ci/tfranking-venv` prints it) the same-named TF-Ranking losses
are timed instead of ours, on TensorFlow 2.15. Lists of 10, 100 and 1000 documents (batches 256,
64 and 8, as `benchmarks/losses.py`), `tf.function` (XLA with `--jit`). Each figure is the median
of 9 interleaved rounds of the process's CPU time per call (all threads, `time.process_time`):
on a loaded machine that counts the work a call does rather than its wait for a core, so the
two venvs' runs compare although they cannot share rounds. A loss whose cost is close to the
trivial floor is bound by the per-call cost of `tf.function` (and XLA's launch), not by its own
arithmetic.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tfranking_losses import SIZES, GradientTimer, make_inputs  # noqa: E402

ROUNDS = 9
ROUND_CPU_SECONDS = 0.1


def trivial(labels, scores):
    return tf.reduce_sum(labels * scores)


def bare_softmax(labels, scores):
    targets = labels / tf.reduce_sum(labels, axis=-1, keepdims=True)
    return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(targets, scores))


def bare_hinge(labels, scores):
    differences = scores[:, :, None] - scores[:, None, :]
    ordered = labels[:, :, None] > labels[:, None, :]
    return tf.reduce_mean(tf.reduce_sum(tf.where(ordered, tf.nn.relu(1.0 - differences), 0.0),
                                        axis=(1, 2)))


def candidates():
    """Returns {name: loss}: the floors, then the losses of this venv's library."""
    found = {"trivial Σ l·s": trivial, "bare softmax": bare_softmax, "bare hinge": bare_hinge}
    try:
        import tensorflow_ranking as tfr

        found["TF-Ranking SoftmaxLoss"] = tfr.keras.losses.SoftmaxLoss()
        found["TF-Ranking PairwiseHingeLoss"] = tfr.keras.losses.PairwiseHingeLoss()
    except ImportError:
        from tfapprox import losses

        found["tfapprox SoftmaxLoss"] = losses.SoftmaxLoss()
        found["tfapprox PairwiseHingeLoss"] = losses.PairwiseHingeLoss()
    return found


def cpu_seconds_per_call(timer, calls):
    start = time.process_time()
    for _ in range(calls):
        timer.call()
    return (time.process_time() - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jit", action="store_true", help="compile the step with XLA")
    args = parser.parse_args()
    losses = candidates()
    print(f"CPU µs per forward+backward call (TensorFlow {tf.__version__}, "
          f"{'XLA' if args.jit else 'tf.function'}, median of {ROUNDS} interleaved rounds)\n")
    print("| loss | " + " | ".join(f"list {size} (batch {batch})" for size, batch in SIZES) + " |")
    print("|---|" + "---:|" * len(SIZES))
    cells = {name: [] for name in losses}
    for list_size, batch_size in SIZES:
        labels, scores = make_inputs(list_size, batch_size)
        timers = {name: GradientTimer(loss, labels, scores, 0.05, jit_compile=args.jit)
                  for name, loss in losses.items()}
        calls = {name: max(3, round(ROUND_CPU_SECONDS / cpu_seconds_per_call(timer, 3)))
                 for name, timer in timers.items()}
        rounds = {name: [] for name in losses}
        for _ in range(ROUNDS):
            for name, timer in timers.items():
                rounds[name].append(cpu_seconds_per_call(timer, calls[name]))
        for name in losses:
            cells[name].append(f"{statistics.median(rounds[name]) * 1e6:,.0f}")
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
