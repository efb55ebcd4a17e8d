"""Named features: what a ranking record holds, by name, as a spec file and as ``tf.io`` specs.

A :class:`FeatureSpec` lists a list's context features (one value set per list: the query, the
user) and its document features (one per document), each a :class:`Feature`, plus the label's
name. It is kept as JSON (docs/data.md, "Feature specs"), written by ``python -m tfapprox.data
spec`` and edited by hand, and it turns into the ``tf.io`` spec dictionaries that TF-Ranking's
dataset builders take (:meth:`FeatureSpec.context_feature_spec`,
:meth:`FeatureSpec.example_feature_spec`, :meth:`FeatureSpec.label_spec`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import tensorflow as tf

from tfapprox.files import create_file, fresh_name

DTYPES = ("float32", "int64", "string")
TRANSFORMS = ("none", "log1p", "quantile")
RECORD_FORMATS = ("elwc", "sequence_example")
MASK_FEATURE_NAME = "example_list_mask"
SPEC_FILE_VERSION = 1


class FeatureSpecError(ValueError):
    """A spec file or spec value that cannot be used; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """One named feature.

    Attributes:
        name: The key under which records hold it.
        dtype: ``"float32"``, ``"int64"`` or ``"string"``.
        length: Values per document (or per list, for a context feature) when fixed; ``None`` when
            it varies (a token list: read as ragged, padded tokens masked).
        default: The value a record that lacks a fixed-length feature gets (numbers, or a string).
        transform: Numeric features only: ``"none"``, ``"log1p"`` or ``"quantile"``.
        vocabulary: String and int64 features: a vocabulary file, one value a line, relative to
            the spec file; values outside it share one out-of-vocabulary bucket.
        embedding_dim: String and int64 features: the width of their embedding.
        missing: How many records (documents, or lists for context) lacked it when the spec was
            inferred; informational.
    """

    name: str
    dtype: str
    length: int | None = 1
    default: float | int | str | None = None
    transform: str = "none"
    vocabulary: str | None = None
    embedding_dim: int | None = None
    missing: int | None = None

    def __post_init__(self):
        where = f"feature {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise FeatureSpecError(f"a feature's name must be a non-empty string; got {self.name!r}")
        if self.dtype not in DTYPES:
            raise FeatureSpecError(f"{where}: dtype must be one of {DTYPES}; got {self.dtype!r}")
        if self.length is not None and (
            isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1
        ):
            raise FeatureSpecError(f"{where}: length must be a positive integer or null; got "
                                   f"{self.length!r}")
        if self.transform not in TRANSFORMS:
            raise FeatureSpecError(f"{where}: transform must be one of {TRANSFORMS}; got "
                                   f"{self.transform!r}")
        if self.transform != "none" and not self.numeric:
            raise FeatureSpecError(f"{where}: transform {self.transform!r} needs a float32 "
                                   f"feature; it is {self.dtype}")
        if self.categorical and self.vocabulary is None and self.dtype == "string":
            raise FeatureSpecError(f"{where}: a string feature needs a vocabulary file")
        if self.embedding_dim is not None and (
            isinstance(self.embedding_dim, bool) or not isinstance(self.embedding_dim, int)
            or self.embedding_dim < 1
        ):
            raise FeatureSpecError(f"{where}: embedding_dim must be a positive integer; got "
                                   f"{self.embedding_dim!r}")

    @property
    def numeric(self) -> bool:
        """Whether the feature enters a model as numbers (float32)."""
        return self.dtype == "float32"

    @property
    def categorical(self) -> bool:
        """Whether the feature enters a model through a lookup and an embedding."""
        return self.dtype == "string" or (self.dtype == "int64" and self.vocabulary is not None)

    @property
    def tf_dtype(self) -> tf.DType:
        return tf.as_dtype(self.dtype)

    def io_spec(self):
        """The ``tf.io`` spec that parses it: fixed length, or ragged when the length varies."""
        if self.length is None:
            return tf.io.RaggedFeature(self.tf_dtype)
        default = self.default
        if default is None:
            default = "" if self.dtype == "string" else 0
        if self.dtype == "string" and isinstance(default, str):
            default = default.encode()
        return tf.io.FixedLenFeature([self.length], self.tf_dtype,
                                     default_value=[default] * self.length)


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """Context features, document features and the label of a set of ranking records.

    Attributes:
        context: Features held once per list.
        document: Features held per document.
        label: The document feature that holds the graded relevance.
        label_default: The label a document that lacks one gets; < 0 marks it as padding, so it
            never counts as relevant.
        label_dtype: How records hold the label: ``"float32"`` or ``"int64"``.
        label_missing: How many documents lacked a label when the spec was inferred; informational.
        record_format: ``"elwc"`` (ExampleListWithContext) or ``"sequence_example"``.
        mask_feature_name: The key under which the dataset yields the list mask.
        base_dir: The spec file's directory; vocabulary paths are relative to it.
    """

    context: tuple[Feature, ...]
    document: tuple[Feature, ...]
    label: str
    label_default: float = -1.0
    label_dtype: str = "float32"
    label_missing: int | None = None
    record_format: str = "elwc"
    mask_feature_name: str = MASK_FEATURE_NAME
    base_dir: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if self.label_dtype not in ("float32", "int64"):
            raise FeatureSpecError(f"label dtype must be float32 or int64; got {self.label_dtype!r}")
        if self.record_format not in RECORD_FORMATS:
            raise FeatureSpecError(f"record_format must be one of {RECORD_FORMATS}; got "
                                   f"{self.record_format!r}")
        names = [f.name for f in self.context + self.document] + [self.label]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise FeatureSpecError(f"feature names must be distinct across context, document and "
                                   f"label; repeated: {', '.join(repeated)}")
        if self.mask_feature_name in names:
            raise FeatureSpecError(f"mask_feature_name {self.mask_feature_name!r} is also a "
                                   "feature's name")
        if not self.document:
            raise FeatureSpecError("a spec needs at least one document feature")

    def model_inputs(self) -> tuple:
        """What a model built over this spec reads, comparable between specs: for each context
        and document feature, its name, dtype, length, default, transform, vocabulary and
        embedding width (not the label, nor the counts of missing values)."""
        return tuple((f.name, f.dtype, f.length, f.default, f.transform, f.vocabulary,
                      f.embedding_dim) for f in self.context + self.document)

    def context_feature_spec(self) -> dict:
        """``{name: tf.io spec}`` of the context features, as TF-Ranking takes them."""
        return {f.name: f.io_spec() for f in self.context}

    def example_feature_spec(self) -> dict:
        """``{name: tf.io spec}`` of the document features (without the label)."""
        return {f.name: f.io_spec() for f in self.document}

    def label_spec(self) -> tuple[str, tf.io.FixedLenFeature]:
        """``(name, FixedLenFeature([1], label dtype, label_default))``, TF-Ranking's label spec."""
        default = self.label_default if self.label_dtype == "float32" else int(self.label_default)
        return self.label, tf.io.FixedLenFeature([1], tf.as_dtype(self.label_dtype),
                                                 default_value=default)

    def vocabulary_path(self, feature: Feature) -> Path | None:
        """The vocabulary file of ``feature``, resolved against the spec file's directory."""
        if feature.vocabulary is None:
            return None
        path = Path(feature.vocabulary)
        return path if path.is_absolute() or self.base_dir is None else Path(self.base_dir) / path

    def to_dict(self) -> dict:
        def entry(feature):
            data = dataclasses.asdict(feature)
            return {k: v for k, v in data.items() if v is not None or k == "length"}

        return {
            "version": SPEC_FILE_VERSION,
            "record_format": self.record_format,
            "label": {"name": self.label, "dtype": self.label_dtype, "default": self.label_default,
                      **({} if self.label_missing is None else {"missing": self.label_missing})},
            "mask_feature_name": self.mask_feature_name,
            "context": [entry(f) for f in self.context],
            "document": [entry(f) for f in self.document],
        }

    @classmethod
    def from_dict(cls, data: dict, base_dir: str | None = None, where: str = "spec") -> FeatureSpec:
        """Builds a spec from its JSON form; unknown keys are refused, naming ``where``."""
        _known_keys(data, {"version", "record_format", "label", "mask_feature_name", "context",
                           "document"}, where)
        if data.get("version", SPEC_FILE_VERSION) != SPEC_FILE_VERSION:
            raise FeatureSpecError(f"{where}: version {data.get('version')!r} is not "
                                   f"{SPEC_FILE_VERSION}")
        label = data.get("label")
        if isinstance(label, str):
            label = {"name": label}
        if not isinstance(label, dict) or "name" not in label:
            raise FeatureSpecError(f"{where}: 'label' must be a name or {{\"name\": ..., "
                                   f"\"default\": ...}}; got {label!r}")
        _known_keys(label, {"name", "dtype", "default", "missing"}, f"{where}: label")
        fields = {f.name for f in dataclasses.fields(Feature)}

        def features(key):
            entries = data.get(key, [])
            if not isinstance(entries, list):
                raise FeatureSpecError(f"{where}: {key!r} must be a list of features")
            out = []
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    raise FeatureSpecError(f"{where}: {key}[{i}] must be an object")
                _known_keys(entry, fields, f"{where}: {key}[{i}]")
                try:
                    out.append(Feature(**entry))
                except (FeatureSpecError, TypeError) as err:
                    raise FeatureSpecError(f"{where}: {key}[{i}]: {err}") from None
            return tuple(out)

        try:
            return cls(
                context=features("context"),
                document=features("document"),
                label=label["name"],
                label_default=float(label.get("default", -1.0)),
                label_dtype=label.get("dtype", "float32"),
                label_missing=label.get("missing"),
                record_format=data.get("record_format", "elwc"),
                mask_feature_name=data.get("mask_feature_name", MASK_FEATURE_NAME),
                base_dir=base_dir,
            )
        except FeatureSpecError as err:
            if str(err).startswith(where):
                raise
            raise FeatureSpecError(f"{where}: {err}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Writes the spec as JSON to the new file ``path``; an existing file (or link) there is
        refused."""
        path = Path(path)
        if os.path.lexists(path):
            raise FileExistsError(f"{path} exists; a spec goes to a new file")
        tmp = fresh_name(path.parent, f".{path.name}.")
        try:
            with os.fdopen(create_file(tmp), "w") as handle:
                handle.write(json.dumps(self.to_dict(), indent=2) + "\n")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # ours, created above
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> FeatureSpec:
        """Reads a spec file; errors name the file and the key."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FeatureSpecError(f"{path}: no such spec file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise FeatureSpecError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise FeatureSpecError(f"{path}: a spec file holds one JSON object")
        spec = cls.from_dict(data, base_dir=str(path.parent), where=str(path))
        spec.check_vocabularies(where=str(path))
        return spec

    def check_vocabularies(self, where: str = "spec") -> None:
        """Refuses a vocabulary file that is missing or holds no value, naming it and its feature."""
        for feature in self.context + self.document:
            path = self.vocabulary_path(feature)
            if path is None:
                continue
            try:
                empty = not any(line.strip() for line in path.read_text().splitlines())
            except OSError as err:
                raise FeatureSpecError(f"{where}: feature {feature.name!r}: vocabulary {path}: "
                                       f"{err.strerror or err}") from None
            if empty:
                raise FeatureSpecError(f"{where}: feature {feature.name!r}: vocabulary {path} is "
                                       "empty (one value a line)")


def _known_keys(data: dict, allowed: set, where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise FeatureSpecError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                               f"allowed: {', '.join(sorted(allowed))}")
