"""Parse throughput of LETOR text by how the chunks are parsed, in a process where TensorFlow runs.

    python benchmarks/parse_workers.py FILE [--modes processes serial threads] [--repeats 3]
        [--workers N] [--letor OLD_LETOR.py]

`processes`: the reader as it is (`read_queries`, its worker processes for inputs of 64 MB or
more); `serial`: one process (workers=1); `threads`: a thread pool over the same chunks, in this
process (numpy releases the GIL only in parts of the parse). `--letor` reads with another version
of `tfapprox/data/letor.py` (e.g. `git show COMMIT:tfapprox/data/letor.py > old.py`) in place of
the package's, to compare with an earlier reader. Modes alternate, `--repeats` times; each line
gives the wall time, documents per second and MB/s, and the CPU seconds of this process and its
children (docs per CPU second, which the machine's load distorts less). The whole file is read,
features into [n, F] arrays, with F given (no pre-pass).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tensorflow as tf

from tfapprox.data import letor, letor_blocks, letor_files


def _parts(reader):
    """Returns `(module, name)` of the function `reader` parses a file's chunks with, its chunk
    reader and its chunk parser: in the package's modules, or all in an older single-file reader."""
    if hasattr(reader, "_parse_blocks"):
        return (reader, "_parse_blocks"), reader._iter_chunks, reader._parse_chunk
    return (letor_blocks, "parse_blocks"), letor_files.iter_chunks, letor_blocks.parse_chunk


def _threads(reader, workers: int):
    """Returns a `parse_blocks` for `reader` that parses chunks in `workers` threads."""
    _, iter_chunks, parse_chunk = _parts(reader)

    def parse_blocks(path, num_features, _, grouped):
        with ThreadPoolExecutor(workers) as pool:
            waiting: collections.deque = collections.deque()
            for lineno, data in iter_chunks(path):
                waiting.append(pool.submit(parse_chunk, path, lineno, data, num_features, grouped))
                if len(waiting) >= 2 * workers:
                    yield from waiting.popleft().result()
            while waiting:
                yield from waiting.popleft().result()

    return parse_blocks


def _cpu_seconds() -> float:
    return sum(getattr(resource.getrusage(who), field)
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))


def _load(path: str | None):
    if path is None:
        return letor
    spec = importlib.util.spec_from_file_location("letor_under_test", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--modes", nargs="+", default=["processes", "serial", "threads"],
                        choices=["processes", "serial", "threads"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None,
                        help="workers of processes and threads (default: the reader's choice)")
    parser.add_argument("--letor", help="another version of letor.py to read with")
    args = parser.parse_args(argv)
    reader = _load(args.letor)
    tf.linalg.matmul(tf.ones([256, 256]), tf.ones([256, 256]))  # TensorFlow's threads are up
    width = reader.scan(args.file, with_features=True, workers=1).num_features
    workers = args.workers or reader.default_workers([args.file])
    megabytes = args.file.stat().st_size / 1e6
    print(f"{args.file}: {megabytes:.1f} MB, {width} features, {workers} workers, "
          f"{os.cpu_count()} CPUs, reader {args.letor or 'tfapprox.data.letor'}")
    (module, name), _, _ = _parts(reader)
    parse_blocks = getattr(module, name)
    for _ in range(args.repeats):
        for mode in args.modes:
            setattr(module, name, _threads(reader, workers) if mode == "threads" else parse_blocks)
            started, cpu = time.perf_counter(), _cpu_seconds()
            docs = sum(len(query.labels) for query in reader.read_queries(
                args.file, width, assume_contiguous=True,
                workers=1 if mode == "serial" else workers))
            wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
            print(f"{mode:9} {wall:6.2f} s  {docs / wall:9,.0f} docs/s  {megabytes / wall:5.1f} MB/s"
                  f"  CPU {cpu:5.1f} s ({docs / cpu:,.0f} docs per CPU s)  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    setattr(module, name, parse_blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
