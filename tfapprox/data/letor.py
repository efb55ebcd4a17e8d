"""Streaming reader for LETOR / SVMlight ranking text.

One document a line: ``label qid:ID index:value index:value ... # optional comment``. Feature
indices are 1-based ASCII digits and may be sparse (a missing feature reads as 0); labels and values
are plain decimals with an optional exponent (``2``, ``-0.5``, ``1e-3``: no ``1_0``, no hex). Tokens are
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

Parsing is vectorised. A read (about 1 MB of lines) whose every line is dense
(``LABEL qid:ID 1:v 2:v ... F:v``, single spaces, no comment) is parsed by one ``numpy.loadtxt`` call
after byte-level checks of its structure and indices; other reads go line by line into blocks, a
dense block again by ``numpy.loadtxt``, other blocks through a numpy tokeniser; any block that fails
a check is re-read token by token, which names the file, line and offending token in the error.
"""

from __future__ import annotations

import gzip
import io
import itertools
import math
import os
import re
import sys
import zlib
from collections import deque
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import numpy as np

BLOCK_LINES = 512
_CHUNK_BYTES = 1 << 20
_PARALLEL_BYTES = 64 << 20
_NUMBER_CHARS = b"0123456789.+-eE"
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# NDCG's gain 2^y - 1 is exact in float32 up to y = 24 and overflows from y = 128 on; LightGBM's and
# XGBoost's exponential gains stop at 31 as well. Larger labels are read only when asked for.
DEFAULT_MAX_LABEL = 31
# An F inferred from the data: always up to _SMALL_WIDTH, else up to _USED_FACTOR x the distinct indices
# in use, and never above MAX_INFERRED_FEATURES (see the module docstring).
MAX_INFERRED_FEATURES = 100_000
_SMALL_WIDTH = 1000
_USED_FACTOR = 10
UTF8_BOM = b"\xef\xbb\xbf"
_DECIMAL = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NON_FINITE = re.compile(rb"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)  # refused by name, later
_NUMBER_HINT = "(LETOR numbers are plain decimals such as 2, -0.5 or 1e-3)"
_IS_NUMBER_BYTE = np.zeros(256, dtype=bool)
_IS_NUMBER_BYTE[list(_NUMBER_CHARS) + [0]] = True  # 0: padding of the gathered value bytes
GROUP_SUFFIXES = (".query", ".group")  # LightGBM, XGBoost
_INDEX_VALUE = re.compile(rb"\d+:")
_QID_VALUE = re.compile(rb"qid:([^ ]*)")
_COLON_TO_SPACE = bytes.maketrans(b":", b" ")


class LetorFormatError(ValueError):
    """Malformed LETOR/SVMlight input; the message names the file, the line and the offending token."""


class FeatureIndexError(LetorFormatError):
    """A feature index above ``num_features``."""


class QueryOrderError(LetorFormatError):
    """With ``assume_contiguous``: a query id whose lines come back after another query's."""


class Query(NamedTuple):
    """All documents of one query: ``labels [n] float32`` and ``features [n, F] float32``."""

    qid: str
    labels: np.ndarray
    features: np.ndarray


PathLike = str | os.PathLike


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------
def open_text(path: PathLike):
    """Returns a binary file object for ``path``, decompressing gzip transparently."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.BufferedReader(gzip.open(path, "rb"), buffer_size=_CHUNK_BYTES)
    return open(path, "rb")


def as_paths(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """Returns ``paths`` (one or several) as a list of existing files; raises FileNotFoundError."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    result = [Path(p) for p in paths]
    if not result:
        raise ValueError("no input files given")
    for path in result:
        if not path.is_file():
            raise FileNotFoundError(f"no such LETOR file: {path}")
    return result


# --------------------------------------------------------------------------------------------------
# Inputs: files with qid:, or LightGBM/XGBoost files whose queries come from a group file
# --------------------------------------------------------------------------------------------------
class Source(NamedTuple):
    """One input file; for a file without ``qid:``, its group file, sizes and first group's number."""

    path: Path
    group_file: Path | None = None
    group_sizes: np.ndarray | None = None  # [queries] int64
    first_group: int = 1


def find_group_file(path: PathLike) -> Path | None:
    """Returns ``<path>.query`` (LightGBM) or ``<path>.group`` (XGBoost) if one lies beside ``path``."""
    path = Path(path)
    found = [path.with_name(path.name + suffix) for suffix in GROUP_SUFFIXES]
    found = [p for p in found if p.is_file()]
    if len(found) > 1:
        raise LetorFormatError(
            f"{path}: both {found[0].name} and {found[1].name} lie beside it; keep the one that "
            "holds its group sizes"
        )
    return found[0] if found else None


def sources(
    paths: PathLike | Iterable[PathLike], query_files: PathLike | Iterable[PathLike | None] | None = None
) -> list[Source]:
    """Returns the input files as :class:`Source` s, with the group sizes of files without ``qid:``.

    ``query_files``: a group file per path, in order (None: look beside the file, see
    :func:`find_group_file`). A file is grouped when its first document line has no ``qid:``.
    Raises LetorFormatError for such a file without a group file, a group file (given or beside it)
    that groups a file with ``qid:`` otherwise than its query ids, inputs that mix the two kinds,
    binary files (TFRecords) among the inputs, or a malformed group file.
    """
    paths = as_paths(paths)
    _refuse_binary(paths)
    if query_files is None:
        query_files = [None] * len(paths)
    elif isinstance(query_files, (str, os.PathLike)):
        query_files = [query_files]
    query_files = [None if q is None else Path(q) for q in query_files]
    if len(query_files) != len(paths):
        raise ValueError(
            f"got {len(query_files)} query files for {len(paths)} inputs; give one per input, in order"
        )
    result = []
    next_group = 1
    for path, given in zip(paths, query_files):
        if given is not None and not given.is_file():
            raise FileNotFoundError(f"no such query file: {given}")
        first = _first_document(path)
        group_file = given or find_group_file(path)
        if first is not None and first[1][:4] == b"qid:":
            if group_file is not None:
                _check_same_grouping(path, group_file)
            result.append(Source(path))
            continue
        if group_file is None:
            if first is not None and _INDEX_VALUE.match(first[1]):
                raise LetorFormatError(
                    f"{path}:{first[0]}: no 'qid:ID' after the label, and no group file beside the "
                    "file; give each line a qid:ID, or the group sizes (one integer per line, as for "
                    f"LightGBM/XGBoost) in {path.name}.query or as a query file (--query-file)"
                )
            result.append(Source(path))  # empty, or malformed: the parser names the problem
            continue
        sizes = read_group_sizes(group_file)
        result.append(Source(path, group_file, sizes, next_group))
        next_group += len(sizes)
    grouped = [s for s in result if s.group_sizes is not None]
    if grouped and len(grouped) < len(result):
        with_qid = next(s.path for s in result if s.group_sizes is None)
        raise LetorFormatError(
            f"inputs mix files with qid: ({with_qid}) and files grouped by a query file "
            f"({grouped[0].path}, {grouped[0].group_file}); read them separately"
        )
    return result


def _check_same_grouping(path: Path, group_file: Path) -> None:
    """Raises LetorFormatError unless the group sizes of ``group_file`` are the lengths of the runs
    of equal query ids in ``path`` (whose lines carry ``qid:``): the file is grouped one way only."""
    sizes = read_group_sizes(group_file).tolist()
    runs = [sum(1 for _ in run) for _, run in itertools.groupby(_iter_qids(path))]
    if sizes != runs:
        raise LetorFormatError(
            f"{path}: the lines carry qid: ({len(runs)} runs of query ids), and the group file "
            f"{group_file} groups them differently ({len(sizes)} groups of {sum(sizes)} documents); "
            "give one grouping: remove or rename the group file, or drop the qid: tokens"
        )


def _iter_qids(path: Path) -> Iterator[bytes | None]:
    """Yields the query id of each document line of ``path``; None for a line without ``qid:``."""
    for _, data in _iter_chunks(path):
        for raw in data.split(b"\n"):
            hash_at = raw.find(b"#")
            parts = (raw[:hash_at] if hash_at >= 0 else raw).split(None, 2)
            if parts:
                yield parts[1][4:] if len(parts) > 1 and parts[1][:4] == b"qid:" else None


def mixed_inputs_error(text: PathLike, record: PathLike) -> LetorFormatError:
    """The error for inputs that mix LETOR text and TFRecord files (whichever comes first)."""
    return LetorFormatError(
        f"inputs mix LETOR text ({text}) and TFRecord files ({record}); give one kind: convert the "
        "text first (python -m tfapprox.data convert) or give only text"
    )


def _is_binary(path: Path) -> bool:
    """True if the (decompressed) start of ``path`` holds a NUL byte, which LETOR text never does.

    A TFRecord file always does: it starts with its first record's length as 8 little-endian bytes.
    """
    try:
        with open_text(path) as handle:
            return b"\0" in handle.read(4096)
    except (EOFError, gzip.BadGzipFile, zlib.error):
        return False  # damaged gzip: the parser names it


def _refuse_binary(paths: list[Path]) -> None:
    binary = [p for p in paths if _is_binary(p)]
    if not binary:
        return
    text = [p for p in paths if p not in binary]
    if text:
        raise mixed_inputs_error(text[0], binary[0])
    raise LetorFormatError(
        f"{binary[0]}: binary data, not LETOR text (a TFRecord file? those are read as they are, "
        "without conversion)"
    )


def read_group_sizes(path: PathLike) -> np.ndarray:
    """Returns the group sizes of a LightGBM ``.query`` / XGBoost ``.group`` file: one integer a line."""
    sizes = []
    for first_lineno, data in _iter_chunks(Path(path)):
        for lineno, raw in enumerate(data.split(b"\n"), first_lineno):
            token = raw.strip()
            if not token:
                continue
            if not token.isdigit() or int(token) == 0:
                raise LetorFormatError(
                    f"{path}:{lineno}: expected a group size (a positive integer: the number of "
                    f"documents of one query), got {_show(token)}"
                )
            sizes.append(int(token))
    if not sizes:
        raise LetorFormatError(f"{path}: no group sizes (the file is empty)")
    return np.asarray(sizes, dtype=np.int64)


def _first_document(path: Path) -> tuple[int, bytes] | None:
    """Returns ``(line number, second token or b"")`` of the first document line; None if none."""
    for lineno, data in _iter_chunks(path):
        for offset, raw in enumerate(data.split(b"\n")):
            parts = raw.split(b"#", 1)[0].split(None, 2)
            if parts:
                return lineno + offset, parts[1] if len(parts) > 1 else b""
    return None


def _count_documents(path: Path) -> int:
    """Returns the number of document lines (not blank, not only a comment) of ``path``."""
    count = 0
    for _, data in _iter_chunks(path):
        for raw in data.split(b"\n"):
            hash_at = raw.find(b"#")
            count += bool((raw[:hash_at] if hash_at >= 0 else raw).strip())
    return count


def _group_mismatch(source: Source, num_docs: int) -> LetorFormatError:
    return LetorFormatError(
        f"{source.path}: {num_docs} documents, but the group sizes in {source.group_file} sum to "
        f"{int(source.group_sizes.sum())} ({len(source.group_sizes)} groups)"
    )


# --------------------------------------------------------------------------------------------------
# Chunks of lines -> parsed blocks (optionally in worker processes)
# --------------------------------------------------------------------------------------------------
def _iter_chunks(path: Path, with_offsets: bool = False) -> Iterator[tuple]:
    """Yields ``(number of the chunk's first line, bytes of whole lines)`` read in large pieces.

    A leading UTF-8 byte order mark is dropped, and CRLF and CR line ends are turned into LF. With
    ``with_offsets``, also the chunk's position in the file: where its bytes are the file's bytes (a
    plain file, no CR seen so far), else None.
    """
    lineno = 1

    def read(handle, size: int) -> bytes:
        try:
            return handle.read(size)
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            where = f"after line {lineno - 1}" if lineno > 1 else "within its first lines"
            raise LetorFormatError(f"{path}: truncated or corrupt gzip data {where} ({err})") from None

    with open_text(path) as handle:
        head = read(handle, len(UTF8_BOM))
        rest = head.removeprefix(UTF8_BOM)
        start = len(head) - len(rest) if isinstance(handle.raw, io.FileIO) else None  # None: gzip
        while True:
            data = read(handle, _CHUNK_BYTES)
            if not data:
                break
            data, held = rest + data, b""
            if b"\r" in data:
                start = None
            if data.endswith(b"\r"):  # maybe half of a CRLF that the next read completes
                data, held = data[:-1], b"\r"
            data = _unify_line_ends(data)
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data + held
                continue
            rest = data[cut + 1:] + held
            yield (lineno, data[:cut], start) if with_offsets else (lineno, data[:cut])
            lineno += data.count(b"\n", 0, cut) + 1
            start = None if start is None else start + cut + 1
        rest = _unify_line_ends(rest)
        if rest:
            yield (lineno, rest, start) if with_offsets else (lineno, rest)


def _unify_line_ends(data: bytes) -> bytes:
    """Returns ``data`` with CRLF and lone CR (old Mac) line ends as LF."""
    if b"\r" not in data:
        return data
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _show(token: bytes) -> str:
    return repr(token.decode("utf-8", errors="replace"))


class _Block(NamedTuple):
    """Parsed documents of up to BLOCK_LINES lines of one file."""

    qids: list[bytes]
    labels: np.ndarray  # [n] float32
    linenos: np.ndarray  # [n] line number of each document
    features: np.ndarray | None  # [n, num_features] float32; None when parsed without num_features
    max_index: int  # largest feature index in the block (0 if none)
    max_line: int  # line of the first document with max_index (0 if none)
    used: np.ndarray | None  # [k] the distinct feature indices; only when parsed without num_features


def _parse_chunk(
    path: Path, first_lineno: int, data, num_features: int | None, grouped: bool = False
) -> list[_Block]:
    """Parses whole lines into blocks; raises LetorFormatError naming file, line and token.

    ``data``: the lines' bytes, or the :class:`_Stretch` of ``path`` that holds them. ``grouped``:
    lines have no ``qid:`` (the queries come from a group file); the blocks' qids are left empty for
    :func:`_iter_blocks` to fill. Module-level (picklable) so that worker processes can run it.
    """
    if isinstance(data, _Stretch):
        data = data.read(path)
    blocks = _parse_dense_lines(first_lineno, data, num_features, grouped)
    if blocks is not None:
        return blocks
    blocks = []
    qids: list[bytes] = []
    labels: list[float] = []
    linenos: list[int] = []
    bodies: list[bytes] = []
    for lineno, raw in enumerate(data.split(b"\n"), first_lineno):
        hash_at = raw.find(b"#")
        if hash_at >= 0:
            raw = raw[:hash_at]
        if not raw.isascii():
            _refuse_unicode_space(path, lineno, raw)
        parts = raw.split(None, 1 if grouped else 2)
        if not parts:
            continue
        if len(parts) < 2 and not grouped:
            raise LetorFormatError(
                f"{path}:{lineno}: expected 'LABEL qid:ID INDEX:VALUE ...', got only {_show(parts[0])}"
            )
        label = float(parts[0]) if parts[0].isdigit() else _parse_number(parts[0])  # isdigit: fast
        if label is None:
            raise LetorFormatError(
                f"{path}:{lineno}: non-numeric label {_show(parts[0])} {_NUMBER_HINT}"
            )
        if not (label >= 0.0 and math.isfinite(label)):
            raise LetorFormatError(
                f"{path}:{lineno}: label {_show(parts[0])} is not a finite number >= 0 "
                "(-1 is reserved for padding)"
            )
        if label > _FLOAT32_MAX:
            raise LetorFormatError(f"{path}:{lineno}: label {_show(parts[0])} overflows float32")
        if grouped:
            body = parts[1].rstrip() if len(parts) == 2 else b""
            if body[:4] == b"qid:":
                raise LetorFormatError(
                    f"{path}:{lineno}: 'qid:' on this line, but the file's first line has none (its "
                    "queries come from a group file): a file gives qid: on every line or on none"
                )
            qids.append(b"")
        else:
            qid = parts[1]
            if qid[:4] != b"qid:" or len(qid) == 4:
                mixed = ""
                if _INDEX_VALUE.match(qid):
                    mixed = " (the file's first line has one: every line needs one)"
                raise LetorFormatError(
                    f"{path}:{lineno}: expected 'qid:ID' as second token, got {_show(qid)}{mixed}"
                )
            qids.append(qid[4:])
            body = parts[2].rstrip() if len(parts) == 3 else b""
        labels.append(label)
        linenos.append(lineno)
        bodies.append(body)
        if len(qids) == BLOCK_LINES:
            blocks.append(_parse_block(path, qids, labels, linenos, bodies, num_features))
            qids, labels, linenos, bodies = [], [], [], []
    if qids:
        blocks.append(_parse_block(path, qids, labels, linenos, bodies, num_features))
    return blocks


def _parse_number(text: bytes) -> float | None:
    """Returns ``float(text)`` for LETOR number syntax (and nan/inf, which callers refuse by name).

    None for anything else Python's float() would take too: ``1_0``, non-ASCII digits, spaces.
    """
    if _DECIMAL.fullmatch(text) or _NON_FINITE.fullmatch(text):
        return float(text)
    return None


def _refuse_unicode_space(path: Path, lineno: int, raw: bytes) -> None:
    """Raises LetorFormatError if ``raw`` holds whitespace other than ASCII (which splits tokens)."""
    text = raw.decode("utf-8", errors="replace")
    space = next((c for c in text if not c.isascii() and c.isspace()), None)
    if space is not None:
        raise LetorFormatError(
            f"{path}:{lineno}: non-ASCII whitespace U+{ord(space):04X} in the line; LETOR tokens are "
            "separated by ASCII spaces or tabs"
        )


def _iter_blocks(
    source: Source, num_features: int | None, workers: int = 1, max_label: float | None = None
) -> Iterator[_Block]:
    """Yields the parsed blocks of ``source`` in file order, using ``workers`` processes if > 1.

    For a grouped source, each document's qid is its group's number; a group-size total that differs
    from the file's document count raises LetorFormatError naming both files and both counts. A label
    above ``max_label`` raises LetorFormatError naming the line.
    """
    grouped = source.group_sizes is not None
    blocks = _parse_blocks(source.path, num_features, workers, grouped)
    if max_label is not None:
        blocks = (_check_labels(source.path, block, max_label) for block in blocks)
    if not grouped:
        yield from blocks
        return
    ends = np.cumsum(source.group_sizes)
    done = 0
    for block in blocks:
        n = len(block.qids)
        if done + n > ends[-1]:
            raise _group_mismatch(source, _count_documents(source.path))
        numbers = np.searchsorted(ends, np.arange(done, done + n), side="right") + source.first_group
        yield block._replace(qids=[str(k).encode() for k in numbers.tolist()])
        done += n
    if done != ends[-1]:
        raise _group_mismatch(source, done)


def _check_labels(path: Path, block: _Block, max_label: float) -> _Block:
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


def _parse_blocks(path: Path, num_features: int | None, workers: int, grouped: bool) -> Iterator[_Block]:
    if workers <= 1:
        for lineno, data in _iter_chunks(path):
            yield from _parse_chunk(path, lineno, data, num_features, grouped)
        return
    # Imported here: a worker loads this module alone, without the package (see worker_pool).
    from tfapprox.data.worker_pool import WorkerPool

    # A chunk that is a stretch of the file is read again by its worker, not sent through a pipe.
    calls = (
        (path, lineno, data if start is None else _Stretch(start, len(data), data[-64:]),
         num_features, grouped)
        for lineno, data, start in _iter_chunks(path, with_offsets=True)
    )
    with WorkerPool(sys.modules[__name__], "_parse_chunk", workers, what=str(path)) as pool:
        for blocks in pool.map(calls):
            yield from blocks


class _Stretch(NamedTuple):
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
    if total < _PARALLEL_BYTES or not worker_pool.available():
        return 1
    return max(1, min(4, os.cpu_count() or 1))


_SKELETONS: dict[int, bytes] = {}


def _dense_skeleton(num_pairs: int) -> bytes:
    """What a dense line ``1:v ... F:v`` looks like with every number character deleted."""
    if num_pairs not in _SKELETONS:
        _SKELETONS[num_pairs] = b": " * (num_pairs - 1) + b":"
    return _SKELETONS[num_pairs]


def _parse_block(path, qids, labels, linenos, bodies, num_features) -> _Block:
    labels_array = np.asarray(labels, dtype=np.float32)
    linenos_array = np.asarray(linenos, dtype=np.int64)
    loaded = _load_dense(b"\n".join(bodies), len(bodies), b"")
    if loaded is not None and (num_features is None or loaded[1].shape[1] <= num_features):
        return _dense_block(qids, labels_array, linenos_array, loaded[1], num_features)
    parsed = _parse_sparse(bodies)
    if parsed is None:
        parsed = _parse_slowly(path, linenos, bodies)
    counts, indices, values = parsed
    max_index, max_line = 0, 0
    if indices.size:
        at = int(np.argmax(indices))
        max_index = int(indices[at])
        max_line = linenos[int(np.searchsorted(np.cumsum(counts), at, side="right"))]
    if num_features is None:
        return _Block(qids, labels_array, linenos_array, None, max_index, max_line, np.unique(indices))
    if max_index > num_features:
        _parse_slowly(path, linenos, bodies, num_features)  # names the first offending line and token
    features = np.zeros((len(qids), num_features), dtype=np.float32)
    features[np.repeat(np.arange(len(qids)), counts), indices - 1] = values
    return _Block(qids, labels_array, linenos_array, features, max_index, max_line, None)


def _dense_block(qids, labels, linenos, dense: np.ndarray, num_features: int | None) -> _Block:
    """The block of documents whose features ``dense`` [n, F0] give every index 1..F0.

    ``num_features``: None, or F >= F0 (zeros fill indices F0+1..F).
    """
    width = dense.shape[1]
    if num_features is None:
        return _Block(qids, labels, linenos, None, width, int(linenos[0]), np.arange(1, width + 1))
    features = dense
    if width < num_features:
        features = np.zeros((len(qids), num_features), dtype=np.float32)
        features[:, :width] = dense
    return _Block(qids, labels, linenos, features, width, int(linenos[0]), None)


def _parse_dense_lines(first_lineno: int, data: bytes, num_features: int | None, grouped: bool):
    """Returns the blocks of a chunk whose every line is exactly ``LABEL qid:ID 1:v 2:v ... F0:v``
    (``LABEL 1:v ... F0:v`` if ``grouped``; single spaces, no comment, an ID of number characters),
    parsed by one ``numpy.loadtxt`` call; None for any other chunk, and for one with a label out of
    range or an index above ``num_features``: the line-by-line path reads it, and names the problem.
    """
    num_lines = data.count(b"\n") + 1
    loaded = _load_dense(data, num_lines, b" " if grouped else b" qid: ")
    if loaded is None:
        return None
    labels, dense = loaded
    if num_features is not None and dense.shape[1] > num_features:
        return None
    if not ((labels >= 0.0) & (labels <= _FLOAT32_MAX)).all():  # NaN fails too
        return None
    if grouped:
        qids = [b""] * num_lines
    else:
        qids = _QID_VALUE.findall(data)
        if len(qids) != num_lines or not all(qids):
            return None
    labels = labels.astype(np.float32)
    linenos = np.arange(first_lineno, first_lineno + num_lines, dtype=np.int64)
    return [
        _dense_block(qids[i:i + BLOCK_LINES], labels[i:i + BLOCK_LINES], linenos[i:i + BLOCK_LINES],
                     dense[i:i + BLOCK_LINES], num_features)
        for i in range(0, num_lines, BLOCK_LINES)
    ]


def _load_dense(text: bytes, num_lines: int, lead: bytes):
    """Parses ``num_lines`` lines, each ``lead`` then exactly ``1:v 2:v ... F0:v``.

    ``lead``: ``b""`` (nothing before the pairs), ``b" "`` (a label) or ``b" qid: "`` (a label and
    ``qid:ID``; the ID is not parsed). Returns ``(labels [n] float64, or None without a label,
    features [n, F0] float32)``; None if a line differs, or a number is malformed or overflows.
    """
    first_line = text[: text.find(b"\n")] if num_lines > 1 else text
    num_pairs = first_line.count(b":") - lead.count(b":")
    if num_pairs <= 0:
        return None
    if text.translate(None, _NUMBER_CHARS) != b"\n".join([lead + _dense_skeleton(num_pairs)] * num_lines):
        return None
    if not _indices_are_one_to(np.frombuffer(text, dtype=np.uint8), num_lines, num_pairs,
                               lead.count(b":")):
        return None
    # The columns once colons are spaces: [label] [qid ID] index value index value ...; only the
    # label and the values are read.
    labelled = int(bool(lead))
    first_value = labelled + 2 * lead.count(b":") + 1
    columns = [*range(labelled), *range(first_value, first_value + 2 * num_pairs, 2)]
    try:
        numbers = np.loadtxt(
            io.BytesIO(text.translate(_COLON_TO_SPACE)),
            delimiter=" ",
            dtype=np.float64,
            comments=None,
            ndmin=2,
            usecols=columns,
        )
    except ValueError:
        return None
    if numbers.shape != (num_lines, len(columns)):
        return None
    with np.errstate(over="ignore"):  # an overflow falls through to the token parser, which names it
        features = numbers[:, labelled:].astype(np.float32)
    if not np.isfinite(features).all():
        return None
    return (numbers[:, 0] if labelled else None), features


def _indices_are_one_to(text: np.ndarray, num_lines: int, num_pairs: int, lead_colons: int) -> bool:
    """True if the pairs' indices are exactly ``1`` .. ``num_pairs`` in every line of ``text``.

    ``text``: the bytes of lines that are each ``lead_colons`` colons (``qid:``), then ``num_pairs``
    ``INDEX:VALUE`` tokens, every token made of number characters (as :func:`_load_dense` checked).
    Index j is right if the bytes before its colon are the digits of j, preceded by a separator.
    """
    colons = np.flatnonzero(text == ord(":"))
    if colons.size != num_lines * (num_pairs + lead_colons):
        return False
    colons = colons.reshape(num_lines, -1)[:, lead_colons:]
    digits, low = 1, 1  # indices low .. 10 * low - 1 have ``digits`` digits
    while low <= num_pairs:
        high = min(10 * low - 1, num_pairs)
        ends = colons[:, low - 1:high]
        index = np.arange(low, high + 1)
        for place in range(digits):
            if not (text[ends - 1 - place] == index // 10**place % 10 + ord("0")).all():
                return False
        before = ends - 1 - digits  # -1: the index starts the text
        if _IS_NUMBER_BYTE[text[np.maximum(before, 0)]][before >= 0].any():
            return False
        digits, low = digits + 1, 10 * low
    return True


def _parse_sparse(bodies: list[bytes]):
    """Returns ``(counts [n], indices [P], values [P])`` by a numpy tokeniser, or None on any doubt."""
    text = b" ".join(bodies) + b" "
    data = np.frombuffer(text, dtype=np.uint8)
    is_space = data <= 32
    step = np.diff(is_space.view(np.int8))
    starts = np.flatnonzero(step == -1) + 1
    if data.size and not is_space[0]:
        starts = np.concatenate([[0], starts])
    ends = np.flatnonzero(step == 1) + 1
    colons = np.flatnonzero(data == ord(":"))
    if len(colons) != len(starts) or len(ends) != len(starts):
        return None
    # Equal counts and one colon strictly inside every token <=> every token is INDEX:VALUE.
    if not ((starts < colons) & (colons < ends - 1)).all():
        return None
    index_len = colons - starts
    if index_len.size and index_len.max() > 9:
        return None
    indices = np.zeros(len(starts), dtype=np.int64)
    for digit_pos in range(int(index_len.max()) if index_len.size else 0):
        present = digit_pos < index_len
        digit = data[np.where(present, colons - 1 - digit_pos, 0)].astype(np.int64) - ord("0")
        if ((digit < 0) | (digit > 9))[present].any():
            return None
        indices += np.where(present, digit, 0) * 10**digit_pos
    if indices.size and indices.min() < 1:
        return None
    value_len = ends - colons - 1
    width = int(value_len.max()) if value_len.size else 1
    columns = np.arange(width)
    gathered = data[np.minimum(colons[:, None] + 1 + columns, data.size - 1)]
    gathered[columns >= value_len[:, None]] = 0
    if not _IS_NUMBER_BYTE[gathered].all():  # float() would take '1_0', ' 1', 'nan', ...
        return None
    try:
        values = np.ascontiguousarray(gathered).view(f"S{width}").ravel().astype(np.float64)
    except ValueError:
        return None
    with np.errstate(over="ignore"):
        values = values.astype(np.float32)
    if not np.isfinite(values).all():
        return None
    counts = np.fromiter((b.count(b":") for b in bodies), dtype=np.int64, count=len(bodies))
    if not _unique_per_document(counts, indices):
        return None
    return counts, indices, values


def _unique_per_document(counts: np.ndarray, indices: np.ndarray) -> bool:
    """True if no document repeats a feature index."""
    if indices.size < 2:
        return True
    doc = np.repeat(np.arange(len(counts)), counts)
    increasing = np.diff(indices) > 0
    new_doc = np.diff(doc) > 0
    if (increasing | new_doc).all():
        return True
    keys = doc * (int(indices.max()) + 1) + indices
    return np.unique(keys).size == keys.size


def _parse_slowly(path, linenos, bodies, num_features=None):
    """Token-by-token parse; raises LetorFormatError naming file, line and token on the first problem."""
    counts, indices, values = [], [], []
    for lineno, body in zip(linenos, bodies):
        seen = set()
        tokens = body.split()
        for token in tokens:
            where = f"{path}:{lineno}"
            index_text, colon, value_text = token.partition(b":")
            if not colon or not index_text or not value_text or b":" in value_text:
                raise LetorFormatError(f"{where}: expected INDEX:VALUE, got token {_show(token)}")
            if not index_text.isdigit() or int(index_text) < 1:
                raise LetorFormatError(
                    f"{where}: feature index must be a positive integer, got token {_show(token)}"
                )
            index = int(index_text)
            if num_features is not None and index > num_features:
                raise FeatureIndexError(
                    f"{where}: feature index {index} is above num_features={num_features} "
                    f"in token {_show(token)}"
                )
            value = _parse_number(value_text)
            if value is None:
                raise LetorFormatError(
                    f"{where}: non-numeric feature value in token {_show(token)} {_NUMBER_HINT}"
                )
            if not math.isfinite(value):
                raise LetorFormatError(f"{where}: non-finite feature value in token {_show(token)}")
            if abs(value) > _FLOAT32_MAX:
                raise LetorFormatError(
                    f"{where}: feature value overflows float32 in token {_show(token)}"
                )
            if index in seen:
                raise LetorFormatError(
                    f"{where}: feature index {index} repeated in token {_show(token)}"
                )
            seen.add(index)
            indices.append(index)
            values.append(value)
        counts.append(len(tokens))
    return (
        np.asarray(counts, dtype=np.int64),
        np.asarray(indices, dtype=np.int64),
        np.asarray(values, dtype=np.float64).astype(np.float32),
    )


# --------------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------------
class _IndexTally:
    """The largest feature index of parsed blocks (and where it first is), and the indices in use."""

    def __init__(self):
        self.in_use = np.zeros(MAX_INFERRED_FEATURES + 1, dtype=bool)
        self.largest = 0
        self.where = ""

    def add(self, path: Path, block: _Block) -> None:
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
        for lineno, data in _iter_chunks(source.path):
            for block in _parse_chunk(source.path, lineno, data, None, grouped):
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
            for block in _iter_blocks(source, None, workers):
                tally.add(path, block)
                for qid in block.qids:
                    count(qid)
                file_docs += len(block.qids)
        elif source.group_sizes is not None:
            file_docs = _count_documents(path)
            if file_docs != source.group_sizes.sum():
                raise _group_mismatch(source, file_docs)
            for number, size in enumerate(source.group_sizes.tolist(), source.first_group):
                counts[str(number).encode()] = size
        else:
            for qid in _iter_qids(path):
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
        for block in _iter_blocks(source, num_features, workers, max_label):
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
        for block in _iter_blocks(source, num_features, workers, max_label):
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
