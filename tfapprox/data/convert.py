"""LETOR text -> sharded TFRecord lists plus a JSON spec, and checks of written records."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import tensorflow as tf

from tfapprox.data import letor, records

SPEC_NAME = "spec.json"
SHARD_SUFFIX = ".tfrecord"
SPEC_VERSION = 1


class RecordError(ValueError):
    """A TFRecord file that is corrupt, truncated, or disagrees with its siblings; names the file."""


def shard_name(index: int, num_shards: int) -> str:
    return f"part-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX}"


class _LabelStats:
    def __init__(self):
        self.counts: dict[float, int] = {}

    def add(self, labels: np.ndarray) -> None:
        values, counts = np.unique(labels, return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist()):
            self.counts[value] = self.counts.get(value, 0) + count

    def as_dict(self) -> dict:
        if not self.counts:
            return {"label_min": None, "label_max": None, "label_counts": {}}
        counts = {}
        if len(self.counts) <= 64:
            counts = {_label_text(v): c for v, c in sorted(self.counts.items())}
        return {"label_min": min(self.counts), "label_max": max(self.counts), "label_counts": counts}


def _label_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def convert(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    output_dir: str | os.PathLike,
    *,
    num_shards: int = 1,
    num_features: int | None = None,
    record_format: str = "elwc",
    assume_contiguous: bool = False,
    overwrite: bool = False,
) -> dict:
    """Converts LETOR/SVMlight files to ``num_shards`` TFRecord files and ``spec.json`` in ``output_dir``.

    All ``inputs`` form one dataset (a query id shared by several files is one list). Lists go to
    shards round-robin in order of first appearance. Returns the spec that was written: ``format``,
    ``example_layout``, ``num_features``, ``num_lists``, ``num_docs``, label range and counts, list
    sizes, sources and per-shard counts. The counts are of what was written, and are checked against
    what was read (an unequal count raises ``RuntimeError``).
    """
    if record_format not in records.RECORD_FORMATS:
        raise ValueError(f"record_format must be one of {records.RECORD_FORMATS}; got {record_format!r}")
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive integer; got {num_shards!r}")
    paths = letor._as_paths(inputs)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    stale = sorted(output_dir.glob("*" + SHARD_SUFFIX)) + sorted(output_dir.glob(SPEC_NAME))
    if stale and not overwrite:
        raise FileExistsError(
            f"{output_dir} already holds {stale[0].name} (and {len(stale) - 1} more); "
            "pass overwrite=True (--overwrite) to replace them"
        )
    for old in stale:
        old.unlink()

    plan = None
    if num_features is None or not assume_contiguous:
        plan = letor.scan(paths, with_features=num_features is None)
        if num_features is None:
            num_features = max(plan.num_features, 1)
        queries = letor._read_planned(paths, num_features, plan)
    else:
        queries = letor._read_contiguous(paths, num_features)

    names = [shard_name(i, num_shards) for i in range(num_shards)]
    shard_lists = [0] * num_shards
    shard_docs = [0] * num_shards
    labels = _LabelStats()
    list_sizes = []
    writers = [tf.io.TFRecordWriter(str(output_dir / (name + ".tmp"))) for name in names]
    try:
        for i, query in enumerate(queries):
            shard = i % num_shards
            writers[shard].write(records.encode_list(query.features, query.labels, query.qid, record_format))
            shard_lists[shard] += 1
            shard_docs[shard] += len(query.labels)
            list_sizes.append(len(query.labels))
            labels.add(query.labels)
    finally:
        for writer in writers:
            writer.close()
    num_docs = sum(shard_docs)
    if plan is not None and (num_docs != plan.num_docs or sum(shard_lists) != len(plan.docs_per_query)):
        raise RuntimeError(
            f"wrote {sum(shard_lists)} lists / {num_docs} documents but read "
            f"{len(plan.docs_per_query)} queries / {plan.num_docs} document lines from {paths}"
        )
    for name in names:
        os.replace(output_dir / (name + ".tmp"), output_dir / name)
    spec = {
        "spec_version": SPEC_VERSION,
        "format": record_format,
        "example_layout": "vector",
        "feature_key": records.FEATURES_KEY,
        "label_key": records.LABEL_KEY,
        "num_features": int(num_features),
        "num_lists": sum(shard_lists),
        "num_docs": num_docs,
        **labels.as_dict(),
        "min_list_size": min(list_sizes) if list_sizes else 0,
        "max_list_size": max(list_sizes) if list_sizes else 0,
        "sources": [str(p) for p in paths],
        "shards": [
            {"file": name, "num_lists": n_lists, "num_docs": n_docs}
            for name, n_lists, n_docs in zip(names, shard_lists, shard_docs)
        ],
    }
    tmp = output_dir / (SPEC_NAME + ".tmp")
    tmp.write_text(json.dumps(spec, indent=2) + "\n")
    os.replace(tmp, output_dir / SPEC_NAME)
    return spec


def convert_tree(input_dir, output_dir, **kwargs) -> dict[str, dict]:
    """Converts a fold layout, keeping its shape; returns ``{"Fold1/train": spec, ...}``.

    ``input_dir`` is either a root with ``Fold<N>/`` directories or one fold directory; each split file
    (``train.txt`` / ``trainingset.txt``, ``vali.txt`` / ``validationset.txt``, ``test.txt`` /
    ``testset.txt``) becomes ``output_dir/[Fold<N>/]<split>/``.
    """
    input_dir, output_dir = Path(input_dir), Path(output_dir)
    splits = letor.find_split_files(input_dir)
    jobs = {}
    if splits:
        jobs = {split: path for split, path in splits.items()}
    else:
        for fold, fold_splits in letor.find_folds(input_dir).items():
            for split, path in fold_splits.items():
                jobs[f"{fold}/{split}"] = path
    return {name: convert(path, output_dir / name, **kwargs) for name, path in jobs.items()}


def read_spec(directory: str | os.PathLike) -> dict | None:
    """Returns the ``spec.json`` of a converted directory, or None if it has none."""
    path = Path(directory) / SPEC_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RecordError(f"{path}: not valid JSON ({err})") from None


def check_records(paths: Iterable[str | os.PathLike], num_features: int | None = None) -> dict:
    """Reads every record of every file and returns ``{"num_lists", "num_docs", "num_features"}``.

    Raises RecordError naming the file for a truncated or corrupt file (CRC mismatch), a record that is
    not a ranking list, files that disagree on the feature count, or a count that disagrees with the
    directory's ``spec.json``.
    """
    from tfapprox.data import dataset  # local: dataset imports this module

    totals = {"num_lists": 0, "num_docs": 0, "num_features": num_features}
    for path in [Path(p) for p in paths]:
        info = dataset.inspect_file(path)
        if totals["num_features"] is None:
            totals["num_features"] = info.num_features
        elif info.num_features != totals["num_features"]:
            raise RecordError(
                f"{path}: documents have {info.num_features} features, but {totals['num_features']} "
                "were expected (from earlier files or num_features)"
            )
        parse = dataset.list_parser(info.record_format, info.num_features, info.layout, info.label_dtype)
        lists = docs = 0
        try:
            for batch in tf.data.TFRecordDataset(str(path)).batch(256).map(parse):
                lists += int(batch[1].shape[0])
                docs += int(tf.reduce_sum(tf.cast(batch[1], tf.int64)))
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
            raise RecordError(f"{path}: corrupt or truncated TFRecord file ({err.message.splitlines()[0]})") from None
        spec = read_spec(path.parent)
        if spec is not None:
            expected = {s["file"]: s for s in spec.get("shards", [])}.get(path.name)
            if expected is not None and (expected["num_lists"], expected["num_docs"]) != (lists, docs):
                raise RecordError(
                    f"{path}: holds {lists} lists / {docs} documents but {path.parent / SPEC_NAME} "
                    f"records {expected['num_lists']} / {expected['num_docs']}"
                )
        totals["num_lists"] += lists
        totals["num_docs"] += docs
    return totals
