"""The deep batch-norm scorer of Bruch et al. (SIGIR 2019) and its padding-safe batch norm.

A scorer maps a batch of padded lists to one score per document:

    {"features": float32 [B, L, F], "mask": bool [B, L]}  (or a bare [B, L, F] tensor)
        -> scores float32 [B, L]

Each document is scored on its own features only, so the scorer is permutation-equivariant over
the list. The one place where documents meet is batch normalisation; `MaskedBatchNormalization`
computes its batch moments over the valid documents only, so padded slots never change a valid
document's score nor the moving averages. Padded slots get score 0.

Reference: S. Bruch, M. Zoghi, M. Bendersky, M. Najork. "Revisiting Approximate Metric
Optimization in the Age of Deep Neural Networks". SIGIR 2019.
"""

import keras
from keras import ops

__all__ = ["PRESETS", "DNNScorer", "MaskedBatchNormalization", "build_scorer"]

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


def _split_inputs(inputs):
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
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                f"{self.name}: the last (channel) dimension must be known; received input shape "
                f"{tuple(input_shape)}."
            )
        shape = (channels,)
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
class DNNScorer(keras.Model):
    """Returns scores `[B, L]` for padded lists of documents, one feed-forward pass per document.

    Architecture (Bruch et al., SIGIR 2019): batch norm on the raw features, then for each width
    in `hidden_units` a block Dense (no bias: the batch norm's beta replaces it) -> batch norm ->
    ReLU -> dropout, then Dense(1). Every batch norm is a `MaskedBatchNormalization`, so padded
    slots never enter batch statistics or moving averages. Padded features are replaced by zeros
    before the first layer (NaN or inf there cannot reach a gradient) and padded slots score 0.

    Inputs are `{"features": float [B, L, F], "mask": bool [B, L]}` (mask optional) or a bare
    `[B, L, F]` tensor in which every slot is valid. The output layer runs in float32, so scores
    are float32 under a mixed-precision policy too.

    Args:
        hidden_units: Widths of the hidden blocks, e.g. `PRESETS["B1024"]`; may be empty.
        dropout: Dropout rate after each hidden block's ReLU, in [0, 1).
        batch_norm_momentum: Momentum of every batch norm's moving averages, in [0, 1).
        batch_norm_epsilon: Epsilon of every batch norm, > 0.
        input_batch_norm: Whether to batch-normalise the raw features.
    """

    def __init__(
        self,
        hidden_units,
        dropout=0.0,
        batch_norm_momentum=0.99,
        batch_norm_epsilon=1e-3,
        input_batch_norm=True,
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

        def batch_norm(name):
            return MaskedBatchNormalization(
                momentum=self.batch_norm_momentum, epsilon=self.batch_norm_epsilon, name=name
            )

        self.input_norm = batch_norm("input_batch_norm") if self.input_batch_norm else None
        self.hidden_dense, self.hidden_norms, self.dropouts = [], [], []
        for i, units in enumerate(hidden_units):
            self.hidden_dense.append(keras.layers.Dense(units, use_bias=False, name=f"dense_{i}"))
            self.hidden_norms.append(batch_norm(f"batch_norm_{i}"))
            self.dropouts.append(keras.layers.Dropout(self.dropout, name=f"dropout_{i}"))
        self.output_dense = keras.layers.Dense(1, dtype="float32", name="score")

    def build(self, input_shape):
        feature_shape = input_shape["features"] if isinstance(input_shape, dict) else input_shape
        num_features = feature_shape[-1]
        if num_features is None:
            raise ValueError(
                "DNNScorer needs a known feature dimension; received features shape "
                f"{tuple(feature_shape)}."
            )
        width = num_features
        if self.input_norm is not None:
            self.input_norm.build((None, None, width))
        for dense, norm in zip(self.hidden_dense, self.hidden_norms):
            dense.build((None, None, width))
            width = dense.units
            norm.build((None, None, width))
        self.output_dense.build((None, None, width))

    def call(self, inputs, training=False):
        features, mask = _split_inputs(inputs)
        valid = ops.expand_dims(mask, -1)
        x = ops.where(valid, features, ops.zeros_like(features))
        if self.input_norm is not None:
            x = self.input_norm(x, mask=mask, training=training)
        for dense, norm, dropout in zip(self.hidden_dense, self.hidden_norms, self.dropouts):
            x = dense(x)
            x = norm(x, mask=mask, training=training)
            x = ops.relu(x)
            x = dropout(x, training=training)
        scores = ops.squeeze(self.output_dense(x), axis=-1)
        return ops.where(mask, scores, ops.zeros_like(scores))

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
        }


def build_scorer(preset="B1024", **kwargs):
    """Returns a `DNNScorer` with the hidden widths of `preset` (a key of `PRESETS`).

    `preset` is case-insensitive; `kwargs` go to `DNNScorer` (dropout, batch_norm_momentum, ...).
    """
    key = str(preset).upper()
    if key not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}; received preset={preset!r}.")
    kwargs.setdefault("name", f"dnn_scorer_{key.lower()}")
    return DNNScorer(hidden_units=PRESETS[key], **kwargs)
