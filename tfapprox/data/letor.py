"""Streaming reader for LETOR / SVMlight ranking text.

One document a line: ``label qid:ID index:value index:value ... # optional comment``. Feature
indices are 1-based ASCII digits and may be sparse (an index left out reads as 0); labels and values
are plain decimals with an optional exponent (``2``, ``-0.5``, ``1e-3``: no ``1_0``, no hex). A value
``NULL`` or ``nan`` (any letter case, ``nan`` with an optional sign) is missing and reads as NaN. Tokens are
separated by ASCII spaces or tabs (other whitespace, such as a non-breaking space, is an error). Lines
may end in LF, CRLF or CR alone, a UTF-8 byte order mark at the start is skipped, files may be
gzip-compressed (detected from the magic bytes), and blank or comment-only lines are skipped.

Without ``num_features`` the width F is the largest feature index, and every document is stored with F
floats, so a stray huge index would blow up memory and output. An inferred F is therefore accepted only
up to ``max(1000, 10 x the number of distinct indices in use)`` and never above
``MAX_INFERRED_FEATURES`` (100,000); a larger index is an error naming its file and line, and a wider
F must be asked for with ``num_features``. With ``num_features``, any index above it is an error.

LightGBM / XGBoost ranking files leave ``qid:ID`` out and give the group sizes (documents per query,
in line order, one integer per line) in a separate file: ``<file>.query`` (LightGBM) or
``<file>.group`` (XGBoost) beside it is picked up when a file's first line has no ``qid:``, or a
group file is given explicitly (``query_files``). Such queries are numbered 1, 2, ... across the inputs.
A group file beside (or given for) a file whose lines carry ``qid:`` must group its lines as the
query ids do (its sizes are the lengths of the runs of equal ids), else the file is refused: the
data would be read one way here and another way by a tool that takes the group file.

:func:`read_queries` yields one :class:`Query` per query id, in order of first appearance, with all of
its documents -- also when a query's lines are not contiguous. It streams: a pre-pass over the query ids
learns each query's document count, so a query is handed out as soon as its last line has been read, and
a file whose queries are contiguous is read in bounded memory whatever its size.

The reader's parts: :mod:`~tfapprox.data.letor_files` (files, gzip, line ends, group files),
:mod:`~tfapprox.data.letor_tokens` (the format line by line and token by token: the specification),
:mod:`~tfapprox.data.letor_fast` (vectorised paths that read the same), and
:mod:`~tfapprox.data.letor_blocks` (chunks to parsed blocks, in worker processes for large inputs).
This module groups the parsed documents into queries and infers the width F.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from tfapprox.data.letor_blocks import default_workers, iter_blocks, parse_chunk
from tfapprox.data.letor_files import (
    PathLike, Source, count_documents, group_mismatch, iter_chunks, iter_qids, sources)
from tfapprox.data.letor_files import (
    GROUP_SUFFIXES, UTF8_BOM, as_paths, find_group_file, mixed_inputs_error, open_text,
    read_group_sizes)
from tfapprox.data.letor_tokens import Block, LetorFormatError, QueryOrderError
from tfapprox.data.letor_tokens import FeatureIndexError

__all__ = [
    "DEFAULT_MAX_LABEL", "GROUP_SUFFIXES", "MAX_INFERRED_FEATURES", "UTF8_BOM", "FeatureIndexError",
    "LetorFormatError", "Query", "QueryOrderError", "Scan", "Source", "as_paths", "default_workers",
    "find_group_file", "mixed_inputs_error", "open_text", "peek_num_features", "read_group_sizes",
    "read_queries", "scan", "sources",
]

# NDCG's gain 2^y - 1 is exact in float32 up to y = 24 and overflows from y = 128 on; LightGBM's and
# XGBoost's exponential gains stop at 31 as well. Larger labels are read only when asked for.
DEFAULT_MAX_LABEL = 31
# An F inferred from the data: always up to _SMALL_WIDTH, else up to _USED_FACTOR x the distinct indices
# in use, and never above MAX_INFERRED_FEATURES (see the module docstring).
MAX_INFERRED_FEATURES = 100_000
_SMALL_WIDTH = 1000
_USED_FACTOR = 10


class Query(NamedTuple):
    """All documents of one query: ``labels [n] float32`` and ``features [n, F] float32``."""

    qid: str
    labels: np.ndarray
    features: np.ndarray


class _IndexTally:
    """The largest feature index of parsed blocks (and where it first is), and the indices in use."""

    def __init__(self):
        self.in_use = np.zeros(MAX_INFERRED_FEATURES + 1, dtype=bool)
        self.largest = 0
        self.where = ""

    def add(self, path: Path, block: Block) -> None:
        if block.max_index > self.largest:
            self.largest, self.where = block.max_index, f"{path}:{block.max_line}"
        self.in_use[block.used[block.used <= MAX_INFERRED_FEATURES]] = True

    def width(self) -> int:
        """Returns F, the largest index (at least 1); LetorFormatError if it is beyond the limit.

        The limit: ``max(1000, 10 x distinct indices in use)``, at most MAX_INFERRED_FEATURES.
        """
        used = int(self.in_use.sum()) + (self.largest > MAX_INFERRED_FEATURES)
        limit = min(MAX_INFERRED_FEATURES, max(_SMALL_WIDTH, _USED_FACTOR * used))
        if self.largest > limit:
            raise LetorFormatError(
                f"{self.where}: feature index {self.largest} is far beyond the others; without "
                f"num_features the width F is inferred only up to {limit} here (10 x the {used} "
                f"distinct indices in use, at least {_SMALL_WIDTH}, never above "
                f"{MAX_INFERRED_FEATURES}), as every document is stored with F floats; if the index "
                "is meant, pass num_features (--num-features)"
            )
        return max(self.largest, 1)


def peek_num_features(paths: PathLike | Iterable[PathLike], query_files=None) -> int | None:
    """Returns the largest feature index in the first chunk (about 1 MB) of each file: a guess of F.

    None if that index is beyond the limit of an inferred width (see :class:`_IndexTally`): only a
    full :func:`scan` can tell whether the rest of the files fill the range.
    """
    tally = _IndexTally()
    for source in sources(paths, query_files):
        grouped = source.group_sizes is not None
        for lineno, data in iter_chunks(source.path):
            for block in parse_chunk(source.path, lineno, data, None, grouped):
                tally.add(source.path, block)
            break
    try:
        return tally.width()
    except LetorFormatError:
        return None


class Scan(NamedTuple):
    """What a pre-pass learned: documents per query id (first-appearance order), the feature count,
    and how many query ids come back after another query's lines (each is read as one list)."""

    docs_per_query: dict[bytes, int]
    num_features: int | None
    num_docs: int
    noncontiguous: int = 0


def scan(
    paths: PathLike | Iterable[PathLike],
    *,
    with_features: bool = False,
    workers: int | None = None,
    query_files=None,
) -> Scan:
    """Returns the query ids with their document counts (and the largest feature index, if asked).

    Without ``with_features`` only the first two tokens of each line are looked at (fast); with it
    every line is parsed. ``query_files``: see :func:`sources`. Raises LetorFormatError for an empty
    file, a malformed line, group sizes that do not add up to a file's documents, or (with features)
    a largest index beyond the limit of an inferred width (see the module docstring).
    """
    return _scan(sources(paths, query_files), with_features, workers)


def _scan(inputs: list[Source], with_features: bool, workers: int | None) -> Scan:
    workers = default_workers([s.path for s in inputs]) if workers is None else workers
    counts: dict[bytes, int] = {}
    tally = _IndexTally()
    num_docs = 0
    last, returning = None, set()  # the previous line's query id; those that came back

    def count(qid: bytes) -> None:
        nonlocal last
        if qid != last and qid in counts:
            returning.add(qid)
        counts[qid] = counts.get(qid, 0) + 1
        last = qid

    for source in inputs:
        path = source.path
        file_docs = 0
        if with_features:
            for block in iter_blocks(source, None, workers):
                tally.add(path, block)
                for qid in block.qids:
                    count(qid)
                file_docs += len(block.qids)
        elif source.group_sizes is not None:
            file_docs = count_documents(path)
            if file_docs != source.group_sizes.sum():
                raise group_mismatch(source, file_docs)
            for number, size in enumerate(source.group_sizes.tolist(), source.first_group):
                counts[str(number).encode()] = size
        else:
            for qid in iter_qids(path):
                if qid is not None:  # else malformed; the full read names it
                    count(qid)
                file_docs += 1
        if file_docs == 0:
            raise LetorFormatError(f"{path}: no documents (the file is empty or has only comments)")
        num_docs += file_docs
    return Scan(counts, tally.width() if with_features else None, num_docs, len(returning))


def read_queries(
    paths: PathLike | Iterable[PathLike],
    num_features: int | None = None,
    *,
    assume_contiguous: bool = False,
    workers: int | None = None,
    plan: Scan | None = None,
    query_files=None,
    max_label: float | None = DEFAULT_MAX_LABEL,
) -> Iterator[Query]:
    """Yields one :class:`Query` per query id, in order of first appearance across ``paths``.

    Args:
      paths: one LETOR/SVMlight file or several (plain or gzip); a query id shared by several files
        is one query.
      num_features: F; features come back as ``[n, F]``. An index above F raises LetorFormatError.
        ``None`` parses the files once more up front to find the largest index, which must not be far
        beyond the indices in use (see the module docstring).
      assume_contiguous: skip the pre-pass over query ids (one read instead of two) and hand a query
        out when its run of lines ends; a query id that comes back later then raises an error.
      workers: processes that parse text (fresh interpreters that run numpy only, see
        :mod:`tfapprox.data.worker_pool`). ``None``: 1 for inputs under 64 MB, else up to 4.
      plan: the result of :func:`scan` on the same ``paths``, if the caller already has it.
      query_files: group files for inputs without ``qid:`` (LightGBM/XGBoost layout), one per path
        (None: ``<file>.query`` or ``<file>.group`` beside it); see :func:`sources`.
      max_label: the largest label accepted (default 31, as LightGBM and XGBoost); None: any.
        Labels must be finite numbers >= 0 in float32 range; they need not be integers.

    Raises:
      LetorFormatError: a malformed line (message: ``file:line: problem ... token``), a label above
        ``max_label``, an empty file, group sizes that do not add up to a file's documents, or (with
        ``assume_contiguous``) a query whose lines are not contiguous.
    """
    inputs = sources(paths, query_files)
    paths = [s.path for s in inputs]
    valid = isinstance(num_features, (int, np.integer)) and num_features >= 1
    if num_features is not None and not valid:
        raise ValueError(f"num_features must be a positive integer or None; got {num_features!r}")
    if max_label is not None and not (isinstance(max_label, (int, float, np.number)) and max_label >= 0):
        raise ValueError(f"max_label must be a number >= 0 or None; got {max_label!r}")
    workers = default_workers(paths) if workers is None else workers
    if num_features is None and (plan is None or plan.num_features is None):
        plan = _scan(inputs, True, workers)
    elif plan is None and not assume_contiguous:
        plan = _scan(inputs, False, workers)
    if num_features is None:
        num_features = plan.num_features
    if plan is None:
        yield from _read_contiguous(inputs, num_features, workers, max_label)
    else:
        yield from _read_planned(inputs, num_features, plan, workers, max_label)


def _make_query(qid: bytes, pieces: list) -> Query:
    if len(pieces) == 1:
        labels, features = pieces[0]
        labels, features = labels.copy(), features.copy()
    else:
        labels = np.concatenate([p[0] for p in pieces])
        features = np.concatenate([p[1] for p in pieces])
    return Query(qid.decode("utf-8", errors="replace"), labels, features)


def _runs(qids: list[bytes]) -> Iterator[tuple[bytes, int, int]]:
    """Yields ``(qid, start, stop)`` for each run of equal consecutive query ids."""
    start = 0
    for i in range(1, len(qids) + 1):
        if i == len(qids) or qids[i] != qids[start]:
            yield qids[start], start, i
            start = i


def _read_planned(
    inputs: list[Source], num_features: int, plan: Scan, workers: int, max_label: float | None
) -> Iterator[Query]:
    remaining = dict(plan.docs_per_query)
    order = deque(plan.docs_per_query)
    pending: dict[bytes, list] = {}
    for source in inputs:
        path = source.path
        for block in iter_blocks(source, num_features, workers, max_label):
            for qid, start, stop in _runs(block.qids):
                if qid not in remaining:
                    raise LetorFormatError(
                        f"{path}:{block.linenos[start]}: query id {qid.decode(errors='replace')!r} "
                        "was not seen by the pre-pass (did the file change while being read?)"
                    )
                piece = (block.labels[start:stop], block.features[start:stop])
                pending.setdefault(qid, []).append(piece)
                remaining[qid] -= stop - start
            while order and remaining[order[0]] == 0:
                qid = order.popleft()
                yield _make_query(qid, pending.pop(qid))
    if order:
        raise LetorFormatError(
            f"{inputs[-1].path}: {len(order)} queries have fewer lines than the pre-pass counted "
            "(did the file change while being read?)"
        )


def _read_contiguous(
    inputs: list[Source], num_features: int, workers: int, max_label: float | None
) -> Iterator[Query]:
    done: dict[bytes, str] = {}
    current: bytes | None = None
    pieces: list = []
    where = ""
    for source in inputs:
        path = source.path
        file_docs = 0
        for block in iter_blocks(source, num_features, workers, max_label):
            file_docs += len(block.qids)
            for qid, start, stop in _runs(block.qids):
                if qid != current:
                    if current is not None:
                        done[current] = where
                        yield _make_query(current, pieces)
                    if qid in done:
                        raise QueryOrderError(
                            f"{path}:{block.linenos[start]}: query id {qid.decode(errors='replace')!r} "
                            f"appears again after its lines ended ({done[qid]}); read without "
                            "assume_contiguous to group non-contiguous queries"
                        )
                    current, pieces = qid, []
                    where = f"{path}:{block.linenos[start]}"
                pieces.append((block.labels[start:stop], block.features[start:stop]))
        if file_docs == 0:
            raise LetorFormatError(f"{path}: no documents (the file is empty or has only comments)")
    if current is not None:
        yield _make_query(current, pieces)
