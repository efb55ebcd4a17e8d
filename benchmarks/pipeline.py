"""Throughput of the data pipeline: (a) LETOR text -> TFRecord conversion, (b) TFRecord -> batches.

    python benchmarks/pipeline.py [--queries 10000] [--docs 120] [--features 136] [--work DIR]
    python benchmarks/pipeline.py --named [--named-lists 1000] [--work DIR]

Data sets: MQ2008 and OHSUMED (all five parts of each, from ../shared/data, when present) and a
generated MSLR-WEB30K-shaped file (136 features, ~120 documents per query, 10,000 queries by default;
written once into --work and reused). Prints one markdown table.

(a) is ``tfapprox.data.converter.convert`` as the CLI runs it (no --num-features, 8 shards, default
worker processes), best wall time of --repeats runs; "docs/CPU-s" adds the CPU time of this process
and its workers, a figure that does not depend on what else the machine runs. (b) iterates
``ranking_dataset(..., batch_size, shuffle=True, seed=0, repeat=True)`` after a few warm-up batches,
counting real (unpadded) documents, for ELWC (the default format) and SequenceExample records.

``--named`` instead times one file of lists as TF-Ranking's ``train_numerical_elwc.tfrecord`` holds
them (``synthetic.named_numeric_lists``: ELWC, 136 float features ``custom_features_j`` of which
each document holds about 70 %, the label under ``utility``; ``--named-lists`` lists of 50-150
documents), read three ways into batches of ``--batch-size`` lists, shuffled, as (b) counts them:
by ``ranking_dataset`` with TF-Ranking's specs (``example_feature_spec`` = {name:
``FixedLenFeature([1], tf.float32, 0.0)``}, ``label_spec`` = ("utility", ``FixedLenFeature([1],
tf.float32, -1.0)``), as ``keras_dnn_tfrecord.py`` gives them); by TF-Ranking 0.5.5's
``tfr.data.build_ranking_dataset`` over the same file and specs, at its defaults, in the side
environment of ``.ci/tfranking-venv`` (TensorFlow 2.15); and, for reference, the same documents in
tfapprox's vector layout (one ``"features"`` vector of 136 floats per document, absent features
0) by ``ranking_dataset`` without a spec. Each rate is the best of ``--repeats`` timings, taken in
turn, and the named path's ratio to TF-Ranking's is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tensorflow as tf

from tfapprox.data import converter, dataset, named_records, records, synthetic

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_conversion(paths, output: Path, record_format: str, repeats: int, shards: int):
    """Returns (spec, best wall seconds, CPU seconds of that run)."""
    best = None
    for _ in range(repeats):
        if output.exists():
            shutil.rmtree(output)
        wall, cpu = time.perf_counter(), cpu_seconds()
        spec = converter.convert(paths, output, num_shards=shards, record_format=record_format)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        if best is None or wall < best[1]:
            best = (spec, wall, cpu)
    return best


def time_batches(ds, mask_name: str, min_docs: int, warmup: int = 5) -> float:
    """Returns real documents per second that iterating ``ds`` delivers (its mask counts them)."""
    batches = iter(ds)
    for _ in range(warmup):
        next(batches)
    docs = 0
    start = time.perf_counter()
    while docs < min_docs:
        inputs, _ = next(batches)
        docs += int(tf.reduce_sum(tf.cast(inputs[mask_name], tf.int32)))
    return docs / (time.perf_counter() - start)


def time_dataset(directory: Path, batch_size: int, min_docs: int) -> float:
    """Returns real documents per second delivered by ranking_dataset over ``directory``."""
    ds = dataset.ranking_dataset(directory, batch_size, shuffle=True, seed=0, repeat=True)
    return time_batches(ds, "mask", min_docs)


LABEL = "utility"
NAMED_SPEC = {f"custom_features_{j}": tf.io.FixedLenFeature([1], tf.float32, default_value=0.0)
              for j in range(1, synthetic.NUMERIC_FEATURES + 1)}

# Runs in TF-Ranking's side environment: argv = file, batch size, documents to read, repeats;
# prints the best documents/s as JSON. The same specs and counting as `time_batches`.
TFR_SCRIPT = """
import json, sys, time
import tensorflow as tf
import tensorflow_ranking as tfr
path, batch_size, min_docs, repeats = sys.argv[1], *map(int, sys.argv[2:])
spec = {f"custom_features_{j}": tf.io.FixedLenFeature([1], tf.float32, default_value=0.0)
        for j in range(1, 137)}
spec["utility"] = tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0)
ds = tfr.data.build_ranking_dataset(
    file_pattern=path, data_format=tfr.data.ELWC, batch_size=batch_size, context_feature_spec={},
    example_feature_spec=spec, mask_feature_name="example_list_mask",
    reader=tf.data.TFRecordDataset, shuffle=True, seed=0)
ds = ds.map(lambda features: (features, features.pop("utility")))
best = 0.0
for _ in range(repeats):
    batches = iter(ds)
    for _ in range(5):
        next(batches)
    docs, start = 0, time.perf_counter()
    while docs < min_docs:
        features, _ = next(batches)
        docs += int(tf.reduce_sum(tf.cast(features["example_list_mask"], tf.int32)))
    best = max(best, docs / (time.perf_counter() - start))
print(json.dumps({"docs_per_s": best, "tensorflow": tf.__version__}))
"""


def write_named_files(work: Path, num_lists: int) -> tuple[Path, Path, int]:
    """Writes (once) the named ELWC file and the same documents in the vector layout; returns
    their paths and the number of documents."""
    named = work / f"named_numeric_{num_lists}.tfrecord"
    vector = work / f"named_numeric_{num_lists}_vector.tfrecord"
    lists = list(synthetic.named_numeric_lists(num_lists, docs_per_list=100, seed=0))
    if not named.exists():
        named_records.write_named_records(named, lists)
    if not vector.exists():
        names = list(NAMED_SPEC)
        with tf.io.TFRecordWriter(str(vector)) as writer:
            for _, documents in lists:
                features = [[d.get(name, 0.0) for name in names] for d in documents]
                writer.write(records.encode_list(features, [d[LABEL] for d in documents]))
    return named, vector, sum(len(documents) for _, documents in lists)


def tfranking_rate(path: Path, batch_size: int, min_docs: int, repeats: int) -> tuple[float, str]:
    """TF-Ranking's documents/s over ``path`` and its TensorFlow version, from the side venv."""
    python = subprocess.run([str(REPO / ".ci" / "tfranking-venv")], capture_output=True, text=True,
                            check=True).stdout.strip()
    done = subprocess.run([python, "-c", TFR_SCRIPT, str(path), str(batch_size), str(min_docs),
                           str(repeats)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode != 0:
        raise SystemExit(f"TF-Ranking's run failed: {done.stderr.strip().splitlines()[-1:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures["docs_per_s"], figures["tensorflow"]


def run_named(args) -> int:
    """Prints the named-feature comparison (``--named``)."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    named, vector, num_docs = write_named_files(work, args.named_lists)
    label_spec = (LABEL, tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0))
    ours = dataset.ranking_dataset(named, args.batch_size, shuffle=True, seed=0, repeat=True,
                                   context_feature_spec={}, example_feature_spec=NAMED_SPEC,
                                   label_spec=label_spec)
    layout = dataset.ranking_dataset(vector, args.batch_size, shuffle=True, seed=0, repeat=True)
    load_before = os.getloadavg()
    rates = {"named": 0.0, "vector": 0.0}
    for _ in range(args.repeats):  # in turn, so that both see the same load
        rates["named"] = max(rates["named"], time_batches(ours, "example_list_mask",
                                                          args.min_docs))
        rates["vector"] = max(rates["vector"], time_batches(layout, "mask", args.min_docs))
    tfr_rate, tfr_tf = tfranking_rate(named, args.batch_size, args.min_docs, args.repeats)
    load_after = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, TensorFlow "
          f"{tf.__version__} (TF-Ranking 0.5.5 on TensorFlow {tfr_tf}); load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{named.name}: {args.named_lists:,} lists, {num_docs:,} documents, "
          f"{named.stat().st_size / 2 ** 20:,.0f} MiB; batch {args.batch_size}, shuffled, "
          f">= {args.min_docs:,} documents per timing, best of {args.repeats}")
    print()
    print("| reader | documents/s | × TF-Ranking |")
    print("|---|---:|---:|")
    for name, rate in (("tfapprox ranking_dataset, named features by spec", rates["named"]),
                       ("TF-Ranking 0.5.5 build_ranking_dataset, same file and spec", tfr_rate),
                       ("tfapprox ranking_dataset, vector layout (same documents)",
                        rates["vector"])):
        print(f"| {name} | {rate:,.0f} | {rate / tfr_rate:.2f} |")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10_000, help="queries in the MSLR-shaped file")
    parser.add_argument("--docs", type=int, default=120, help="mean documents per query (MSLR-shaped)")
    parser.add_argument("--features", type=int, default=136, help="features (MSLR-shaped)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tfapprox-pipeline-bench"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="conversion runs per set, or timings per reader with --named "
                        "(best is shown)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument(
        "--min-docs", type=int, default=1_000_000, help="documents read per dataset timing"
    )
    parser.add_argument("--named", action="store_true",
                        help="named features by spec beside TF-Ranking and the vector layout")
    parser.add_argument("--named-lists", type=int, default=1000, help="lists in the named file")
    args = parser.parse_args(argv)
    if args.named:
        return run_named(args)

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sets = []
    for name in ("MQ2008", "OHSUMED"):
        parts = sorted((SHARED_DATA / name).glob("S[1-5].txt"))
        if parts:
            sets.append((name, parts))
        else:
            print(f"({name} skipped: no {SHARED_DATA / name}/S1..S5.txt)", file=sys.stderr)
    mslr = work / f"mslr_shaped_q{args.queries}_d{args.docs}_f{args.features}.txt"
    if not mslr.exists():
        start = time.perf_counter()
        summary = synthetic.write_letor(mslr, args.queries, args.docs, args.features, seed=0)
        print(f"generated {mslr} ({summary['num_docs']:,} docs) in {time.perf_counter() - start:.1f}s",
              file=sys.stderr)
    sets.append((f"MSLR-shaped ({args.queries:,} queries)", [mslr]))

    load_before = os.getloadavg()
    rows = []
    for name, paths in sets:
        slug = "".join(c if c.isalnum() else "_" for c in name)
        spec, wall, cpu = time_conversion(paths, work / slug / "elwc", "elwc", args.repeats, args.shards)
        time_conversion(paths, work / slug / "seq", "sequence_example", 1, args.shards)
        elwc = time_dataset(work / slug / "elwc", args.batch_size, args.min_docs)
        sequence = time_dataset(work / slug / "seq", args.batch_size, args.min_docs)
        rows.append((name, spec["num_lists"], spec["num_docs"], spec["num_features"],
                     spec["num_docs"] / wall, spec["num_docs"] / cpu, elwc, sequence))
        print(f"done: {name}", file=sys.stderr)
    load_after = os.getloadavg()

    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"TensorFlow {tf.__version__}; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after")
    print(f"conversion: best of {args.repeats}, {args.shards} shards, F inferred; dataset: batch "
          f"{args.batch_size}, list_size=None, shuffled, >= {args.min_docs:,} docs read")
    print()
    print("| data | lists | docs | F | text→TFRecord docs/s | text→TFRecord docs/CPU-s "
          "| TFRecord→batches docs/s, ELWC | SequenceExample |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, lists, docs, features, convert_rate, convert_cpu, elwc, sequence in rows:
        print(f"| {name} | {lists:,} | {docs:,} | {features} | {convert_rate:,.0f} | {convert_cpu:,.0f} "
              f"| {elwc:,.0f} | {sequence:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
