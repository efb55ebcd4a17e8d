"""Pointwise losses: each document's score against its own label, averaged over the real
documents of a list (TF-Ranking's `SigmoidCrossEntropyLoss`, `MeanSquaredLoss` and
`OrdinalLoss`).

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


@keras.saving.register_keras_serializable(package="tfapprox")
class OrdinalLoss(_PointwiseLoss):
    """Ordinal regression by K = `ordinal_size` binary classifiers, one per grade: the scorer
    emits K logits per document, `y_pred` `[B, L, K]` (`[B, L]` when K = 1), s_{i,j} that of
    the event y_i ≥ j, and

        loss = (1/n) Σ_i Σ_{j=1}^{K} [ −o_{i,j}·ln σ(s_{i,j}) − (1 − o_{i,j})·ln(1 − σ(s_{i,j})) ],

    o_{i,j} = 1{y_i ≥ j}, or with `use_fraction_label` min(max(y_i − j + 1, 0), 1) (a label 1.2
    is [1, 0.2] for K = 2, [1, 0] without), n the list's real documents. This is the extended
    binary classification of Li & Lin (NIPS 2006, §2: one threshold classifier per rank, trained
    on the labels' cumulative indicators), TF-Ranking's `OrdinalLoss` (whose docstring cites no
    paper; its Keras class takes no `temperature`). Labels above K count as K.

    σ(s_{i,j}) estimates P(y_i ≥ j), so a document's ranking score is its expected label
    E[min(y_i, K)] = Σ_j σ(s_{i,j}) (`expected_labels`), as McRank ranks by expected relevance
    (Li, Burges & Wu, NIPS 2007, eq. 4). TF-Ranking leaves the score to the user.
    """

    def __init__(self, ordinal_size=1, use_fraction_label=False,
                 reduction="sum_over_batch_size", name="ordinal_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)
        self.ordinal_size = base.check_cutoff("ordinal_size", ordinal_size, allow_none=False)
        self.use_fraction_label = bool(use_fraction_label)

    def standardize(self, y_true, y_pred):
        return rank_ops.standardize(y_true, y_pred, ragged=self.ragged, outputs=self.ordinal_size)

    def document_losses(self, labels, scores):
        excess = ops.expand_dims(labels, -1) - ops.arange(self.ordinal_size, dtype=scores.dtype)
        if self.use_fraction_label:  # y − (j − 1), clipped to [0, 1]
            targets = ops.clip(excess, 0.0, 1.0)
        else:  # 1{y ≥ j}
            targets = ops.cast(excess >= 1.0, scores.dtype)
        return ops.sum(ops.softplus(scores) - targets * scores, axis=-1)

    @staticmethod
    def expected_labels(logits):
        """Returns each document's expected label Σ_j σ(s_{i,j}), `[B, L]`, from its ordinal
        logits `[B, L, K]`: the score to rank (and serve) by."""
        return ops.sum(ops.sigmoid(logits), axis=-1)

    def get_config(self):
        return {**super().get_config(), "ordinal_size": self.ordinal_size,
                "use_fraction_label": self.use_fraction_label}
