"""The on-disk layout of a converted set: shards ``part-NNNNN-of-NNNNN.tfrecord`` beside a
``spec.json`` that lists each with its list, document and byte counts, and the checks that a shard
is whole and is what its spec says.

Written by :mod:`tfapprox.data.converter`, read by :mod:`tfapprox.data.dataset`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import tensorflow as tf

SPEC_NAME = "spec.json"
SHARD_SUFFIX = ".tfrecord"
SPEC_VERSION = 1


class RecordError(ValueError):
    """A TFRecord file that is corrupt, truncated, or disagrees with its siblings; names the file."""


def shard_name(index: int, num_shards: int) -> str:
    return f"part-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX}"


def read_spec(directory: str | os.PathLike) -> dict | None:
    """Returns the ``spec.json`` of a converted directory, or None if it has none."""
    path = Path(directory) / SPEC_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RecordError(f"{path}: not valid JSON ({err})") from None


def shard_entry(path: Path) -> dict | None:
    """Returns the ``spec.json`` entry (file, num_lists, num_docs, bytes) of shard ``path``.

    None if its directory has no ``spec.json``; RecordError if it has one that does not list ``path``
    (a leftover or a copy: reading it would mix it into the converted set).
    """
    spec = read_spec(path.parent)
    if spec is None:
        return None
    entries = {s["file"]: s for s in spec.get("shards", [])}
    if path.name not in entries:
        raise RecordError(
            f"{path}: not listed in {path.parent / SPEC_NAME}, which lists {len(entries)} shard(s) "
            f"({', '.join(sorted(entries)[:3])}{', ...' if len(entries) > 3 else ''}); move it out "
            "of the directory, or convert again"
        )
    return entries[path.name]


def listed_shards(directory: Path) -> list[Path] | None:
    """Returns the shards that ``directory/spec.json`` lists (None without a spec).

    Raises RecordError if a listed shard is missing.
    """
    spec = read_spec(directory)
    if spec is None:
        return None
    shards = [directory / s["file"] for s in spec.get("shards", [])]
    for shard in shards:
        if not shard.is_file():
            raise RecordError(
                f"{directory / SPEC_NAME} lists {shard.name}, which is missing (deleted, or not "
                "copied with the rest?)"
            )
    return shards


def check_size(path: Path) -> dict | None:
    """Raises RecordError if ``path``'s size differs from its ``spec.json`` entry; returns the entry."""
    entry = shard_entry(path)
    size = path.stat().st_size
    if entry is not None and "bytes" in entry and entry["bytes"] != size:
        raise RecordError(
            f"{path}: {size} bytes, but {path.parent / SPEC_NAME} records {entry['bytes']} "
            "(truncated or rewritten?)"
        )
    return entry


_VERIFIED: dict[tuple, int] = {}


def verify_file(path: str | os.PathLike) -> int:
    """Reads every record of a TFRecord file (checking its CRCs) and returns the number of records.

    Raises RecordError naming the file if it is truncated or corrupt, or if its size or record count
    disagrees with its directory's ``spec.json``. A file already verified in this process (same path,
    size and modification time) is not read again.
    """
    path = Path(path)
    entry = check_size(path)
    status = path.stat()
    key = (str(path.resolve()), status.st_size, status.st_mtime_ns)
    if key in _VERIFIED:
        return _VERIFIED[key]
    try:
        count = int(tf.data.TFRecordDataset(str(path), buffer_size=1 << 22).reduce(
            tf.constant(0, tf.int64), lambda n, _: n + 1))
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
        raise RecordError(f"{path}: corrupt or truncated TFRecord file ({error_summary(err)})") from None
    if entry is not None and entry["num_lists"] != count:
        raise RecordError(
            f"{path}: holds {count} records but {path.parent / SPEC_NAME} records {entry['num_lists']}"
        )
    _VERIFIED[key] = count
    return count


def error_summary(err: tf.errors.OpError) -> str:
    """Returns the useful part of a TF error message ("corrupted record at 3848")."""
    text = err.message.splitlines()[0] if err.message else type(err).__name__
    assertion = re.search(r"assertion failed: \[(.*?)\]", text)
    if assertion:
        return assertion.group(1).replace("\\'", "'")
    return text.split("}}")[-1].split(" [Op:")[0].strip()
