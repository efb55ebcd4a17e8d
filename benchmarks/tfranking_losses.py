"""TF-Ranking's half of `benchmarks/losses.py`, and the timing harness both halves share.

`benchmarks/losses.py` starts this file with `--serve` under the side venv's python
(`.ci/tfranking-venv`: TensorFlow 2.15, TF-Ranking 0.5.5) and imports `SIZES`, `make_inputs`
and `GradientTimer` from it, so both sides time the same inputs the same way. Served, it reads
requests `LOSS LIST_SIZE` from stdin, one a line, and answers each with the lists/s of one
timed round (compiling and warming up on a pair's first request), so the caller can interleave
our rounds with TF-Ranking's and both see the same load on the machine. Run alone it times
every TF-Ranking loss and prints JSON:

    "$(.ci/tfranking-venv)" benchmarks/tfranking_losses.py [--round-seconds 0.3] [--jit]
                                                           [--unknown-list-size]
"""

import argparse
import importlib.metadata
import json
import sys
import time

import numpy as np
import tensorflow as tf

SIZES = ((10, 256), (100, 64), (1000, 8))  # (list size, batch size)
ROUNDS = 10


def make_inputs(list_size, batch_size, seed=0):
    """Returns float32 `(labels, scores)` `[batch_size, list_size]`: labels 0..4, no padding."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=(batch_size, list_size)).astype(np.float32)
    scores = rng.normal(size=(batch_size, list_size)).astype(np.float32)
    return tf.constant(labels), tf.constant(scores)


class GradientTimer:
    """Times forward+backward of `loss` on one batch: the gradient of the reduced loss with
    respect to the scores, in a `tf.function` (XLA with `jit_compile`).

    Building it compiles, warms up and picks how many calls make a round of about
    `round_seconds`; each `round()` returns that round's lists/s. Report the fastest round, as
    `timeit` advises: slower ones measure the other processes on the machine, not the loss.
    `unknown_list_size` traces the step for `[None, None]` inputs, as whole lists are traced in a
    trainer.
    """

    def __init__(self, loss, labels, scores, round_seconds=0.3, jit_compile=False,
                 unknown_list_size=False):
        self.labels, self.scores = labels, scores
        signature = [tf.TensorSpec((None, None), tf.float32)] * 2 if unknown_list_size else None

        @tf.function(jit_compile=jit_compile, input_signature=signature)
        def step(labels, scores):
            with tf.GradientTape() as tape:
                tape.watch(scores)
                value = loss(labels, scores)
            return value, tape.gradient(value, scores)

        self.step = step
        self.calibrate(round_seconds)

    def calibrate(self, round_seconds):
        """Compiles and warms up the step and picks how many calls make a round."""
        for _ in range(3):
            self.call()
        start, calls = time.perf_counter(), 0
        while calls < 2 or time.perf_counter() - start < 0.2 * round_seconds:
            self.call()
            calls += 1
        self.calls_per_round = max(1, round(round_seconds * calls / (time.perf_counter() - start)))

    def call(self):
        return self.step(self.labels, self.scores)[1].numpy()

    def round(self):
        """Returns the lists/s of one timed round."""
        start = time.perf_counter()
        for _ in range(self.calls_per_round):
            self.call()
        return self.calls_per_round * int(self.labels.shape[0]) / (time.perf_counter() - start)


# TF-Ranking's losses that tfapprox has under the same name and defaults (`benchmarks/losses.py`
# times ours beside them).
SAME_NAMED = ("SoftmaxLoss", "CalibratedSoftmaxLoss", "UniqueSoftmaxLoss", "PairwiseHingeLoss",
              "PairwiseSoftZeroOneLoss", "PairwiseMSELoss", "YetiLogisticLoss",
              "SigmoidCrossEntropyLoss", "MeanSquaredLoss", "ApproxMRRLoss",
              "GumbelApproxNDCGLoss")


def tfranking_losses():
    """Returns {name: TF-Ranking loss}, with ApproxNDCG at our default alpha = 10."""
    import tensorflow_ranking as tfr

    return {
        "ApproxNDCGLoss": tfr.keras.losses.ApproxNDCGLoss(temperature=0.1),
        "PairwiseLogisticLoss": tfr.keras.losses.PairwiseLogisticLoss(),
        "ListMLELoss": tfr.keras.losses.ListMLELoss(),
        **{name: getattr(tfr.keras.losses, name)() for name in SAME_NAMED},
    }


def versions():
    return {package: importlib.metadata.version(package)
            for package in ("tensorflow", "tensorflow-ranking")}


def serve(round_seconds, jit_compile, unknown_list_size, losses=None, versions_line=None):
    """Answers `LOSS LIST_SIZE` lines on stdin with one round's lists/s each, until EOF, after
    a first line of versions; `losses` (name -> loss) default to TF-Ranking's
    (`benchmarks/losses.py --serve` passes tfapprox's)."""
    losses, timers = losses or tfranking_losses(), {}
    print(json.dumps(versions_line or versions()), flush=True)
    for line in sys.stdin:
        name, list_size = line.split()
        key = name, int(list_size)
        if key not in timers:
            batch_size = dict(SIZES)[key[1]]
            timers[key] = GradientTimer(losses[name], *make_inputs(key[1], batch_size),
                                        round_seconds, jit_compile, unknown_list_size)
        print(timers[key].round(), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-seconds", type=float, default=0.3,
                        help=f"length of each of the {ROUNDS} timed rounds (default 0.3)")
    parser.add_argument("--jit", action="store_true", help="compile with XLA (jit_compile)")
    parser.add_argument("--unknown-list-size", action="store_true",
                        help="trace for [None, None] inputs, as a trainer traces whole lists")
    parser.add_argument("--serve", action="store_true",
                        help="answer `LOSS LIST_SIZE` requests on stdin (see the docstring)")
    args = parser.parse_args()
    if args.serve:
        serve(args.round_seconds, args.jit, args.unknown_list_size)
        return
    results = []
    for name, loss in tfranking_losses().items():
        for list_size, batch_size in SIZES:
            timer = GradientTimer(loss, *make_inputs(list_size, batch_size), args.round_seconds,
                                  args.jit, args.unknown_list_size)
            results.append({"loss": name, "list_size": list_size, "batch_size": batch_size,
                            "lists_per_s": max(timer.round() for _ in range(ROUNDS))})
    print(json.dumps({"versions": versions(), "results": results}))


if __name__ == "__main__":
    main()
