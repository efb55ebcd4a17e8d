"""The deep batch-norm scorer of Bruch et al. (SIGIR 2019), DASALC's additions (Qin et al., ICLR
2021), and the padding-safe layers they are made of.

A scorer maps a batch of padded lists to one score per document:

    {"features": float32 [B, L, F], "mask": bool [B, L]}  (or a bare [B, L, F] tensor)
        -> scores float32 [B, L]

The pipeline: input transform (`symmetric_log1p` or `QuantileTransform`), optionally each feature
standardised within its list appended (`standardize_within_lists`), `MaskedBatchNormalization`
-> Gaussian noise (training only) -> per-document tower, optionally crossed with a
`DocumentInteraction` block -> Dense(1). Without the interaction block and the list
standardisation each document is scored on its own features; with either, documents of a list
meet, but without positions, so either way the scorer is permutation-equivariant over the list.
Batch norm, the list standardisation and attention see valid documents only, so padded slots never
change a valid document's score nor the moving averages. Padded slots score 0.

References: S. Bruch, M. Zoghi, M. Bendersky, M. Najork. "Revisiting Approximate Metric
Optimization in the Age of Deep Neural Networks". SIGIR 2019. Z. Qin, L. Yan, H. Zhuang, Y. Tay,
R. K. Pasumarthi, X. Wang, M. Bendersky, M. Najork. "Are Neural Rankers still Outperformed by
Gradient Boosted Decision Trees?". ICLR 2021.
"""

import math

import keras
from keras import ops

from tfapprox.missing_values import MissingValueFill, missing_values

__all__ = [
    "PRESETS",
    "RECIPES",
    "DNNScorer",
    "DocumentInteraction",
    "MaskedBatchNormalization",
    "QuantileTransform",
    "MAX_ATTENTION_PAIRS",
    "attends_within_lists",
    "build_scorer",
    "check_attention_pairs",
    "scores_depend_on_list",
    "standardize_within_lists",
    "symmetric_log1p",
]

# Hidden-layer widths of the B-nets: B<n> starts at n units and halves down to 16. LINEAR has no
# hidden layer: batch-normalised features and one Dense(1), a linear scorer (as in Chen et al. 2009).
PRESETS = {
    "LINEAR": (),
    "B64": (64, 32, 16),
    "B128": (128, 64, 32, 16),
    "B256": (256, 128, 64, 32, 16),
    "B512": (512, 256, 128, 64, 32, 16),
    "B1024": (1024, 512, 256, 128, 64, 32, 16),
}

# Scorer recipes beyond the B-nets' widths: DNNScorer arguments by name. DASALC (Qin et al., ICLR
# 2021): log1p-transformed, batch-normalised inputs with Gaussian noise, a B256 tower crossed with
# two layers of 2-head self-attention over the list (its widths cut from the paper's 1024 to fit
# the shared sets and a CPU). The noise's σ = 1.5 on the unit-variance inputs is the authors'
# default (TF-Ranking's research/dasalc.py; 4.5 for Yahoo!); the σ = 0.1 we had barely
# regularised (YAHOO, mean validation NDCG@10 of the five folds: .730 with it, .754 with 1.5).
RECIPES = {
    "DASALC": {
        "hidden_units": PRESETS["B256"],
        "input_transform": "log1p",
        "noise_stddev": 1.5,
        "attention_layers": 2,
        "attention_heads": 2,
        "attention_units": 64,
    },
}
INPUT_TRANSFORMS = ("none", "log1p", "quantile")


def symmetric_log1p(x):
    """Returns `sign(x) · ln(1 + |x|)` elementwise (Qin et al., ICLR 2021, §4.1)."""
    return ops.sign(x) * ops.log1p(ops.abs(x))


def standardize_within_lists(x, mask, epsilon=1e-3):
    """Returns each feature standardised over the valid documents of its list, 0 at padding:

        z_{q,d,f} = (x_{q,d,f} − μ_{q,f}) / √(σ²_{q,f} + ε),

    μ and σ² the mean and (biased) variance of feature f over list q's documents where `mask`
    `[B, L]` is True, or, for a `mask` `[B, L, F]` of the values present, over the documents where
    feature f is present (a missing value counts in no statistic and gives 0). A feature constant
    within a list gives 0 there. The list-level context a tree ensemble, scoring each document
    alone, cannot use (a document's value relative to the other candidates for the same query).
    """
    x = ops.cast(x, "float32")
    valid = ops.cast(mask, "bool")
    if len(valid.shape) == 2:
        valid = ops.expand_dims(valid, -1)
    count = ops.maximum(ops.sum(ops.cast(valid, "float32"), axis=1, keepdims=True), 1.0)
    mean = ops.sum(ops.where(valid, x, 0.0), axis=1, keepdims=True) / count
    centred = ops.where(valid, x - mean, 0.0)  # where(valid, ...): NaN at a missing value stays out
    variance = ops.sum(ops.square(centred), axis=1, keepdims=True) / count
    return centred * ops.rsqrt(variance + epsilon)


def split_inputs(inputs):
    """Returns `(features [B, L, F], mask bool [B, L])` from a dict or a bare feature tensor.

    A dict must hold `"features"` and may hold `"mask"` (True on real documents); without a mask,
    and for a bare tensor, every slot is valid.
    """
    if isinstance(inputs, dict):
        unknown = set(inputs) - {"features", "mask"}
        if "features" not in inputs or unknown:
            raise ValueError(
                "Scorer inputs must be a [B, L, F] tensor or a dict with keys 'features' and "
                f"optionally 'mask'; received keys {sorted(inputs)}."
            )
        features = inputs["features"]
        mask = inputs.get("mask")
    else:
        features, mask = inputs, None
    if len(features.shape) != 3:
        raise ValueError(
            f"Scorer features must have rank 3 [batch, list, features]; received shape "
            f"{tuple(features.shape)}."
        )
    if mask is None:
        mask = ops.ones(ops.shape(features)[:-1], dtype="bool")
    else:
        mask = ops.cast(mask, "bool")
    return features, mask


def _known_last_dimension(layer, input_shape, what):
    """Returns `input_shape[-1]`, or raises naming `layer` and `what` the dimension is if None."""
    if input_shape[-1] is None:
        raise ValueError(
            f"{layer.name}: {what} must be known; received input shape {tuple(input_shape)}."
        )
    return input_shape[-1]


@keras.saving.register_keras_serializable(package="tfapprox")
class MaskedBatchNormalization(keras.layers.Layer):
    """Batch normalisation whose batch moments cover only the positions where `mask` is True.

    In training, each channel is normalised with the mean and (biased) variance of the valid
    positions, and the moving averages follow them:
    `moving = momentum * moving + (1 - momentum) * batch_moment`. A batch with no valid position
    leaves the moving averages untouched. At inference the moving averages are used. Masked
    positions are normalised like the others but contribute nothing to any statistic.

    Unlike `keras.layers.BatchNormalization(...)(x, mask=...)`, the moments divide by the exact
    count of valid positions and an all-padding batch cannot drag the moving averages to zero.
    Statistics are computed in float32 whatever the compute dtype.

    Args:
        momentum: Weight of the old value in the moving averages, in [0, 1).
        epsilon: Added to the variance before the square root, > 0.
        center: Whether to learn an offset `beta`.
        scale: Whether to learn a scale `gamma`.
    """

    def __init__(self, momentum=0.99, epsilon=1e-3, center=True, scale=True, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); received momentum={momentum!r}.")
        if not epsilon > 0.0:
            raise ValueError(f"epsilon must be > 0; received epsilon={epsilon!r}.")
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.center = bool(center)
        self.scale = bool(scale)
        self.supports_masking = True

    def build(self, input_shape):
        shape = (_known_last_dimension(self, input_shape, "the last (channel) dimension"),)
        self.gamma = (
            self.add_weight(shape=shape, name="gamma", initializer="ones", autocast=False)
            if self.scale
            else None
        )
        self.beta = (
            self.add_weight(shape=shape, name="beta", initializer="zeros", autocast=False)
            if self.center
            else None
        )
        self.moving_mean = self.add_weight(
            shape=shape, name="moving_mean", initializer="zeros", trainable=False, autocast=False
        )
        self.moving_variance = self.add_weight(
            shape=shape, name="moving_variance", initializer="ones", trainable=False, autocast=False
        )

    def call(self, inputs, mask=None, training=False):
        x = ops.cast(inputs, "float32")
        if training:
            if mask is None:
                mask = ops.ones(ops.shape(x)[:-1], dtype="bool")
            mean, variance, count = self._masked_moments(x, ops.cast(mask, "bool"))
            has_valid = count > 0
            for moving, batch_value in (
                (self.moving_mean, mean),
                (self.moving_variance, variance),
            ):
                old = ops.convert_to_tensor(moving)
                updated = self.momentum * old + (1.0 - self.momentum) * batch_value
                moving.assign(ops.where(has_valid, updated, old))
        else:
            mean = ops.convert_to_tensor(self.moving_mean)
            variance = ops.convert_to_tensor(self.moving_variance)
        outputs = (x - mean) * ops.rsqrt(variance + self.epsilon)
        if self.scale:
            outputs = outputs * self.gamma
        if self.center:
            outputs = outputs + self.beta
        return ops.cast(outputs, self.compute_dtype)

    @staticmethod
    def _masked_moments(x, mask):
        """Returns per-channel `(mean, variance, count)` over the positions where `mask` is True."""
        axes = tuple(range(len(x.shape) - 1))
        valid = ops.expand_dims(mask, -1)
        count = ops.sum(ops.cast(mask, "float32"))
        denominator = ops.maximum(count, 1.0)
        mean = ops.sum(ops.where(valid, x, 0.0), axis=axes) / denominator
        squared_deviation = ops.where(valid, ops.square(x - mean), 0.0)
        variance = ops.sum(squared_deviation, axis=axes) / denominator
        return mean, variance, count

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
        }


@keras.saving.register_keras_serializable(package="tfapprox")
class QuantileTransform(keras.layers.Layer):
    """Maps each feature through its empirical distribution to a standard normal ("rank-Gauss"):

        z = Φ⁻¹(F̂(x)),   F̂(x) = Σ_i (p_{i+1} − p_i) · clip((x − q_i) / (q_{i+1} − q_i), 0, 1),

    `q_0 ≤ … ≤ q_{n−1}` the feature's quantiles at the evenly spaced levels `p_i = i / (n − 1)`,
    set by `adapt` from training documents, so F̂ interpolates the empirical CDF linearly between
    them. Where quantiles tie (a value many documents share, such as a missing feature's 0), the
    tied interval counts half for `x` equal to it, all for `x` above: the value gets its mid-rank.
    F̂ is clipped to [1/(2n), 1 − 1/(2n)] before Φ⁻¹, so the output lies within ±2.66 (n = 128).

    The transform is monotone per feature, so it keeps every feature's order and only changes
    spacing: what trees ignore and a network's first layers are sensitive to. Before `adapt` the
    quantiles are those of N(0, 1), so the layer roughly passes standard-normal inputs through.
    The quantiles are weights (not trained): checkpoints and exported models carry them. Cost per
    document: O(features × num_quantiles) elementwise.

    Args:
        num_quantiles: n, the number of quantiles per feature, >= 2.
    """

    CHUNK = 16  # quantile intervals per step of `call`

    def __init__(self, num_quantiles=128, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_quantiles, int) or num_quantiles < 2:
            raise ValueError(
                f"num_quantiles must be an integer >= 2; received num_quantiles={num_quantiles!r}."
            )
        self.num_quantiles = num_quantiles

    def build(self, input_shape):
        channels = _known_last_dimension(self, input_shape, "the feature dimension")
        normal = self._normal_quantiles()
        self.quantiles = self.add_weight(
            shape=(self.num_quantiles, channels), name="quantiles", trainable=False,
            initializer=lambda shape, dtype=None: ops.tile(ops.expand_dims(normal, 1), [1, shape[1]]),
            autocast=False,
        )

    def _normal_quantiles(self):
        levels = ops.linspace(0.0, 1.0, self.num_quantiles)
        tail = 0.5 / self.num_quantiles
        return _standard_normal_quantile(ops.clip(levels, tail, 1.0 - tail))

    def adapt(self, features, mask=None, ignore_missing=False):
        """Sets each feature's quantiles from `features` `[..., F]` (a NumPy-convertible array),
        counting only the positions where `mask` `[...]` is True; with `ignore_missing`, only the
        values that are not NaN (a feature with none keeps its quantiles). Returns the layer."""
        import numpy as np

        features = np.asarray(features, np.float64)
        if not self.built:
            self.build(features.shape)
        if features.shape[-1] != self.quantiles.shape[1]:
            raise ValueError(
                f"{self.name}: adapt got {features.shape[-1]} features, the layer has "
                f"{self.quantiles.shape[1]}."
            )
        rows = features.reshape(-1, features.shape[-1])
        if mask is not None:
            rows = rows[np.asarray(mask, bool).reshape(-1)]
        if not len(rows):
            raise ValueError(f"{self.name}: adapt got no valid document.")
        bad = np.isinf(rows) if ignore_missing else ~np.isfinite(rows)
        if bad.any():
            raise ValueError(
                f"{self.name}: adapt got {int(bad.sum())} non-finite feature values (NaN or "
                f"inf) in {int(bad.any(axis=1).sum())} of {len(rows)} valid documents."
            )
        levels = np.linspace(0.0, 1.0, self.num_quantiles)
        nan = np.isnan(rows)
        if nan.any():
            quantiles = np.array(self.quantiles, np.float64)
            for f in range(rows.shape[1]):
                if not nan[:, f].all():
                    quantiles[:, f] = np.quantile(rows[~nan[:, f], f], levels)
        else:
            quantiles = np.quantile(rows, levels, axis=0)
        self.quantiles.assign(quantiles.astype("float32"))
        return self

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        q = ops.convert_to_tensor(self.quantiles)
        lows, widths = q[:-1], q[1:] - q[:-1]
        spread = widths > 0
        scale = 1.0 / ops.where(spread, widths, 1.0)
        cdf = ops.zeros_like(x)
        # intervals a chunk at a time: [B, L, chunk, F] at most, few ops for graph mode
        for start in range(0, self.num_quantiles - 1, self.CHUNK):
            part = slice(start, start + self.CHUNK)
            offset = ops.expand_dims(x, -2) - lows[part]
            inside = ops.clip(offset * scale[part], 0.0, 1.0)
            tied = 0.5 + 0.5 * ops.sign(offset)
            cdf = cdf + ops.sum(ops.where(spread[part], inside, tied), axis=-2)
        cdf = cdf / (self.num_quantiles - 1)
        tail = 0.5 / self.num_quantiles
        return ops.cast(_standard_normal_quantile(ops.clip(cdf, tail, 1.0 - tail)),
                        self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_quantiles": self.num_quantiles}


def _standard_normal_quantile(p):
    """Φ⁻¹(p) = √2 · erfinv(2p − 1)."""
    return 2.0**0.5 * ops.erfinv(2.0 * p - 1.0)


@keras.saving.register_keras_serializable(package="tfapprox")
class DocumentInteraction(keras.layers.Layer):
    """Returns `[B, L, units]` per-document encodings that have attended to the other documents of
    their list: DASALC's document-interaction network (Qin et al., ICLR 2021, §4.3).

    `x = Dense(units)(inputs)`, then `layers` times a Transformer encoder block without positions:
    `x = LayerNorm(x + Dropout(MultiHeadAttention(x, x)))`, `x = LayerNorm(x + FFN(x))` with
    `FFN = Dense(units, relu) -> Dense(units)`. Padded documents are masked as keys (no valid
    document attends to them) and as queries (their rows are zeroed after every block), so padding
    never reaches a valid document. Without positional encodings the block is permutation-
    equivariant over the list. Cost is O(L²) per list and head.

    Args:
        units: Width of the encodings (divisible by `heads`).
        layers: Number of stacked blocks, >= 1.
        heads: Attention heads per block, >= 1.
        dropout: Dropout rate inside the blocks, in [0, 1).
    """

    def __init__(self, units=64, layers=1, heads=2, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("units", units), ("layers", layers), ("heads", heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; received {name}={value!r}.")
        if units % heads:
            raise ValueError(
                f"units must be divisible by heads; received units={units!r}, heads={heads!r}."
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); received dropout={dropout!r}.")
        self.units, self.layers, self.heads, self.dropout = units, layers, heads, float(dropout)
        self.supports_masking = True
        self.projection = keras.layers.Dense(units, name="projection")
        # One list per kind of sublayer (Keras tracks lists of layers), index i for block i.
        self.attentions = [
            keras.layers.MultiHeadAttention(
                heads, units // heads, dropout=self.dropout, name=f"attention_{i}"
            )
            for i in range(layers)
        ]
        self.attention_dropouts = [
            keras.layers.Dropout(self.dropout, name=f"dropout_{i}") for i in range(layers)
        ]
        self.attention_norms = [
            keras.layers.LayerNormalization(name=f"attention_norm_{i}") for i in range(layers)
        ]
        self.ffn_hidden = [
            keras.layers.Dense(units, activation="relu", name=f"ffn_hidden_{i}")
            for i in range(layers)
        ]
        self.ffn_output = [keras.layers.Dense(units, name=f"ffn_output_{i}") for i in range(layers)]
        self.ffn_norms = [
            keras.layers.LayerNormalization(name=f"ffn_norm_{i}") for i in range(layers)
        ]

    def build(self, input_shape):
        self.projection.build(input_shape)
        shape = (None, None, self.units)
        for attention in self.attentions:
            attention.build(shape, shape)
        for layer in self.attention_norms + self.ffn_hidden + self.ffn_output + self.ffn_norms:
            layer.build(shape)

    def call(self, inputs, mask, training=False):
        valid = ops.expand_dims(ops.cast(mask, "bool"), -1)  # [B, L, 1] queries
        attends = ops.logical_and(valid, ops.expand_dims(ops.cast(mask, "bool"), 1))  # [B, L, L]
        x = self.projection(inputs)
        for i in range(self.layers):
            attended = self.attentions[i](x, x, attention_mask=attends, training=training)
            attended = self.attention_dropouts[i](attended, training=training)
            x = self.attention_norms[i](x + attended)
            x = self.ffn_norms[i](x + self.ffn_output[i](self.ffn_hidden[i](x)))
            x = ops.where(valid, x, ops.zeros_like(x))
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "layers": self.layers,
            "heads": self.heads,
            "dropout": self.dropout,
        }


# The default bound on the document pairs (lists × L², L the padded list length) one call of a
# model whose documents attend to each other may take: each attention block holds [lists, heads,
# L, L] grids (docs/benchmarks.md measures DASALC's memory by list length).
MAX_ATTENTION_PAIRS = 2**26


def _sublayers(model):
    """Yields `model` and every layer inside it, at any depth."""
    return model._flatten_layers(include_self=True, recursive=True)


def attends_within_lists(model):
    """Whether documents of a list attend to each other in `model` (a `MultiHeadAttention` at any
    depth, as in `DocumentInteraction`), so one list of L documents costs O(L²) memory."""
    return any(isinstance(layer, keras.layers.MultiHeadAttention) for layer in _sublayers(model))


def scores_depend_on_list(model):
    """Whether a document's score from `model` depends on the other documents of its list: they
    attend to each other (`attends_within_lists`), or a `DNNScorer` inside standardises features
    within the list (`list_standardize`), as in an ensemble holding such a scorer."""
    return attends_within_lists(model) or any(
        getattr(layer, "list_standardize", False) for layer in _sublayers(model)
    )


def check_attention_pairs(model, lists, length, max_pairs, where, advice=""):
    """Raises ValueError, naming `where` (and ending with `advice`), if `model`'s documents attend
    to each other and `lists` lists of `length` documents exceed `max_pairs` document pairs
    (lists × length²)."""
    pairs = lists * length * length
    if pairs > max_pairs and attends_within_lists(model):
        longest = math.isqrt(max_pairs // lists)
        raise ValueError(
            f"{where}: lists of {length} documents, {lists} at a time, are "
            f"{lists} × {length}² = {pairs} document pairs for the model's attention over "
            f"each list, above the bound of {max_pairs} pairs; lists of at most {longest} "
            f"documents fit ({lists} at a time){': use ' + advice if advice else ''}"
        )


@keras.saving.register_keras_serializable(package="tfapprox")
class DNNScorer(keras.Model):
    """Returns scores `[B, L]` for padded lists of documents, one feed-forward pass per document.

    Architecture (Bruch et al., SIGIR 2019): batch norm on the raw features, then for each width
    in `hidden_units` a block Dense (no bias: the batch norm's beta replaces it) -> batch norm ->
    ReLU -> dropout, then Dense(1). Every batch norm is a `MaskedBatchNormalization`, so padded
    slots never enter batch statistics or moving averages. Padded features are replaced by zeros
    before the first layer (NaN or inf there cannot reach a gradient) and padded slots score 0.

    DASALC's additions (Qin et al., ICLR 2021), each off by default: `input_transform="log1p"`
    applies `symmetric_log1p` before the input batch norm; `list_standardize=True` appends to
    the (transformed) features each of them standardised within its list
    (`standardize_within_lists`), so 2F inputs go on; `noise_stddev > 0` adds Gaussian noise
    `N(0, σ²)` to the (transformed, normalised) inputs in training only; `attention_layers > 0`
    runs a `DocumentInteraction` block on those inputs, projects its output `a` to the tower's
    last width and crosses it into the tower's output `h` as `(1 + a) ⊙ h` (latent cross) before
    Dense(1).

    Missing values: with `handles_missing=True` a NaN feature value of a real document is
    missing. It stays out of the input transform, of `adapt`'s quantiles and of the list
    standardisation's statistics (its standardised value is 0), and `MissingValueFill` replaces
    it by the feature's learned fill value and appends a missing indicator per feature (F more
    inputs), so no NaN reaches any layer or batch statistic. Without it a NaN feature value
    makes that document's score NaN.

    Inputs are `{"features": float [B, L, F], "mask": bool [B, L]}` (mask optional) or a bare
    `[B, L, F]` tensor in which every slot is valid. The output layer runs in float32, so scores
    are float32 under a mixed-precision policy too.

    Args:
        hidden_units: Widths of the hidden blocks, e.g. `PRESETS["B1024"]`; may be empty.
        dropout: Dropout rate after each hidden block's ReLU, in [0, 1).
        batch_norm_momentum: Momentum of every batch norm's moving averages, in [0, 1).
        batch_norm_epsilon: Epsilon of every batch norm, > 0.
        input_batch_norm: Whether to batch-normalise the (transformed) features.
        input_transform: `"none"`, `"log1p"` (`sign(x) · ln(1 + |x|)`) or `"quantile"` (each
            feature through its training quantiles to N(0, 1), `QuantileTransform`: call
            `adapt` on training documents before training), before the batch norm.
        list_standardize: Whether to append each (transformed) feature standardised within its
            list. Like the attention, it makes a document's score depend on its list.
        noise_stddev: σ of the Gaussian noise added to the inputs in training, >= 0 (0: none).
        attention_layers: Stacked self-attention blocks over the list, >= 0 (0: none).
        attention_heads: Heads per attention block.
        attention_units: Width of the attention blocks (divisible by `attention_heads`).
        handles_missing: Whether NaN feature values are missing values (see above); the model's
            attribute of that name says so to exports and serving.
    """

    def __init__(
        self,
        hidden_units,
        dropout=0.0,
        batch_norm_momentum=0.99,
        batch_norm_epsilon=1e-3,
        input_batch_norm=True,
        input_transform="none",
        list_standardize=False,
        noise_stddev=0.0,
        attention_layers=0,
        attention_heads=2,
        attention_units=64,
        handles_missing=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        hidden_units = tuple(hidden_units)
        if not all(isinstance(u, int) and not isinstance(u, bool) and u > 0 for u in hidden_units):
            raise ValueError(
                f"hidden_units must be positive integers; received hidden_units={hidden_units!r}."
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); received dropout={dropout!r}.")
        self.hidden_units = hidden_units
        self.dropout = float(dropout)
        self.batch_norm_momentum = float(batch_norm_momentum)
        self.batch_norm_epsilon = float(batch_norm_epsilon)
        self.input_batch_norm = bool(input_batch_norm)
        if input_transform not in INPUT_TRANSFORMS:
            raise ValueError(
                f"input_transform must be one of {INPUT_TRANSFORMS}; received "
                f"input_transform={input_transform!r}."
            )
        if not noise_stddev >= 0.0:
            raise ValueError(f"noise_stddev must be >= 0; received noise_stddev={noise_stddev!r}.")
        if not isinstance(attention_layers, int) or attention_layers < 0:
            raise ValueError(
                f"attention_layers must be an integer >= 0; received "
                f"attention_layers={attention_layers!r}."
            )
        self.input_transform = input_transform
        self.list_standardize = bool(list_standardize)
        self.noise_stddev = float(noise_stddev)
        self.attention_layers = attention_layers
        self.attention_heads = attention_heads
        self.attention_units = attention_units
        self.handles_missing = bool(handles_missing)

        def batch_norm(name):
            return MaskedBatchNormalization(
                momentum=self.batch_norm_momentum, epsilon=self.batch_norm_epsilon, name=name
            )

        self.quantile = (QuantileTransform(name="input_quantiles")
                         if input_transform == "quantile" else None)
        self.missing_fill = MissingValueFill(name="missing_fill") if self.handles_missing else None
        self.input_norm = batch_norm("input_batch_norm") if self.input_batch_norm else None
        self.hidden_dense, self.hidden_norms, self.dropouts = [], [], []
        for i, units in enumerate(hidden_units):
            self.hidden_dense.append(keras.layers.Dense(units, use_bias=False, name=f"dense_{i}"))
            self.hidden_norms.append(batch_norm(f"batch_norm_{i}"))
            self.dropouts.append(keras.layers.Dropout(self.dropout, name=f"dropout_{i}"))
        # Drawn here, not by keras.layers.GaussianNoise: that layer refuses σ > 1, and DASALC's σ
        # on the normalised inputs is 1.5 (Web30K) to 4.5 (Yahoo!).
        self.noise_seed = (
            keras.random.SeedGenerator(name="input_noise_seed") if self.noise_stddev > 0 else None
        )
        if attention_layers:
            self.interaction = DocumentInteraction(
                units=attention_units,
                layers=attention_layers,
                heads=attention_heads,
                dropout=self.dropout,
                name="document_interaction",
            )
            self.cross = None  # Dense(tower width), made in build: the width may be F
        else:
            self.interaction = self.cross = None
        self.output_dense = keras.layers.Dense(1, dtype="float32", name="score")

    def build(self, input_shape):
        feature_shape = input_shape["features"] if isinstance(input_shape, dict) else input_shape
        num_features = feature_shape[-1]
        if num_features is None:
            raise ValueError(
                "DNNScorer needs a known feature dimension; received features shape "
                f"{tuple(feature_shape)}."
            )
        if self.quantile is not None and not self.quantile.built:  # adapt may have built it
            self.quantile.build((None, None, num_features))
        if self.missing_fill is not None:
            self.missing_fill.build((None, None, num_features))
        width = num_features * (1 + self.list_standardize + self.handles_missing)
        if self.input_norm is not None:
            self.input_norm.build((None, None, width))
        if self.interaction is not None:
            self.interaction.build((None, None, width))
            self.cross = keras.layers.Dense(
                self.hidden_units[-1] if self.hidden_units else width, name="latent_cross"
            )
            self.cross.build((None, None, self.attention_units))
        for dense, norm in zip(self.hidden_dense, self.hidden_norms):
            dense.build((None, None, width))
            width = dense.units
            norm.build((None, None, width))
        self.output_dense.build((None, None, width))

    def call(self, inputs, training=False):
        features, mask = split_inputs(inputs)
        if self.handles_missing:
            present, missing = missing_values(features, mask)
        else:
            present = ops.expand_dims(mask, -1)
        x = ops.where(present, features, ops.zeros_like(features))
        if self.input_transform == "log1p":
            x = symmetric_log1p(x)
        elif self.quantile is not None:
            x = self.quantile(x)
        standardized = None
        if self.list_standardize:
            standardized = standardize_within_lists(x, present if self.handles_missing else mask)
        if self.missing_fill is not None:
            x = self.missing_fill(x, missing)
        if standardized is not None:
            x = ops.concatenate([ops.cast(x, "float32"), standardized], -1)
        if self.input_norm is not None:
            x = self.input_norm(x, mask=mask, training=training)
        if training and self.noise_seed is not None:
            x = x + keras.random.normal(
                ops.shape(x), stddev=self.noise_stddev, dtype=x.dtype, seed=self.noise_seed
            )
        inputs = x
        for dense, norm, dropout in zip(self.hidden_dense, self.hidden_norms, self.dropouts):
            x = dense(x)
            x = norm(x, mask=mask, training=training)
            x = ops.relu(x)
            x = dropout(x, training=training)
        if self.interaction is not None:
            interactions = self.interaction(inputs, mask=mask, training=training)
            x = (1.0 + self.cross(interactions)) * x
        scores = ops.squeeze(self.output_dense(x), axis=-1)
        return ops.where(mask, scores, ops.zeros_like(scores))

    def adapt(self, features, mask=None):
        """Fits the input transform to training documents (`features` `[..., F]`, `mask` `[...]`):
        the quantiles of `input_transform="quantile"` (of the values present, with
        `handles_missing`); nothing for the other transforms."""
        if self.quantile is not None:
            self.quantile.adapt(features, mask, ignore_missing=self.handles_missing)

    def compute_output_shape(self, input_shape):
        feature_shape = input_shape["features"] if isinstance(input_shape, dict) else input_shape
        return tuple(feature_shape[:-1])

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_units": list(self.hidden_units),
            "dropout": self.dropout,
            "batch_norm_momentum": self.batch_norm_momentum,
            "batch_norm_epsilon": self.batch_norm_epsilon,
            "input_batch_norm": self.input_batch_norm,
            "input_transform": self.input_transform,
            "list_standardize": self.list_standardize,
            "noise_stddev": self.noise_stddev,
            "attention_layers": self.attention_layers,
            "attention_heads": self.attention_heads,
            "attention_units": self.attention_units,
            "handles_missing": self.handles_missing,
        }


def build_scorer(preset="B1024", **kwargs):
    """Returns a `DNNScorer` with the hidden widths of `preset` (a key of `PRESETS`) or the
    arguments of a recipe (a key of `RECIPES`, e.g. `"dasalc"`).

    `preset` is case-insensitive; `kwargs` go to `DNNScorer` (dropout, batch_norm_momentum,
    input_transform, ...) and override a recipe's arguments.
    """
    key = str(preset).upper()
    if key in RECIPES:
        arguments = dict(RECIPES[key])
    elif key in PRESETS:
        arguments = {"hidden_units": PRESETS[key]}
    else:
        raise ValueError(
            f"preset must be one of {sorted(PRESETS) + sorted(RECIPES)}; received "
            f"preset={preset!r}."
        )
    arguments.setdefault("name", f"dnn_scorer_{key.lower()}")
    return DNNScorer(**{**arguments, **kwargs})
