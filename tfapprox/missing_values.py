"""Missing feature values (NaN) in a scorer's input: a learned fill value per feature and a missing
indicator, as a tree ensemble's learned default branch lets a missing value count as whatever
helps the ranking.

A value is missing where a real document's feature is NaN (`NULL` or `nan` in LETOR text, see
docs/data.md). `missing_values` finds them; `MissingValueFill` replaces each by its feature's
learned fill value c_f and appends the indicator m_{d,f} ∈ {0, 1}:

    x̃_{d,f} = (1 − m_{d,f}) · x_{d,f} + m_{d,f} · c_f,    inputs [x̃, m]  (2F values per document).

So a missing value reaches the network neither as NaN nor as a silent 0, and the network can
weigh "missing" on its own (the indicator) and as a value (the fill, trained with the network).
"""

import keras
from keras import ops


def missing_values(features, mask):
    """Returns `(present, missing)`, bool `[B, L, F]`: where a real document's (`mask` `[B, L]`)
    feature is a number, and where it is NaN. Padded slots are in neither."""
    valid = ops.expand_dims(ops.cast(mask, "bool"), -1)
    nan = ops.isnan(features)
    return ops.logical_and(valid, ops.logical_not(nan)), ops.logical_and(valid, nan)


@keras.saving.register_keras_serializable(package="tfapprox")
class MissingValueFill(keras.layers.Layer):
    """Returns `[x̃, m]` `[..., 2F]`: `inputs` `[..., F]` with each value where `missing` is True
    replaced by its feature's learned fill value (a weight, initially 0), then the missing
    indicators as 0/1 floats. Values where `missing` is False pass as they are (they must be
    finite: replace NaN at padded slots before)."""

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(
                f"{self.name}: the feature dimension must be known; received input shape "
                f"{tuple(input_shape)}."
            )
        self.fill = self.add_weight(shape=(input_shape[-1],), name="fill", initializer="zeros")

    def call(self, inputs, missing):
        x = ops.cast(inputs, self.compute_dtype)
        filled = ops.where(missing, ops.cast(self.fill, x.dtype), x)
        return ops.concatenate([filled, ops.cast(missing, x.dtype)], axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (2 * input_shape[-1],)
