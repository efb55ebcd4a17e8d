"""Models over named features: a `FeatureSpec`'s context and document features into the scorers.

A ranking record holds named features (docs/data.md, "Feature specs"); the scorers of
`tfapprox.models` take one float vector per document. Two stages join them:

    raw features {name: [B, ...] / [B, L, ...], mask}       (strings, int64, ragged token lists)
        -> FeatureLookup (TensorFlow)                       vocabulary ids, padded token lists
        -> FeatureInputs (any backend, XLA)                 {"features": [B, L, F'], "mask": [B, L]}
        -> a scorer (`tfapprox.models.build_scorer`)        scores [B, L]

`FeatureLookup` maps string and int64 values through `StringLookup` / `IntegerLookup` to ids
(0: no token, 1: out of vocabulary, 2...: the vocabulary) and pads ragged token lists. It runs
TensorFlow's lookup tables, which XLA cannot compile, so it belongs in the `tf.data` pipeline
(`dataset.map`), where it runs on the CPU whatever the Keras backend. `FeatureInputs` embeds the
ids, averages each token list over its real tokens, applies each numeric feature's transform,
broadcasts the context features over the list's documents and concatenates everything: keras.ops
only, so it trains under XLA and on JAX. `NamedFeatureScorer` chains them with a scorer, with the
lookup inside the model (one model from raw features, TensorFlow, no XLA) or outside it.

Every stage works document by document (the context being the same for all of a list's
documents), so it is permutation-equivariant over the list, and padded documents (mask False) and
padded tokens reach no real document's features: padded documents come out as zeros, and the
scorers keep them out of batch-norm statistics and attention.

`ConcatFeatures` and `DocumentInteractionAttention` are TF-Ranking's layers of those names, for
programs that compose their model by hand.
"""

from pathlib import Path

import keras
from keras import ops

from tfapprox.models import DocumentInteraction, QuantileTransform, build_scorer, symmetric_log1p

__all__ = [
    "DEFAULT_EMBEDDING_DIM",
    "ConcatFeatures",
    "DocumentInteractionAttention",
    "FeatureInputs",
    "FeatureLookup",
    "NamedFeatureScorer",
    "broadcast_context",
    "build_named_scorer",
    "concatenate_per_document",
    "read_vocabulary",
]

DEFAULT_EMBEDDING_DIM = 20  # a categorical feature's width when its spec entry names none
PAD_ID = 0  # a token list's padding (and a padded document's tokens)
OOV_ID = 1  # a value outside the vocabulary; the vocabulary's values are 2, 3, ...
FIRST_VOCABULARY_ID = 2


def read_vocabulary(path, dtype="string"):
    """Returns the values of a vocabulary file, one a line (blank lines skipped), as `str` or, for
    `dtype="int64"`, `int`; errors name the file and line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such vocabulary file") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: a vocabulary file must be UTF-8 text ({error})") from None
    values = []
    for number, line in enumerate(lines, 1):
        value = line.strip()
        if not value:
            continue
        if dtype == "int64":
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"{path}:{number}: an int64 vocabulary holds integers; got "
                                 f"{value!r}") from None
        values.append(value)
    if not values:
        raise ValueError(f"{path}: the vocabulary file is empty")
    return values


def _as_spec(spec):
    """A `FeatureSpec` from a spec or its JSON form (`FeatureSpec.to_dict`)."""
    from tfapprox.data.feature_spec import FeatureSpec  # TensorFlow; the scorers import without it

    return spec if isinstance(spec, FeatureSpec) else FeatureSpec.from_dict(spec)


def _vocabularies(spec, features):
    """`{vocabulary: values}` of the categorical `features`, read from the spec's files."""
    return {f.vocabulary: read_vocabulary(spec.vocabulary_path(f), f.dtype)
            for f in features if f.categorical}


def _model_features(spec):
    """The spec's features that enter a model, checked: every one but a variable-length number."""
    features = spec.context + spec.document
    for feature in features:
        if feature.length is None and not feature.categorical:
            raise ValueError(
                f"feature {feature.name!r}: a variable-length {feature.dtype} feature without a "
                "vocabulary has no fixed width in a model; give it a length (or a vocabulary)")
    return features


def _check_present(layer, inputs, features):
    """Raises ValueError naming `layer` and the `features` that `inputs` lack."""
    missing = [f.name for f in features if f.name not in inputs]
    if missing:
        raise ValueError(f"{layer.name}: the features lack {', '.join(map(repr, missing))} (the "
                         f"spec's); received keys {sorted(inputs)}")


def broadcast_context(context, mask):
    """Returns context features `[B, D]` repeated for each of a list's documents: `[B, L, D]`,
    `L` the list size of `mask` `[B, L]`."""
    shape = ops.shape(mask)
    return ops.broadcast_to(ops.expand_dims(context, 1), (shape[0], shape[1], context.shape[-1]))


def concatenate_per_document(context_parts, document_parts, mask):
    """Returns float32 `[B, L, ΣD]`: the context parts `[B, D]` repeated for every document, then
    the document parts `[B, L, D]`, side by side; zeros where `mask` `[B, L]` is False."""
    mask = ops.cast(mask, "bool")
    parts = [broadcast_context(ops.cast(part, "float32"), mask) for part in context_parts]
    parts += [ops.cast(part, "float32") for part in document_parts]
    return ops.where(ops.expand_dims(mask, -1), ops.concatenate(parts, axis=-1), 0.0)


@keras.saving.register_keras_serializable(package="tfapprox")
class ConcatFeatures(keras.layers.Layer):
    """TF-Ranking's `ConcatFeatures`: `[B, L, ΣD]`, per document its list's context features and
    its own document features, concatenated in the order of their sorted names (context first).

    Called on `(context_features, example_features, list_mask)`: dicts of `[B, D]` and
    `[B, L, D]` tensors and a bool `[B, L]` mask. Where TF-Ranking's layer fills padded documents
    with copies of valid ones (`circular_padding`), this one leaves them as zeros: every tfapprox
    scorer and loss masks them.
    """

    def call(self, inputs):
        context_features, example_features, list_mask = inputs
        return concatenate_per_document([context_features[k] for k in sorted(context_features)],
                                        [example_features[k] for k in sorted(example_features)],
                                        list_mask)

    def compute_output_shape(self, input_shape):
        context_shapes, example_shapes, mask_shape = input_shape
        widths = [shape[-1] for shape in list(context_shapes.values())
                  + list(example_shapes.values())]
        width = None if None in widths else sum(widths)
        return tuple(mask_shape) + (width,)


@keras.saving.register_keras_serializable(package="tfapprox")
class DocumentInteractionAttention(DocumentInteraction):
    """TF-Ranking's `DocumentInteractionAttention` (Pasumarthi et al., 2020) under its name and
    arguments: a `tfapprox.models.DocumentInteraction` of `num_layers` blocks, `num_heads` heads,
    `head_size` units. Called on `(example_inputs [B, L, D], list_mask [B, L])` (mask may be None:
    every document valid); returns `[B, L, head_size]`, zeros at padded documents.

    As in TF-Ranking, `head_size` is the output width; here it is split among the heads (so it
    must be divisible by `num_heads`), and each block adds a feed-forward sublayer after the
    attention. Padded documents are masked as keys and queries.
    """

    def __init__(self, num_heads, head_size, num_layers=1, dropout=0.5, **kwargs):
        super().__init__(units=head_size, layers=num_layers, heads=num_heads, dropout=dropout,
                         **kwargs)

    def build(self, input_shape):
        super().build(input_shape[0])

    def call(self, inputs, training=False):
        example_inputs, list_mask = inputs
        if list_mask is None:
            list_mask = ops.ones(ops.shape(example_inputs)[:-1], dtype="bool")
        return super().call(example_inputs, list_mask, training=training)

    def compute_output_shape(self, input_shape):
        return super().compute_output_shape(input_shape[0])

    def get_config(self):
        config = super().get_config()
        renamed = {"units": "head_size", "layers": "num_layers", "heads": "num_heads"}
        return {renamed.get(key, key): value for key, value in config.items()}


@keras.saving.register_keras_serializable(package="tfapprox")
class FeatureLookup(keras.layers.Layer):
    """Returns a spec's features with every categorical one as int32 vocabulary ids, padded.

    TensorFlow only (lookup tables, which XLA cannot compile): map it over the `tf.data` pipeline,
    `dataset.map(lambda features, labels: (lookup(features), labels))`, so that the model after it
    compiles, or keep it in the model (`NamedFeatureScorer(..., lookup=...)`, no XLA there).

    A string feature goes through `StringLookup`, an int64 feature with a vocabulary through
    `IntegerLookup`, one out-of-vocabulary bucket each: ids are 0 for no token, 1 for a value
    outside the vocabulary, 2, 3, ... for the vocabulary's values in file order. Features that name
    the same vocabulary file share one lookup. A token list (`length: null`) may come ragged
    (`[B, None]` context, `[B, L, None]` document; padded by its row lengths), sparse (a
    `VarLenFeature`) or dense, padded with `""` (strings) or 0 (int64); the output pads it with
    id 0. Numeric features pass through as float32, the mask (`spec.mask_feature_name`) as bool;
    other keys are dropped.

    Args:
        spec: A `FeatureSpec` or its JSON form.
        vocabularies: `{vocabulary file as the spec names it: values}`; read from the spec's files
            when omitted (saved models carry them, so loading reads no file).
        token_multiple: Pads every token list dimension up to a multiple of this (None: to the
            batch's longest list), so that a compiled model (XLA, JAX) sees few token lengths and
            compiles few times.
    """

    def __init__(self, spec, vocabularies=None, token_multiple=None, **kwargs):
        super().__init__(**kwargs)
        if token_multiple is not None and (isinstance(token_multiple, bool) or not isinstance(
                token_multiple, int) or token_multiple < 1):
            raise ValueError(f"token_multiple must be a positive integer or None; received "
                             f"token_multiple={token_multiple!r}.")
        self.token_multiple = token_multiple
        self.spec = _as_spec(spec)
        self.features = _model_features(self.spec)
        if vocabularies is None:
            vocabularies = _vocabularies(self.spec, self.features)
        self.vocabularies = {name: list(values) for name, values in vocabularies.items()}
        self.supports_jit = False
        # Keras converts a layer's inputs to the backend's tensors: not strings nor ragged tensors,
        # and on JAX not the symbolic tensors of a tf.data map either. The inputs stay TensorFlow's.
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self._lookup_of = {}  # vocabulary file -> index in self.lookups
        self.lookups = []
        for feature in self.features:
            if feature.categorical and feature.vocabulary not in self._lookup_of:
                kind = (keras.layers.StringLookup if feature.dtype == "string"
                        else keras.layers.IntegerLookup)
                self._lookup_of[feature.vocabulary] = len(self.lookups)
                self.lookups.append(kind(
                    vocabulary=self.vocabularies[feature.vocabulary], num_oov_indices=1,
                    mask_token=None, output_mode="int", name=f"lookup_{len(self.lookups)}"))

    def __call__(self, inputs, **kwargs):
        import tensorflow as tf

        tensors = (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)
        inputs = {name: value if isinstance(value, tensors) else tf.convert_to_tensor(value)
                  for name, value in inputs.items()}
        return super().__call__(inputs, **kwargs)

    def build(self, input_shape=None):
        for lookup in self.lookups:
            lookup.build(None)

    def call(self, inputs):
        import tensorflow as tf

        _check_present(self, inputs, self.features)
        outputs = {}
        for feature in self.features:
            value = inputs[feature.name]
            if not feature.categorical:
                outputs[feature.name] = tf.cast(value, tf.float32)
                continue
            if isinstance(value, tf.RaggedTensor):
                outputs[feature.name] = value.with_flat_values(
                    self._ids(feature, value.flat_values)).to_tensor(PAD_ID)
            elif isinstance(value, tf.SparseTensor):  # a VarLenFeature
                outputs[feature.name] = tf.sparse.to_dense(tf.SparseTensor(
                    value.indices, self._ids(feature, value.values), value.dense_shape), PAD_ID)
            else:
                found = self._ids(feature, value)
                if feature.length is None:  # dense token lists, padded with "" or 0
                    found = tf.where(value == tf.zeros_like(value), PAD_ID, found)
                outputs[feature.name] = found
            if feature.length is None and self.token_multiple:
                ids = outputs[feature.name]
                extra = -tf.shape(ids)[-1] % self.token_multiple
                padding = tf.concat([tf.zeros([tf.rank(ids) - 1, 2], tf.int32), [[0, extra]]], 0)
                outputs[feature.name] = tf.pad(ids, padding, constant_values=PAD_ID)
        if self.spec.mask_feature_name in inputs:
            outputs[self.spec.mask_feature_name] = tf.cast(inputs[self.spec.mask_feature_name],
                                                           tf.bool)
        return outputs

    def _ids(self, feature, values):
        """The ids of `values`: the lookup's 0 (out of vocabulary) becomes OOV_ID, the vocabulary
        starts at FIRST_VOCABULARY_ID."""
        import tensorflow as tf

        if feature.dtype == "int64":
            values = tf.cast(values, tf.int64)
        return tf.cast(self.table(feature.vocabulary)(values), tf.int32) + OOV_ID

    def table(self, vocabulary):
        """The lookup layer of `vocabulary` (a file as the spec names it), shared by every
        feature that names it."""
        return self.lookups[self._lookup_of[vocabulary]]

    def get_config(self):
        return {**super().get_config(), "spec": self.spec.to_dict(),
                "vocabularies": self.vocabularies, "token_multiple": self.token_multiple}


@keras.saving.register_keras_serializable(package="tfapprox")
class FeatureInputs(keras.layers.Layer):
    """Returns `{"features": float32 [B, L, F'], "mask": bool [B, L]}`, what every scorer of
    `tfapprox.models` takes, from a spec's features as `FeatureLookup` gives them.

    Per document, in this order:
    - numeric features (float32, and int64 without a vocabulary, as numbers), `length` columns
      each, through the spec's transform: `"none"`, `"log1p"` (`symmetric_log1p`) or
      `"quantile"` (`tfapprox.models.QuantileTransform`, fitted by `adapt`);
    - each categorical feature's embedding (`embedding_dim` wide, `DEFAULT_EMBEDDING_DIM` when the
      spec names none; features sharing a vocabulary file and width share the table) averaged
      over its real tokens, ids > 0 (`e = Σ_t 1[id_t > 0] E[id_t] / max(1, Σ_t 1[id_t > 0])`, so
      a list without tokens gives 0);
    - context features first, each repeated for every document of its list, then document
      features; within each, numeric (untransformed and log1p), quantile, then embedded features,
      each group in spec order.

    Inputs: context features `[B, length]`, document features `[B, L, length]` (ids `[B, L, T]`
    for token lists), and the mask under `spec.mask_feature_name` (without it every document is
    valid). Padded documents' values are replaced by zeros before any transform (NaN there
    reaches nothing) and their output rows are zeros. keras.ops only: runs under XLA and on JAX.

    Args:
        spec: A `FeatureSpec` or its JSON form.
        vocabulary_sizes: `{vocabulary file as the spec names it: number of values}`; counted in
            the spec's files when omitted (saved models carry them).
    """

    def __init__(self, spec, vocabulary_sizes=None, **kwargs):
        super().__init__(**kwargs)
        self.spec = _as_spec(spec)
        features = _model_features(self.spec)
        if vocabulary_sizes is None:
            vocabulary_sizes = {name: len(values)
                                for name, values in _vocabularies(self.spec, features).items()}
        self.vocabulary_sizes = dict(vocabulary_sizes)
        self.groups = {level: self._grouped(getattr(self.spec, level))
                       for level in ("context", "document")}
        self._embedding_of = {}  # (vocabulary file, width) -> index in self.embeddings
        self.embeddings = []
        for feature in features:
            key = self._embedding_key(feature)
            if feature.categorical and key not in self._embedding_of:
                self._embedding_of[key] = len(self.embeddings)
                self.embeddings.append(keras.layers.Embedding(
                    self.vocabulary_sizes[feature.vocabulary] + FIRST_VOCABULARY_ID, key[1],
                    name=f"embedding_{len(self.embeddings)}"))
        self.quantiles = {level: QuantileTransform(name=f"{level}_quantiles")
                          for level in ("context", "document") if self.groups[level]["quantile"]}

    @staticmethod
    def _grouped(features):
        groups = {"numeric": [], "quantile": [], "embedded": []}
        for feature in features:
            group = ("embedded" if feature.categorical
                     else "quantile" if feature.transform == "quantile" else "numeric")
            groups[group].append(feature)
        return groups

    @staticmethod
    def _embedding_key(feature):
        return feature.vocabulary, feature.embedding_dim or DEFAULT_EMBEDDING_DIM

    @property
    def output_width(self):
        """F', the number of features per document."""
        return sum(f.length if group != "embedded" else self._embedding_key(f)[1]
                   for groups in self.groups.values() for group, features in groups.items()
                   for f in features)

    def build(self, input_shape=None):
        for level, quantile in self.quantiles.items():
            if not quantile.built:  # adapt may have built it
                quantile.build((None, sum(f.length for f in self.groups[level]["quantile"])))
        for embedding in self.embeddings:
            if not embedding.built:
                embedding.build((None,))

    def _mask(self, inputs):
        if self.spec.mask_feature_name in inputs:
            return ops.cast(inputs[self.spec.mask_feature_name], "bool")
        first = inputs[self.spec.document[0].name]
        return ops.ones(ops.shape(first)[:2], dtype="bool")

    def _columns(self, inputs, features, valid):
        """The features' values side by side, `[..., Σ length]`, zero where `valid` is False."""
        x = ops.concatenate([ops.cast(inputs[f.name], "float32") for f in features], axis=-1)
        return x if valid is None else ops.where(valid, x, 0.0)

    def _block(self, inputs, level, valid):
        """`[B, D]` (context) or `[B, L, D]` (document): the level's features, transformed."""
        groups = self.groups[level]
        parts = []
        if groups["numeric"]:
            x = self._columns(inputs, groups["numeric"], valid)
            log1p = [f.transform == "log1p" for f in groups["numeric"] for _ in range(f.length)]
            if any(log1p):
                x = ops.where(ops.convert_to_tensor(log1p), symmetric_log1p(x), x)
            parts.append(x)
        if groups["quantile"]:
            parts.append(ops.cast(self.quantiles[level](
                self._columns(inputs, groups["quantile"], valid)), "float32"))
        for feature in groups["embedded"]:
            ids = ops.cast(inputs[feature.name], "int32")
            if valid is not None:
                ids = ops.where(valid, ids, PAD_ID)
            real = ops.expand_dims(ops.cast(ids > PAD_ID, "float32"), -1)
            embedding = self.embeddings[self._embedding_of[self._embedding_key(feature)]]
            vectors = ops.cast(embedding(ids), "float32")
            total = ops.sum(vectors * real, axis=-2)
            parts.append(total / ops.maximum(ops.sum(real, axis=-2), 1.0))
        return parts

    def call(self, inputs):
        _check_present(self, inputs, self.spec.context + self.spec.document)
        mask = self._mask(inputs)
        features = concatenate_per_document(self._block(inputs, "context", None),
                                            self._block(inputs, "document",
                                                        ops.expand_dims(mask, -1)), mask)
        return {"features": features, "mask": mask}

    def adapt(self, batches):
        """Fits the quantile transforms to the numeric values of `batches`: feature dicts (or
        `(features, labels)` pairs), as the model takes them; context values count once per
        list, document values once per valid document. Returns the layer."""
        import numpy as np

        if not self.quantiles:
            return self
        values = {level: [] for level in self.quantiles}
        for batch in batches:
            features = batch[0] if isinstance(batch, tuple) else batch
            mask = np.asarray(ops.convert_to_numpy(self._mask(features)))
            for level in values:
                columns = np.concatenate(
                    [np.asarray(features[f.name], np.float32)
                     for f in self.groups[level]["quantile"]], axis=-1)
                values[level].append(columns[mask] if level == "document" else columns)
        for level, quantile in self.quantiles.items():
            quantile.adapt(np.concatenate(values[level]))
        return self

    def get_config(self):
        return {**super().get_config(), "spec": self.spec.to_dict(),
                "vocabulary_sizes": self.vocabulary_sizes}


@keras.saving.register_keras_serializable(package="tfapprox")
class NamedFeatureScorer(keras.Model):
    """Returns scores `[B, L]` from named features: `scorer(inputs(lookup(features)))`.

    Args:
        inputs: A `FeatureInputs`.
        scorer: A scorer of `tfapprox.models` (anything that takes `{"features", "mask"}`).
        lookup: A `FeatureLookup` run inside the model, so that it takes raw features (strings,
            ragged token lists): TensorFlow only, and Keras compiles such a model without XLA
            (`jit_compile=True` falls back with a warning). None (the default): the model takes
            what `FeatureLookup` gives, so map the lookup over the dataset; numeric-only specs
            need none.
    """

    def __init__(self, inputs, scorer, lookup=None, **kwargs):
        super().__init__(**kwargs)
        deserialize = keras.saving.deserialize_keras_object
        self.feature_inputs = inputs if isinstance(inputs, keras.layers.Layer) else deserialize(
            inputs)
        self.scorer = scorer if isinstance(scorer, keras.layers.Layer) else deserialize(scorer)
        self.lookup = (lookup if lookup is None or isinstance(lookup, keras.layers.Layer)
                       else deserialize(lookup))

    @property
    def spec(self):
        return self.feature_inputs.spec

    def build(self, input_shape=None):
        # each part is built already when the model was loaded: it was saved with its build config
        if self.lookup is not None and not self.lookup.built:
            self.lookup.build()
        if not self.feature_inputs.built:
            self.feature_inputs.build()
        if not self.scorer.built:
            self.scorer.build({"features": (None, None, self.feature_inputs.output_width),
                               "mask": (None, None)})

    def build_from_config(self, config):
        self.build()

    def call(self, inputs, training=False):
        if self.lookup is not None:
            inputs = self.lookup(inputs)
        return self.scorer(self.feature_inputs(inputs), training=training)

    def adapt(self, batches):
        """Fits the input transforms to training `batches` (a re-iterable of feature dicts or
        `(features, labels)` pairs, as the model takes them): the spec's quantile features, then
        the scorer's own input transform over what `FeatureInputs` gives."""
        import numpy as np

        def looked_up():
            for batch in batches:
                features = batch[0] if isinstance(batch, tuple) else batch
                yield features if self.lookup is None else self.lookup(features)

        self.feature_inputs.adapt(looked_up())
        if getattr(self.scorer, "quantile", None) is not None:  # DNNScorer's quantile inputs
            outputs = [self.feature_inputs(features) for features in looked_up()]
            features = np.concatenate([ops.convert_to_numpy(o["features"])[
                ops.convert_to_numpy(o["mask"])] for o in outputs])
            self.scorer.adapt(features)

    def get_config(self):
        serialize = keras.saving.serialize_keras_object
        return {**super().get_config(), "inputs": serialize(self.feature_inputs),
                "scorer": serialize(self.scorer),
                "lookup": None if self.lookup is None else serialize(self.lookup)}


def build_named_scorer(spec, preset="B1024", lookup=False, **kwargs):
    """Returns a `NamedFeatureScorer` over `spec`'s features with `tfapprox.models.build_scorer(
    preset, **kwargs)` (a B-net preset or a recipe such as `"dasalc"`), the lookup inside the
    model when `lookup` is True. Vocabulary files are read once, here."""
    spec = _as_spec(spec)
    vocabularies = _vocabularies(spec, _model_features(spec))
    sizes = {name: len(values) for name, values in vocabularies.items()}
    return NamedFeatureScorer(
        FeatureInputs(spec, vocabulary_sizes=sizes, name="feature_inputs"),
        build_scorer(preset, **kwargs),
        lookup=FeatureLookup(spec, vocabularies, name="feature_lookup") if lookup else None,
        name=f"named_{str(preset).lower()}_scorer")
