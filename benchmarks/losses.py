"""Prints forward+backward throughput (lists/s) of every tfapprox loss beside TF-Ranking's.

    python benchmarks/losses.py [--backend tensorflow|jax] [--round-seconds 0.3] [--jit]
                                [--unknown-list-size] [--no-tfranking] [--no-peers]
                                [--loss NAME ...]
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

The path column says which of `tfapprox.pair_plan`'s choices each loss took, as
`pair_plan.recording_paths` records them while a separate step is traced
(`benchmarks/pair_paths.py`; the timed steps are the same code, not instrumented): which choices
XLA compiles, lists ordered by a sorting network, by counting or by a sort (under XLA, static list
sizes: ListMLE's orders up to `network_order_up_to` by the network, other orders up to
`counted_order_up_to` by counting), pair exponentials from per-document factors where every list
spans at most 2·EXP_LIMIT or one per pair (`factored_exponentials`), and RankNet's backward pass
on JAX. All were chosen from CPU measurements: `--counted-order-up-to 0`,
`--network-order-up-to 0` and `--per-pair-exps` time the losses under a `PairPlan` that takes the
other paths, so a run on another device (a GPU) can check them. Without XLA, lists of a static
size up to `elementwise_sums_up_to` sum their pairs by products and reductions instead of batched
matmuls (`--elementwise-sums-up-to 0` always takes the matmul).

With `--backend jax` each loss runs on Keras' JAX backend instead: forward+backward under
`jax.jit`, labels and scores passed as arguments (as Keras' JAX train step passes them; closed
over, they become constants that XLA folds into [B, L, L] tensors). Beside it, in the same
interleaved rounds: the same loss on TensorFlow with XLA (this script's `--serve --jit`, in a
subprocess on the TensorFlow backend) and Rax 0.4's counterpart (`rax.approx_t12n(rax.ndcg_metric,
temperature=0.1)`, `rax.pairwise_logistic_loss`, `rax.listmle_loss`, `rax.softmax_loss`, and for
ApproxAP the nearest, `rax.approx_t12n(rax.ap_metric, temperature=0.1)`, whose smooth AP is built
differently; `--no-peers` times tfapprox alone). The path column is the JAX step's. Rax calls
`jax.util.wraps`, which current JAX no longer has: the script supplies one.

The JAX table of docs/benchmarks.md (each loss at lists 10, 100 and 1000 beside TF + XLA and Rax):

    python benchmarks/losses.py --backend jax --loss approx_ndcg approx_ap ranknet \
        weighted_ranknet listmle softmax_loss
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import types


def _backend_asked():
    """Returns the Keras backend that `--backend` asks for, read before Keras is imported (the
    TensorFlow backend when this file is imported)."""
    if __name__ != "__main__":
        return "tensorflow"
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--backend", choices=("tensorflow", "jax"), default="tensorflow")
    return parser.parse_known_args()[0].backend


os.environ["KERAS_BACKEND"] = _backend_asked()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfapprox import losses  # noqa: E402
from tfapprox.pair_plan import DEFAULT, PairPlan, using  # noqa: E402
import pair_paths  # noqa: E402
from limits import pairs_per_second  # noqa: E402
from tfranking_losses import ROUNDS, SAME_NAMED, SIZES, GradientTimer, make_inputs, serve  # noqa: E402

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


class RoundServer:
    """A process that answers `LOSS LIST_SIZE` lines with the lists/s of one timed round each,
    after a first line of versions (`tfranking_losses.serve`)."""

    def __init__(self, command):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        self.versions = json.loads(self.read())

    def read(self):
        line = self.process.stdout.readline()
        if not line:
            sys.exit(f"{self.process.args[1:3]} exited with {self.process.wait()}")
        return line

    def round(self, name, list_size):
        self.process.stdin.write(f"{name} {list_size}\n")
        self.process.stdin.flush()
        return float(self.read())

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def tfranking_server(round_seconds, jit_compile, unknown_list_size):
    """Returns `benchmarks/tfranking_losses.py --serve` in the side venv (built on first use)."""
    built = subprocess.run([str(REPO / ".ci" / "tfranking-venv")], capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"the TF-Ranking side venv could not be built:\n{built.stderr[-2000:]}\n"
                 "(run with --no-tfranking to time tfapprox alone)")
    python = built.stdout.strip().splitlines()[-1]
    return RoundServer([python, str(HERE / "tfranking_losses.py"), "--serve",
                        "--round-seconds", str(round_seconds)]
                       + (["--jit"] if jit_compile else [])
                       + (["--unknown-list-size"] if unknown_list_size else []))


def tensorflow_xla_server(round_seconds):
    """Returns this script's `--serve --jit`: tfapprox's losses on TensorFlow with XLA."""
    return RoundServer([sys.executable, str(pathlib.Path(__file__).resolve()), "--serve", "--jit",
                        "--round-seconds", str(round_seconds)])


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
            paths = pair_paths.describe(pair_paths.traced_on_tensorflow(
                loss, *inputs, jit_compile, unknown_list_size))
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


class JaxGradientTimer(GradientTimer):
    """`GradientTimer` on JAX: forward+backward of `loss(labels, scores)` (summed to a scalar)
    under `jax.jit`, labels and scores passed as arguments."""

    def __init__(self, loss, labels, scores, round_seconds=0.3):
        import jax
        import jax.numpy as jnp

        self.labels, self.scores = jnp.asarray(labels), jnp.asarray(scores)
        self.step = jax.jit(jax.value_and_grad(lambda s, y: jnp.sum(loss(y, s))))
        self.calibrate(round_seconds)

    def call(self):
        return self.step(self.scores, self.labels)[1].block_until_ready()


def _give_jax_a_util_wraps():
    """Supplies `jax.util.wraps` (gone from JAX's public API), which Rax 0.4's transformations
    call to name the functions they return."""
    import jax

    if hasattr(jax, "util") and hasattr(jax.util, "wraps"):
        return

    def wraps(wrapped, namestr=None, docstr=None, **kwargs):
        def named(function):
            name = getattr(wrapped, "__name__", "function")
            function.__name__ = name if namestr is None else namestr.format(fun=name)
            doc = wrapped.__doc__ or ""
            function.__doc__ = doc if docstr is None else docstr.format(fun=name, doc=doc,
                                                                       **kwargs)
            function.__wrapped__ = wrapped
            return function
        return named

    jax.util = types.SimpleNamespace(wraps=wraps)


def rax_counterparts():
    """Returns {our loss name: (Rax function, loss(labels, scores))} with the same per-list
    values up to reduction (ApproxNDCG at our α = 10 is temperature 0.1), and for ApproxAP the
    nearest Rax has."""
    _give_jax_a_util_wraps()
    import rax

    approx_ndcg = rax.approx_t12n(rax.ndcg_metric, temperature=0.1)
    approx_ap = rax.approx_t12n(rax.ap_metric, temperature=0.1)
    return {"approx_ndcg": ("approx_t12n(ndcg_metric)", lambda y, s: -approx_ndcg(s, y)),
            "approx_ap": ("approx_t12n(ap_metric)", lambda y, s: -approx_ap(s, y)),
            "ranknet": ("pairwise_logistic_loss", lambda y, s: rax.pairwise_logistic_loss(s, y)),
            "listmle": ("listmle_loss", lambda y, s: rax.listmle_loss(s, y)),
            "softmax_loss": ("softmax_loss", lambda y, s: rax.softmax_loss(s, y))}


def measure_jax(round_seconds, server, counterparts, names):
    """Returns [(loss, list size, JAX lists/s, TF+XLA lists/s or None, Rax function or None,
    its lists/s or None, paths taken)]: the three timed in interleaved rounds."""
    rows = []
    for name in names:
        loss = losses.LOSSES[name](**PARAMS.get(name, {}))
        rax_name, rax_loss = counterparts.get(name, (None, None))
        for list_size, batch_size in SIZES:
            inputs = [x.numpy() for x in make_inputs(list_size, batch_size)]
            paths = pair_paths.describe(pair_paths.traced_on_jax(loss, *inputs))
            timers = {"jax": JaxGradientTimer(loss, *inputs, round_seconds)}
            if rax_loss:
                timers["rax"] = JaxGradientTimer(rax_loss, *inputs, round_seconds)
            rounds = {key: [] for key in (*timers, "tf")}
            for _ in range(ROUNDS):
                for key, timer in timers.items():
                    rounds[key].append(timer.round())
                if server:
                    rounds["tf"].append(server.round(name, list_size))
            best = {key: max(values) if values else None for key, values in rounds.items()}
            rows.append((type(loss).__name__, list_size, best["jax"], best["tf"], rax_name,
                         best.get("rax"), paths))
            print(f"  {rows[-1]}", file=sys.stderr)
    return rows


def jax_table(rows):
    """Returns the markdown table of `measure_jax`'s rows."""
    lines = ["| loss | list size | batch | JAX lists/s | TF + XLA lists/s | JAX / TF-XLA | "
             "Rax function | Rax lists/s | JAX / Rax | path |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for name, list_size, ours, tf_xla, rax_name, rax_speed, paths in rows:
        line = f"| {name} | {list_size} | {dict(SIZES)[list_size]} | {ours:,.0f} |"
        line += (f" {tf_xla:,.0f} | {ours / tf_xla:.2f}× |" if tf_xla else " | |")
        line += (f" {rax_name} | {rax_speed:,.0f} | {ours / rax_speed:.2f}× |" if rax_speed
                 else " | | |")
        lines.append(f"{line} {paths} |")
    return "\n".join(lines)


def main_jax(args):
    """`--backend jax`: prints `jax_table` for the losses asked for."""
    import jax
    import jaxlib

    server = None if args.no_peers else tensorflow_xla_server(args.round_seconds)
    counterparts = {} if args.no_peers else rax_counterparts()
    rows = measure_jax(args.round_seconds, server, counterparts, args.loss)
    against = ""
    if server:
        server.close()
        import rax

        against = (f"; TF + XLA: tfapprox on TensorFlow {server.versions['tensorflow']} "
                   f"(`--serve --jit`, a subprocess); Rax {rax.__version__}")
    print(f"Forward+backward lists/s (jax.jit, float32, CPU, {os.cpu_count()} cores, fastest of "
          f"{ROUNDS} interleaved rounds): tfapprox on JAX {jax.__version__} (jaxlib "
          f"{jaxlib.__version__}), Keras {keras.__version__}{against}.\n")
    print(jax_table(rows))


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
    parser.add_argument("--backend", choices=("tensorflow", "jax"), default="tensorflow",
                        help="Keras backend of tfapprox's losses (jax: beside TF+XLA and Rax)")
    parser.add_argument("--no-peers", action="store_true",
                        help="with --backend jax, time tfapprox alone (no TF+XLA, no Rax)")
    parser.add_argument("--serve", action="store_true",
                        help="answer `LOSS LIST_SIZE` requests on stdin with one round each (the "
                        "TF+XLA peer of --backend jax)")
    parser.add_argument("--round-seconds", type=float, default=0.3,
                        help=f"length of each of the {ROUNDS} timed rounds (default 0.3)")
    parser.add_argument("--jit", action="store_true", help="compile with XLA (jit_compile)")
    parser.add_argument("--unknown-list-size", action="store_true",
                        help="trace for [None, None] inputs, as the trainer traces whole lists")
    parser.add_argument("--no-tfranking", action="store_true",
                        help="time tfapprox alone (no side venv)")
    parser.add_argument("--loss", nargs="+", choices=sorted(losses.LOSSES),
                        default=list(losses.LOSSES), help="losses to time (default: all)")
    parser.add_argument("--counted-order-up-to", type=int, default=DEFAULT.counted_order_up_to,
                        help="under XLA, order lists of a static size up to this by counting "
                        "instead of sorting (default "
                        f"{DEFAULT.counted_order_up_to}; 0 always sorts)")
    parser.add_argument("--network-order-up-to", type=int, default=DEFAULT.network_order_up_to,
                        help="under XLA, order ListMLE's lists of a static size up to this by a "
                        "sorting network instead of counting or sorting (default "
                        f"{DEFAULT.network_order_up_to}; 0 never)")
    parser.add_argument("--per-pair-exps", action="store_true",
                        help="under XLA, one exp per pair instead of per-document factors")
    parser.add_argument("--elementwise-sums-up-to", type=int,
                        default=DEFAULT.elementwise_sums_up_to,
                        help="without XLA, sum the pairs of lists of a static size up to this by "
                        "products instead of matmuls (default "
                        f"{DEFAULT.elementwise_sums_up_to}; 0 always takes the matmul)")
    args = parser.parse_args()
    plan = PairPlan(elementwise_sums_up_to=args.elementwise_sums_up_to,
                    counted_order_up_to=args.counted_order_up_to,
                    network_order_up_to=args.network_order_up_to,
                    factored_exponentials=not args.per_pair_exps)
    with using(plan):
        run(args, plan)


def run(args, plan):
    """Times the losses as `args` ask, each traced under `plan`."""
    if args.serve:
        serve(args.round_seconds, args.jit, args.unknown_list_size,
              {name: losses.LOSSES[name](**PARAMS.get(name, {})) for name in losses.LOSSES},
              {"tensorflow": tf.__version__, "keras": keras.__version__})
        return
    if args.backend == "jax":
        main_jax(args)
        return
    server = None if args.no_tfranking else tfranking_server(args.round_seconds, args.jit,
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
        compiled += (f"; counted order up to list size {plan.counted_order_up_to}, "
                     f"network order up to {plan.network_order_up_to}, "
                     f"{'factored' if plan.factored_exponentials else 'per-pair'} exps")
    else:
        compiled += f"; pair sums by products up to list size {plan.elementwise_sums_up_to}"
    print(f"Forward+backward lists/s ({compiled}, float32, CPU, {os.cpu_count()} cores, fastest "
          f"of {ROUNDS} rounds): tfapprox on TensorFlow {tf.__version__}{against}. Pair "
          f"limit (benchmarks/limits.py, same run): {pair_limit / 1e9:.2f} G sigmoid pairs/s.\n")
    print(table(rows, pair_limit))


if __name__ == "__main__":
    main()
