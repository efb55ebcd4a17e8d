"""The vectorised paths of the LETOR parser, each reading what :mod:`tfapprox.data.letor_tokens`
reads (the tests compare them on every number form and layout).

A read whose every line is dense (``LABEL qid:ID 1:v 2:v ... F:v``, single spaces, no comment) is
parsed by one ``numpy.loadtxt`` call after byte-level checks of its structure and indices
(:func:`parse_dense_lines`); a block of other lines by ``numpy.loadtxt`` again when it is dense
(:func:`load_dense`), else by a numpy tokeniser (:func:`parse_sparse`). Each returns None at the
first doubt, and the caller falls back to the token-by-token parser, which names the problem. The
tokeniser reads missing-value markers (``NULL``, ``nan``) as NaN, as the token parser does.
Standard library and numpy only: the parsing workers load it.
"""

from __future__ import annotations

import io
import re

import numpy as np

from tfapprox.data.letor_tokens import BLOCK_LINES, FLOAT32_MAX, MISSING_MARKERS, NUMBER_CHARS, Block

_IS_NUMBER_BYTE = np.zeros(256, dtype=bool)
_IS_NUMBER_BYTE[list(NUMBER_CHARS) + [0]] = True  # 0: padding of the gathered value bytes
_IS_LETTER_BYTE = np.zeros(256, dtype=bool)
_IS_LETTER_BYTE[list(range(ord("A"), ord("Z") + 1)) + list(range(ord("a"), ord("z") + 1))] = True
_QID_VALUE = re.compile(rb"qid:([^ ]*)")
_COLON_TO_SPACE = bytes.maketrans(b":", b" ")


def dense_block(qids, labels, linenos, dense: np.ndarray, num_features: int | None) -> Block:
    """The block of documents whose features ``dense`` [n, F0] give every index 1..F0.

    ``num_features``: None, or F >= F0 (zeros fill indices F0+1..F).
    """
    width = dense.shape[1]
    if num_features is None:
        return Block(qids, labels, linenos, None, width, int(linenos[0]), np.arange(1, width + 1))
    features = dense
    if width < num_features:
        features = np.zeros((len(qids), num_features), dtype=np.float32)
        features[:, :width] = dense
    return Block(qids, labels, linenos, features, width, int(linenos[0]), None)


_SKELETONS: dict[int, bytes] = {}


def _dense_skeleton(num_pairs: int) -> bytes:
    """What a dense line ``1:v ... F:v`` looks like with every number character deleted."""
    if num_pairs not in _SKELETONS:
        _SKELETONS[num_pairs] = b": " * (num_pairs - 1) + b":"
    return _SKELETONS[num_pairs]


def parse_dense_lines(first_lineno: int, data: bytes, num_features: int | None, grouped: bool):
    """Returns the blocks of a chunk whose every line is exactly ``LABEL qid:ID 1:v 2:v ... F0:v``
    (``LABEL 1:v ... F0:v`` if ``grouped``; single spaces, no comment, an ID of number characters),
    parsed by one ``numpy.loadtxt`` call; None for any other chunk, and for one with a label out of
    range or an index above ``num_features``: the line-by-line path reads it, and names the problem.
    """
    num_lines = data.count(b"\n") + 1
    loaded = load_dense(data, num_lines, b" " if grouped else b" qid: ")
    if loaded is None:
        return None
    labels, dense = loaded
    if num_features is not None and dense.shape[1] > num_features:
        return None
    if not ((labels >= 0.0) & (labels <= FLOAT32_MAX)).all():  # NaN fails too
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
        dense_block(qids[i:i + BLOCK_LINES], labels[i:i + BLOCK_LINES], linenos[i:i + BLOCK_LINES],
                     dense[i:i + BLOCK_LINES], num_features)
        for i in range(0, num_lines, BLOCK_LINES)
    ]


def load_dense(text: bytes, num_lines: int, lead: bytes):
    """Parses ``num_lines`` lines, each ``lead`` then exactly ``1:v 2:v ... F0:v``.

    ``lead``: ``b""`` (nothing before the pairs), ``b" "`` (a label) or ``b" qid: "`` (a label and
    ``qid:ID``; the ID is not parsed). Returns ``(labels [n] float64, or None without a label,
    features [n, F0] float32)``; None if a line differs, or a number is malformed or overflows.
    """
    first_line = text[: text.find(b"\n")] if num_lines > 1 else text
    num_pairs = first_line.count(b":") - lead.count(b":")
    if num_pairs <= 0:
        return None
    if text.translate(None, NUMBER_CHARS) != b"\n".join([lead + _dense_skeleton(num_pairs)] * num_lines):
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
    ``INDEX:VALUE`` tokens, every token made of number characters (as :func:`load_dense` checked).
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


def parse_sparse(bodies: list[bytes]):
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
    missing = _missing_markers(gathered, value_len)
    if missing is not None:
        gathered[missing] = 0
        gathered[missing, 0] = ord("0")
    if not _IS_NUMBER_BYTE[gathered].all():  # float() would take '1_0', ' 1', 'inf', ...
        return None
    try:
        values = np.ascontiguousarray(gathered).view(f"S{width}").ravel().astype(np.float64)
    except ValueError:
        return None
    with np.errstate(over="ignore"):
        values = values.astype(np.float32)
    if not np.isfinite(values).all():
        return None
    if missing is not None:
        values[missing] = np.nan
    counts = np.fromiter((b.count(b":") for b in bodies), dtype=np.int64, count=len(bodies))
    if not _unique_per_document(counts, indices):
        return None
    return counts, indices, values


def _missing_markers(gathered: np.ndarray, value_len: np.ndarray) -> np.ndarray | None:
    """Where the values ``gathered`` [P, width] (bytes, 0-padded to ``value_len``) are missing-value
    markers (``NULL``, ``nan``, ... in any case); None if no value holds a letter."""
    letters = _IS_LETTER_BYTE[gathered]
    if not letters.any():
        return None
    lowered = gathered | np.where(letters, 0x20, 0).astype(np.uint8)
    missing = np.zeros(len(gathered), dtype=bool)
    for marker in MISSING_MARKERS:
        if gathered.shape[1] >= len(marker):
            spelled = (lowered[:, :len(marker)] == np.frombuffer(marker, np.uint8)).all(axis=1)
            missing |= spelled & (value_len == len(marker))
    return missing


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
