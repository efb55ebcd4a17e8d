"""LETOR text -> sharded TFRecord lists plus a JSON spec (the layout of :mod:`tfapprox.data.shards`)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Iterable

import numpy as np
import tensorflow as tf

from tfapprox.data import folds, letor, records, shards
from tfapprox.files import create_file, new_directory, refuse_symlink


class _LabelStats:
    def __init__(self):
        self.counts: dict[float, int] = {}

    def add(self, labels: np.ndarray) -> None:
        values, counts = np.unique(labels, return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist()):
            self.counts[value] = self.counts.get(value, 0) + count

    def as_dict(self) -> dict:
        if not self.counts:
            return {"label_min": None, "label_max": None, "integer_labels": True, "label_counts": {}}
        counts = {}
        if len(self.counts) <= 64:
            counts = {_label_text(v): c for v, c in sorted(self.counts.items())}
        return {
            "label_min": min(self.counts),
            "label_max": max(self.counts),
            "integer_labels": all(float(v).is_integer() for v in self.counts),
            "label_counts": counts,
        }


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
    workers: int | None = None,
    query_files=None,
    max_label: float | None = letor.DEFAULT_MAX_LABEL,
) -> dict:
    """Converts LETOR/SVMlight files to ``num_shards`` TFRecord files plus ``spec.json`` in a directory.

    All ``inputs`` form one dataset (a query id shared by several files is one list). Lists go to
    shards round-robin in order of first appearance. Returns the spec that was written: ``format``,
    ``example_layout``, ``num_features``, ``num_lists``, ``num_docs``, label range and counts, list
    sizes, sources and per-shard counts. The counts are of what was written, and are checked against
    what was read (an unequal count raises ``RuntimeError``). ``workers``: text-parsing processes
    (see :func:`letor.read_queries`). ``query_files``: group files of inputs without ``qid:``
    (LightGBM/XGBoost layout), one per input; None looks for ``<input>.query`` / ``<input>.group``.
    ``max_label``: a larger label is an error naming its line (None: no limit); see
    :func:`letor.read_queries`.

    The set is written to a new sibling directory and renamed into place when complete: a failed
    conversion leaves ``output_dir`` as it was. An existing set is replaced only with ``overwrite``;
    a directory holding anything but shards and ``spec.json`` (regular files), and an ``output_dir``
    that is a symbolic link, are refused before anything is written.
    """
    if record_format not in records.RECORD_FORMATS:
        raise ValueError(f"record_format must be one of {records.RECORD_FORMATS}; got {record_format!r}")
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive integer; got {num_shards!r}")
    sources = letor.sources(inputs, query_files)
    output_dir = Path(os.path.abspath(output_dir))
    previous = _previous_output(output_dir)
    if previous and not overwrite:
        raise FileExistsError(
            f"{output_dir} already holds {previous[0].name} (and {len(previous) - 1} more); "
            "pass overwrite=True (--overwrite) to replace them"
        )
    # The new set is written beside the output directory and swapped in only when complete, so a
    # failed or interrupted conversion leaves the previous set as it was.
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = new_directory(output_dir.parent, f".{output_dir.name}.converting-")
    try:
        spec = _convert_into(
            sources, staging, num_shards, num_features, record_format, assume_contiguous, workers,
            max_label,
        )
        _swap_in(staging, output_dir, previous)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # ours: created above; gone after the swap
    return spec


def _previous_output(output_dir: Path) -> list[Path]:
    """Returns the shards and spec of an earlier conversion in ``output_dir``.

    Raises FileExistsError if ``output_dir`` is a symbolic link or not a directory, or holds anything
    else: it is replaced as a whole.
    """
    refuse_symlink(output_dir, "convert")
    if not output_dir.exists():
        return []
    if not output_dir.is_dir():
        raise FileExistsError(f"{output_dir} exists and is not a directory")
    found = sorted(output_dir.iterdir())
    others = [p for p in found if not _is_converter_output(p)]
    if others:
        raise FileExistsError(
            f"{output_dir} holds {others[0].name}, which convert did not write (and "
            f"{len(others) - 1} more); convert into a new or empty directory: the output directory "
            "is replaced as a whole"
        )
    return found


def _is_converter_output(path: Path) -> bool:
    name = path.name.removesuffix(".tmp")  # ".tmp": left by an interrupted older version
    regular = path.is_file() and not path.is_symlink()
    return regular and (name == shards.SPEC_NAME or name.endswith(shards.SHARD_SUFFIX))


def _swap_in(staging: Path, output_dir: Path, previous: list[Path]) -> None:
    """Renames ``staging`` to ``output_dir``; an existing one, holding ``previous``, is deleted.

    Only the files of ``previous`` and the directory that held them are deleted: if anything else has
    appeared there meanwhile, the old directory is left aside (renamed) with a warning naming it.
    """
    if not output_dir.exists():
        os.rename(staging, output_dir)
        return
    holder = new_directory(output_dir.parent, f".{output_dir.name}.replaced-")
    replaced = holder / output_dir.name
    os.rename(output_dir, replaced)
    try:
        os.rename(staging, output_dir)
    except BaseException:
        os.rename(replaced, output_dir)
        holder.rmdir()
        raise
    for path in previous:
        (replaced / path.name).unlink(missing_ok=True)
    try:
        replaced.rmdir()
        holder.rmdir()
    except OSError:  # something else appeared in the old directory meanwhile: not ours to delete
        warnings.warn(f"{output_dir} was replaced; its old directory held files convert did not "
                      f"write, and was kept as {replaced}")


def _convert_into(sources, output_dir, num_shards, num_features, record_format, assume_contiguous,
                  workers, max_label) -> dict:
    """Writes the shards and ``spec.json`` of :func:`convert` into the empty ``output_dir``."""
    paths = [s.path for s in sources]
    read_options = {"query_files": [s.group_file for s in sources]}
    workers = letor.default_workers(paths) if workers is None else workers
    names = [shards.shard_name(i, num_shards) for i in range(num_shards)]
    written, noncontiguous = None, 0
    # One pass, for queries in contiguous lines (the norm) and F known or settled by the first lines.
    width = num_features or letor.peek_num_features(paths, **read_options)
    if width is not None:
        try:
            queries = letor.read_queries(
                paths, width, assume_contiguous=True, workers=workers, max_label=max_label,
                **read_options,
            )
            written = _write_shards(queries, output_dir, names, record_format)
        except (letor.QueryOrderError, letor.FeatureIndexError) as err:
            if isinstance(err, letor.QueryOrderError) and assume_contiguous:
                raise
            if isinstance(err, letor.FeatureIndexError) and num_features is not None:
                raise
            for name in names:  # the partial shards of this pass, written again below
                (output_dir / name).unlink()
    if written is None:
        # Non-contiguous queries, or a feature index beyond (or too far for) the first lines: plan,
        # then read again.
        plan = letor.scan(paths, with_features=num_features is None, workers=workers, **read_options)
        width = num_features or plan.num_features
        queries = letor.read_queries(
            paths, width, workers=workers, plan=plan, max_label=max_label, **read_options
        )
        written = _write_shards(queries, output_dir, names, record_format)
        noncontiguous = plan.noncontiguous
        if written["num_docs"] != plan.num_docs or written["num_lists"] != len(plan.docs_per_query):
            raise RuntimeError(
                f"wrote {written['num_lists']} lists / {written['num_docs']} documents but the pre-pass "
                f"counted {len(plan.docs_per_query)} queries / {plan.num_docs} document lines in {paths}"
            )
    spec = {
        "spec_version": shards.SPEC_VERSION,
        "format": record_format,
        "example_layout": "vector",
        "feature_key": records.FEATURES_KEY,
        "label_key": records.LABEL_KEY,
        "num_features": int(width),
        **{k: v for k, v in written.items() if k != "shards"},
        "noncontiguous_queries": noncontiguous,  # query ids whose lines came back, each one list
        "sources": [str(p) for p in paths],
        **({"group_files": [str(s.group_file) for s in sources]} if sources[0].group_file else {}),
        "shards": [
            {**shard, "bytes": (output_dir / shard["file"]).stat().st_size}
            for shard in written["shards"]
        ],
    }
    with os.fdopen(create_file(output_dir / shards.SPEC_NAME), "w") as handle:
        handle.write(json.dumps(spec, indent=2) + "\n")
    return spec


def _write_shards(queries, output_dir: Path, names: list[str], record_format: str) -> dict:
    """Writes ``queries`` round-robin to ``names`` in ``output_dir``; returns the counts written."""
    shard_lists = [0] * len(names)
    shard_docs = [0] * len(names)
    labels = _LabelStats()
    list_sizes = []
    missing = None  # [F] missing values (NaN) per feature
    for name in names:  # TFRecordWriter follows links: create each file first, as a new regular file
        os.close(create_file(output_dir / name))
    writers = [tf.io.TFRecordWriter(str(output_dir / name)) for name in names]
    try:
        for i, query in enumerate(queries):
            shard = i % len(names)
            record = records.encode_list(query.features, query.labels, query.qid, record_format)
            writers[shard].write(record)
            shard_lists[shard] += 1
            shard_docs[shard] += len(query.labels)
            list_sizes.append(len(query.labels))
            labels.add(query.labels)
            counts = np.isnan(query.features).sum(axis=0)
            missing = counts if missing is None else missing + counts
    finally:
        for writer in writers:
            writer.close()
    return {
        "num_lists": sum(shard_lists),
        "num_docs": sum(shard_docs),
        **labels.as_dict(),
        "min_list_size": min(list_sizes, default=0),
        "max_list_size": max(list_sizes, default=0),
        "missing_values": [] if missing is None else missing.tolist(),
        "shards": [
            {"file": name, "num_lists": n_lists, "num_docs": n_docs}
            for name, n_lists, n_docs in zip(names, shard_lists, shard_docs)
        ],
    }


def convert_tree(input_dir, output_dir, **kwargs) -> dict[str, dict]:
    """Converts a fold layout, keeping its shape; returns ``{"Fold1/train": spec, ...}``.

    ``input_dir`` is either a root with ``Fold<N>/`` directories or one fold directory; each split file
    (``train.txt`` / ``trainingset.txt``, ``vali.txt`` / ``validationset.txt``, ``test.txt`` /
    ``testset.txt``) becomes ``output_dir/[Fold<N>/]<split>/``. An ``output_dir`` or ``Fold<N>``
    directory there that is a symbolic link is refused before anything is written.
    """
    input_dir, output_dir = Path(input_dir), Path(output_dir)
    splits = folds.find_split_files(input_dir)
    jobs = {}
    if splits:
        jobs = {split: path for split, path in splits.items()}
    else:
        for fold, fold_splits in folds.find_folds(input_dir).items():
            refuse_symlink(output_dir / fold, "convert")
            for split, path in fold_splits.items():
                jobs[f"{fold}/{split}"] = path
    refuse_symlink(output_dir, "convert")
    return {name: convert(path, output_dir / name, **kwargs) for name, path in jobs.items()}
