"""Where LETOR text comes from: files (plain or gzip, a byte order mark, CR or CRLF line ends read
as LF) in chunks of whole lines, and the group files of LightGBM/XGBoost inputs without ``qid:``.

:func:`sources` checks the inputs and pairs each file with its group sizes; :func:`iter_chunks`
reads a file as ``(first line number, bytes of whole lines)``, about ``CHUNK_BYTES`` at a time.
"""

from __future__ import annotations

import gzip
import io
import itertools
import os
import zlib
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from tfapprox.data.letor_tokens import INDEX_VALUE, LetorFormatError, show

CHUNK_BYTES = 1 << 20
UTF8_BOM = b"\xef\xbb\xbf"
GROUP_SUFFIXES = (".query", ".group")  # LightGBM, XGBoost

PathLike = str | os.PathLike


def open_text(path: PathLike):
    """Returns a binary file object for ``path``, decompressing gzip transparently."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.BufferedReader(gzip.open(path, "rb"), buffer_size=CHUNK_BYTES)
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
            if first is not None and INDEX_VALUE.match(first[1]):
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
    runs = [sum(1 for _ in run) for _, run in itertools.groupby(iter_qids(path))]
    if sizes != runs:
        raise LetorFormatError(
            f"{path}: the lines carry qid: ({len(runs)} runs of query ids), and the group file "
            f"{group_file} groups them differently ({len(sizes)} groups of {sum(sizes)} documents); "
            "give one grouping: remove or rename the group file, or drop the qid: tokens"
        )


def iter_qids(path: Path) -> Iterator[bytes | None]:
    """Yields the query id of each document line of ``path``; None for a line without ``qid:``."""
    for _, data in iter_chunks(path):
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
    for first_lineno, data in iter_chunks(Path(path)):
        for lineno, raw in enumerate(data.split(b"\n"), first_lineno):
            token = raw.strip()
            if not token:
                continue
            if not token.isdigit() or int(token) == 0:
                raise LetorFormatError(
                    f"{path}:{lineno}: expected a group size (a positive integer: the number of "
                    f"documents of one query), got {show(token)}"
                )
            sizes.append(int(token))
    if not sizes:
        raise LetorFormatError(f"{path}: no group sizes (the file is empty)")
    return np.asarray(sizes, dtype=np.int64)


def _first_document(path: Path) -> tuple[int, bytes] | None:
    """Returns ``(line number, second token or b"")`` of the first document line; None if none."""
    for lineno, data in iter_chunks(path):
        for offset, raw in enumerate(data.split(b"\n")):
            parts = raw.split(b"#", 1)[0].split(None, 2)
            if parts:
                return lineno + offset, parts[1] if len(parts) > 1 else b""
    return None


def count_documents(path: Path) -> int:
    """Returns the number of document lines (not blank, not only a comment) of ``path``."""
    count = 0
    for _, data in iter_chunks(path):
        for raw in data.split(b"\n"):
            hash_at = raw.find(b"#")
            count += bool((raw[:hash_at] if hash_at >= 0 else raw).strip())
    return count


def group_mismatch(source: Source, num_docs: int) -> LetorFormatError:
    return LetorFormatError(
        f"{source.path}: {num_docs} documents, but the group sizes in {source.group_file} sum to "
        f"{int(source.group_sizes.sum())} ({len(source.group_sizes)} groups)"
    )


def iter_chunks(path: Path, with_offsets: bool = False) -> Iterator[tuple]:
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
            data = read(handle, CHUNK_BYTES)
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
