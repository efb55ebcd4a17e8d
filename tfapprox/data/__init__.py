"""Ranking data: LETOR/SVMlight text, TFRecord lists (ELWC), and the tf.data pipeline.

Text -> records -> dataset: :func:`read_queries` streams LETOR text query by query, :func:`convert`
writes sharded TFRecords plus ``spec.json`` (also ``python -m tfapprox.data convert``),
:func:`ranking_dataset` yields padded batches ``({"features", "mask"}, labels)`` from those records or
straight from text, and :func:`parse_elwc` is the graph-only parser shared with serving.

Modules import one way: ``letor`` (text) -> ``records`` (protos) -> ``shards`` (a converted set on
disk: ``spec.json``, shard names, file checks) -> ``converter`` (writes) / ``dataset`` (reads);
``folds`` finds the split files of a fold layout.
"""

from tfapprox.data.converter import convert, convert_tree
from tfapprox.data.dataset import (
    DatasetInfo,
    NoRelevantDocument,
    check_records,
    check_relevant_documents,
    describe,
    ranking_dataset,
    ranking_dataset_by_seed,
)
from tfapprox.data.folds import find_folds, find_split_files
from tfapprox.data.letor import LetorFormatError, Query, read_queries
from tfapprox.data.records import encode_elwc, encode_examples, parse_elwc, parse_examples
from tfapprox.data.shards import RecordError, read_spec
from tfapprox.data.synthetic import write_letor, write_splits

__all__ = [
    "DatasetInfo",
    "LetorFormatError",
    "NoRelevantDocument",
    "Query",
    "RecordError",
    "check_records",
    "check_relevant_documents",
    "convert",
    "convert_tree",
    "describe",
    "encode_elwc",
    "encode_examples",
    "find_folds",
    "find_split_files",
    "parse_elwc",
    "parse_examples",
    "ranking_dataset",
    "ranking_dataset_by_seed",
    "read_queries",
    "read_spec",
    "write_letor",
    "write_splits",
]
