"""Serving latency per signature: TF Serving's C++ loader and the Python loader, p50 and p99.

    python -m benchmarks.serving [--export DIR ...] [--runs 200] [--out FILE]
    python -m benchmarks.serving --ab ROUNDS [--export DIR ...]

Each export (default: a B64 and a B1024 scorer (B64 only with --ab) with F = 46, MQ2008's feature
count, exported to a temporary directory; latency does not depend on the weights' values) is
loaded by the C++ runner
of tests/cpp_loader.py (`tensorflow::LoadSavedModel`, tag serve, default session options: intra-
and inter-op threads as TF Serving sets them by default) and by `tf.saved_model.load`. Every
signature scores the same random lists at 1x10, 1x100, 16x100 and 1x1000 documents, `--runs`
times after 20 warm-up runs. The C++ latency is that of one request inside the server: the
TensorProto -> Tensor conversion, Session::Run, and the output's conversion back; the Python one
is a signature call on tensors already built. Prints a markdown table, and the ratio
serving_default / score_features at 16x100 through the C++ loader.

`--ab ROUNDS` measures only that ratio, on a shared machine: each round runs score_features then
serving_default 10 times each on the same 16x100 lists in one C++ loader, and the ratio of their
p50s is taken per round; it prints the median of the ROUNDS ratios (and the pooled p50s).
"""

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import cpp_loader  # noqa: E402  (tests/cpp_loader.py)

SHAPES = ((1, 10), (1, 100), (16, 100), (1, 1000))
NUM_FEATURES = 46
WARMUP_RUNS = 20


def _export(preset, base_dir):
    from tfapprox import export
    from tfapprox.models import build_scorer

    model = build_scorer(preset)
    return export.export_saved_model(model, base_dir, preset.lower(), NUM_FEATURES)


def _python_latencies(signature, inputs, runs):
    """Returns the latencies in microseconds of `runs` calls, after WARMUP_RUNS."""
    import tensorflow as tf

    tensors = {key: tf.constant(value) for key, value in inputs.items()}
    latencies = []
    for _ in range(WARMUP_RUNS + runs):
        start = time.perf_counter()
        signature(**tensors)
        latencies.append((time.perf_counter() - start) * 1e6)
    return np.array(latencies[WARMUP_RUNS:])


def measure(path, runner, runs):
    """Returns rows `(signature, shape, loader, p50 ms, p99 ms)` for the export at `path`."""
    import tensorflow as tf

    signatures = tf.saved_model.load(path).signatures
    rows = []
    with cpp_loader.CppLoader(runner, path) as loader:
        for lists, documents in SHAPES:
            features = np.random.default_rng(0).normal(size=(lists, documents, NUM_FEATURES))
            requests = cpp_loader.signature_requests(features.astype("float32"))
            for name, inputs in requests.items():
                if name not in signatures:  # an export from before the signature existed
                    continue
                _, cpp = loader.run(name, inputs, WARMUP_RUNS + runs)
                python = _python_latencies(signatures[name], inputs, runs)
                for loader_name, latencies in (("C++", cpp[WARMUP_RUNS:]), ("Python", python)):
                    p50, p99 = np.percentile(latencies, [50, 99]) / 1000
                    rows.append((name, f"{lists}x{documents}", loader_name, p50, p99))
    return rows


def table(results):
    """Returns the markdown table of `{model: rows}`."""
    lines = [
        "| model | signature | lists x docs | C++ p50 ms | C++ p99 ms | Python p50 ms "
        "| Python p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, rows in results.items():
        cells = {(name, shape, loader): (p50, p99) for name, shape, loader, p50, p99 in rows}
        for name, shape in dict.fromkeys((name, shape) for name, shape, *_ in rows):
            cpp, python = cells[name, shape, "C++"], cells[name, shape, "Python"]
            lines.append(
                f"| {model} | `{name}` | {shape} | {cpp[0]:.3f} | {cpp[1]:.3f} | "
                f"{python[0]:.3f} | {python[1]:.3f} |"
            )
    return "\n".join(lines)


def alternate(exports, runner, rounds, runs=10):
    """Returns `{model: (median ratio, p50 serving_default ms, p50 score_features ms)}` at 16x100
    through the C++ loader: every round runs each model's score_features then serving_default
    `runs` times, so that all of them see the same load; the ratio is of one round's p50s."""
    features = np.random.default_rng(0).normal(size=(16, 100, NUM_FEATURES)).astype("float32")
    requests = cpp_loader.signature_requests(features)
    names = ("score_features", "serving_default")
    latencies = {(model, name): [] for model in exports for name in names}
    with contextlib.ExitStack() as stack:
        loaders = {
            model: stack.enter_context(cpp_loader.CppLoader(runner, path))
            for model, path in exports.items()
        }
        for (model, name) in latencies:
            loaders[model].run(name, requests[name], WARMUP_RUNS)
        for _ in range(rounds):
            for (model, name), measured in latencies.items():
                measured.append(loaders[model].run(name, requests[name], runs)[1])
    results = {}
    for model in exports:
        served, scored = (np.array(latencies[model, name]) for name in reversed(names))
        ratio = np.median(np.median(served, axis=1) / np.median(scored, axis=1))
        results[model] = (ratio, np.median(served) / 1000, np.median(scored) / 1000)
    return results


SHAPE_CPP = ("16x100", "C++")  # the cell the summary lines compare (docs/benchmarks.md#serving)


def _model_name(path):
    """Returns the model directory's name of the SavedModel version directory `path`."""
    return os.path.basename(os.path.dirname(os.path.normpath(path)))


def ratios(results):
    """Returns lines: serving_default / score_features p50 at 16x100 through the C++ loader."""
    lines = []
    for model, rows in results.items():
        p50 = {name: p for name, shape, loader, p, _ in rows if (shape, loader) == SHAPE_CPP}
        if "serving_default" not in p50:
            continue
        ratio = p50["serving_default"] / p50["score_features"]
        lines.append(
            f"{model}: serving_default {p50['serving_default']:.3f} ms / score_features "
            f"{p50['score_features']:.3f} ms = {ratio:.2f}x at 16x100 (C++ loader, p50)"
        )
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", action="append", help="a SavedModel version directory, "
                        "named in the table by its model directory (repeatable); default: fresh "
                        "B64 and B1024 exports")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per cell")
    parser.add_argument("--out", help="also write the report (markdown) to this file")
    parser.add_argument("--ab", type=int, metavar="ROUNDS", help="only the ratio "
                        "serving_default / score_features at 16x100 (C++), alternating them for "
                        "ROUNDS rounds")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tfapprox-serving-") as scratch:
        runner = cpp_loader.build(scratch)
        named = {_model_name(path): path for path in args.export or []}
        presets = ("B64",) if args.ab else ("B64", "B1024")
        exports = named or {preset: _export(preset, scratch) for preset in presets}
        if args.ab:
            for model, (ratio, served, scored) in alternate(exports, runner, args.ab).items():
                print(f"{model}: serving_default / score_features = {ratio:.2f}x at 16x100 (C++ "
                      f"loader, median of {args.ab} rounds' p50 ratios; pooled p50 "
                      f"{served:.3f} / {scored:.3f} ms)")
            return
        results = {model: measure(path, runner, args.runs) for model, path in exports.items()}
    import tensorflow as tf

    report = "\n".join(
        [
            f"TensorFlow {tf.__version__}, {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, 1-minute load average {load_before:.1f} before and "
            f"{os.getloadavg()[0]:.1f} after; {args.runs} runs per cell",
            "",
            table(results),
            "",
            *ratios(results),
        ]
    )
    print(report)
    if args.out:
        with open(args.out, "w") as out:
            out.write(report + "\n")


if __name__ == "__main__":
    main()
