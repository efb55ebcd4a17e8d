"""The one base class of every tfapprox loss, and the checks of its arguments.

Inputs, for every loss: `y_true` is `[B, L]` graded labels (a label < 0 marks a padded slot) or a
dict `{"labels": [B, L], "mask": [B, L]}`; `y_pred` is `[B, L]` or `[B, L, 1]` scores. Padded slots
never influence a value or a gradient, and may hold anything, NaN included.

Each loss first computes one value per list. A list for which the loss is undefined — no relevant
document, or fewer than two comparable documents for a pairwise loss — contributes 0 and a zero
gradient; so does a list whose real documents all have the same label, for every loss: each order
of it is ideal, so it has nothing to teach (the smooth losses — ApproxNDCG, ApproxAP, Approx P@k,
SoftRank — would otherwise push its scores apart, and ListMLE toward an arbitrary order); and so
does a batch of no lists or of empty lists. A NaN label or a NaN score on a real document makes
its list's loss NaN (the label is not taken for padding), so `keras.callbacks.TerminateOnNaN`
stops training. Labels of 128 and more (2^128 overflows float32) are fine: see
`tfapprox.ops.gains`. Reductions:

- `"sum_over_batch_size"` (default; `"mean"` is the same): the mean over the lists that *have* a
  loss, weighted by `sample_weight` (one weight ≥ 0 per list, `tfapprox.ops.list_weights`) when
  given. Lists without a loss do not dilute the mean, unlike TF-Ranking's default. Under a
  tf.distribute strategy with N replicas each replica's mean is divided by N, as Keras' own mean
  reductions do.
- `"sum"`: the weighted sum over lists.
- `None` or `"none"`: one value per list, `[B]`.
"""

import functools
import inspect
import math

import keras
from keras import ops

from tfapprox import ops as rank_ops
from tfapprox import pair_sums

REDUCTIONS = ("sum_over_batch_size", "mean", "sum", "none", None)


def check_positive(name, value):
    """Returns `value` as a float, or raises ValueError unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be a finite number > 0; got {value!r}")
    return float(value)


def check_nonnegative(name, value):
    """Returns `value` as a float, or raises ValueError unless it is a finite number ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise ValueError(f"`{name}` must be a finite number >= 0; got {value!r}")
    return float(value)


def check_cutoff(name, value, allow_none=True):
    """Returns `value`, or raises ValueError unless it is an int ≥ 1 (or None if allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "None or an int >= 1" if allow_none else "an int >= 1"
        raise ValueError(f"`{name}` must be {expected}; got {value!r}")
    return value


def check_pairwise(value):
    """Returns `value`, or raises ValueError unless it is one of `pair_sums.PAIRWISE_MODES`."""
    if value not in pair_sums.PAIRWISE_MODES:
        raise ValueError(f"`pairwise` must be one of {pair_sums.PAIRWISE_MODES}; got {value!r}")
    return value


def check_threshold(value):
    """Returns `relevance_threshold` as a float, or raises ValueError unless it is finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"`relevance_threshold` must be a finite number; got {value!r}")
    return float(value)


def check_seed(value, allow_none=False):
    """Returns `seed`, or raises ValueError unless it is an int (or None if allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`seed` must be {'None or ' if allow_none else ''}an int; got {value!r}")
    return value


def slope(alpha, temperature):
    """Returns the sigmoid slope α of an Approx loss given as `alpha` or as TF-Ranking's
    `temperature` = 1/α (not both)."""
    if temperature is None:
        return check_positive("alpha", alpha)
    return 1.0 / check_positive("temperature", temperature)


class RankingLoss(keras.losses.Loss):
    """Base class: standardises inputs, asks the subclass for per-list values, reduces them.

    Every loss also takes `ragged=True` (keyword only), as TF-Ranking's do: labels and scores may
    then be `tf.RaggedTensor` `[B, (L)]`, made dense in one place (`tfapprox.ops.dense_lists`)."""

    def __init__(self, reduction="sum_over_batch_size", name=None, dtype=None):
        if reduction not in REDUCTIONS:
            raise ValueError(f"`reduction` must be one of {REDUCTIONS}; got {reduction!r}")
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.ragged = False

    def __init_subclass__(cls, **kwargs):
        """Gives each subclass's constructor the keyword `ragged`, so no constructor repeats it."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def init_taking_ragged(self, *args, ragged=False, **kwargs):
            init(self, *args, **kwargs)
            self.ragged = bool(ragged)

        init_taking_ragged.__signature__ = _with_ragged(inspect.signature(init))
        cls.__init__ = init_taking_ragged

    def get_config(self):
        return {**super().get_config(), **({"ragged": True} if self.ragged else {})}

    def standardize(self, y_true, y_pred):
        """Returns `(labels, mask, scores)` (`tfapprox.ops.standardize`)."""
        return rank_ops.standardize(y_true, y_pred, ragged=self.ragged)

    def per_list(self, labels, mask, scores):
        """Returns `(loss [B], has_loss [B] bool)` from standardised inputs; `has_loss` None
        means every list with two different labels (`has_label_pairs`) has a loss: real labels
        being ≥ 0, such a list also has a document with label > 0."""
        raise NotImplementedError

    def losses_and_flags(self, y_true, y_pred):
        """Returns the loss of each list (0 where it has none, NaN where a real document's label
        or score is NaN) and whether it has one, `[B]`. A list whose real documents all share
        one label has none, whatever `per_list` says: every order of it is ideal."""
        labels, mask, scores = self.standardize(y_true, y_pred)
        loss, has_loss = self.per_list(labels, mask, scores)
        has_pairs = rank_ops.has_label_pairs(labels, mask)
        has_loss = has_pairs if has_loss is None else ops.logical_and(has_loss, has_pairs)
        nan_input = rank_ops.nan_input_lists(labels, scores)
        loss = ops.where(nan_input, float("nan"), ops.where(has_loss, loss, 0.0))
        return loss, ops.logical_or(has_loss, nan_input)

    def call(self, y_true, y_pred):
        """Returns the loss of each list, `[B]`: 0 where the list has no loss."""
        return self.losses_and_flags(y_true, y_pred)[0]

    def __call__(self, y_true, y_pred, sample_weight=None):
        loss, has_loss = self.losses_and_flags(y_true, y_pred)
        weights = ops.cast(has_loss, rank_ops.COMPUTE_DTYPE)
        if sample_weight is not None:
            weights = weights * rank_ops.list_weights(sample_weight, loss)
        if self.reduction in (None, "none"):
            result = loss if sample_weight is None else loss * weights
        elif self.reduction == "sum":
            result = ops.sum(loss * weights)
        elif sample_weight is None:  # a count of lists, and loss is 0 where it has none
            result = _share_of_replica(ops.sum(loss) / ops.maximum(ops.sum(weights), 1.0))
        else:
            result = rank_ops.safe_divide(ops.sum(loss * weights), ops.sum(weights))
            result = _share_of_replica(result)
        return ops.cast(result, self.dtype)


def _with_ragged(signature):
    """Returns `signature` with the keyword-only `ragged=False` added (before any `**kwargs`), so
    that `inspect.signature` and `help` show what the constructor takes."""
    parameters = list(signature.parameters.values())
    at = len(parameters) - (parameters[-1].kind is inspect.Parameter.VAR_KEYWORD)
    parameters.insert(at, inspect.Parameter("ragged", inspect.Parameter.KEYWORD_ONLY,
                                            default=False))
    return signature.replace(parameters=parameters)


def _share_of_replica(mean):
    """Divides a per-replica mean by the replica count under tf.distribute, as Keras' own mean
    reductions do, so that the gradients summed over replicas are those of the global mean."""
    if keras.backend.backend() != "tensorflow":
        return mean
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return mean if replicas == 1 else mean / replicas
