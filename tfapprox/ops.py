"""Ranking math shared by losses and metrics: input standardisation, ranks, gains, discounts.

Everything here is written with `keras.ops`, so it runs on the TensorFlow, JAX and PyTorch
backends. Tensors are `[batch, list_size]` unless a docstring says otherwise; `mask` is True on
real documents and False on padded slots. No function here lets a padded slot enter a sum.
This module says what is computed: the pair kernels (pairwise sums, counts and orders) are
`tfapprox.pair_sums`, and where a formula has several ways to be computed, `tfapprox.pair_plan`
chooses which.
"""

import sys

import keras
import numpy as np
from keras import ops

from tfapprox import pair_plan, pair_sums
from tfapprox.pair_sums import COMPUTE_DTYPE


def _static_shape(x):
    return tuple(x.shape)


def standardize(y_true, y_pred, ragged=False, outputs=None):
    """Returns `(labels, mask, scores)`: float32 `[B, L]`, bool `[B, L]`, float32 `[B, L]`.

    `y_true` is a `[B, L]` tensor of graded labels (a label < 0 marks padding) or a dict
    `{"labels": [B, L], "mask": [B, L]}`; `y_pred` is `[B, L]` or `[B, L, 1]`. Padded slots get
    label 0 and score 0, so a NaN or huge value there cannot reach any value or gradient.
    A NaN label is not a padding marker: it stays, on a real document, for `nan_input_lists` to
    find. Scores in float16/bfloat16 are computed in float32. With `ragged=True`, any of them
    may be a `tf.RaggedTensor` `[B, (L)]` (`dense_lists`). With `outputs` = K, `y_pred` holds K
    outputs per document, `[B, L, K]` (`[B, L]` too when K = 1), and scores are `[B, L, K]`.
    """
    if isinstance(y_true, dict):
        if "labels" not in y_true:
            raise ValueError(
                "y_true as a dict needs the key 'labels' (and optionally 'mask'); "
                f"got keys {sorted(y_true)}")
        labels, mask = y_true["labels"], y_true.get("mask")
    else:
        labels, mask = y_true, None
    if ragged:
        labels, mask, y_pred = dense_lists(labels, mask, y_pred)
    for what, tensor in (("y_true (labels)", labels), ("y_true['mask']", mask),
                         ("y_pred (scores)", y_pred)):
        _check_dense(what, tensor)
    labels = ops.stop_gradient(ops.cast(ops.convert_to_tensor(labels), COMPUTE_DTYPE))
    scores = ops.cast(ops.convert_to_tensor(y_pred), COMPUTE_DTYPE)
    outputs_per_document = None
    if outputs is not None:
        outputs_per_document = _per_document_outputs(scores, outputs)
        scores = outputs_per_document[..., 0]  # one per document, for the checks below
    if len(scores.shape) == 3 and scores.shape[-1] == 1:
        scores = ops.squeeze(scores, axis=-1)
    if len(labels.shape) == 3 and labels.shape[-1] == 1:
        labels = ops.squeeze(labels, axis=-1)
    for what, tensor in (("y_true (labels)", labels), ("y_pred (scores)", scores)):
        if len(tensor.shape) != 2:
            raise ValueError(
                f"{what} must have shape [batch, list_size] (y_pred may also be "
                f"[batch, list_size, 1]); got shape {_static_shape(tensor)}")
    if not _shapes_compatible(labels.shape, scores.shape):
        raise ValueError(
            f"y_true (labels) has shape {_static_shape(labels)} but y_pred (scores) has "
            f"shape {_static_shape(scores)}; both must be [batch, list_size]")
    valid = ops.logical_not(ops.less(labels, 0.0))  # NaN is not < 0: it stays real
    if mask is not None:
        mask = ops.convert_to_tensor(mask)
        if not _shapes_compatible(mask.shape, labels.shape):
            raise ValueError(
                f"y_true['mask'] has shape {_static_shape(mask)} but the labels have shape "
                f"{_static_shape(labels)}")
        valid = ops.logical_and(valid, ops.cast(mask, "bool"))
    labels = ops.where(valid, labels, 0.0)
    if outputs_per_document is not None:
        return labels, valid, ops.where(ops.expand_dims(valid, -1), outputs_per_document, 0.0)
    scores = ops.where(valid, scores, 0.0)
    return labels, valid, scores


def _per_document_outputs(scores, outputs):
    """Returns `scores` as `[B, L, outputs]`, or raises ValueError naming its shape."""
    if len(scores.shape) == 2 and outputs == 1:
        scores = ops.expand_dims(scores, -1)
    if len(scores.shape) != 3 or scores.shape[-1] != outputs:
        raise ValueError(f"y_pred (scores) must have shape [batch, list_size, {outputs}] "
                         f"({outputs} outputs per document); got shape {_static_shape(scores)}")
    return scores


def _is_ragged(tensor):
    """Whether `tensor` is a `tf.RaggedTensor` (False without TensorFlow imported)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(tensor, tf.RaggedTensor)


def dense_lists(labels, mask, scores):
    """Returns `(labels, mask, scores)` with each `tf.RaggedTensor` `[B, (L), ...]` among them made
    dense, as TF-Ranking's `ragged=True` does: the slots past a list's end get label −1 (padding),
    mask False and score 0, and the ragged ones are padded to the width of a dense one beside
    them (a model's `[B, L]` scores beside ragged labels). Tensors that are not ragged pass as
    they are; TensorFlow is needed only when one is ragged, so this runs on every backend."""
    if not any(_is_ragged(t) for t in (labels, mask, scores)):
        return labels, mask, scores
    dense_width = next((t.shape[1] if t.shape[1] is not None else ops.shape(t)[1]
                        for t in (labels, scores) if t is not None and not _is_ragged(t)), None)

    def to_dense(tensor, fill):
        return _ragged_to_dense(tensor, fill, dense_width) if _is_ragged(tensor) else tensor

    return to_dense(labels, -1.0), to_dense(mask, False), to_dense(scores, 0.0)


def _ragged_to_dense(ragged, fill, width=None):
    """Returns a `tf.RaggedTensor` `[B, (L), ...]` as a dense `[B, width, ...]` (width: its longest
    row when None), `fill` past each row's end.

    Work-around: `RaggedTensor.to_tensor` has no XLA kernel (RaggedTensorToTensor), and Keras
    compiles `model.fit` with XLA by default; so one gather of the values, O(B·width), which XLA
    compiles. Remove when TensorFlow registers an XLA kernel for RaggedTensorToTensor
    (`test_ragged_targets_train_under_xla` then passes with `to_tensor` too).
    """
    tf = sys.modules["tensorflow"]
    if ragged.ragged_rank != 1:
        raise ValueError(f"ragged lists must be [batch, (list_size), ...] with one ragged "
                         f"dimension; got ragged_rank {ragged.ragged_rank}")
    lengths = ragged.row_lengths()
    longest = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
    if width is None:
        width = longest
    else:
        width = tf.cast(width, lengths.dtype)
        known = _known_values(longest - width)
        if known is not None and known > 0:
            raise ValueError(f"a ragged list has {int(known)} more entries than the dense "
                             "tensor beside it has slots: labels and scores must hold the same "
                             "lists")
    slots = tf.range(width, dtype=lengths.dtype)
    inside = slots[None, :] < lengths[:, None]
    values = ragged.values
    # past a row's end, the index of one extra value: `fill`
    padded = tf.concat([values, tf.fill(tf.concat([[1], tf.shape(values)[1:]], 0),
                                        tf.cast(fill, values.dtype))], axis=0)
    beyond = tf.cast(tf.shape(values)[0], lengths.dtype)
    index = tf.where(inside, ragged.row_starts()[:, None] + slots[None, :], beyond)
    return tf.gather(padded, index)


def _check_dense(what, tensor):
    """Raises ValueError for a ragged or sparse TensorFlow tensor: lists are dense `[B, L]`
    unless the loss or metric was built with `ragged=True`."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(tensor, (tf.RaggedTensor, tf.SparseTensor)):
        raise ValueError(
            f"{what} is a {type(tensor).__name__} of shape {_static_shape(tensor)}; pass a dense "
            "[batch, list_size] tensor, padded with label -1 (e.g. "
            "`labels.to_tensor(default_value=-1.0)`, scores with `.to_tensor()`), or build the "
            "loss or metric with `ragged=True`")


def list_weights(sample_weight, per_list):
    """Returns `sample_weight` as one float32 weight per list, shaped like `per_list` `[B]`.

    It may be a scalar, `[B]` or `[B, 1]`; another shape is a ValueError, and so is a negative
    weight whose value is known when called (eagerly). While a graph or a jit function is
    traced the values are not known: there a negative weight becomes NaN, so the loss or metric
    it weighs reports NaN.
    """
    weights = ops.cast(ops.convert_to_tensor(sample_weight), COMPUTE_DTYPE)
    if len(weights.shape) == 2 and weights.shape[-1] == 1:
        weights = ops.squeeze(weights, axis=-1)
    if len(weights.shape) > 1 or (len(weights.shape) == 1
                                  and not _shapes_compatible(weights.shape, per_list.shape)):
        raise ValueError(
            "sample_weight must hold one weight per list, shape [batch] or [batch, 1] with "
            f"batch = {per_list.shape[0]}; got shape {_static_shape(weights)}")
    known = _known_values(weights)
    if known is not None and np.any(known < 0):
        raise ValueError(f"sample_weight must be >= 0; got {known[known < 0][:5].tolist()} "
                         f"at lists {np.flatnonzero(known < 0)[:5].tolist()}")
    return ops.broadcast_to(ops.where(weights < 0, float("nan"), weights), ops.shape(per_list))


def _known_values(tensor):
    """Returns the values of `tensor` as numpy when they are known now, or None while a graph
    or a jit function is being traced."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tensor.numpy() if tf.executing_eagerly() else None
    if backend == "jax":
        import jax

        return None if isinstance(tensor, jax.core.Tracer) else np.asarray(tensor)
    return ops.convert_to_numpy(tensor)


def nan_input_lists(labels, scores):
    """Returns bool `[B]`: whether a real document of the list has a NaN label or score, from
    `standardize`'s outputs (padded slots hold label 0 and score 0).

    Such a list's loss and metric are NaN, so bad inputs are seen (by
    `keras.callbacks.TerminateOnNaN`, say) instead of silently ranked.
    """
    if len(labels.shape) == 3:  # subtopic labels [B, L, T]
        labels = ops.sum(labels, axis=-1)
    nan_scores = ops.isnan(scores)
    if len(scores.shape) == 3:  # K outputs per document [B, L, K]
        nan_scores = ops.any(nan_scores, axis=-1)
    return ops.any(ops.logical_or(ops.isnan(labels), nan_scores), axis=-1)


def _shapes_compatible(a, b):
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _lowest(values, mask):
    """Returns each list's lowest real value [B, 1] (0 for a list without real documents): what
    padded slots hold where they must not widen a list's span or raise a running maximum."""
    lowest = ops.min(ops.where(mask, values, float("inf")), axis=-1, keepdims=True,
                     initial=float("inf"))
    return ops.where(ops.isinf(lowest), 0.0, lowest)


def real_maximum(values, mask):
    """Returns each list's highest real value [..., 1] (0 for a list without real documents),
    without gradient: the shift that keeps a softmax's exponentials from overflowing."""
    top = ops.max(ops.where(mask, values, float("-inf")), axis=-1, keepdims=True,
                  initial=float("-inf"))
    return ops.stop_gradient(ops.where(ops.isfinite(top), top, 0.0))


def approx_ranks(scores, mask, alpha, pairwise="auto"):
    """Returns the smooth positions π̂(x) = 1 + Σ_{y≠x, y real} σ(α(s_y − s_x)) (Qin et al. eq. 20).

    π̂ = ½ + `pair_sums.sigmoid_pair_sums` weighted by the mask (its y = x term is σ(0) = ½), so
    padded documents add exactly 0 to every sum, and long lists are summed in blocks (`pairwise`).
    Under XLA padded slots hold the list's lowest real scaled score (no gradient), so they do not
    widen the span that decides the factored exponentials; without XLA, where no factors are
    taken, they hold 0 (4 ops fewer). Their own π̂ is meaningless and no measure reads it.
    σ saturates cleanly, so |α·Δs| up to 1e4 and beyond gives finite values and gradients.
    """
    scaled = ops.multiply(scores, alpha)
    compiled = pair_plan.xla_path("approx ranks")
    fill = ops.stop_gradient(_lowest(scaled, mask)) if compiled else 0.0
    scaled = ops.where(mask, scaled, fill)
    return 0.5 + pair_sums.sigmoid_pair_sums(scaled, ops.cast(mask, COMPUTE_DTYPE), pairwise)


def has_label_pairs(labels, mask):
    """Returns bool `[B]`: whether two real documents of a list have different labels — O(L);
    labels as `standardize` gives them (padded 0, real ≥ 0 or NaN)."""
    highest = ops.max(labels, axis=-1, initial=float("-inf"))  # padded 0 ≤ every real label
    lowest = ops.min(ops.where(mask, labels, float("inf")), axis=-1, initial=float("inf"))
    return ops.greater(highest, lowest)


LOWEST_FLOAT32 = -3.4028234663852886e38


def exact_ranks(scores, mask):
    """Returns 1-based positions π(x) after sorting by descending score; ties keep list order.

    π(x) = 1 + #{real y: s_y > s_x} + #{real y before x in the list: s_y = s_x}, from one stable
    argsort (TensorFlow's goes through top_k, which keeps equal entries in order; jnp.argsort is
    stable) inverted by a second: O(L log L) time and O(L) memory, so whole lists of any length
    are measured. Padded slots take the positions after every real document (a real score of −inf
    counts as the lowest finite float, so it still ranks before them); no measure reads them.
    The positions are a permutation of 1..L. Where the plan says so (`pair_plan.order`: under
    XLA, short lists of a static size), they are counted instead.
    """
    keys = ops.where(mask, ops.maximum(scores, LOWEST_FLOAT32), float("-inf"))
    if pair_plan.order(keys.shape[1]) == "counted":
        return ops.cast(pair_sums.descending_positions_by_counting(keys) + 1, COMPUTE_DTYPE)
    order = ops.argsort(-keys, axis=-1)
    return ops.cast(ops.argsort(order, axis=-1) + 1, COMPUTE_DTYPE)


# Gains are exact up to 2^MAX_EXACT_GAIN_EXPONENT; above it a list's gains are scaled down.
MAX_EXACT_GAIN_EXPONENT = 64.0


def gains(labels):
    """Returns the gain G(y) = 2^y − 1 of each label (0 on padded slots, whose label is 0).

    In a list whose largest label m exceeds 64, every gain is divided by 2^(m − 64), so that
    labels of 128 and more (2^128 overflows float32) give finite gains. Only ratios of gains
    within a list are used (NDCG, Chen et al.'s weights over N_C), and those the scale leaves as
    they are; lists with labels ≤ 64 get the exact gains.
    """
    top = ops.max(labels, axis=-1, keepdims=True, initial=0.0)
    shift = ops.maximum(top - MAX_EXACT_GAIN_EXPONENT, 0.0)
    return ops.power(2.0, labels - shift) - ops.power(2.0, -shift)


def discounts(ranks):
    """Returns the position discount D(r) = 1 / log2(1 + r)."""
    return ops.log(2.0) / ops.log1p(ranks)


def top_k_cutoff(ranks, k):
    """Returns 1{r ≤ k} as float, or all ones when `k` is None."""
    if k is None:
        return ops.ones_like(ranks)
    return ops.cast(ops.less_equal(ranks, float(k)), COMPUTE_DTYPE)


def smooth_top_k_cutoff(ranks, k, beta):
    """Returns σ(β(k + ½ − r)), the smooth truncation of 1{r ≤ k} (Qin et al. §4.2), or ones."""
    if k is None:
        return ops.ones_like(ranks)
    return ops.sigmoid(beta * (float(k) + 0.5 - ranks))


def ideal_positions(labels, mask, pairwise="auto"):
    """Returns each document's best attainable position: 1 + #{real y: label_y > label_x}.

    Graded labels (every real label an integer in [0, GRADES)) are counted per grade, O(L·GRADES):
    #{y: l_y > l_x} = n_{≥ l_x + 1}. Other labels take a pairwise count, dense or in blocks of
    columns as `pairwise` says (as the pair sums of the losses are), so a long list never holds
    its `[L, L]` comparisons at once; under XLA it runs only for batches that need it
    (`tfapprox.pair_sums.first_or_fallback`), elsewhere in an `ops.cond`.
    """
    real_labels = ops.where(mask, labels, float("-inf"))

    def by_counting(real_labels):  # n_{≥ l_x + 1}, picked by comparing with each grade
        at_least = ops.cast(_count_at_least_each_grade(real_labels), COMPUTE_DTYPE)
        grade_above = ops.expand_dims(ops.where(mask, labels + 1.0, 0.0), 2)
        grades = ops.cast(ops.arange(GRADES + 1), COMPUTE_DTYPE)
        return ops.sum(ops.where(grade_above == grades, ops.expand_dims(at_least, 1), 0.0),
                       axis=-1)

    def by_pairs(real_labels):
        return pair_sums.higher_counts(real_labels, pairwise)

    graded = _all_graded(ops.where(mask, labels, 0.0))
    if pair_plan.xla_path("ideal positions"):
        return 1.0 + pair_sums.first_or_fallback(graded, by_counting, by_pairs, real_labels)
    return 1.0 + ops.cond(graded, lambda: by_counting(real_labels), lambda: by_pairs(real_labels))


# Graded labels: integers 0 ≤ l < GRADES, whose ideal DCG is counted per grade instead of sorted.
GRADES = 32


def ideal_dcg(labels, topk=None):
    """Returns N = max DCG (@topk): Σ_r G(r-th largest label)·D(r), r ≤ topk. Padded labels are 0.

    Compiled by XLA, where a sort is slow on CPU, graded labels (every label an integer in
    [0, GRADES)) need none: the n_v documents of grade v fill positions n_{>v} + 1 … n_{≥v} of
    the ideal ranking, so N = Σ_v G(v)·(C(n_{≥v}) − C(n_{>v})) with C(n) = Σ_{r ≤ n} D(r)·
    1{r ≤ topk}, O(L·GRADES). Other labels, and graphs not compiled by XLA, sort (chosen at run
    time with `ops.cond`).
    """
    positions = ops.cast(ops.arange(1, ops.shape(labels)[1] + 1), COMPUTE_DTYPE)
    weights = discounts(positions) * top_k_cutoff(positions, topk)

    def by_sorting():
        best_first = ops.top_k(gains(labels), ops.shape(labels)[1])[0]
        return ops.sum(best_first * ops.expand_dims(weights, 0), axis=-1)

    def by_counting():
        at_least = _count_at_least_each_grade(labels)
        cumulative = ops.take(ops.pad(ops.cumsum(weights), ((1, 0),)), at_least)  # [B, G + 1]
        grades = ops.cast(ops.arange(GRADES), COMPUTE_DTYPE)
        return ops.sum((cumulative[:, :-1] - cumulative[:, 1:]) * gains(grades), axis=-1)

    if not pair_plan.xla_path("ideal DCG"):
        return by_sorting()
    return ops.cond(_all_graded(labels), by_counting, by_sorting)


def _all_graded(labels):
    """Whether every label is an integer in [0, GRADES) (a bool scalar)."""
    return ops.all(ops.logical_and(ops.equal(labels, ops.floor(labels)),
                                   ops.logical_and(labels >= 0.0, labels < GRADES)))


def _count_at_least_each_grade(labels):
    """Returns int32 `[B, GRADES + 1]`: entry v counts the labels ≥ v of each list."""
    grades = ops.cast(ops.arange(GRADES + 1), COMPUTE_DTYPE)
    return ops.sum(ops.cast(ops.expand_dims(labels, 2) >= grades, "int32"), axis=1)


def safe_divide(numerator, denominator):
    """Returns numerator / denominator, and 0 where the denominator is 0 — with finite gradients."""
    nonzero = ops.not_equal(denominator, 0.0)
    return ops.where(nonzero, numerator / ops.where(nonzero, denominator, 1.0), 0.0)


def binary_relevance(labels, mask, threshold):
    """Returns r(x) = 1{label ≥ threshold} on real documents, as float (labels `[B, L]`, or
    `[B, L, T]` with one label per subtopic)."""
    if len(labels.shape) == 3:
        mask = ops.expand_dims(mask, -1)
    return ops.cast(ops.logical_and(mask, ops.greater_equal(labels, threshold)), COMPUTE_DTYPE)


def count_per_list(indicator):
    """Returns Σ over the list of a bool or 0/1 tensor, as float `[B]`."""
    return ops.sum(ops.cast(indicator, COMPUTE_DTYPE), axis=-1)


# Tie-breaking keys are integers in [0, KEY_LEVELS); an integer label below LARGEST_EXACT_LABEL
# plus key / KEY_LEVELS is exact in float32 (13 + KEY_BITS bits < 24).
KEY_BITS = 10
KEY_LEVELS = 2 ** KEY_BITS
LARGEST_EXACT_LABEL = 2 ** 13
_GOLDEN = -1640531535  # 0x9E3779B1, ⌊2^32/φ⌋, as an int32
_SEED_STEP = 1663821227  # 0x632BE5AB, an odd int32


def _float32_bits(values):
    """Returns the bits of float32 `values` `[B, L]` as int32. A `None` list size is viewed with a
    last axis of 1: Keras 3.15's TensorFlow `view` tests the last axis's size in Python."""
    if values.shape[-1] is not None:
        return ops.view(values, "int32")
    return ops.squeeze(ops.view(ops.expand_dims(values, -1), "int32"), -1)


def tie_breaking_keys(scores, seed):
    """Returns pseudo-random int32 keys in [0, `KEY_LEVELS`) to order documents with equal labels.

    A multiplicative (Fibonacci) hash of each score's float32 bits and the seed: the top
    `KEY_BITS` bits of (bits + seed·c)·⌊2^32/φ⌋ mod 2^32. Stateless, so it works under jit on
    every backend; it changes from step to step as the scores move and is reproducible for a
    given seed.
    Documents with equal scores get equal keys (and stay in list order, which changes no term of
    a Plackett–Luce likelihood). No gradient.
    """
    bits = _float32_bits(ops.stop_gradient(scores))
    offset = (seed * _SEED_STEP + 2 ** 31) % 2 ** 32 - 2 ** 31
    mixed = ops.multiply(ops.add(bits, ops.convert_to_tensor(offset, "int32")),
                         ops.convert_to_tensor(_GOLDEN, "int32"))
    return ops.bitwise_and(ops.right_shift(mixed, 32 - KEY_BITS), KEY_LEVELS - 1)


def descending_order(values):
    """Returns the indices that sort each list of `values` [B, L] into descending order, equal
    values in list order: one `ops.top_k` of the whole list (TensorFlow's and JAX's keep equal
    entries in index order), where `ops.argsort` of −values negates twice around it on
    TensorFlow."""
    list_size = values.shape[1] if values.shape[1] is not None else ops.shape(values)[1]
    return ops.top_k(values, list_size)[1]


def gather_in_lists(values, indices):
    """Returns `values[b, indices[b, p]]`, shaped like `indices` [B, P]: one gather from the
    flattened batch, where `ops.take_along_axis` broadcasts and reshapes around it."""
    batch_size, list_size = ops.shape(values)[0], ops.shape(values)[1]
    offsets = ops.expand_dims(ops.arange(batch_size) * list_size, 1)
    flat = ops.reshape(indices + ops.cast(offsets, indices.dtype), (-1,))
    return ops.reshape(ops.take(ops.reshape(values, (-1,)), flat), ops.shape(indices))


def plackett_luce_order(labels, mask, keys):
    """Returns the indices that sort each list into the label-consistent permutation y.

    Labels descending; documents with equal labels by descending int32 `keys` (in
    [0, `KEY_LEVELS`)); remaining ties in list order; padded slots after every real document.
    One sort (TensorFlow's argsort goes through top_k, which keeps equal entries in order;
    jnp.argsort is stable), O(L log L), of:
    - without XLA (and on TensorFlow, XLA with a `None` list size), int64 codes from the
      label's float32 bits and the key: exact for every label, no run-time choice;
    - under XLA with a static list size, label·`KEY_LEVELS` + key for integer labels, ordered as
      the plan chooses (`pair_plan.order`): through a sorting network (labels below its code
      limit / `KEY_LEVELS` − 1), by counting, or sorted as label + key / `KEY_LEVELS` (exact in
      float32 below `LARGEST_EXACT_LABEL`); other labels take two stable argsorts, by key and
      then by label, chosen at run time with `ops.cond`.
    """
    how = pair_plan.order(labels.shape[1], network=True)
    by_network, by_counting = how == "network", how == "counted"
    if not (by_network or by_counting) and keras.backend.backend() != "jax":
        # int64 codes (JAX has them only with x64 on): real labels are ≥ 0 or NaN, and such
        # float32s, sign bit cleared (for −0), order as their bits do as integers
        bits = ops.bitwise_and(_float32_bits(labels), 2 ** 31 - 1)
        codes = ops.cast(bits, "int64") * KEY_LEVELS + ops.cast(keys, "int64")
        return descending_order(ops.where(mask, codes, -1))
    sort_labels = ops.where(mask, labels, float("-inf"))
    limit = (pair_sums.network_code_limit(labels.shape[1]) // KEY_LEVELS - 1 if by_network
             else LARGEST_EXACT_LABEL)

    def by_label_plus_key():
        if by_network:
            codes = ops.where(mask, ops.cast(labels, "int32") + 1, 0) * KEY_LEVELS + keys
            return pair_sums.descending_order_by_network(codes)
        values = sort_labels + ops.cast(keys, COMPUTE_DTYPE) / KEY_LEVELS
        if by_counting:
            return pair_sums.descending_order_by_counting(values)
        return descending_order(values)

    def by_key_then_label():
        by_key = descending_order(ops.cast(keys, COMPUTE_DTYPE))
        # −0 as 0: XLA's sort puts −0 below 0
        labels_by_key = gather_in_lists(ops.where(sort_labels == 0.0, 0.0, sort_labels), by_key)
        return gather_in_lists(by_key, descending_order(labels_by_key))

    small_integers = ops.logical_and(ops.equal(labels, ops.floor(labels)),
                                     ops.logical_and(labels >= 0.0, labels < limit))
    # read on every slot: `standardize` gives padded slots label 0
    return ops.cond(ops.all(small_integers), by_label_plus_key, by_key_then_label)


def _add_next_block(width, high, total):
    """One round of the suffix scan: adds to each position's sum the sum `width` places on.

    A sum is held as the pair (high, total), meaning e^high · total; the result is rescaled to
    the larger `high`, so every exponent is ≤ 0. Positions with fewer than `width` successors
    keep their pair. Returns the next round's width and the new pair.
    """
    inside = ops.expand_dims(ops.arange(ops.shape(high)[1]) < ops.shape(high)[1] - width, 0)
    next_high = ops.where(inside, ops.roll(high, -width, axis=1), high)
    next_total = ops.where(inside, ops.roll(total, -width, axis=1), 0.0)
    top = ops.maximum(high, next_high)
    return width * 2, top, total * ops.exp(high - top) + next_total * ops.exp(next_high - top)


def _suffix_sums_by_scan(high, total):
    """Returns Σ_{i ≥ p} e^{high_i} · total_i at each position p as a pair (high, total) (see
    `_add_next_block`): a log-depth scan (Hillis & Steele), ⌈log2 L⌉ rounds, O(L log L) work,
    every exponent ≤ 0, so any gaps between the `high`s stay finite. The rounds run in a while
    loop, for static list sizes too: unrolled in a branch of `suffix_logsumexp_minus_self`'s
    `cond`, they made XLA compute both branches."""
    list_size = ops.shape(high)[1]
    _, high, total = ops.while_loop(
        lambda width, *_: width < list_size, _add_next_block,
        (ops.convert_to_tensor(1, "int32"), high, total), maximum_iterations=63)
    return high, total


# A reverse cumulative sum of e^{s − max} is exact in float32 while every suffix sum is at least
# this: what underflows (terms below 2^-126, fewer than 2^40 of them) is then below 2^-86 of it.
SMALLEST_EXACT_SUFFIX_SUM = 2.0 ** -60


def _suffix_terms_by_pairs(scores, mask, real):
    """Returns `(t, shares)`: t_p = ln Σ_{i ≥ p, i real} e^{s_i − s_p} `[B, L]` (meaningless on
    padded p) and shares_pi = e^{s_i − s_p − t_p} `[B, L, L]` (0 where i < p or i is padded),
    from the pairs of a short list: each row's sum is scaled by its own largest term, so nothing
    underflows or overflows whatever the gaps. O(L²) in ~10 ops: the fallback of short lists
    without XLA, where TensorFlow passes every op of a branch not taken, and the scans' while
    loops (~110 ops in the two branches) cost a short list's step more than these pairs."""
    list_size = scores.shape[1]
    later = np.triu(np.ones((list_size, list_size), np.float32))  # [p, i]: i ≥ p
    reach = ops.expand_dims(ops.convert_to_tensor(later), 0) * ops.expand_dims(real, 1)
    fixed = ops.where(mask, scores, 0.0)
    gaps = (ops.expand_dims(fixed, 1) - ops.expand_dims(fixed, 2)) * reach  # s_i − s_p, or 0
    top = ops.max(gaps, axis=-1, keepdims=True)  # ≥ 0, the gap of a real p to itself
    weights = ops.exp(gaps - top) * reach
    total = ops.expand_dims(ops.sum(weights, axis=-1) + (1.0 - real), -1)  # ≥ 1
    return ops.squeeze(top + ops.log(total), -1), weights / total


def suffix_logsumexp_minus_self(scores, mask):
    """Returns t_p = ln S_p − s_p, S_p = Σ_{i ≥ p, i real} e^{s_i}, at each real position p, and 0
    on padded ones, whose scores must be finite (`standardize` gives them 0); its gradient is
    written out:

        ∂(Σ_p u_p t_p)/∂s_q = −u_q + Σ_{p ≤ q, p real} u_p e^{s_q − ln S_p}    (q real).

    Both ways, usually one running sum (`pair_sums.running_sums`) over e^{s − m}, m the list's
    top score (padded ones included): O(L). When a batch has a suffix whose sum would underflow
    that (scores more than ~40 below the top at the end of a list), the whole batch takes, chosen
    at run time with `ops.cond`, a log-depth scan (`_suffix_sums_by_scan`, exact for score gaps
    of 1e4), or in short lists without XLA (`pair_plan.short_list_without_xla`) the pairs
    (`_suffix_terms_by_pairs`).
    The gradient being written out, nothing differentiates through the `cond` (its gradient
    plumbing cost more than the sums at list 10 without XLA, and XLA cannot differentiate a
    `cond` over a while loop).
    """
    real = ops.cast(mask, scores.dtype)
    by_pairs = pair_plan.short_list_without_xla(scores.shape[1])

    @ops.custom_gradient
    def terms(scores):
        # padded scores count towards m (fewer ops than masking them out): one far above the
        # real ones makes the real sums underflow, and the batch take the fallback
        top = ops.max(scores, axis=-1, keepdims=True, initial=float("-inf"))
        exp = ops.exp(scores - top) * real  # multiplied, not selected: cheaper without XLA
        total = pair_sums.running_sums(exp, reverse=True) + (1.0 - real)  # 1 on padded slots
        exact = ops.all(total >= SMALLEST_EXACT_SUFFIX_SUM)  # False for a NaN or infinite top

        def by_fallback():
            if by_pairs:
                return _suffix_terms_by_pairs(scores, mask, real)[0] + scores
            high, sums = _suffix_sums_by_scan(ops.where(mask, scores, _lowest(scores, mask)), real)
            return high + ops.log(ops.where(mask, sums, 1.0))

        log_sums = ops.cond(exact, lambda: top + ops.log(total), by_fallback)

        def gradient(*args, upstream=None):
            upstream = (args[0] if upstream is None else upstream) * real

            def by_cumsum():  # e^{s_q − m} Σ_{p ≤ q} u_p / (e^{−m} S_p), every S_p e^{−m} ≥ 2^-60
                return exp * pair_sums.running_sums(upstream / total)

            def by_fallback():
                if by_pairs:  # Σ_p u_p e^{s_q − ln S_p}
                    shares = _suffix_terms_by_pairs(scores, mask, real)[1]
                    return ops.sum(shares * ops.expand_dims(upstream, 2), axis=1)
                # the prefix sums as suffix sums of the lists reversed
                high = ops.where(mask, -log_sums, _lowest(-log_sums, mask))
                high, sums = _suffix_sums_by_scan(ops.flip(high, axis=-1),
                                                  ops.flip(upstream, axis=-1))
                return ops.exp(ops.where(mask, scores + ops.flip(high, axis=-1), float("-inf"))
                               ) * ops.flip(sums, axis=-1)

            # 0 on padded slots: their e^{s − m} and their upstream are 0
            return ops.cond(exact, by_cumsum, by_fallback) - upstream

        return ops.where(mask, log_sums - scores, 0.0), gradient

    return terms(scores)
