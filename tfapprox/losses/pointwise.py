"""Pointwise losses: each document's score against its own label, averaged over the real
documents of a list (TF-Ranking's `SigmoidCrossEntropyLoss` and `MeanSquaredLoss`).

TF-Ranking's Keras reduction divides the batch's summed document losses by B·L, padded slots
included; ours is the mean over each list's real documents, then over the lists that have a loss
(`tfapprox.losses.base`), so a list whose real labels are all equal contributes nothing here
either.
"""

import keras
from keras import ops

from tfapprox import ops as rank_ops
from tfapprox.losses import base


class _PointwiseLoss(base.RankingLoss):
    """Mean over the real documents of `document_losses(labels, scores)` `[B, L]`."""

    def document_losses(self, labels, scores):
        raise NotImplementedError

    def per_list(self, labels, mask, scores):
        losses = ops.where(mask, self.document_losses(labels, scores), 0.0)
        return rank_ops.safe_divide(ops.sum(losses, axis=-1), rank_ops.count_per_list(mask)), None


@keras.saving.register_keras_serializable(package="tfapprox")
class SigmoidCrossEntropyLoss(_PointwiseLoss):
    """Sigmoid cross-entropy of each document, labels in [0, 1] as probabilities of relevance:

        loss = (1/n) Σ_i [ −l_i·ln σ(s_i/T) − (1 − l_i)·ln(1 − σ(s_i/T)) ],

    n the list's real documents, T = `temperature`."""

    def __init__(self, temperature=1.0, reduction="sum_over_batch_size",
                 name="sigmoid_cross_entropy_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.temperature = base.check_positive("temperature", temperature)

    def document_losses(self, labels, scores):
        logits = scores / self.temperature  # ln(1 + e^x) − l·x, stable for any x
        return ops.softplus(logits) - labels * logits

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


@keras.saving.register_keras_serializable(package="tfapprox")
class MeanSquaredLoss(_PointwiseLoss):
    """Squared error of each score against its label: loss = (1/n) Σ_i (l_i − s_i)²."""

    def __init__(self, reduction="sum_over_batch_size", name="mean_squared_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)

    def document_losses(self, labels, scores):
        return ops.square(labels - scores)
