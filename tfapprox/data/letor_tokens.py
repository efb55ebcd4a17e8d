"""LETOR text line by line and token by token: the specification of the format.

Every faster path (:mod:`tfapprox.data.letor_fast`) must read what this module reads, and leaves
anything it is unsure of to it; this module names the file, line and token of every problem.
The format itself is described in :mod:`tfapprox.data.letor`. Standard library and numpy only: the
parsing workers load it (see :mod:`tfapprox.data.worker_pool`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

BLOCK_LINES = 512  # documents per parsed block
FLOAT32_MAX = float(np.finfo(np.float32).max)
NUMBER_CHARS = b"0123456789.+-eE"
DECIMAL = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NON_FINITE = re.compile(rb"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)  # refused by name, later
NUMBER_HINT = "(LETOR numbers are plain decimals such as 2, -0.5 or 1e-3)"
_VALUE_HINT = NUMBER_HINT[:-1] + "; a missing value is NULL or nan)"
INDEX_VALUE = re.compile(rb"\d+:")
# A feature value that is missing, read as NaN: NULL (LETOR 4.0's aggregation sets) and nan (what
# LightGBM, XGBoost, numpy and C write for NaN; C's printf writes -nan too), in any letter case.
MISSING_MARKERS = (b"null", b"nan", b"-nan", b"+nan")


class LetorFormatError(ValueError):
    """Malformed LETOR/SVMlight input; the message names the file, the line and the offending token."""


class FeatureIndexError(LetorFormatError):
    """A feature index above ``num_features``."""


class QueryOrderError(LetorFormatError):
    """With ``assume_contiguous``: a query id whose lines come back after another query's."""


class Block(NamedTuple):
    """Parsed documents of up to ``BLOCK_LINES`` lines of one file."""

    qids: list[bytes]
    labels: np.ndarray  # [n] float32
    linenos: np.ndarray  # [n] line number of each document
    features: np.ndarray | None  # [n, num_features] float32; None when parsed without num_features
    max_index: int  # largest feature index in the block (0 if none)
    max_line: int  # line of the first document with max_index (0 if none)
    used: np.ndarray | None  # [k] the distinct feature indices; only when parsed without num_features


class Line(NamedTuple):
    """One document line: its query id (b"" in a grouped file), label, number and feature tokens."""

    qid: bytes
    label: float
    lineno: int
    body: bytes


def show(token: bytes) -> str:
    return repr(token.decode("utf-8", errors="replace"))


def parse_number(text: bytes) -> float | None:
    """Returns ``float(text)`` for LETOR number syntax (and nan/inf, which callers refuse by name).

    None for anything else Python's float() would take too: ``1_0``, non-ASCII digits, spaces.
    """
    if DECIMAL.fullmatch(text) or _NON_FINITE.fullmatch(text):
        return float(text)
    return None


def is_missing(text: bytes) -> bool:
    """True if the feature value ``text`` is a missing-value marker (``NULL``, ``nan``, ...)."""
    return text.lower() in MISSING_MARKERS


def split_lines(path: Path, first_lineno: int, data: bytes, grouped: bool) -> Iterator[Line]:
    """Yields the document lines of ``data`` (whole lines, LF-separated, the first numbered
    ``first_lineno``) with their label checked; blank and comment-only lines are skipped.

    ``grouped``: lines have no ``qid:`` (the queries come from a group file). Raises
    LetorFormatError naming the line for a missing or malformed label or ``qid:ID``.
    """
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
                f"{path}:{lineno}: expected 'LABEL qid:ID INDEX:VALUE ...', got only {show(parts[0])}"
            )
        label = float(parts[0]) if parts[0].isdigit() else parse_number(parts[0])  # isdigit: fast
        if label is None:
            raise LetorFormatError(f"{path}:{lineno}: non-numeric label {show(parts[0])} {NUMBER_HINT}")
        if not (label >= 0.0 and math.isfinite(label)):
            raise LetorFormatError(
                f"{path}:{lineno}: label {show(parts[0])} is not a finite number >= 0 "
                "(-1 is reserved for padding)"
            )
        if label > FLOAT32_MAX:
            raise LetorFormatError(f"{path}:{lineno}: label {show(parts[0])} overflows float32")
        if grouped:
            body = parts[1].rstrip() if len(parts) == 2 else b""
            if body[:4] == b"qid:":
                raise LetorFormatError(
                    f"{path}:{lineno}: 'qid:' on this line, but the file's first line has none (its "
                    "queries come from a group file): a file gives qid: on every line or on none"
                )
            yield Line(b"", label, lineno, body)
            continue
        qid = parts[1]
        if qid[:4] != b"qid:" or len(qid) == 4:
            mixed = ""
            if INDEX_VALUE.match(qid):
                mixed = " (the file's first line has one: every line needs one)"
            raise LetorFormatError(
                f"{path}:{lineno}: expected 'qid:ID' as second token, got {show(qid)}{mixed}"
            )
        yield Line(qid[4:], label, lineno, parts[2].rstrip() if len(parts) == 3 else b"")


def _refuse_unicode_space(path: Path, lineno: int, raw: bytes) -> None:
    """Raises LetorFormatError if ``raw`` holds whitespace other than ASCII (which splits tokens)."""
    text = raw.decode("utf-8", errors="replace")
    space = next((c for c in text if not c.isascii() and c.isspace()), None)
    if space is not None:
        raise LetorFormatError(
            f"{path}:{lineno}: non-ASCII whitespace U+{ord(space):04X} in the line; LETOR tokens are "
            "separated by ASCII spaces or tabs"
        )


def parse_tokens(path, linenos, bodies, num_features=None):
    """Returns ``(counts [n], indices [P], values [P])`` of the ``INDEX:VALUE`` tokens of each line
    body, token by token (a missing-value marker as NaN); raises LetorFormatError naming file, line and token on the first problem."""
    counts, indices, values = [], [], []
    for lineno, body in zip(linenos, bodies):
        seen = set()
        tokens = body.split()
        for token in tokens:
            where = f"{path}:{lineno}"
            index_text, colon, value_text = token.partition(b":")
            if not colon or not index_text or not value_text or b":" in value_text:
                raise LetorFormatError(f"{where}: expected INDEX:VALUE, got token {show(token)}")
            if not index_text.isdigit() or int(index_text) < 1:
                raise LetorFormatError(
                    f"{where}: feature index must be a positive integer, got token {show(token)}"
                )
            index = int(index_text)
            if num_features is not None and index > num_features:
                raise FeatureIndexError(
                    f"{where}: feature index {index} is above num_features={num_features} "
                    f"in token {show(token)}"
                )
            value = math.nan if is_missing(value_text) else parse_number(value_text)
            if value is None:
                raise LetorFormatError(
                    f"{where}: non-numeric feature value in token {show(token)} {_VALUE_HINT}"
                )
            if math.isinf(value):
                raise LetorFormatError(
                    f"{where}: infinite feature value in token {show(token)} (a missing value is "
                    "NULL or nan)"
                )
            if abs(value) > FLOAT32_MAX:
                raise LetorFormatError(f"{where}: feature value overflows float32 in token {show(token)}")
            if index in seen:
                raise LetorFormatError(f"{where}: feature index {index} repeated in token {show(token)}")
            seen.add(index)
            indices.append(index)
            values.append(value)
        counts.append(len(tokens))
    return (
        np.asarray(counts, dtype=np.int64),
        np.asarray(indices, dtype=np.int64),
        np.asarray(values, dtype=np.float64).astype(np.float32),
    )
