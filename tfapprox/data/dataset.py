"""tf.data pipelines of padded ranking lists, from TFRecord shards or straight from LETOR text.

Every dataset yields ``(inputs, labels)`` with ``inputs = {"features": float32 [B, L, F], "mask": bool
[B, L]}`` and ``labels`` float32 ``[B, L]``, -1 on padded slots (see docs/contracts.md).

Whole lists can be grouped by length and padded to one of a few sizes (``list_buckets``), so that a
compiled step (XLA) sees a bounded number of shapes; see docs/data.md ("Length buckets").
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import numpy as np
import tensorflow as tf

from tfapprox.data import letor, named_records, records, shards
from tfapprox.data.feature_spec import MASK_FEATURE_NAME

_VERIFY_BYTES = 256 << 20
_SAMPLE_LISTS = 256  # lists per file checked against a feature spec when not verifying
_TEXT_START = re.compile(rb"^\s*[-+0-9.eE]+\s+(qid:|\d+:)")  # LETOR, or LightGBM (no qid:)


class FileInfo(NamedTuple):
    """What one input file holds, learned from its first record (or first line, for text)."""

    path: Path
    kind: str  # "tfrecord" or "letor"
    record_format: str | None  # "elwc" / "sequence_example"; None for text and for empty shards
    layout: str | None  # document Example layout: "vector" / "per_feature"
    num_features: int | None
    label_dtype: tf.DType


class DatasetInfo(NamedTuple):
    """The resolved inputs of :func:`ranking_dataset`."""

    files: list[Path]
    kind: str
    record_format: str
    layout: str
    num_features: int
    label_dtype: tf.DType
    num_lists: int | None  # from spec.json files, when every directory has one
    num_docs: int | None


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------
def resolve_files(file_pattern, converted: bool = True) -> list[Path]:
    """The files behind globs, files and directories (their ``*.tfrecord`` shards: with
    ``converted``, those their ``spec.json`` lists)."""
    patterns = [file_pattern] if isinstance(file_pattern, (str, os.PathLike)) else list(file_pattern)
    files: list[Path] = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        if os.path.isdir(pattern):
            matched = sorted(glob.glob(os.path.join(pattern, "*" + shards.SHARD_SUFFIX)))
            listed = shards.listed_shards(Path(pattern)) if converted else None
            if listed is not None:
                for path in matched:
                    shards.shard_entry(Path(path))  # names a shard the spec does not list
                matched = [str(p) for p in listed]
            if not matched:
                raise FileNotFoundError(f"{pattern}: directory holds no *{shards.SHARD_SUFFIX} files")
        else:
            matched = sorted(glob.glob(pattern))
            if not matched:
                raise FileNotFoundError(f"no files match {pattern!r}")
        files.extend(Path(m) for m in matched if os.path.isfile(m))
    if not files:
        raise FileNotFoundError(f"no files match {file_pattern!r}")
    return files


def _is_letor_text(path: Path) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(4096).removeprefix(letor.UTF8_BOM)
    if head[:2] == b"\x1f\x8b":
        return True
    for line in head.splitlines():
        line = line.split(b"#", 1)[0]
        if line.strip():
            return bool(_TEXT_START.match(line))
    return False


def inspect_file(path: str | os.PathLike) -> FileInfo:
    """Returns what ``path`` holds: LETOR text, or TFRecords of which format, layout and width.

    Raises ``shards.RecordError`` naming the file if its first record cannot be read or understood.
    """
    path = Path(path)
    if _is_letor_text(path):
        return FileInfo(path, "letor", None, None, None, tf.float32)
    try:
        first = list(tf.data.TFRecordDataset(str(path)).take(1).as_numpy_iterator())
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError) as err:
        raise shards.RecordError(
            f"{path}: corrupt or truncated TFRecord file ({shards.error_summary(err)})"
        ) from None
    if not first:
        return FileInfo(path, "tfrecord", None, None, None, tf.float32)
    try:
        record_format, layout, num_features, label_dtype = _describe_record(first[0])
    except ValueError as err:
        raise shards.RecordError(f"{path}: first record is not a ranking list ({err})") from None
    return FileInfo(path, "tfrecord", record_format, layout, num_features, label_dtype)


def _describe_record(serialized: bytes):
    """Returns ``(record_format, layout, num_features, label_dtype)`` of one serialized list."""
    try:
        sequence = tf.train.SequenceExample.FromString(serialized)
        feature_lists = sequence.feature_lists.feature_list
        if records.FEATURES_KEY in feature_lists and feature_lists[records.FEATURES_KEY].feature:
            width = len(feature_lists[records.FEATURES_KEY].feature[0].float_list.value)
            return "sequence_example", "vector", width, tf.float32
    except Exception:  # noqa: BLE001 - protobuf raises DecodeError or others for non-matching bytes
        pass
    examples, _ = records.split_elwc(serialized)
    if not examples:
        raise ValueError("an ExampleListWithContext without documents; cannot tell its feature count")
    try:
        info = records.describe_example(examples[0])
    except Exception as err:  # noqa: BLE001
        raise ValueError(
            f"neither an ExampleListWithContext nor a SequenceExample list: {err}"
        ) from None
    return "elwc", info["layout"], info["num_features"], info["label_dtype"]


def describe(file_pattern, num_features: int | None = None) -> DatasetInfo:
    """Returns the resolved files, format and feature count behind ``file_pattern``.

    Every TFRecord file's first record is read, so shards that disagree on the feature count (or with
    their ``spec.json``) raise ``shards.RecordError`` naming the file. For LETOR text the feature
    count is ``num_features`` or, if None, the largest index in the files.
    """
    files = resolve_files(file_pattern)
    infos = [inspect_file(f) for f in files]
    for info in infos:
        if info.kind == "tfrecord":
            shards.shard_entry(info.path)  # in a converted directory, only what its spec lists
    kinds = {i.kind for i in infos}
    if len(kinds) > 1:
        text = next(i.path for i in infos if i.kind == "letor")
        raise letor.mixed_inputs_error(text, next(i.path for i in infos if i.kind == "tfrecord"))
    if kinds == {"letor"}:
        if num_features is None:
            num_features = letor.scan(files, with_features=True).num_features
        return DatasetInfo(files, "letor", "elwc", "vector", num_features, tf.float32, None, None)

    specs = {}
    for info in infos:
        if info.path.parent not in specs:
            specs[info.path.parent] = shards.read_spec(info.path.parent)
    reference = None  # (num_features, where it came from)
    if num_features is not None:
        reference = (num_features, "num_features")
    for directory, spec in specs.items():
        if spec is not None:
            width = int(spec["num_features"])
            where = str(directory / shards.SPEC_NAME)
            if reference is None:
                reference = (width, where)
            elif width != reference[0]:
                raise shards.RecordError(
                    f"{where} says {width} features but {reference[1]} says {reference[0]}"
                )
    known = [i for i in infos if i.num_features is not None]
    if not known:
        raise shards.RecordError(f"no records in any of {len(files)} files matching {file_pattern!r}")
    for info in known:
        if reference is None:
            reference = (info.num_features, str(info.path))
        elif info.num_features != reference[0]:
            raise shards.RecordError(
                f"{info.path}: documents have {info.num_features} features, but {reference[1]} "
                f"has {reference[0]}; all shards must agree"
            )
    signatures = {(i.record_format, i.layout, i.label_dtype) for i in known}
    if len(signatures) > 1:
        raise shards.RecordError(
            f"files matching {file_pattern!r} mix record formats: {sorted(map(str, signatures))}"
        )
    record_format, layout, label_dtype = signatures.pop()
    num_lists = num_docs = None
    if all(spec is not None for spec in specs.values()):
        counted = {}
        for spec_dir, spec in specs.items():
            for shard in spec.get("shards", []):
                counted[spec_dir / shard["file"]] = (shard["num_lists"], shard["num_docs"])
        if all(f in counted for f in files):
            num_lists = sum(counted[f][0] for f in files)
            num_docs = sum(counted[f][1] for f in files)
    return DatasetInfo(
        files, "tfrecord", record_format, layout, reference[0], label_dtype, num_lists, num_docs
    )


# --------------------------------------------------------------------------------------------------
# Parsing a batch of serialized lists
# --------------------------------------------------------------------------------------------------
def list_parser(
    record_format: str,
    num_features: int,
    layout: str = "vector",
    label_dtype: tf.DType = tf.float32,
    *,
    list_size: int | None = None,
    seed: int | tf.Tensor | None = None,
) -> Callable:
    """Returns ``parse(serialized [B], batch_index=None) -> (features, mask, labels)``.

    ``list_size=None`` pads to the batch's longest list; an int truncates and pads every list to that
    size. With ``seed`` truncation keeps a random subset drawn from ``(seed, batch_index)`` (stateless,
    so the same batch gets the same subset on every run); without it keeps each list's head.
    """

    def parse(serialized, batch_index=None):
        step_seed = None
        if seed is not None and list_size is not None:
            step_seed = records.batch_seed(seed, batch_index)
        if record_format == "elwc":
            examples, lengths = records.decode_elwc(serialized)
            if list_size is not None:
                indices, lengths = records.choose_documents(lengths, tf.shape(examples)[1],
                                                            list_size, step_seed)
                examples = records.pad_lists(tf.gather(examples, indices, batch_dims=1), list_size,
                                             "")
            features, mask, labels = records.parse_example_lists(
                examples, lengths, num_features, layout=layout, label_dtype=label_dtype
            )
        else:
            features, mask, labels = records.parse_lists(
                serialized, num_features, record_format=record_format
            )
            if list_size is not None:
                lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
                indices, lengths = records.choose_documents(lengths, tf.shape(mask)[1], list_size,
                                                            step_seed)
                features = records.pad_lists(tf.gather(features, indices, batch_dims=1), list_size,
                                             0.0)
                mask = tf.sequence_mask(lengths, maxlen=list_size)
                labels = records.pad_lists(tf.gather(labels, indices, batch_dims=1), list_size, -1.0)
                labels = tf.where(mask, labels, -1.0)
        if list_size is not None:
            features = tf.ensure_shape(features, [None, list_size, num_features])
            mask = tf.ensure_shape(mask, [None, list_size])
            labels = tf.ensure_shape(labels, [None, list_size])
        return features, mask, labels

    return parse


def _vector_reader(info: DatasetInfo, list_size: int | None, seed) -> Callable:
    """Returns ``read(serialized, batch_index, size=None) -> ({"features", "mask"}, labels)``,
    padded to ``size`` lists when given (a length bucket)."""
    parse = list_parser(info.record_format, info.num_features, info.layout, info.label_dtype,
                        list_size=list_size, seed=seed)

    def read(serialized, batch_index, size=None):
        features, mask, labels = parse(serialized, batch_index)
        if size is not None:
            features = records.pad_lists(features, size, 0.0)
            mask = records.pad_lists(mask, size, False)
            labels = records.pad_lists(labels, size, records.PAD_LABEL)
        return {"features": features, "mask": mask}, labels

    return read


def _describe_named(file_pattern, spec: named_records.NamedSpec, num_shards: int,
                    shard_index: int, verify: bool | None) -> DatasetInfo:
    """The files behind ``file_pattern`` checked against ``spec`` (this worker's shard of them:
    all their lists when ``verify``, else each file's first ones); prints how many documents lack
    a label."""
    files = resolve_files(file_pattern, converted=False)  # a spec.json there may be a feature spec
    text = next((f for f in files if _is_letor_text(f)), None)
    if text is not None:
        raise ValueError(f"{text}: LETOR text holds numbered features, not named ones; read it "
                         "without a feature spec")
    record_format = named_records.record_format_of(files, spec)
    mine = files[shard_index::num_shards] or files
    if verify is None:
        verify = sum(f.stat().st_size for f in mine) <= _VERIFY_BYTES
    result = named_records.scan(mine, spec, record_format, None if verify else _SAMPLE_LISTS)
    warning = named_records.label_warning(result, spec, mine)
    if warning:
        print(warning)
    return DatasetInfo(files, "tfrecord", record_format, "named", None, tf.float32,
                       result.lists if verify and len(mine) == len(files) else None,
                       result.documents if verify and len(mine) == len(files) else None)


# --------------------------------------------------------------------------------------------------
# Checking every record
# --------------------------------------------------------------------------------------------------
def check_records(paths: Iterable[str | os.PathLike], num_features: int | None = None) -> dict:
    """Reads every record of every file and returns ``{"num_lists", "num_docs", "num_features"}``.

    Raises ``shards.RecordError`` naming the file for a truncated or corrupt file (CRC mismatch), a
    record that is not a ranking list, files that disagree on the feature count, or a count that
    disagrees with the directory's ``spec.json``.
    """
    totals = {"num_lists": 0, "num_docs": 0, "num_features": num_features}
    for path in [Path(p) for p in paths]:
        info = inspect_file(path)
        if totals["num_features"] is None:
            totals["num_features"] = info.num_features
        elif info.num_features != totals["num_features"]:
            raise shards.RecordError(
                f"{path}: documents have {info.num_features} features, but {totals['num_features']} "
                "were expected (from earlier files or num_features)"
            )
        shards.verify_file(path)
        lists = docs = 0
        if info.num_features is not None:
            parse = list_parser(info.record_format, info.num_features, info.layout, info.label_dtype)
            try:
                for _, mask, _ in tf.data.TFRecordDataset(str(path)).batch(256).map(parse):
                    lists += int(mask.shape[0])
                    docs += int(tf.reduce_sum(tf.cast(mask, tf.int64)))
            except tf.errors.OpError as err:
                raise shards.RecordError(
                    f"{path}: a record is not a valid ranking list ({shards.error_summary(err)})"
                ) from None
        entry = shards.shard_entry(path)
        if entry is not None and entry["num_docs"] != docs:
            raise shards.RecordError(
                f"{path}: holds {docs} documents but {path.parent / shards.SPEC_NAME} records "
                f"{entry['num_docs']}"
            )
        totals["num_lists"] += lists
        totals["num_docs"] += docs
    return totals


# --------------------------------------------------------------------------------------------------
# List-length buckets
# --------------------------------------------------------------------------------------------------
_LENGTH_BATCH = 1024  # lists whose lengths are read at once
_MAX_CANDIDATE_SIZES = 2048  # bucket_sizes picks among at most this many sizes (memory: their square)


def _lengths_reader(record_format: str) -> Callable:
    """Returns ``lengths(serialized [B]) -> int64 [B]``: each list's document count, read without
    parsing the documents."""

    def lengths(serialized):
        if record_format == "elwc":
            return tf.cast(records.decode_elwc(serialized)[1], tf.int64)
        _, _, counts = tf.io.parse_sequence_example(serialized, sequence_features={
            records.LABEL_KEY: tf.io.FixedLenSequenceFeature([], tf.float32)})
        return counts[records.LABEL_KEY]

    return lengths


def list_lengths(file_pattern, num_features: int | None = None) -> np.ndarray:
    """Returns the document count of every list behind ``file_pattern``, in file order (one pass)."""
    info = describe(file_pattern, num_features)
    if info.kind == "letor":
        return np.array([len(q.labels) for q in letor.read_queries(info.files, info.num_features)],
                        np.int64)
    return _read_lengths(info.files, _lengths_reader(info.record_format))


def _read_lengths(files: list[Path], lengths: Callable) -> np.ndarray:
    counted = tf.data.TFRecordDataset([str(f) for f in files]).batch(_LENGTH_BATCH).map(lengths)
    return np.concatenate([np.zeros([0], np.int64), *counted.as_numpy_iterator()])


def bucket_sizes(lengths, max_buckets: int) -> list[int]:
    """Returns at most ``max_buckets`` pad sizes, the largest the longest list, that minimise the
    padded slots Σ_i (size(l_i) − l_i) when each list of ``lengths`` is padded to the smallest
    size ≥ its length l_i.

    By dynamic programming over the candidate sizes u_1 < … < u_m (the distinct lengths; at most
    2048 of them, else 2048 of their quantiles, the longest always among them): with C_b and
    S_b the count and the summed length of the lists up to u_b, padding the lists in
    (u_a, u_b] to u_b costs u_b·(C_b − C_a) − (S_b − S_a), and the best cover of u_1..u_b by j
    sizes is best_j(b) = min_a best_{j−1}(a) + cost(a, b).
    """
    if not isinstance(max_buckets, (int, np.integer)) or max_buckets < 1:
        raise ValueError(f"max_buckets must be a positive integer; got {max_buckets!r}")
    lengths = np.asarray(lengths, np.int64)
    if lengths.size == 0:
        return []
    sizes = np.unique(lengths)
    if sizes.size > _MAX_CANDIDATE_SIZES:
        sizes = np.unique(np.quantile(sizes, np.linspace(0, 1, _MAX_CANDIDATE_SIZES),
                                      method="higher"))
    group = np.searchsorted(sizes, lengths)  # each list's candidate: the smallest size >= it
    count = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=sizes.size))])
    total = np.concatenate([[0], np.cumsum(np.bincount(group, lengths, minlength=sizes.size))])
    padded_to = np.concatenate([[0], sizes]).astype(np.float64)
    cost = padded_to[None, :] * (count[None, :] - count[:, None]) - (total[None, :] - total[:, None])
    cost[np.tril_indices(sizes.size + 1)] = np.inf  # cost[a, b] only for a < b
    best = np.full(sizes.size + 1, np.inf)
    best[0] = 0.0
    previous = []  # per number of sizes: the best a for each b
    for _ in range(min(max_buckets, sizes.size)):
        covers = best[:, None] + cost
        previous.append(np.argmin(covers, axis=0))
        best = np.minimum(covers.min(axis=0), np.where(np.arange(best.size) == 0, 0.0, np.inf))
    chosen, b = [], sizes.size
    for before in reversed(previous):
        if b == 0:
            break
        chosen.append(int(sizes[b - 1]))
        b = int(before[b])
    return sorted(chosen)


def _grouped_by_bucket(data: tf.data.Dataset, lengths: Callable, sizes: list[int],
                       group_size: int) -> tf.data.Dataset:
    """Returns ``data``'s serialized lists as ``(length, serialized)``, reordered so that each run of
    ``group_size`` lists shares a bucket (the smallest of ``sizes`` ≥ the length; lists longer than
    every size share one more).

    Lists keep their order within a bucket; a bucket's lists leave as soon as ``group_size`` have
    come. What is left in the buckets when ``data`` ends follows, bucket by bucket, so only the
    very last run is shorter: the element count and the ``group_size`` runs' boundaries are those of
    ``data``.
    """
    boundaries = tf.constant(sizes, tf.int64)

    def bucket(length, serialized):
        del serialized
        return tf.searchsorted(boundaries, tf.reshape(length, [1]), out_type=tf.int64)[0]

    with_lengths = data.batch(_LENGTH_BATCH).map(lambda s: (lengths(s), s)).unbatch()
    return with_lengths.group_by_window(
        bucket, lambda _, window: window.batch(group_size), window_size=group_size).unbatch()


def _bucket_padding(lengths: tf.Tensor, sizes: list[int], batch_size: int) -> tf.Tensor:
    """Returns the size a batch of lists of ``lengths`` is padded to: the smallest of ``sizes`` ≥
    its longest list (that list's length beyond every size). A batch of fewer than ``batch_size``
    lists (an epoch's last) takes the largest, so it adds one shape rather than one per size."""
    longest = tf.reduce_max(lengths)
    sizes = tf.constant(sizes, tf.int64)
    fitting = tf.concat([sizes, tf.reshape(longest, [1])], axis=0)
    size = tf.gather(fitting, tf.searchsorted(sizes, tf.reshape(longest, [1]))[0])
    return tf.where(tf.size(lengths) < batch_size, tf.maximum(sizes[-1], longest), size)


# --------------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------------
def ranking_dataset(
    file_pattern,
    batch_size: int,
    list_size: int | None = None,
    shuffle: bool = True,
    seed: int | None = None,
    *,
    num_features: int | None = None,
    repeat: bool = False,
    drop_remainder: bool = False,
    shuffle_buffer_size: int = 1024,
    random_subset: bool | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
    deterministic: bool | None = None,
    cycle_length: int = 4,
    verify: bool | None = None,
    list_buckets: int | list[int] | None = None,
    bucket_batch_size: int | None = None,
    feature_spec=None,
    context_feature_spec: dict | None = None,
    example_feature_spec: dict | None = None,
    label_spec: tuple | None = None,
    mask_feature_name: str = MASK_FEATURE_NAME,
    data_format: str | None = None,
) -> tf.data.Dataset:
    """Returns a ``tf.data.Dataset`` of ``({"features" [B,L,F], "mask" [B,L]}, labels [B,L])``, or
    with a feature spec, of ``(features by name, labels [B,L])``.

    Args:
      file_pattern: TFRecord files written by ``python -m tfapprox.data convert`` (or any ELWC /
        SequenceExample lists): a glob, a directory of ``*.tfrecord`` shards, a file, or a list of
        those. LETOR/SVMlight text files (plain or gzip) are accepted too: they are read into memory
        and encoded on the fly -- the same batches without a conversion step, for small data.
      batch_size: lists per batch.
      list_size: ``None`` pads each batch to its longest list; an int truncates longer lists and pads
        every list to exactly ``list_size`` (static shape).
      shuffle: shuffle the file order and the lists (through a ``shuffle_buffer_size`` buffer) anew
        each epoch.
      seed: makes shuffling and random truncation repeatable; with a seed (or without shuffling) the
        element order is deterministic, the same on every iteration of the dataset (with
        ``repeat``, each pass is shuffled anew). For a dataset per seed (per epoch), see
        :func:`ranking_dataset_by_seed`.
      num_features: F; taken from the files when None (they must agree).
      repeat: repeat indefinitely.
      random_subset: truncate to a uniformly random subset of each longer list (relevant documents are
        not preferred), drawn anew per batch; otherwise keep each list's head. Defaults to ``shuffle``
        (training); evaluation keeps heads.
      num_shards, shard_index: for multi-worker training, read only every ``num_shards``-th file
        starting at ``shard_index`` (needs at least ``num_shards`` files; for text input, every
        ``num_shards``-th list).
      deterministic: element order independent of thread timing; defaults to ``seed is not None or
        not shuffle``.
      cycle_length: shards read concurrently.
      verify: read every record once up front (CRC checks), so a truncated or corrupt shard raises
        ``shards.RecordError`` naming it instead of a ``DataLossError`` mid-training that names
        no file. ``None``: when the files total at most 256 MB. A file's size is always checked
        against its ``spec.json``.
      list_buckets: with ``list_size=None``, group lists by length and pad each batch to the
        smallest of a few sizes that holds its longest list, instead of to that list's length: a
        list of sizes, or an int, the most sizes to choose from the files' list lengths
        (:func:`bucket_sizes`, after one pass that reads them, :func:`list_lengths`). A batch of
        fewer than ``batch_size`` lists is padded to the largest size; lists longer than every size
        get batches of their own, padded to their longest. Lists wait in their bucket until
        ``bucket_batch_size`` have come, so a bucket's lists stay in shuffled order, and the number
        of batches is the same as without buckets.
      bucket_batch_size: lists grouped together (default ``batch_size``); a multiple of
        ``batch_size``. Under a distribution strategy, the global batch size: the replicas' batches
        of one step then together hold the lists that one replica's batch would.
      feature_spec: a :class:`~tfapprox.data.feature_spec.FeatureSpec` or its file: read records
        with named features (docs/data.md, "Feature specs") instead of the vector layouts.
      context_feature_spec, example_feature_spec, label_spec: TF-Ranking's specs, as its
        ``build_ranking_dataset`` and ``SimpleDatasetBuilder`` take them (``{name:
        tf.io.FixedLenFeature | VarLenFeature | RaggedFeature}`` and ``(name, FixedLenFeature([1],
        ...))``), instead of ``feature_spec``. The dataset then yields ``(features, labels)``:
        context features ``[B, ...]``, document features ``[B, L, ...]`` (dense, sparse or ragged
        per their spec), ``features[mask_feature_name]`` bool ``[B, L]``, labels float32 ``[B, L]``
        with -1 on padded slots (:mod:`tfapprox.data.named_records`). The files are checked against
        the spec first (each file's first lists, or all of them when ``verify``).
      data_format: ``"elwc"`` or ``"sequence_example"`` for those records; detected when None.

    Raises:
      FileNotFoundError: nothing matches ``file_pattern``.
      shards.RecordError: a corrupt first record, or shards that disagree on the feature count; with
        a spec, records that disagree with it (naming the file and the feature).
      letor.LetorFormatError: malformed LETOR text.
    """
    arguments = dict(locals())  # the arguments above, all of which but seed the builder takes
    del arguments["seed"]
    return ranking_dataset_by_seed(**arguments)(seed)


def ranking_dataset_by_seed(
    file_pattern, batch_size: int, list_size: int | None = None, shuffle: bool = True, *,
    num_features=None, repeat=False, drop_remainder=False, shuffle_buffer_size=1024,
    random_subset=None, num_shards=1, shard_index=0, deterministic=None, cycle_length=4,
    verify=None, list_buckets=None, bucket_batch_size=None, feature_spec=None,
    context_feature_spec=None, example_feature_spec=None, label_spec=None,
    mask_feature_name=MASK_FEATURE_NAME, data_format=None,
) -> Callable[[int | None], tf.data.Dataset]:
    """Returns ``dataset(seed)``, :func:`ranking_dataset` of these arguments (the same, but
    ``seed``) and ``seed``, for datasets that differ only by their seed (a trainer's epochs).

    The files are found, described and checked here, once, and the pipeline's map functions are
    traced on the first call; later calls build only the seeded shuffles and reuse the rest.
    """
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    if list_size is not None and (not isinstance(list_size, (int, np.integer)) or list_size < 1):
        raise ValueError(f"list_size must be None or a positive integer; got {list_size!r}")
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index must be in [0, num_shards={num_shards}); got {shard_index!r}")
    bucket_batch_size = batch_size if bucket_batch_size is None else bucket_batch_size
    if list_buckets is not None and list_size is not None:
        raise ValueError(f"list_buckets pads whole lists; it cannot go with list_size={list_size}")
    if bucket_batch_size < 1 or bucket_batch_size % batch_size:
        raise ValueError(f"bucket_batch_size must be a positive multiple of batch_size={batch_size}; "
                         f"got {bucket_batch_size!r}")
    named = named_records.resolve_spec(feature_spec, context_feature_spec, example_feature_spec,
                                       label_spec, mask_feature_name, data_format)
    if named is None:
        info = describe(file_pattern, num_features)
        lengths_of = _lengths_reader(info.record_format)
    else:
        if num_features is not None:
            raise ValueError("num_features goes with the vector layouts; a feature spec names "
                             "the features")
        info = _describe_named(file_pattern, named, num_shards, shard_index, verify)
        lengths_of = named_records.lengths_reader(named, info.record_format)
    if isinstance(list_buckets, (int, np.integer)):
        list_buckets = bucket_sizes(_read_lengths(info.files, lengths_of), list_buckets)
    elif list_buckets is not None and (not list_buckets or list_buckets[0] < 1
                                       or list(list_buckets) != sorted(set(list_buckets))):
        raise ValueError(f"list_buckets must be increasing positive sizes; got {list_buckets!r}")
    if info.kind == "letor":
        lists = tf.constant([
            records.encode_elwc(q.features, q.labels, q.qid)
            for q in letor.read_queries(info.files, info.num_features)
        ], dtype=tf.string)
    else:
        files = info.files
        if num_shards > 1:
            if len(files) < num_shards:
                raise ValueError(
                    f"cannot shard {len(files)} files over num_shards={num_shards} workers; "
                    f"convert with --shards {num_shards} or more"
                )
            files = files[shard_index::num_shards]
        if verify is None:
            verify = sum(f.stat().st_size for f in files) <= _VERIFY_BYTES
        for path in files if named is None else ():  # named records: checked by the spec
            if verify:
                shards.verify_file(path)
            else:
                shards.check_size(path)
        files = [str(f) for f in files]
    if random_subset is None:
        random_subset = shuffle

    @tf.function
    def batches(data: tf.data.Dataset, subset_seed: tf.Tensor | None,
                ordered: bool) -> tf.data.Dataset:
        """Returns the batches of the (shuffled) serialized lists `data`, in order if `ordered`:
        traced once per kind of `data`, then reused."""
        if repeat:
            data = data.repeat()
        if list_buckets:
            data = _grouped_by_bucket(data, lengths_of, list(list_buckets), bucket_batch_size)
        data = data.batch(batch_size, drop_remainder=drop_remainder)
        if named is None:
            read = _vector_reader(info, list_size, subset_seed)
        else:
            read = named_records.batch_reader(named, info.record_format, list_size, subset_seed)

        def to_model_inputs(batch_index, batch):
            lengths, serialized = batch if list_buckets else (None, batch)
            size = None
            if list_buckets:
                size = tf.cast(_bucket_padding(lengths, list(list_buckets), batch_size), tf.int32)
            return read(serialized, batch_index, size)

        data = data.enumerate().map(
            to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered
        )
        return data.prefetch(tf.data.AUTOTUNE)

    def dataset(seed: int | None) -> tf.data.Dataset:
        ordered = deterministic if deterministic is not None else seed is not None or not shuffle
        # A seeded dataset gives the same order on every iteration (Keras may read the first
        # batches of an epoch's dataset, then iterate it again from the start: on JAX, the first
        # fit of a process does); repeated passes of one iteration are shuffled anew.
        reshuffle = seed is None or repeat
        if seed is None and (shuffle or random_subset):
            seed_for_subset = int(np.random.default_rng().integers(2**31))
        else:
            seed_for_subset = seed if seed is not None else 0
        if info.kind == "letor":
            data = tf.data.Dataset.from_tensor_slices(lists)
            if num_shards > 1:
                data = data.shard(num_shards, shard_index)
        else:
            file_data = tf.data.Dataset.from_tensor_slices(files)
            if shuffle:
                file_data = file_data.shuffle(len(files), seed=seed,
                                             reshuffle_each_iteration=reshuffle)
            data = file_data.interleave(
                lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20),
                cycle_length=max(1, min(cycle_length, len(files))),
                block_length=1,
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=ordered,
            )
        if shuffle:
            data = data.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=reshuffle)
        subset_seed = tf.constant(seed_for_subset, tf.int64) if random_subset else None
        return batches(data, subset_seed, ordered)

    return dataset


SPLIT_NAMES = {"train": "training", "vali": "validation", "test": "test"}


class NoRelevantDocument(ValueError):
    """A training split in which no document is relevant: there is nothing to learn."""


def check_relevant_documents(splits: dict, *, sources: dict | None = None,
                             num_features: int | None = None, warn: Callable[[str], None] = print
                             ) -> None:
    """Refuses a training split, and warns of a validation or test split, without a relevant document.

    With none, every ranking metric of the split is 0: training has nothing to learn, and model
    selection on such a validation split would pick epoch 1 whatever happened. ``splits``:
    ``{"train" | "vali" | "test": files}``, records or LETOR text as :func:`ranking_dataset` reads
    them; ``sources``: the files to name for each split (default: ``splits``'); ``warn`` gets the
    warnings. Raises :class:`NoRelevantDocument` for a training split.
    """
    for split, files in splits.items():
        files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
        if _has_relevant_document(files, num_features):
            continue
        named = (sources or {}).get(split, files)
        problem = (f"the {SPLIT_NAMES[split]} split ({', '.join(map(str, named))}) has no relevant "
                   "document (no label above 0)")
        if split == "train":
            raise NoRelevantDocument(f"{problem}: there is nothing to learn")
        warn(f"Warning: {problem}: every {SPLIT_NAMES[split]} metric will be 0"
             + (", and model selection and early stopping have nothing to go on"
                if split == "vali" else ""))


def _has_relevant_document(files: list, num_features: int | None) -> bool:
    """Reads the answer from converted sets' spec.json label range, or else from the labels."""
    return _any_list(files, num_features, lambda spec: (spec.get("label_max") or 0) > 0,
                     lambda inputs, labels: tf.reduce_any(labels > 0))


def has_missing_values(files: list, num_features: int | None = None) -> bool:
    """Whether a document of ``files`` (TFRecord lists) misses a feature value (NaN): from
    converted sets' spec.json (``missing_values``), or else from the features (one pass)."""
    return _any_list(files, num_features, lambda spec: any(spec.get("missing_values") or []),
                     lambda inputs, labels: tf.reduce_any(tf.math.is_nan(inputs["features"])))


def _any_list(files: list, num_features: int | None, in_spec: Callable[[dict], bool],
              in_batch: Callable) -> bool:
    """Whether ``in_spec`` holds for a directory's spec.json, where every directory of ``files``
    has one, else whether ``in_batch(inputs, labels)`` holds for a batch of the lists."""
    specs = [shards.read_spec(directory) for directory in {Path(f).parent for f in files}]
    if all(spec is not None for spec in specs):
        return any(in_spec(spec) for spec in specs)
    dataset = ranking_dataset([str(f) for f in files], 64, None, shuffle=False,
                              num_features=num_features)
    return bool(dataset.reduce(tf.constant(False),
                               lambda found, batch: found | in_batch(*batch)))
