"""Prints forward+backward throughput (lists/s) of every tfapprox loss beside TF-Ranking's.

    python benchmarks/losses.py [--round-seconds 0.3] [--jit] [--no-tfranking] [--loss NAME ...]

Each loss is timed at list sizes 10, 100 and 1000 (batch 256, 64 and 8; float32 labels 0..4,
no padding) on the TensorFlow backend: the gradient of the reduced loss with respect to the
scores, in a `tf.function` (XLA with `--jit`), compiled and warmed up first. TF-Ranking 0.5.5's
ApproxNDCG (temperature 0.1, i.e. our default alpha = 10), PairwiseLogistic and ListMLE are
timed the same way by `benchmarks/tfranking_losses.py --serve` in the side venv that
`.ci/tfranking-venv` prints (built on first use). Our timed rounds alternate with TF-Ranking's,
one at a time so the two never share the CPU but both see the same load from the rest of the
machine, and each figure is the fastest of 10 rounds. The last column is ours / TF-Ranking for
the TF-Ranking loss that computes the same per-list values. For the pairwise losses the table
adds the share of this machine's limit: pairs/s (lists/s × list size²) over the sigmoid pairs/s
that `benchmarks/limits.py` measures in the same run (a fused forward pass that evaluates each
pair's σ once, so a forward+backward pass at 100 % would be as cheap as that forward alone).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tfapprox import losses  # noqa: E402
from limits import pairs_per_second  # noqa: E402
from tfranking_losses import ROUNDS, SIZES, GradientTimer, make_inputs  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).resolve().parent

# Our loss -> the TF-Ranking loss with the same per-list values (tests/test_parity_tfranking.py).
COUNTERPARTS = {"ApproxNDCGLoss": "ApproxNDCGLoss", "RankNetLoss": "PairwiseLogisticLoss",
                "ListMLELoss": "ListMLELoss"}
PARAMS = {"approx_precision": {"k": 10}}
NOT_PAIRWISE = ("listmle", "weighted_listmle")  # O(L log L): no share of the pair limit


class TFRankingServer:
    """`benchmarks/tfranking_losses.py --serve` in the side venv: one timed round per request."""

    def __init__(self, round_seconds, jit_compile):
        built = subprocess.run([str(REPO / ".ci" / "tfranking-venv")], capture_output=True,
                               text=True)
        if built.returncode != 0:
            sys.exit(f"the TF-Ranking side venv could not be built:\n{built.stderr[-2000:]}\n"
                     "(run with --no-tfranking to time tfapprox alone)")
        python = built.stdout.strip().splitlines()[-1]
        command = [python, str(HERE / "tfranking_losses.py"), "--serve",
                   "--round-seconds", str(round_seconds)] + (["--jit"] if jit_compile else [])
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        self.versions = json.loads(self.read())

    def read(self):
        line = self.process.stdout.readline()
        if not line:
            sys.exit(f"tfranking_losses.py --serve exited with {self.process.wait()}")
        return line

    def round(self, name, list_size):
        self.process.stdin.write(f"{name} {list_size}\n")
        self.process.stdin.flush()
        return float(self.read())

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def measure(round_seconds, jit_compile, server, names):
    """Returns [(loss, list size, ours lists/s, TF-Ranking loss or None, its lists/s or None)]."""
    rows = []
    for name in names:
        cls = losses.LOSSES[name]
        loss = cls(**PARAMS.get(name, {}))
        counterpart = COUNTERPARTS.get(cls.__name__) if server else None
        for list_size, batch_size in SIZES:
            timer = GradientTimer(loss, *make_inputs(list_size, batch_size), round_seconds,
                                  jit_compile)
            ours, theirs = [], []
            for _ in range(ROUNDS):
                ours.append(timer.round())
                if counterpart:
                    theirs.append(server.round(counterpart, list_size))
            rows.append((cls.__name__, list_size, max(ours), counterpart,
                         max(theirs) if theirs else None))
            print(f"  {rows[-1]}", file=sys.stderr)
    return rows


def table(rows, pair_limit):
    """Returns the markdown table of `measure`'s rows; `pair_limit` is the sigmoid pairs/s."""
    pairwise = {losses.LOSSES[name].__name__ for name in losses.LOSSES
                if name not in NOT_PAIRWISE}
    lines = ["| loss | list size | batch | tfapprox lists/s | TF-Ranking loss | "
             "TF-Ranking lists/s | ours / TF-Ranking | share of pair limit |",
             "|---|---:|---:|---:|---|---:|---:|---:|"]
    for name, list_size, ours, counterpart, theirs in rows:
        line = f"| {name} | {list_size} | {dict(SIZES)[list_size]} | {ours:,.0f} |"
        if theirs is None:
            line += " | | |"
        else:
            line += f" {counterpart} | {theirs:,.0f} | {ours / theirs:.2f}× |"
        share = ours * list_size ** 2 / pair_limit if name in pairwise else None
        line += f" {share:.0%} |" if share is not None else " |"
        lines.append(line)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-seconds", type=float, default=0.3,
                        help=f"length of each of the {ROUNDS} timed rounds (default 0.3)")
    parser.add_argument("--jit", action="store_true", help="compile with XLA (jit_compile)")
    parser.add_argument("--no-tfranking", action="store_true",
                        help="time tfapprox alone (no side venv)")
    parser.add_argument("--loss", nargs="+", choices=sorted(losses.LOSSES),
                        default=list(losses.LOSSES), help="losses to time (default: all)")
    args = parser.parse_args()
    server = None if args.no_tfranking else TFRankingServer(args.round_seconds, args.jit)
    rows = measure(args.round_seconds, args.jit, server, args.loss)
    pair_limit = pairs_per_second("sigmoid", args.round_seconds)
    against = ""
    if server:
        server.close()
        against = (f"; TF-Ranking {server.versions['tensorflow-ranking']} on TensorFlow "
                   f"{server.versions['tensorflow']}")
    compiled = "XLA" if args.jit else "tf.function"
    print(f"Forward+backward lists/s ({compiled}, float32, CPU, {os.cpu_count()} cores, fastest "
          f"of {ROUNDS} rounds): tfapprox on TensorFlow {tf.__version__}{against}. Pair "
          f"limit (benchmarks/limits.py, same run): {pair_limit / 1e9:.2f} G sigmoid pairs/s.\n")
    print(table(rows, pair_limit))


if __name__ == "__main__":
    main()
