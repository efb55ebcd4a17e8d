"""Prints forward+backward throughput (lists/s) of every tfapprox loss beside TF-Ranking's.

    python benchmarks/losses.py [--round-seconds 0.3] [--jit] [--unknown-list-size]
                                [--no-tfranking] [--loss NAME ...]
                                [--counted-order-up-to N] [--network-order-up-to N]
                                [--per-pair-exps]
                                [--elementwise-sums-up-to N]

Each loss is timed at list sizes 10, 100 and 1000 (batch 256, 64 and 8; float32 labels 0..4,
no padding) on the TensorFlow backend: the gradient of the reduced loss with respect to the
scores, in a `tf.function` (XLA with `--jit`; traced for `[None, None]` inputs, as a trainer
traces whole lists, with `--unknown-list-size`), compiled and warmed up first. TF-Ranking 0.5.5's
ApproxNDCG (temperature 0.1, i.e. our default alpha = 10), PairwiseLogistic and ListMLE are
timed the same way (and TF-Ranking's losses that tfapprox has under the same name, at their
defaults) by `benchmarks/tfranking_losses.py --serve` in the side venv that
`.ci/tfranking-venv` prints (built on first use). Our timed rounds alternate with TF-Ranking's,
one at a time so the two never share the CPU but both see the same load from the rest of the
machine, and each figure is the fastest of 10 rounds. The last column is ours / TF-Ranking for
the TF-Ranking loss that computes the same per-list values. For the pairwise losses the table
adds the share of this machine's limit: pairs/s (lists/s × list size²) over the sigmoid pairs/s
that `benchmarks/limits.py` measures in the same run (a fused forward pass that evaluates each
pair's σ once, so a forward+backward pass at 100 % would be as cheap as that forward alone).

The path column says which of `tfapprox.pair_sums`' compiled-mode choices each loss took, read
from a separate traced call (the timed ones are not instrumented): lists ordered by a sorting
network, by counting or by a sort (under XLA, static list sizes: ListMLE's orders up to
`NETWORK_ORDER_UP_TO` by the network, other orders up to `COUNTED_ORDER_UP_TO` by counting), and
pair exponentials from per-document factors or one per pair (`FACTORED_EXPONENTIALS`, under XLA;
factors only where every list spans at most 2·EXP_LIMIT, so the share of calls that fit is
given). All were chosen from CPU measurements: `--counted-order-up-to 0`,
`--network-order-up-to 0` and `--per-pair-exps` take the other paths, so a run on another device
(a GPU) can check them. Without XLA, lists of a static size up to `ELEMENTWISE_SUMS_UP_TO` sum
their pairs by products and reductions instead of batched matmuls (`--elementwise-sums-up-to 0`
always takes the matmul).
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

from tfapprox import losses, pair_sums  # noqa: E402
import pair_paths  # noqa: E402
from limits import pairs_per_second  # noqa: E402
from tfranking_losses import ROUNDS, SAME_NAMED, SIZES, GradientTimer, make_inputs  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).resolve().parent

# Our loss -> the TF-Ranking loss with the same per-list values (tests/test_parity_tfranking.py).
COUNTERPARTS = {"ApproxNDCGLoss": "ApproxNDCGLoss", "RankNetLoss": "PairwiseLogisticLoss",
                "PairwiseLogisticLoss": "PairwiseLogisticLoss", "ListMLELoss": "ListMLELoss",
                **{name: name for name in SAME_NAMED}}
PARAMS = {"approx_precision": {"k": 10}, "gumbel_approx_precision": {"k": 10}}
# O(L log L) or O(L): no share of the pair limit
NOT_PAIRWISE = ("listmle", "weighted_listmle", "softmax_loss", "calibrated_softmax_loss",
                "sigmoid_cross_entropy_loss", "mean_squared_loss")


class TFRankingServer:
    """`benchmarks/tfranking_losses.py --serve` in the side venv: one timed round per request."""

    def __init__(self, round_seconds, jit_compile, unknown_list_size):
        built = subprocess.run([str(REPO / ".ci" / "tfranking-venv")], capture_output=True,
                               text=True)
        if built.returncode != 0:
            sys.exit(f"the TF-Ranking side venv could not be built:\n{built.stderr[-2000:]}\n"
                     "(run with --no-tfranking to time tfapprox alone)")
        python = built.stdout.strip().splitlines()[-1]
        command = [python, str(HERE / "tfranking_losses.py"), "--serve",
                   "--round-seconds", str(round_seconds)] + (["--jit"] if jit_compile else []) + (
                       ["--unknown-list-size"] if unknown_list_size else [])
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


def paths_taken(loss, inputs, jit_compile, unknown_list_size=False):
    """Returns which `tfapprox.pair_sums` paths a forward+backward pass of `loss` on `inputs` takes.

    One `GradientTimer` traces and calls its step, recorded by `pair_paths.recording`, in a graph
    that XLA does not compile but that takes XLA's paths when `jit_compile` (`compiled_by_xla`
    answers so), where the recorder can read the values it sees.
    """
    def read_traced(value, append):
        tf.py_function(lambda known: append(bool(known)), [value], [])

    with pair_paths.recording(jit_compile, read_traced) as described:
        GradientTimer(loss, *inputs, 0.0, jit_compile=False, unknown_list_size=unknown_list_size)
    return described()


def measure(round_seconds, jit_compile, unknown_list_size, server, names):
    """Returns [(loss, list size, ours lists/s, TF-Ranking loss or None, its lists/s or None,
    paths taken)]."""
    rows = []
    for name in names:
        cls = losses.LOSSES[name]
        loss = cls(**PARAMS.get(name, {}))
        counterpart = COUNTERPARTS.get(cls.__name__) if server else None
        for list_size, batch_size in SIZES:
            inputs = make_inputs(list_size, batch_size)
            paths = paths_taken(loss, inputs, jit_compile, unknown_list_size)
            timer = GradientTimer(loss, *inputs, round_seconds, jit_compile, unknown_list_size)
            ours, theirs = [], []
            for _ in range(ROUNDS):
                ours.append(timer.round())
                if counterpart:
                    theirs.append(server.round(counterpart, list_size))
            rows.append((cls.__name__, list_size, max(ours), counterpart,
                         max(theirs) if theirs else None, paths))
            print(f"  {rows[-1]}", file=sys.stderr)
    return rows


def table(rows, pair_limit):
    """Returns the markdown table of `measure`'s rows; `pair_limit` is the sigmoid pairs/s."""
    pairwise = {losses.LOSSES[name].__name__ for name in losses.LOSSES
                if name not in NOT_PAIRWISE}
    lines = ["| loss | list size | batch | tfapprox lists/s | TF-Ranking loss | "
             "TF-Ranking lists/s | ours / TF-Ranking | share of pair limit | path |",
             "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for name, list_size, ours, counterpart, theirs, paths in rows:
        line = f"| {name} | {list_size} | {dict(SIZES)[list_size]} | {ours:,.0f} |"
        if theirs is None:
            line += " | | |"
        else:
            line += f" {counterpart} | {theirs:,.0f} | {ours / theirs:.2f}× |"
        share = ours * list_size ** 2 / pair_limit if name in pairwise else None
        line += f" {share:.0%} |" if share is not None else " |"
        lines.append(f"{line} {paths} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-seconds", type=float, default=0.3,
                        help=f"length of each of the {ROUNDS} timed rounds (default 0.3)")
    parser.add_argument("--jit", action="store_true", help="compile with XLA (jit_compile)")
    parser.add_argument("--unknown-list-size", action="store_true",
                        help="trace for [None, None] inputs, as the trainer traces whole lists")
    parser.add_argument("--no-tfranking", action="store_true",
                        help="time tfapprox alone (no side venv)")
    parser.add_argument("--loss", nargs="+", choices=sorted(losses.LOSSES),
                        default=list(losses.LOSSES), help="losses to time (default: all)")
    parser.add_argument("--counted-order-up-to", type=int, default=pair_sums.COUNTED_ORDER_UP_TO,
                        help="under XLA, order lists of a static size up to this by counting "
                        "instead of sorting (default "
                        f"{pair_sums.COUNTED_ORDER_UP_TO}; 0 always sorts)")
    parser.add_argument("--network-order-up-to", type=int, default=pair_sums.NETWORK_ORDER_UP_TO,
                        help="under XLA, order ListMLE's lists of a static size up to this by a "
                        "sorting network instead of counting or sorting (default "
                        f"{pair_sums.NETWORK_ORDER_UP_TO}; 0 never)")
    parser.add_argument("--per-pair-exps", action="store_true",
                        help="under XLA, one exp per pair instead of per-document factors")
    parser.add_argument("--elementwise-sums-up-to", type=int,
                        default=pair_sums.ELEMENTWISE_SUMS_UP_TO,
                        help="without XLA, sum the pairs of lists of a static size up to this by "
                        "products instead of matmuls (default "
                        f"{pair_sums.ELEMENTWISE_SUMS_UP_TO}; 0 always takes the matmul)")
    args = parser.parse_args()
    pair_sums.ELEMENTWISE_SUMS_UP_TO = args.elementwise_sums_up_to
    pair_sums.COUNTED_ORDER_UP_TO = args.counted_order_up_to
    pair_sums.NETWORK_ORDER_UP_TO = args.network_order_up_to
    pair_sums.FACTORED_EXPONENTIALS = not args.per_pair_exps
    server = None if args.no_tfranking else TFRankingServer(args.round_seconds, args.jit,
                                                            args.unknown_list_size)
    rows = measure(args.round_seconds, args.jit, args.unknown_list_size, server, args.loss)
    pair_limit = pairs_per_second("sigmoid", args.round_seconds)
    against = ""
    if server:
        server.close()
        against = (f"; TF-Ranking {server.versions['tensorflow-ranking']} on TensorFlow "
                   f"{server.versions['tensorflow']}")
    compiled = "XLA" if args.jit else "tf.function"
    if args.unknown_list_size:
        compiled += " traced for a None list size"
    if args.jit:
        compiled += (f"; counted order up to list size {pair_sums.COUNTED_ORDER_UP_TO}, "
                     f"network order up to {pair_sums.NETWORK_ORDER_UP_TO}, "
                     f"{'factored' if pair_sums.FACTORED_EXPONENTIALS else 'per-pair'} exps")
    else:
        compiled += f"; pair sums by products up to list size {pair_sums.ELEMENTWISE_SUMS_UP_TO}"
    print(f"Forward+backward lists/s ({compiled}, float32, CPU, {os.cpu_count()} cores, fastest "
          f"of {ROUNDS} rounds): tfapprox on TensorFlow {tf.__version__}{against}. Pair "
          f"limit (benchmarks/limits.py, same run): {pair_limit / 1e9:.2f} G sigmoid pairs/s.\n")
    print(table(rows, pair_limit))


if __name__ == "__main__":
    main()
