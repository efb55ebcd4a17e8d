"""Throughput of the data pipeline: (a) LETOR text -> TFRecord conversion, (b) TFRecord -> batches.

    python benchmarks/pipeline.py [--queries 10000] [--docs 120] [--features 136] [--work DIR]

Data sets: MQ2008 and OHSUMED (all five parts of each, from ../shared/data, when present) and a
generated MSLR-WEB30K-shaped file (136 features, ~120 documents per query, 10,000 queries by default;
written once into --work and reused). Prints one markdown table.

(a) is ``tfapprox.data.converter.convert`` as the CLI runs it (no --num-features, 8 shards, default
worker processes), best wall time of --repeats runs; "docs/CPU-s" adds the CPU time of this process
and its workers, a figure that does not depend on what else the machine runs. (b) iterates
``ranking_dataset(..., batch_size, shuffle=True, seed=0, repeat=True)`` after a few warm-up batches,
counting real (unpadded) documents, for ELWC (the default format) and SequenceExample records.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import tensorflow as tf

from tfapprox.data import converter, dataset, synthetic

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


def time_dataset(directory: Path, batch_size: int, min_docs: int, warmup: int = 5) -> float:
    """Returns real documents per second delivered by ranking_dataset over ``directory``."""
    ds = dataset.ranking_dataset(directory, batch_size, shuffle=True, seed=0, repeat=True)
    batches = iter(ds)
    for _ in range(warmup):
        next(batches)
    docs = 0
    start = time.perf_counter()
    while docs < min_docs:
        inputs, _ = next(batches)
        docs += int(tf.reduce_sum(tf.cast(inputs["mask"], tf.int32)))
    return docs / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10_000, help="queries in the MSLR-shaped file")
    parser.add_argument("--docs", type=int, default=120, help="mean documents per query (MSLR-shaped)")
    parser.add_argument("--features", type=int, default=136, help="features (MSLR-shaped)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tfapprox-pipeline-bench"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="conversion runs per set (best is shown)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument(
        "--min-docs", type=int, default=1_000_000, help="documents read per dataset timing"
    )
    args = parser.parse_args(argv)

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
