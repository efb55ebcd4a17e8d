"""Where a run's lists come from: LETOR folds, TFRecords, or generated demo data, as tf.data.

`resolve` turns the `data` section of the config into `Splits`: TFRecord files per split plus the
feature count and the number of training lists. A split's files are the ones named for it
(`data.train`, `data.vali`, `data.test`), else the data directory's (`data.dir`), else the generated
demo set's: a file named explicitly always wins for its split. Every split must have the training
split's feature count, unless `data.num_features` says how wide sparse files are.

LETOR text is converted once into `<cache_dir>/records/<key>/` (key: the source files' paths, sizes
and mtimes), so each epoch's dataset is cheap to build; with no data given,
`<cache_dir>/demo-<key>/{train,vali,test}.txt` is generated first by `tfapprox.data.write_splits`.
Cache entries are written to a temporary directory and renamed into place, so concurrent workers and
killed runs never see half of one; a killed process's temporary directory is removed by the next.

Training batches for epoch e are shuffled with a seed drawn from `(seed, e)`: a resumed run sees the
same order as an uninterrupted one. Whole training lists are grouped by length and padded to one
of a few sizes chosen once from the training lists' lengths (`data.buckets`, `data.bucket_sizes`),
in groups of the global batch size, so the number of batches is what it would be without buckets.
Under a multi-worker strategy every worker builds the same sequence of per-replica batches and keeps
every n-th: together the workers see exactly the global batches a single worker would.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfapprox.data.dataset import (  # noqa: F401 - SPLIT_NAMES and NoRelevantDocument: trainer.data's
    SPLIT_NAMES, NoRelevantDocument, check_relevant_documents, has_missing_values)
from tfapprox.files import remove_abandoned
from trainer import named_data
from trainer.config import DataConfig

EVAL_BATCH_SIZE = 64
SHUFFLE_BUFFER_LISTS = 4096  # a full shuffle up to this many training lists, a windowed one beyond

# The demo set: 40 features, graded labels 0..4, about 40 documents per query. Sized so that
# `python -m trainer` trains for a minute or two on a laptop CPU.
DEMO_DATA = {"num_queries": 4000, "docs_per_query": 40, "num_features": 40, "noise": 0.5, "seed": 0}

# LETOR sets kept as their five parts; fold k trains on parts k, k+1, k+2, validates on k+3 and tests
# on k+4 (mod 5), as in the original distributions (see ../shared/data/README.md).
_PART = re.compile(r"^S([1-5])\.txt(\.gz)?$", re.IGNORECASE)

Printer = Callable[[str], None]

SPLITS = ("train", "vali", "test")


@dataclasses.dataclass
class Splits:
    """TFRecord files of each split, ready for `tfapprox.data.ranking_dataset`."""

    train: list[str]
    vali: list[str]
    test: list[str] | None
    num_features: int
    num_train_lists: int
    fingerprints: dict[str, list] = dataclasses.field(default_factory=dict)  # split -> fingerprint
    train_buckets: list[int] | None = None  # pad sizes of whole training lists (None: no buckets)
    feature_spec: Any = None  # records with named features: their FeatureSpec (num_features None)
    missing_values: bool = False  # whether a training document misses a feature value (NaN)
    # a model whose documents attend to each other: most document pairs (lists × L²) one
    # evaluation batch may hold (None: unbounded); set by build.bound_evaluation
    eval_max_pairs: int | None = None


def resolve(config: DataConfig, print_fn: Printer = print) -> Splits:
    """Returns the `Splits` of `config`, generating and converting into the cache as needed."""
    cache = Path(config.cache_dir)
    sources = _sources(config, lambda: _demo_splits(cache, {**DEMO_DATA, **config.synthetic},
                                                    print_fn))
    print_fn("Data: " + " | ".join(f"{SPLIT_NAMES[split]} {', '.join(paths)}"
                                   for split, paths in sources.items()))
    if config.feature_spec is not None:
        return _named_splits(config, sources, print_fn)
    records = {split: _as_records(paths, config.num_features, cache, print_fn)
               for split, paths in sources.items()}
    num_features = config.num_features or _common_width(sources, records)
    check_relevant_documents(records, sources=sources, num_features=num_features, warn=print_fn)
    return Splits(
        train=records["train"],
        vali=records["vali"],
        test=records.get("test"),
        num_features=num_features,
        num_train_lists=_count_lists(records["train"], num_features),
        fingerprints={split: fingerprint(paths) for split, paths in sources.items()},
        train_buckets=_train_buckets(config, records["train"], num_features, print_fn),
        missing_values=has_missing_values(records["train"], num_features),
    )


def _named_splits(config: DataConfig, sources: dict[str, list[str]], print_fn: Printer) -> Splits:
    """Returns the `Splits` of records with named features (`config.feature_spec`), read where
    they are (trainer.named_data), each split checked against the spec."""
    spec = named_data.load_spec(config.feature_spec)
    files = {split: [str(f) for f in _expand(paths)] for split, paths in sources.items()}
    lists = named_data.check_records(spec, files, print_fn)
    buckets = None
    if config.list_size is None and (config.buckets or config.bucket_sizes):
        buckets = config.bucket_sizes or named_data.bucket_sizes(files["train"], spec, config.buckets)
        print_fn(f"Training lists padded to {', '.join(map(str, buckets))} documents by length")
    return Splits(train=files["train"], vali=files["vali"], test=files.get("test"),
                  num_features=None, num_train_lists=lists["train"],
                  fingerprints={split: fingerprint(paths) for split, paths in sources.items()},
                  train_buckets=buckets, feature_spec=spec)


def _train_buckets(config: DataConfig, files: list[str], num_features: int,
                   print_fn: Printer) -> list[int] | None:
    """Returns the pad sizes of whole training lists: `config.bucket_sizes`, or at most
    `config.buckets` sizes that minimise the padding of the training lists (one pass over them to
    read their lengths); None with a `list_size` or without buckets."""
    from tfapprox.data.dataset import bucket_sizes, list_lengths

    if config.list_size is not None or not (config.buckets or config.bucket_sizes):
        return None
    sizes = config.bucket_sizes or bucket_sizes(list_lengths(files, num_features), config.buckets)
    print_fn(f"Training lists padded to {', '.join(map(str, sizes))} documents by length")
    return sizes


def check_sources(config: DataConfig) -> None:
    """Raises FileNotFoundError naming a data file, glob or directory that is missing.

    Nothing is read or converted: this runs before anything long does.
    """
    for patterns in _sources(config, lambda: {}).values():
        _expand(patterns)


def source_files(config: DataConfig) -> dict[str, list[Path]]:
    """Returns each split's files as `resolve` reads them, before any conversion; generates and
    converts nothing, so the demo set's files only once they exist. Raises FileNotFoundError
    naming a missing file, glob or directory."""
    sources = _sources(config, lambda: _demo_splits(
        Path(config.cache_dir), {**DEMO_DATA, **config.synthetic}, print_fn=None))
    return {split: _expand(paths) for split, paths in sources.items()}


def fingerprint(patterns: list[str]) -> list[list]:
    """Returns what identifies a split's data: each file's name, size and modification time.

    Paths are left out, so the same files named relatively or absolutely, or moved, are the same
    data; a file replaced in place is not.
    """
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in _expand(patterns)]


def describe_fingerprint(value: list[list]) -> str:
    """Returns a fingerprint as text: `name (N bytes, modified YYYY-mm-dd HH:MM:SS)`, ..."""
    return ", ".join(
        f"{name} ({size} bytes, modified "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(mtime_ns / 1e9))})"
        for name, size, mtime_ns in value)


def train_dataset(splits: Splits, batch_size: int, list_size: int | None, *,
                  seed: tuple[int, int], num_shards: int = 1, shard_index: int = 0,
                  global_batch_size: int | None = None) -> tf.data.Dataset:
    """Returns one epoch of shuffled training batches; `seed` is `(run seed, epoch)`.

    With `num_shards > 1` only batches `shard_index, shard_index + num_shards, ...` are kept.
    Whole lists (`list_size` None) are grouped by length in groups of `global_batch_size` lists
    (default `batch_size`) and padded to `splits.train_buckets`: consecutive batches of
    `batch_size` then make up the global batches that one replica would take. A run that trains
    epoch after epoch takes them from one `TrainingEpochs` instead, which builds the pipeline once.
    """
    run_seed, epoch = seed
    return TrainingEpochs(splits, list_size, seed=run_seed, global_batch_size=global_batch_size
                          ).dataset(epoch, batch_size, num_shards=num_shards,
                                    shard_index=shard_index)


class TrainingEpochs:
    """The training batches of each epoch of a run, from a pipeline prepared once.

    Epoch e's batches are shuffled with a seed drawn from `(seed, e)`. The files are described and
    checked, and the pipeline's map functions traced, on first use (per batch size and shard),
    not again each epoch (`tfapprox.data.ranking_dataset_by_seed`): the same batches in the same
    order, for less work per epoch (docs/benchmarks.md, "Per-epoch overhead of the trainer").
    """

    def __init__(self, splits: Splits, list_size: int | None, *, seed: int,
                 global_batch_size: int | None = None):
        self._splits, self._list_size, self._seed = splits, list_size, seed
        self._global_batch_size = global_batch_size
        self._pipelines: dict[tuple[int, int], Callable[[int], tf.data.Dataset]] = {}

    def dataset(self, epoch: int, batch_size: int, *, num_shards: int = 1,
                shard_index: int = 0) -> tf.data.Dataset:
        """Returns epoch `epoch`'s batches of `batch_size` lists (shard `shard_index` of
        `num_shards`; see `train_dataset`)."""
        from tfapprox.data import ranking_dataset_by_seed

        splits, list_size = self._splits, self._list_size
        if (batch_size, num_shards) not in self._pipelines:
            self._pipelines[batch_size, num_shards] = ranking_dataset_by_seed(
                splits.train, batch_size, list_size, shuffle=True,
                num_features=splits.num_features, feature_spec=splits.feature_spec,
                shuffle_buffer_size=min(max(splits.num_train_lists, 1), SHUFFLE_BUFFER_LISTS),
                list_buckets=splits.train_buckets if list_size is None else None,
                bucket_batch_size=self._global_batch_size,
            )
        epoch_seed = int(np.random.SeedSequence([self._seed, epoch]).generate_state(1)[0] >> 1)
        dataset = self._pipelines[batch_size, num_shards](epoch_seed)
        if splits.feature_spec is not None:
            dataset = named_data.looked_up(dataset, splits.feature_spec)
        num_batches = -(-splits.num_train_lists // batch_size)
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_batches))
        if num_shards > 1:
            dataset = dataset.shard(num_shards, shard_index)
        return dataset


def eval_dataset(paths: list[str], splits: Splits) -> tf.data.Dataset:
    """Returns whole lists of `paths` in file order, for exact metrics: `EVAL_BATCH_SIZE` lists
    a batch, fewer where `splits.eval_max_pairs` bounds a batch's document pairs (at least one;
    a list longer than the bound is refused in one line)."""
    from tfapprox.data import ranking_dataset

    batch_size = eval_batch_size(paths, splits)
    if splits.feature_spec is not None:
        return named_data.eval_dataset(paths, splits.feature_spec, batch_size)
    dataset = ranking_dataset(paths, batch_size, None, shuffle=False,
                              num_features=splits.num_features)
    num_batches = -(-_count_lists(paths, splits.num_features) // batch_size)
    return dataset.apply(tf.data.experimental.assert_cardinality(num_batches))


def eval_batch_size(paths: list[str], splits: Splits) -> int:
    """Returns the lists an evaluation batch of `paths` holds (see `eval_dataset`)."""
    if splits.eval_max_pairs is None:
        return EVAL_BATCH_SIZE
    from tfapprox.data.dataset import list_lengths

    lengths = (named_data.list_lengths(paths, splits.feature_spec)
               if splits.feature_spec is not None else list_lengths(paths, splits.num_features))
    longest = max(int(max(lengths, default=1)), 1)
    if longest * longest > splits.eval_max_pairs:
        raise ValueError(
            f"evaluation on {', '.join(paths)}: a list of {longest} documents is {longest}² = "
            f"{longest * longest} document pairs for the model's attention, above the bound of "
            f"{splits.eval_max_pairs} pairs: use a larger --max-pairs")
    return max(1, min(EVAL_BATCH_SIZE, splits.eval_max_pairs // (longest * longest)))


def padded_lists(paths: list[str], splits: Splits) -> tuple[list, list, list]:
    """Returns every list of `paths` in length buckets, each padded to its own longest list
    (`tfapprox.adarank.length_buckets`): features float32 [Q_b, L_b, F], labels float32
    [Q_b, L_b] (-1 on padding) and mask bool [Q_b, L_b], one array per bucket. For models fitted
    on a whole split at once (AdaRank)."""
    from tfapprox.adarank import length_buckets

    batches = list(eval_dataset(paths, splits).as_numpy_iterator())
    return length_buckets([inputs["features"] for inputs, _ in batches],
                          [labels for _, labels in batches],
                          [inputs["mask"] for inputs, _ in batches])


def letor_folds(directory: str | os.PathLike) -> dict[int, tuple[list[str], list[str], list[str]]]:
    """Returns `{fold: (train files, vali files, test files)}` of a LETOR set directory.

    The directory holds either `Fold1..Fold5/` with train/vali/test files, or the five parts
    `S1.txt..S5.txt` from which the standard folds are assembled.
    """
    from tfapprox.data import find_folds

    directory = Path(directory)
    parts = {}
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        match = _PART.match(path.name)
        if match:
            parts[int(match.group(1))] = str(path)
    if len(parts) == 5:
        def part(k: int) -> str:
            return parts[(k - 1) % 5 + 1]

        return {k: ([part(k), part(k + 1), part(k + 2)], [part(k + 3)], [part(k + 4)])
                for k in range(1, 6)}
    try:
        folds = find_folds(directory)
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{directory}: expected S1.txt..S5.txt or Fold1..Fold5/ directories ({err})"
        ) from None
    return {int(name[4:]): ([str(s["train"])], [str(s["vali"])], [str(s["test"])])
            for name, s in folds.items()}


# --------------------------------------------------------------------------------------------------


def _sources(config: DataConfig, demo: Callable[[], dict[str, Path]]) -> dict[str, list[str]]:
    """Returns each split's files or globs: those named for it, else the data directory's, else
    `demo()`'s (called only when needed). Splits with none are left out; test is optional."""
    named = {split: getattr(config, split) for split in SPLITS if getattr(config, split)}
    missing = [split for split in ("train", "vali") if split not in named]
    if config.dir is not None:
        found = _split_files(config.dir, needed=missing)
    else:
        found = demo() if missing else {}
    return {split: named.get(split) or [str(found[split])]
            for split in SPLITS if split in named or split in found}


def _split_files(directory: str, needed: list[str]) -> dict[str, Path]:
    """Returns the split files of a LETOR fold directory, which must hold the `needed` splits."""
    from tfapprox.data import find_split_files

    if not Path(directory).is_dir():
        raise FileNotFoundError(f"data directory {directory} does not exist")
    found = find_split_files(directory)
    if any(split not in found for split in needed):
        raise FileNotFoundError(
            f"{directory}: expected {' and '.join(needed)} files (train.txt and vali.txt, or "
            "trainingset.txt and validationset.txt, in any case, optionally .gz); found "
            f"{sorted(p.name for p in found.values())}"
        )
    return found


def _common_width(sources: dict[str, list[str]], records: dict[str, list[str]]) -> int:
    """Returns the feature count the splits share; raises ValueError naming the files if not one."""
    from tfapprox.data import describe

    widths = {split: describe(files).num_features for split, files in records.items()}
    if len(set(widths.values())) > 1:
        described = "; ".join(f"{SPLIT_NAMES[split]} ({', '.join(sources[split])}) {width}"
                              for split, width in widths.items())
        raise ValueError(
            f"the splits have different feature counts: {described}. Give data of one feature set, "
            "or, for sparse files that leave out zero features, the width with --num-features")
    return widths["train"]


def _demo_splits(cache: Path, params: dict[str, Any],
                 print_fn: Printer | None) -> dict[str, Path]:
    """Returns the demo set's split files, generated first if missing; with `print_fn` None only
    if they exist (none otherwise)."""
    from tfapprox.data import write_splits

    target = cache / f"demo-{_key(params)}"
    if not target.exists():
        if print_fn is None:
            return {}
        print_fn(f"Generating demo data in {target} ({params['num_queries']} queries)")
        _publish(target, lambda tmp: write_splits(tmp, **params))
    return {split: target / f"{split}.txt" for split in ("train", "vali", "test")}


def _as_records(patterns: list[str], num_features: int | None, cache: Path,
                print_fn: Printer) -> list[str]:
    """Returns TFRecord files for `patterns`, converting LETOR text into the cache once.

    The cache entry is keyed by the text files' paths, sizes and mtimes (and those of the group
    files beside them, `<file>.query` / `<file>.group`, for LightGBM-style files without qid:) and
    `num_features` (None: the largest feature index in the files).
    """
    from tfapprox.data import convert
    from tfapprox.data.dataset import inspect_file
    from tfapprox.data.letor import GROUP_SUFFIXES

    files = _expand(patterns)
    if inspect_file(files[0]).kind != "letor":
        return [str(f) for f in files]
    beside = [f.with_name(f.name + suffix) for f in files for suffix in GROUP_SUFFIXES]
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns)
             for f in files + [g for g in beside if g.is_file()]]
    target = cache / "records" / _key({"files": stats, "num_features": num_features})
    if not target.exists():
        names = ", ".join(f.name for f in files)
        print_fn(f"Converting {names} to TFRecords in {target}")
        _publish(target, lambda tmp: convert(files, tmp, num_features=num_features))
    return [str(p) for p in sorted(target.glob("*.tfrecord"))]


def _expand(patterns: list[str]) -> list[Path]:
    """Returns the files named by `patterns`: files, globs, or directories of *.tfrecord shards."""
    files = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            matched = sorted(Path(pattern).glob("*.tfrecord"))
        else:
            matched = [Path(m) for m in sorted(glob.glob(pattern)) if os.path.isfile(m)]
        if not matched:
            raise FileNotFoundError(f"no data files match {pattern!r}")
        files.extend(matched)
    return files


def _count_lists(files: list[str], num_features: int) -> int:
    from tfapprox.data import describe

    counted = describe(files, num_features).num_lists
    if counted is None:
        counted = int(tf.data.TFRecordDataset(files).reduce(np.int64(0), lambda n, _: n + 1))
    return counted


def _publish(target: Path, write: Callable[[Path], Any]) -> None:
    """Runs `write(tmp)` into a fresh temporary directory, then renames it to `target`.

    If another process published `target` first, its copy is kept and ours discarded. Temporary
    directories of processes that no longer run (killed mid-conversion) are removed first.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(target.parent, _TMP_NAME)  # a cache shared between hosts keeps the others'
    tmp = target.with_name(f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        os.rename(tmp, target)
    except OSError:
        if not target.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# A cache entry's temporary directory names its writer: .<entry>.tmp-<host>-<pid>.
_TMP_NAME = re.compile(r"\..+\.tmp-(?P<host>.+)-(?P<pid>\d+)")


def _key(values: Any) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]
