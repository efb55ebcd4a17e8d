"""Ranking data: LETOR/SVMlight text, TFRecord lists (ELWC), and the tf.data pipeline.

Text -> records -> dataset: :func:`read_queries` streams LETOR text query by query, :func:`convert`
writes sharded TFRecords plus ``spec.json`` (also ``python -m tfapprox.data convert``),
:func:`ranking_dataset` yields padded batches ``({"features", "mask"}, labels)`` from those records or
straight from text, and :func:`parse_elwc` is the graph-only parser shared with serving.

Records with named features (TF-Ranking's data): :class:`FeatureSpec` says what they hold (inferred
by :func:`infer_spec`, also ``python -m tfapprox.data spec``), ``ranking_dataset(...,
feature_spec=)`` or ``ranking_dataset(..., example_feature_spec=, label_spec=)`` reads them by name,
and :func:`write_named_records` writes them.

Modules import one way: ``letor`` (text: ``letor_tokens``, the format's specification, under
``letor_files`` (sources), ``letor_fast`` (vectorised parsing) and ``letor_blocks`` (parsing, in
worker processes for large inputs)) -> ``records`` (protos) -> ``shards`` (a converted set on
disk: ``spec.json``, shard names, file checks) -> ``converter`` (writes) / ``dataset`` (reads);
``folds`` finds the split files of a fold layout. ``feature_spec`` -> ``named_records`` (parsing and
writing by name) -> ``dataset`` -> ``spec_inference``.
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
from tfapprox.data.feature_spec import Feature, FeatureSpec, FeatureSpecError
from tfapprox.data.folds import find_folds, find_split_files
from tfapprox.data.letor import LetorFormatError, Query, read_queries
from tfapprox.data.records import encode_elwc, encode_examples, parse_elwc, parse_examples
from tfapprox.data.named_records import encode_named_list, write_named_records
from tfapprox.data.shards import RecordError, read_spec
from tfapprox.data.spec_inference import infer_spec
from tfapprox.data.synthetic import write_letor, write_named, write_splits

__all__ = [
    "DatasetInfo",
    "Feature",
    "FeatureSpec",
    "FeatureSpecError",
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
    "encode_named_list",
    "find_folds",
    "find_split_files",
    "infer_spec",
    "parse_elwc",
    "parse_examples",
    "ranking_dataset",
    "ranking_dataset_by_seed",
    "read_queries",
    "read_spec",
    "write_letor",
    "write_named",
    "write_named_records",
    "write_splits",
]
