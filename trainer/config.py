"""The trainer's configuration: nested dataclasses, named presets, files, and dotted overrides.

A run is described by one `Config`. It is built in three layers, later ones winning:
a named preset (`demo` unless told otherwise) or a YAML/JSON file, then command-line flags. Flags and
the cross-validation grid both arrive as dotted keys (`loss.params.alpha=10`), so there is one
override mechanism, `apply_overrides`.

Files and flag values are read as users write them: `1e-3` is a number (PyYAML follows YAML 1.1,
which reads it as a string), and a key given twice in one mapping is an error, as a repeated flag is.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, get_type_hints

import yaml

OPTIMIZERS = ("adagrad", "adam")
STRATEGIES = ("default", "mirrored", "multi_worker")
BACKENDS = ("tensorflow", "jax")
MODEL_KINDS = ("dnn", "adarank")


@dataclasses.dataclass
class DataConfig:
    """Where the lists come from. With no `dir`/`train` the package generates `synthetic` data."""

    dir: str | None = None  # a LETOR fold directory: train.txt, vali.txt, test.txt
    # Files or globs, LETOR text (*.txt) or ELWC TFRecords; each, when given, replaces dir's file.
    train: list[str] | None = None
    vali: list[str] | None = None
    test: list[str] | None = None
    num_features: int | None = None  # required for TFRecords; read from LETOR text otherwise
    # A feature spec file (`python -m tfapprox.data spec`): train/vali/test are then TFRecords of
    # ELWC or SequenceExample lists with named features, read by it (trainer.named_data).
    feature_spec: str | None = None
    list_size: int | None = None  # training lists cut/padded to this (None: whole lists, see buckets)
    # Whole training lists are grouped by length and each batch padded to the smallest of at most
    # `buckets` sizes chosen from the training lists' lengths (so XLA compiles at most buckets + 1
    # shapes); 0 pads each batch to its longest list. `bucket_sizes` gives the sizes instead.
    buckets: int = 8
    bucket_sizes: list[int] | None = None
    cache_dir: str = "runs/data"  # generated data and LETOR→TFRecord conversions live here
    synthetic: dict[str, Any] = dataclasses.field(default_factory=dict)  # synthetic.write_letor kwargs


@dataclasses.dataclass
class ModelConfig:
    kind: str = "dnn"  # dnn: a scorer trained on `loss`; adarank: AdaRank (tfapprox.adarank)
    preset: str = "B256"  # a B-net (linear, B64 ... B1024) or a recipe (dasalc)
    dropout: float = 0.0
    batch_norm_momentum: float | None = None  # None: the scorer's default
    # DASALC's pieces, each None for the preset's own choice (the B-nets: none of them), so that
    # an ablation switches one off or on: "none", "log1p" or "quantile"; whether to append each
    # feature standardised within its list; σ of the training-only input noise; self-attention
    # blocks over the list (0: none).
    input_transform: str | None = None
    list_standardize: bool | None = None
    noise_stddev: float | None = None
    attention_layers: int | None = None
    # Whether NaN feature values are missing values the scorer handles (DNNScorer's
    # handles_missing); None: whether the training data holds any (LETOR's NULL or nan).
    handles_missing: bool | None = None
    adarank_measure: str = "ndcg"  # E of AdaRank: map, ndcg, ndcg@k, p@k, mrr
    adarank_rounds: int = 100  # at most this many boosting rounds; the best on validation is kept


@dataclasses.dataclass
class LossConfig:
    name: str = "approx_ndcg"
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class OptimizerConfig:
    name: str = "adagrad"
    learning_rate: float = 0.05


@dataclasses.dataclass
class TrainConfig:
    batch_size: int = 32  # lists per step (global, across replicas)
    epochs: int = 20
    seed: int = 0
    select_metric: str = "ndcg@5"  # model selection and early stopping, on validation
    patience: int = 5  # epochs without improvement before stopping; 0 never stops early
    metrics: list[str] = dataclasses.field(
        default_factory=lambda: ["ndcg@1", "ndcg@5", "ndcg@10", "map", "p@10", "mrr"]
    )
    run_dir: str = "runs/demo"  # checkpoint, TensorBoard logs, results.json
    # A model whose documents attend to each other (dasalc): the most document pairs, lists × L²,
    # one training batch and one exported serving request may hold; None: the package's default
    # (tfapprox.models.MAX_ATTENTION_PAIRS).
    max_pairs: int | None = None


@dataclasses.dataclass
class ExportConfig:
    enabled: bool = True
    base_dir: str = "saved_models"
    name: str = "tfapprox_demo"
    version: int | None = None
    max_documents: int | None = None  # per request, padding counted; None: tfapprox.export's default


@dataclasses.dataclass
class RuntimeConfig:
    backend: str | None = None  # the Keras backend: tensorflow | jax | None ($KERAS_BACKEND, else tensorflow)
    strategy: str = "default"  # default | mirrored | multi_worker (reads TF_CONFIG)
    mixed_precision: bool = False
    jit: bool = False


@dataclasses.dataclass
class CVConfig:
    folds: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3, 4, 5])
    grid: dict[str, list[Any]] = dataclasses.field(default_factory=dict)  # dotted key -> values
    out_dir: str = "runs/cv"


@dataclasses.dataclass
class Config:
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    export: ExportConfig = dataclasses.field(default_factory=ExportConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    cv: CVConfig = dataclasses.field(default_factory=CVConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Config":
        config = _build(cls, values, where="config")
        validate(config)
        return config


# Named configurations. `demo` is what a bare `python -m trainer` runs: generated data, sized so one run
# takes a minute or two on a laptop CPU. The LETOR ones are starting points for `cv` on the shared sets
# (`--data-dir` points at a set directory with S1..S5.txt or at its Fold1..Fold5 layout).
PRESETS: dict[str, dict[str, Any]] = {
    "demo": {},
    "ohsumed": {
        "model": {"preset": "B64", "dropout": 0.1},
        "loss": {"name": "approx_ndcg", "params": {"alpha": 10.0}},
        "optimizer": {"name": "adagrad", "learning_rate": 0.05},
        "train": {"batch_size": 8, "epochs": 60, "patience": 10, "run_dir": "runs/ohsumed"},
        "export": {"enabled": False, "name": "tfapprox_ohsumed"},
        "cv": {"out_dir": "runs/cv_ohsumed"},
    },
    "mq2008": {
        "model": {"preset": "B128", "dropout": 0.1},
        "loss": {"name": "approx_ndcg", "params": {"alpha": 10.0}},
        "optimizer": {"name": "adagrad", "learning_rate": 0.05},
        "train": {"batch_size": 16, "epochs": 60, "patience": 10, "run_dir": "runs/mq2008"},
        "export": {"enabled": False, "name": "tfapprox_mq2008"},
        "cv": {"out_dir": "runs/cv_mq2008"},
    },
}


def load(source: str | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Returns the `Config` of a preset name or YAML/JSON file (`demo` when None), overrides applied.

    `overrides` maps dotted keys (`train.epochs`, `loss.params.alpha`) to values.
    """
    values = load_dict(source)
    apply_overrides(values, overrides or {})
    return Config.from_dict(values)


def load_dict(source: str | None) -> dict[str, Any]:
    """Returns the plain dict of a preset name or a config file, on top of the defaults."""
    base = Config().to_dict()
    if source is None:
        source = "demo"
    path = Path(source)
    if path.is_file():
        text = path.read_text()
        try:
            values = (json.loads(text, object_pairs_hook=_unique_keys) if path.suffix == ".json"
                      else yaml.load(text, Loader=_Loader))
        except (json.JSONDecodeError, yaml.YAMLError, ValueError) as err:
            raise ValueError(f"config file {path} is not valid {path.suffix or 'YAML'}: {err}") from None
        values = values or {}
        if not isinstance(values, dict):
            raise ValueError(f"config file {path} must hold a mapping, got {type(values).__name__}")
    elif source in PRESETS:
        values = copy.deepcopy(PRESETS[source])
    else:
        raise ValueError(
            f"--config {source!r} is neither a file nor a preset; presets are {sorted(PRESETS)}"
        )
    return _merge(base, values, where="config")


def apply_overrides(values: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Sets each dotted key of `overrides` in the nested dict `values`, in place.

    Keys must name existing fields, except under the free-form dicts `loss.params`,
    `data.synthetic` and `cv.grid`.
    """
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = values
        for depth, part in enumerate(parts[:-1]):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(_unknown_key(dotted, ".".join(parts[: depth + 1]), node))
            node = node[part]
            if node is None:
                raise KeyError(f"cannot set {dotted!r}: {'.'.join(parts[: depth + 1])} is empty")
        leaf = parts[-1]
        free_form = ".".join(parts[:-1]) in ("loss.params", "data.synthetic", "cv.grid")
        if not free_form and leaf not in node:
            raise KeyError(_unknown_key(dotted, dotted, node))
        node[leaf] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    """Returns `(key, value)` of `key=value`, the value read as YAML (`10` → 10, `[1, 2]` → list)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), _parse_scalar(raw)


def parse_grid_axis(text: str) -> tuple[str, list[Any]]:
    """Returns `(key, values)` of `key=v1,v2,...` (each value read as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or not raw:
        raise ValueError(f"expected KEY=V1,V2,..., got {text!r}")
    return key.strip(), [_parse_scalar(v) for v in raw.split(",")]


def validate(config: Config) -> None:
    """Raises ValueError naming the field when a value is out of range."""
    checks = [
        (config.optimizer.name in OPTIMIZERS, "optimizer.name", config.optimizer.name, f"one of {OPTIMIZERS}"),
        (config.optimizer.learning_rate > 0, "optimizer.learning_rate", config.optimizer.learning_rate, "> 0"),
        (config.runtime.backend in (None, *BACKENDS), "runtime.backend", config.runtime.backend, f"one of {BACKENDS} or null"),
        (config.runtime.backend != "jax" or config.runtime.strategy == "default", "runtime.strategy",
         config.runtime.strategy, "default on the jax backend (the strategies are tf.distribute's)"),
        (config.runtime.strategy in STRATEGIES, "runtime.strategy", config.runtime.strategy, f"one of {STRATEGIES}"),
        (config.model.kind in MODEL_KINDS, "model.kind", config.model.kind, f"one of {MODEL_KINDS}"),
        (config.model.adarank_rounds >= 1, "model.adarank_rounds", config.model.adarank_rounds, ">= 1"),
        (config.model.kind != "adarank" or config.runtime.strategy == "default", "runtime.strategy",
         config.runtime.strategy, "default with model.kind adarank (it fits in one process)"),
        (config.train.batch_size >= 1, "train.batch_size", config.train.batch_size, ">= 1"),
        (config.train.epochs >= 1, "train.epochs", config.train.epochs, ">= 1"),
        (config.train.patience >= 0, "train.patience", config.train.patience, ">= 0"),
        (config.train.max_pairs is None or config.train.max_pairs >= 1, "train.max_pairs", config.train.max_pairs, ">= 1 or null"),
        (0.0 <= config.model.dropout < 1.0, "model.dropout", config.model.dropout, "in [0, 1)"),
        (config.data.list_size is None or config.data.list_size >= 2, "data.list_size", config.data.list_size, ">= 2 (one document has nothing to rank against) or null"),
        (config.data.num_features is None or config.data.num_features >= 1, "data.num_features", config.data.num_features, ">= 1 or null"),
        (config.data.buckets >= 0, "data.buckets", config.data.buckets, ">= 0"),
        (config.data.bucket_sizes is None or _increasing_sizes(config.data.bucket_sizes), "data.bucket_sizes", config.data.bucket_sizes, "increasing positive integers or null"),
        (_is_plain_name(config.export.name), "export.name", config.export.name, "a directory name without '/' that does not start with '.'"),
        (config.export.version is None or config.export.version >= 0, "export.version", config.export.version, ">= 0 or null"),
        (config.export.max_documents is None or config.export.max_documents >= 1, "export.max_documents", config.export.max_documents, ">= 1 or null"),
        (all(1 <= f <= 5 for f in config.cv.folds) and config.cv.folds, "cv.folds", config.cv.folds, "a non-empty subset of 1..5"),
    ]
    for ok, field, value, expected in checks:
        if not ok:
            raise ValueError(f"{field} must be {expected}, got {value!r}")
    if config.data.dir is None and config.data.train is not None and not config.data.vali:
        raise ValueError("data.train needs data.vali too: model selection runs on validation data")
    if config.data.feature_spec is not None:
        _check_named(config)


def _check_named(config: Config) -> None:
    """Raises ValueError for settings that records with named features (`data.feature_spec`) do
    not go with."""
    refused = [
        (config.data.train is None or config.data.dir is not None, "data.feature_spec reads the "
         "records of data.train and data.vali (--train, --vali), not a LETOR data.dir"),
        (config.data.num_features is not None, "data.feature_spec names the features; "
         "data.num_features goes with the vector layouts"),
        (config.model.kind != "dnn", "data.feature_spec trains model.kind dnn; AdaRank fits "
         "numbered LETOR features"),
        (config.runtime.strategy != "default", "data.feature_spec trains with runtime.strategy "
         "default (one process, one replica)"),
    ]
    for wrong, message in refused:
        if wrong:
            raise ValueError(message)


def _increasing_sizes(sizes: list[Any]) -> bool:
    return (bool(sizes) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)
            and sizes == sorted(set(sizes)))


def _is_plain_name(name: str) -> bool:
    return bool(name) and not name.startswith(".") and "/" not in name


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.load(raw, Loader=_Loader)
    except yaml.YAMLError:
        return raw


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, with numbers in exponent notation (`1e-3`, `2E5`, `1.0e3`) read as
    floats, and a key repeated within one mapping refused."""

    def construct_mapping(self, node, deep=False):
        seen = []
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.append(key)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads's object hook: a dict of `pairs`, refusing a key given twice."""
    keys = [key for key, _ in pairs]
    repeated = next((key for key in keys if keys.count(key) > 1), None)
    if repeated is not None:
        raise ValueError(f"key {repeated!r} is given twice")
    return dict(pairs)


def _unknown_key(dotted: str, prefix: str, node: Any) -> str:
    known = sorted(node) if isinstance(node, dict) else []
    return f"unknown config key {dotted!r} (no {prefix!r}); known keys here: {known}"


def _merge(base: dict[str, Any], values: dict[str, Any], where: str) -> dict[str, Any]:
    """Returns `base` updated by `values` recursively; unknown keys are an error."""
    merged = copy.deepcopy(base)
    for key, value in values.items():
        if key not in merged:
            raise KeyError(f"unknown key {key!r} in {where}; expected one of {sorted(merged)}")
        if isinstance(merged[key], dict) and isinstance(value, dict) and key not in ("params", "synthetic", "grid"):
            merged[key] = _merge(merged[key], value, f"{where}.{key}")
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _build(cls: type, values: Any, where: str) -> Any:
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a mapping, got {values!r}")
    hints = get_type_hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):
        if field.name not in values:
            continue
        value = values[field.name]
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            kwargs[field.name] = _build(hint, value, f"{where}.{field.name}")
        else:
            kwargs[field.name] = _coerce(value, hint, f"{where}.{field.name}")
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise KeyError(f"unknown key(s) {sorted(unknown)} in {where}")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Returns `value` checked against a field's type hint (`int | None`, `list[str]`, ...).

    A string given for a list field becomes a one-element list; an int for a float field a float.
    """
    options = [a for a in typing.get_args(hint)] if isinstance(hint, types.UnionType) else [hint]
    if value is None:
        if type(None) in options:
            return None
        raise ValueError(f"{where} must not be empty")
    kind = next(o for o in options if o is not type(None))
    origin = typing.get_origin(kind) or kind
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} must be a list, got {value!r}")
        return list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if origin is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
        return value
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value
    if origin is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        return float(value)
    if origin is str and not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {value!r}")
    return value
