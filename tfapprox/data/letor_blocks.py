"""LETOR text to parsed blocks of documents: chunks of a file's lines, parsed in this process or in
worker processes (fresh interpreters that run numpy only, see :mod:`tfapprox.data.worker_pool`).

A chunk is parsed by the fastest path that is sure of it (:mod:`tfapprox.data.letor_fast`); any
block that a fast path doubts is read again token by token (:mod:`tfapprox.data.letor_tokens`),
which names the file, line and offending token in the error. Standard library and numpy only: the
workers load this module (and its sibling modules) without the package.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from tfapprox.data import letor_fast as fast
from tfapprox.data.letor_files import Source, count_documents, group_mismatch, iter_chunks
from tfapprox.data.letor_tokens import BLOCK_LINES, Block, LetorFormatError, parse_tokens, split_lines

PARALLEL_BYTES = 64 << 20  # inputs from this size on are parsed by several processes


def parse_chunk(
    path: Path, first_lineno: int, data, num_features: int | None, grouped: bool = False
) -> list[Block]:
    """Parses whole lines into blocks; raises LetorFormatError naming file, line and token.

    ``data``: the lines' bytes, or the :class:`Stretch` of ``path`` that holds them. ``grouped``:
    lines have no ``qid:`` (the queries come from a group file); the blocks' qids are left empty for
    :func:`iter_blocks` to fill. Module-level (picklable) so that worker processes can run it.
    """
    if isinstance(data, Stretch):
        data = data.read(path)
    blocks = fast.parse_dense_lines(first_lineno, data, num_features, grouped)
    if blocks is not None:
        return blocks
    blocks = []
    lines = split_lines(path, first_lineno, data, grouped)
    while batch := list(itertools.islice(lines, BLOCK_LINES)):
        blocks.append(_parse_block(path, *zip(*batch), num_features))
    return blocks


def _parse_block(path, qids, labels, linenos, bodies, num_features) -> Block:
    qids = list(qids)
    labels_array = np.asarray(labels, dtype=np.float32)
    linenos_array = np.asarray(linenos, dtype=np.int64)
    loaded = fast.load_dense(b"\n".join(bodies), len(bodies), b"")
    if loaded is not None and (num_features is None or loaded[1].shape[1] <= num_features):
        return fast.dense_block(qids, labels_array, linenos_array, loaded[1], num_features)
    parsed = fast.parse_sparse(bodies)
    if parsed is None:
        parsed = parse_tokens(path, linenos, bodies)
    counts, indices, values = parsed
    max_index, max_line = 0, 0
    if indices.size:
        at = int(np.argmax(indices))
        max_index = int(indices[at])
        max_line = linenos[int(np.searchsorted(np.cumsum(counts), at, side="right"))]
    if num_features is None:
        return Block(qids, labels_array, linenos_array, None, max_index, max_line, np.unique(indices))
    if max_index > num_features:
        parse_tokens(path, linenos, bodies, num_features)  # names the first offending line and token
    features = np.zeros((len(qids), num_features), dtype=np.float32)
    features[np.repeat(np.arange(len(qids)), counts), indices - 1] = values
    return Block(qids, labels_array, linenos_array, features, max_index, max_line, None)


def iter_blocks(
    source: Source, num_features: int | None, workers: int = 1, max_label: float | None = None
) -> Iterator[Block]:
    """Yields the parsed blocks of ``source`` in file order, using ``workers`` processes if > 1.

    For a grouped source, each document's qid is its group's number; a group-size total that differs
    from the file's document count raises LetorFormatError naming both files and both counts. A label
    above ``max_label`` raises LetorFormatError naming the line.
    """
    grouped = source.group_sizes is not None
    blocks = parse_blocks(source.path, num_features, workers, grouped)
    if max_label is not None:
        blocks = (check_labels(source.path, block, max_label) for block in blocks)
    if not grouped:
        yield from blocks
        return
    ends = np.cumsum(source.group_sizes)
    done = 0
    for block in blocks:
        n = len(block.qids)
        if done + n > ends[-1]:
            raise group_mismatch(source, count_documents(source.path))
        numbers = np.searchsorted(ends, np.arange(done, done + n), side="right") + source.first_group
        yield block._replace(qids=[str(k).encode() for k in numbers.tolist()])
        done += n
    if done != ends[-1]:
        raise group_mismatch(source, done)


def check_labels(path: Path, block: Block, max_label: float) -> Block:
    above = block.labels > max_label
    if above.any():
        i = int(np.argmax(above))
        raise LetorFormatError(
            f"{path}:{block.linenos[i]}: label {block.labels[i]:g} is above max_label={max_label:g} "
            "(NDCG's gain 2^label - 1 loses integer precision above 24 and overflows float32 from "
            "128; LightGBM and XGBoost stop at 31 too); if such labels are meant, raise the limit: "
            "max_label=N, python -m tfapprox.data convert --max-label N"
        )
    return block


def parse_blocks(path: Path, num_features: int | None, workers: int, grouped: bool) -> Iterator[Block]:
    if workers <= 1:
        for lineno, data in iter_chunks(path):
            yield from parse_chunk(path, lineno, data, num_features, grouped)
        return
    # Imported here: a worker loads this module alone, without the package (see worker_pool).
    from tfapprox.data.worker_pool import WorkerPool

    # A chunk that is a stretch of the file is read again by its worker, not sent through a pipe.
    calls = (
        (path, lineno, data if start is None else Stretch(start, len(data), data[-64:]),
         num_features, grouped)
        for lineno, data, start in iter_chunks(path, with_offsets=True)
    )
    with WorkerPool(sys.modules[__name__], "parse_chunk", workers, what=str(path)) as pool:
        for blocks in pool.map(calls):
            yield from blocks


class Stretch(NamedTuple):
    """Where a chunk lies in its (plain) file, and its last bytes: a worker reads it there."""

    start: int
    size: int
    tail: bytes

    def read(self, path: Path) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(self.start)
            data = handle.read(self.size)
        if len(data) != self.size or not data.endswith(self.tail):
            raise LetorFormatError(f"{path}: the file changed while being read")
        return data


def default_workers(paths: list[Path]) -> int:
    """Processes used to parse ``paths``: 1 for small inputs, else up to 4 (at most the CPU count)."""
    from tfapprox.data import worker_pool

    total = sum(p.stat().st_size for p in paths)
    if total < PARALLEL_BYTES or not worker_pool.available():
        return 1
    return max(1, min(4, os.cpu_count() or 1))
