"""Records with named features as a run's data: `data.feature_spec` and the ELWC or SequenceExample
TFRecords of `data.train`, `data.vali` and `data.test` (files, globs or directories).

The records are read where they are, by `tfapprox.data.ranking_dataset(feature_spec=...)`: no
conversion, no cache. Each split is checked against the spec before anything is built (a feature
of another dtype or length, a feature no record holds, SequenceExamples where the spec says ELWC:
one line naming the file and the feature). A spec with categorical features (strings, int64 with a
vocabulary) has its `FeatureLookup` mapped over the datasets, so the model after it
(`tfapprox.named_inputs.NamedFeatureScorer` without a lookup) compiles under XLA (`--jit`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from tfapprox.data.feature_spec import FeatureSpec

Printer = Callable[[str], None]

# Token lists are padded up to a multiple of this, so that a compiled step (--jit) sees few shapes.
TOKEN_MULTIPLE = 16


@functools.lru_cache(maxsize=8)
def _load(path: str, modified_ns: int) -> FeatureSpec:
    return FeatureSpec.load(path)


def load_spec(path: str) -> FeatureSpec:
    """Returns the spec of the file `path` (read again when the file changed); FeatureSpecError
    names the file and the key."""
    try:
        modified_ns = Path(path).stat().st_mtime_ns
    except FileNotFoundError:
        raise FileNotFoundError(f"data.feature_spec: no such spec file {path}") from None
    return _load(str(path), modified_ns)


def build_scorer(path: str, preset: str, **kwargs):
    """Returns the scorer of `preset` over the features of the spec file `path`, built, taking
    what `lookup(spec)` gives (`tfapprox.named_inputs.build_named_scorer`)."""
    from tfapprox.named_inputs import build_named_scorer

    model = build_named_scorer(load_spec(path), preset, **kwargs)
    model.build()
    return model


def lookup(spec: FeatureSpec):
    """Returns the `FeatureLookup` of `spec`'s categorical features (None when it has none): one per
    spec and spec directory (where its vocabularies are) in a process, its vocabularies read once."""
    return _lookup(spec, spec.base_dir)


@functools.lru_cache(maxsize=8)
def _lookup(spec: FeatureSpec, base_dir: str | None):
    from tfapprox.named_inputs import FeatureLookup

    if not any(f.categorical for f in spec.context + spec.document):
        return None
    return FeatureLookup(spec, token_multiple=TOKEN_MULTIPLE, name="feature_lookup")


def looked_up(dataset: tf.data.Dataset, spec: FeatureSpec) -> tf.data.Dataset:
    """Returns `dataset` with its categorical features as vocabulary ids (`lookup(spec)`)."""
    layer = lookup(spec)
    if layer is None:
        return dataset
    return dataset.map(lambda features, labels: (layer(features), labels),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def eval_dataset(paths: list[str], spec: FeatureSpec, batch_size: int) -> tf.data.Dataset:
    """Returns whole lists of `paths` in file order, as the model takes them."""
    from tfapprox.data import ranking_dataset

    dataset = ranking_dataset(paths, batch_size, None, shuffle=False, feature_spec=spec)
    num_batches = -(-len(list_lengths(paths, spec)) // batch_size)
    return looked_up(dataset.apply(tf.data.experimental.assert_cardinality(num_batches)), spec)


def check_records(spec: FeatureSpec, files: dict[str, list[str]], print_fn: Printer) -> dict[str, int]:
    """Reads every list of each split's `files` against `spec`; returns `{split: lists}`. Raises
    `RecordError` naming the file and the feature; prints how many documents lack a label."""
    from tfapprox.data import named_records

    named = named_records.resolve_spec(feature_spec=spec)
    counts = {}
    for split, paths in files.items():
        paths = [Path(p) for p in paths]
        record_format = named_records.record_format_of(paths, named)
        result = named_records.scan(paths, named, record_format)
        warning = named_records.label_warning(result, named, paths)
        if warning:
            print_fn(f"Warning: {warning}")
        counts[split] = result.lists
    return counts


@functools.lru_cache(maxsize=4)
def _lengths(files: tuple[str, ...], spec: FeatureSpec) -> np.ndarray:
    from tfapprox.data import named_records

    named = named_records.resolve_spec(feature_spec=spec)
    reader = named_records.lengths_reader(
        named, named_records.record_format_of([Path(f) for f in files], named))
    counted = tf.data.TFRecordDataset(list(files)).batch(1024).map(reader)
    return np.concatenate([np.zeros([0], np.int64), *counted.as_numpy_iterator()])


def list_lengths(files: list[str], spec: FeatureSpec) -> np.ndarray:
    """Returns the document count of every list of `files`, in file order (one pass, once)."""
    return _lengths(tuple(files), spec)


def bucket_sizes(files: list[str], spec: FeatureSpec, max_buckets: int) -> list[int]:
    """Returns at most `max_buckets` pad sizes for the lists of `files`
    (`tfapprox.data.bucket_sizes`)."""
    from tfapprox.data.dataset import bucket_sizes as sizes_of

    return sizes_of(list_lengths(files, spec), max_buckets)
