"""The pair kernels of `tfapprox.ops`: their reference implementations and the fast variants.

Each kernel has one plain reference implementation, the formula written out in `keras.ops` and
differentiated by autodiff, which the tests hold every variant to:

- σ pair sums S_k = Σ_j w_j σ(v_j − v_k) (`sigmoid_pair_sums`; `reference_sigmoid_pair_sums`),
- logistic pair sums, RankNet's Σ_{j: l_j < l_k} ln(1 + e^{s_j − s_k}) (`logistic_pair_sums`;
  `reference_logistic_pair_sums`),
- pair counts (`higher_counts`, `concordant_counts`; dense is the reference),
- orders (`descending_positions_by_counting`, `descending_order_by_counting`,
  `descending_order_by_network`; the reference is a stable sort, `tfapprox.ops.descending_order`),
- running sums (`running_sums`; the reference is a cumulative sum).

The variants: pairs summed densely or in blocks of columns; custom gradients, whose backward pass
is one pass over the pairs instead of a second trip through autodiff's broadcast graph; without
XLA, products and reductions instead of small matmuls; under XLA, pair exponentials from
per-document factors, logs of chunks of pairs, and backend and compiler work-arounds, each in a
block with its reason. Which variant a trace takes is `tfapprox.pair_plan`'s choice, from the
backend, XLA or not, the device and the static shape; the figures behind the choices:
docs/benchmarks.md#pair-paths.
"""

import keras
import numpy as np
from keras import ops

from tfapprox import pair_plan
from tfapprox.pair_plan import xla_path

COMPUTE_DTYPE = "float32"


# Pairwise sums (Σ_j f(x_k, x_j) for every k) are dense, or over long lists computed a block of
# columns at a time, forward and backward: memory O(B·L·block) instead of O(B·L²). "dense" and
# "blocked" force either way; "auto" asks the plan (`pair_plan.pairs`).
PAIRWISE_MODES = ("auto", "dense", "blocked")


def _dense_or_blocked(pairwise, like, dense, blocked):
    """Returns `dense()` or `blocked()`, as `pairwise` says; "auto" as the plan chooses for lists
    of `like` [B, L] (when the graph runs if L is not static)."""
    if pairwise not in PAIRWISE_MODES:
        raise ValueError(f"`pairwise` must be one of {PAIRWISE_MODES}; got {pairwise!r}")
    how = pair_plan.pairs(pairwise, like.shape[1])
    if how == "by size":
        return ops.cond(ops.shape(like)[1] > pair_plan.active().blocked_above, blocked, dense)
    return blocked() if how == "blocked" else dense()


def _sum_over_column_blocks(block_sums, columns, fills, block):
    """Returns Σ_J block_sums([c[:, J] for c in columns]) over blocks J of `block` columns.

    `columns` are `[B, L]`; they are padded with `fills` to a whole number of blocks, and
    `block_sums` must give 0 for a padded column. It returns `[B, L]` row sums over one block's
    `[B, L, block]` pairs, so one block of pairs is alive at a time. The loop runs with a
    `None` list dimension (a while loop in a TensorFlow graph, which XLA compiles too).
    """
    batch_size, list_size = ops.shape(columns[0])
    num_blocks = (list_size + block - 1) // block
    padding = ((0, 0), (0, num_blocks * block - list_size))
    padded = [ops.pad(column, padding, constant_values=fill)
              for column, fill in zip(columns, fills)]

    def add_block(index, total):
        start = (0, index * block)
        return total + block_sums(
            [ops.slice(column, start, (batch_size, block)) for column in padded])

    return _one_step_at_a_time(num_blocks, add_block,
                               ops.zeros_like(columns[0], dtype=COMPUTE_DTYPE))


def _one_step_at_a_time(num_steps, body, initial):
    """Returns `ops.fori_loop(0, num_steps, body, initial)`, its steps never overlapping.

    Backend fallback: a TensorFlow graph runs up to 10 steps of a while loop at once, each with
    its own block of pairs, so on TensorFlow the loop is `tf.while_loop(parallel_iterations=1)`.
    JAX, XLA and eager loops run one step at a time anyway.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.fori_loop(0, num_steps, body, initial)
    import tensorflow as tf

    return tf.while_loop(lambda step, value: step < num_steps,
                         lambda step, value: (step + 1, body(step, value)),
                         (0, initial), parallel_iterations=1)[1]


def _pair_sums(row_sums, row_sum_gradients, dense_sums, values, constants, fills, pairwise):
    """Returns R_k = Σ_j f(values, constants; k, j), `[B, L]`, differentiable in `values`.

    Dense, `dense_sums(values, *constants)` gives the row sums over the whole list and a function
    of the upstream gradient that returns Σ_k upstream_k·∂R_k/∂values, from what the forward
    pass kept (each pair's function evaluated once). Blocked, `row_sums(*rows, *columns)` gives
    the row sums over the given columns and `row_sum_gradients(*rows, upstream, *columns,
    column_upstream)` the part of that gradient those columns contribute, both from `[B, L]`
    rows and `[B, J]` columns of (values, *constants); both are summed over column blocks
    (padded with `fills`, then 0 for the upstream) and the backward pass recomputes each block.
    `constants` get no gradient.
    """
    constants = [ops.stop_gradient(constant) for constant in constants]

    def with_gradient(forward_and_gradient):
        @ops.custom_gradient
        def sums(*inputs):  # the constants are inputs too: captured, they break inside ops.cond
            total, values_gradient = forward_and_gradient(*inputs)

            def gradient(*args, upstream=None):
                upstream = args[0] if upstream is None else upstream
                return (values_gradient(upstream),
                        *[ops.zeros_like(constant) for constant in inputs[1:]])

            return total, gradient

        return sums(values, *constants)

    def blocked_sums(*rows):
        # From rows cut off from every tape: an eager tf.GradientTape would otherwise record the
        # blocks and keep each one's pairs while it lives (O(B·L²) in all), though the gradient
        # recomputes them. JAX has no tape; graphs free them anyway.
        fixed = [ops.stop_gradient(row) for row in rows]
        block = pair_plan.active().pair_block  # the backward pass's too, whenever it runs
        total = _sum_over_column_blocks(lambda columns: row_sums(*fixed, *columns), fixed, fills,
                                        block)

        def gradient(upstream):
            # ties upstream's `None` dimensions to the rows': XLA cannot slice it otherwise when
            # it comes from another pair sum's matmul (ApproxAP's truncation)
            upstream = ops.reshape(upstream, ops.shape(rows[0]))
            return _sum_over_column_blocks(
                lambda columns: row_sum_gradients(*rows, upstream, *columns),
                (*rows, upstream), (*fills, 0.0), block)

        return total, gradient

    return _dense_or_blocked(pairwise, values, lambda: with_gradient(dense_sums),
                             lambda: with_gradient(blocked_sums))


# Elementwise sums (without XLA): a batched matmul of many small matrices costs more than the
# products it replaces, so the pairs of short lists (`pair_plan.sums_by_products`) are summed
# against per-document vectors by products and reductions; longer ones, and a `None` size, by
# matmul. Under XLA the pairs fuse and no matmul is used.
def elementwise_sums_apply(pairs):
    """Whether `_row_sums` and `_column_sums` of `pairs` [B, L, L] take products and reductions."""
    return pair_plan.sums_by_products(pairs.shape[-1])


def running_sums(values, reverse=False):
    """Returns Σ_{i ≤ p} v_i at each position p of `values` [B, L] (Σ_{i ≥ p} with `reverse`):
    a cumulative sum (between flips for `reverse`), the reference, or for short lists without
    XLA (`pair_plan.short_list_without_xla`) one matmul with a triangular matrix of ones, which
    costs fewer of TensorFlow's per-op overheads there."""
    list_size = values.shape[1]
    if pair_plan.short_list_without_xla(list_size):
        index = np.arange(list_size)
        summed = index[:, None] >= index[None, :] if reverse else index[:, None] <= index[None, :]
        return ops.matmul(values, ops.convert_to_tensor(summed.astype(np.float32)))
    if reverse:
        return ops.flip(ops.cumsum(ops.flip(values, axis=-1), axis=-1), axis=-1)
    return ops.cumsum(values, axis=-1)


def _row_sums(pairs, *column_vectors):
    """Returns [Σ_j pairs_kj·c_j for each c of `column_vectors`], each `[B, L]`: one batched
    matmul, or products and reductions for short lists (`elementwise_sums_apply`)."""
    if elementwise_sums_apply(pairs):
        return [ops.sum(pairs * ops.expand_dims(c, 1), axis=-1) for c in column_vectors]
    sums = ops.matmul(pairs, ops.stack(column_vectors, axis=-1))
    return [sums[..., i] for i in range(len(column_vectors))]


def _column_sums(pairs, row_vector):
    """Returns Σ_k r_k·pairs_kj for each j, `[B, L]`, as `_row_sums` chooses."""
    if elementwise_sums_apply(pairs):
        return ops.sum(pairs * ops.expand_dims(row_vector, 2), axis=1)
    return ops.squeeze(ops.matmul(ops.expand_dims(row_vector, 1), pairs), axis=1)


def _differences(values, column_values):
    """Returns `[B, K, J]`: entry `[b, k, j]` = v_j − v_k."""
    return ops.expand_dims(column_values, 1) - ops.expand_dims(values, 2)


def _weighted_sigmoid_sums(values, weights, column_values, column_weights):
    """Σ_j w_j σ(v_j − v_k) for each row k."""
    sigmoid = ops.sigmoid(_differences(values, column_values))
    return ops.sum(sigmoid * ops.expand_dims(column_weights, 1), axis=-1)


def _weighted_sigmoid_sum_gradients(values, weights, upstream, column_values, column_weights,
                                    column_upstream):
    """∂/∂v_k of Σ_i g_i Σ_j w_j σ(v_j − v_i), restricted to the columns j:
    Σ_j σ'(v_j − v_k)·(w_k·g_j − g_k·w_j), with σ' = σ(1 − σ) even."""
    sigmoid = ops.sigmoid(_differences(values, column_values))
    slope = sigmoid * (1.0 - sigmoid)
    return (weights * ops.sum(slope * ops.expand_dims(column_upstream, 1), axis=-1)
            - upstream * ops.sum(slope * ops.expand_dims(column_weights, 1), axis=-1))


# Factored exponentials (XLA on CPU, where transcendental functions are the cost of a fused pass
# over the pairs). e^x is a normal float32 for |x| ≤ EXP_LIMIT (e^88.8 overflows, e^−87.4 is
# subnormal).
EXP_LIMIT = 87.0


# Loops of 0 or 1 steps (an XLA work-around): once XLA keeps apart the branches of an `ops.cond`
# of plain arithmetic, `ops.cond` can take their place.
def _only_if(needed, compute, *inputs):
    """Returns `compute(*inputs)` where the bool scalar `needed` is True, else zeros like the
    first input.

    It runs in a loop of 0 or 1 steps, not in an `ops.cond`: XLA turns a conditional whose
    branches are plain arithmetic into a select that evaluates both. Each input is given plus
    0·step, so that XLA cannot hoist any of the work out of the loop either.
    """
    def step_once(step, _):
        return compute(*[x + 0.0 * ops.cast(step, x.dtype) for x in inputs])

    return ops.fori_loop(0, ops.cast(needed, "int32"), step_once, ops.zeros_like(inputs[0]))


def first_or_fallback(use_first, first, fallback, *inputs):
    """Returns `first(*inputs)` where the bool scalar `use_first` is True, else
    `fallback(*inputs)`, the latter computed only for batches that need it (`_only_if`)."""
    return ops.where(use_first, first(*inputs),
                     _only_if(ops.logical_not(use_first), fallback, *inputs))


def _factored_or_per_pair(fits, by_factors, by_pairs, *inputs, sigmoid_sums=False,
                          seldom_fit=False):
    """Returns `by_factors(*inputs)` where the bool scalar `fits` is True, else
    `by_pairs(*inputs)` (`first_or_fallback`); always the latter where the plan takes one exp per
    pair for the first input's lists (`pair_plan.factored_exponentials`)."""
    batch_size, list_size = inputs[0].shape
    if not pair_plan.factored_exponentials(batch_size, list_size, sigmoid_sums, seldom_fit):
        return by_pairs(*inputs)
    return first_or_fallback(fits, by_factors, by_pairs, *inputs)


def _exponential_factors(values):
    """Returns `(fits, above, below)`: whether every list spans at most 2·EXP_LIMIT (a bool
    scalar), and e^{v − c}, e^{c − v} with c each list's mid-range, so that
    e^{v_k − v_j} = above_k·below_j (the offsets are clipped to ±EXP_LIMIT: exact only where
    `fits`). Both factors are normal floats, and a product of two is exact to a few ulps or
    overflows to inf or underflows to 0 where the exact value would in float32."""
    top = ops.max(values, axis=-1, keepdims=True, initial=float("-inf"))
    bottom = ops.min(values, axis=-1, keepdims=True, initial=float("inf"))
    center = ops.where(ops.isfinite(top + bottom), 0.5 * (top + bottom), 0.0)
    offset = ops.clip(values - center, -EXP_LIMIT, EXP_LIMIT)
    return ops.all(top - bottom <= 2.0 * EXP_LIMIT), ops.exp(offset), ops.exp(-offset)


# Separate passes (an XLA-on-CPU work-around, for JAX's XLA; TensorFlow's XLA does not need it).
# JAX's XLA hands every large reduction to its CPU library (YNNPACK), whose fusions take float
# arithmetic and exp/log (no compare or select) and share no pair-shaped operand with another
# fusion: whatever a fusion cannot take is first written out as a [B, L, L] tensor. With the
# forward and backward passes of the σ sums broadcasting the same per-document factors (which
# XLA then multiplies once, for both), a step wrote two or three such tensors. So the σ sums below
# take σ(v_j − v_k) = a_j / (a_j + a_k) forward and σ' = u(1 − u), u = b_k / (b_j + b_k),
# backward (a = e^{v−c}, b = e^{c−v}), and broadcast w forward, −w backward. A scalar constant is
# a shared operand too: XLA broadcasts it to [B, L, L] once for every fusion that uses it, so
# "1 − u" or "1 / x" in two passes wrote a tensor of ones; on JAX the backward passes of lists
# longer than the plan's `constant_free_above` take no constant (shorter ones keep it: a tensor
# of ones that stays in cache costs less than a quotient or exp more per pair).
# `tests/test_ops.py` checks from the compiled HLO that no [B, L, L] tensor is written under
# `jax.jit`. RankNet's backward pass has its own plan ("Select last"). Remove this when XLA's CPU
# library fusions take selects and shared operands.
def _dense_sigmoid_sums(values, weights, factored=True):
    """Σ_j w_j σ(v_j − v_k) over the whole list and its gradient
    ∂/∂v_k = Σ_j σ'_kj·(w_k g_j − g_k w_j), σ' = σ(1 − σ) symmetric in (k, j).

    Not compiled by XLA, each op is a pass over the [B, L, L] pairs: one sigmoid kernel, kept
    for the backward pass (a matmul, or products in short lists: `_row_sums`). Compiled by XLA
    (JAX; TensorFlow with jit_compile), where the passes fuse and transcendental functions are the
    cost, σ(v_j − v_k) = 1 / (1 + p), p = e^{v_k − v_j}. When every list of the batch spans at
    most 2·EXP_LIMIT, p comes from per-document factors (`_exponential_factors`): two exps per
    document instead of one per pair, σ = a_j / (a_j + a_k) forward and σ' = u(1 − u),
    u = b_k / (b_j + b_k), backward, each factor ≤ e^EXP_LIMIT so that no sum overflows ("Separate
    passes" says why two factor sets). Wider batches take one exp per pair as well (`_only_if`);
    with `factored=False`, every batch does, without that test. The backward pass rebuilds the
    pairs instead of keeping a [B, L, L] tensor; per pair it takes σ' as p·σ² (p capped at 1e30,
    where σ' < 1e-30). Where the plan says so (`pair_plan.sigmoid_gradient_without_constants`,
    on JAX), it takes no constant ("Separate passes"): σ' = u·(1 − u) from two quotients, and per
    pair 1 / (r + 1/r)², r = e^{(v_j − v_k)/2} and 1/r each from an exp (σ' rounds to 0 where
    either overflows). Both ways σ' is accurate where σ is near 0 and near 1.
    """
    if not xla_path("sigmoid sums"):
        sigmoid = ops.sigmoid(_differences(values, values))

        def gradient_from_sigmoid(upstream):  # w_k·Σ_j σ'_kj g_j − g_k·Σ_j σ'_kj w_j
            by_upstream, by_weights = _row_sums(sigmoid * (1.0 - sigmoid), upstream, weights)
            return weights * by_upstream - upstream * by_weights

        return _row_sums(sigmoid, weights)[0], gradient_from_sigmoid

    fixed = ops.stop_gradient(values)
    fits, above, below = _exponential_factors(fixed)

    def sums_by_factors(values, weights):  # σ(v_j − v_k) = a_j / (a_j + a_k)
        del values  # the factors hold them
        return ops.sum(ops.expand_dims(weights * above, 1)
                       / (ops.expand_dims(above, 1) + ops.expand_dims(above, 2)), axis=-1)

    def sums_by_pairs(values, weights):  # σ(v_j − v_k) = 1 / (1 + p)
        return ops.sum(ops.expand_dims(weights, 1) / (1.0 + ops.exp(-_differences(values, values))),
                       axis=-1)

    without_constants = pair_plan.sigmoid_gradient_without_constants(values.shape[1])

    def pulled_back_by_factors(values, weights, upstream):  # σ' = u(1 − u), u = b_k / (b_j + b_k)
        del values  # the factors hold them
        column, row = ops.expand_dims(below, 1), ops.expand_dims(below, 2)
        if without_constants:  # 1 − u = b_j / (b_j + b_k)
            total = column + row
            slope = (row / total) * (column / total)
        else:
            share = row / (column + row)
            slope = share * (1.0 - share)
        return ops.sum(slope * _pair_upstream(weights, upstream), axis=-1)

    def pulled_back_by_pairs(values, weights, upstream):
        if without_constants:  # σ' = 1 / (r + 1/r)², r = e^{(v_j − v_k)/2}, 1/r its own exp
            halves = 0.5 * values
            spread = ops.exp(_differences(halves, halves)) + ops.exp(_differences(-halves, -halves))
            return ops.sum(_pair_upstream(weights, upstream) / (spread * spread), axis=-1)
        negated = -values  # σ' = p / (1 + p)², p from −v
        ratio = ops.minimum(ops.exp(_differences(negated, negated)), 1e30)
        sigmoid = 1.0 / (1.0 + ratio)
        return ops.sum(ratio * sigmoid * sigmoid * _pair_upstream(weights, upstream), axis=-1)

    def either(by_factors, by_pairs, *inputs):
        return _factored_or_per_pair(fits, by_factors, by_pairs, fixed, *inputs,
                                     sigmoid_sums=True, seldom_fit=not factored)

    return (either(sums_by_factors, sums_by_pairs, weights),
            lambda upstream: either(pulled_back_by_factors, pulled_back_by_pairs, weights,
                                    upstream))


def _pair_upstream(weights, upstream):
    """Returns w_k·g_j − g_k·w_j `[B, K, J]`, broadcasting −w where the forward pass broadcasts w
    ("Separate passes")."""
    return (ops.expand_dims(weights, 2) * ops.expand_dims(upstream, 1)
            + ops.expand_dims(upstream, 2) * ops.expand_dims(-weights, 1))


def sigmoid_pair_sums(values, weights=None, pairwise="auto", factored=True):
    """Returns S_k = Σ_j w_j σ(v_j − v_k) over every j of the list (j = k adds w_k/2), `[B, L]`.

    `weights` (default all 1) get no gradient; a column of weight 0 adds exactly 0. Dense, it
    takes two exps per document when every list spans at most 2·EXP_LIMIT, else one per pair
    (`_dense_sigmoid_sums`); `factored=False` skips the first for values that seldom fit, such
    as β·positions. Summed in blocks of columns with a recomputing backward pass for long lists
    (`pairwise`, see PAIRWISE_MODES); padded block columns hold v = −inf, where σ and σ' are
    exactly 0. Its reference is `reference_sigmoid_pair_sums`.
    """
    weights = ops.ones_like(values) if weights is None else weights
    return _pair_sums(_weighted_sigmoid_sums, _weighted_sigmoid_sum_gradients,
                      lambda values, weights: _dense_sigmoid_sums(values, weights, factored),
                      values, (weights,), (float("-inf"), 0.0), pairwise)


def reference_sigmoid_pair_sums(values, weights=None):
    """`sigmoid_pair_sums` as its formula: σ of every difference, summed, differentiated by
    autodiff (`[B, L, L]` pairs, no custom gradient): the reference of the variants."""
    weights = ops.stop_gradient(ops.ones_like(values) if weights is None else weights)
    return _weighted_sigmoid_sums(values, weights, values, weights)


def _logistic_sums(scores, ranked, column_scores, column_ranked):
    """Σ_{j: l_k > l_j} ln(1 + e^{s_j − s_k}) for each row k (`ranked`: labels, NaN = no pair)."""
    pairs = ops.greater(ops.expand_dims(ranked, 2), ops.expand_dims(column_ranked, 1))
    return ops.sum(ops.where(pairs, ops.softplus(_differences(scores, column_scores)), 0.0),
                   axis=-1)


def _logistic_sum_gradients(scores, ranked, upstream, column_scores, column_ranked,
                            column_upstream):
    """∂/∂s_k of Σ_i g_i·(row i of `_logistic_sums`), restricted to the columns j:
    Σ_j g_j·1{l_j > l_k}·σ(s_k − s_j) − g_k·1{l_k > l_j}·σ(s_j − s_k)."""
    sigmoid = ops.sigmoid(_differences(scores, column_scores))  # σ(s_j − s_k)
    ranked, column_ranked = ops.expand_dims(ranked, 2), ops.expand_dims(column_ranked, 1)
    k_is_lower = ops.where(ops.greater(column_ranked, ranked),
                           (1.0 - sigmoid) * ops.expand_dims(column_upstream, 1), 0.0)
    k_is_upper = ops.where(ops.greater(ranked, column_ranked), sigmoid, 0.0)
    return ops.sum(k_is_lower, axis=-1) - upstream * ops.sum(k_is_upper, axis=-1)


def _log1p(x):
    """ln(1 + x) for x ≥ 0, accurate to a few ulps with one `log` (Goldberg 1991, Thm. 4);
    `ops.log1p` costs about twice as much under XLA on CPU."""
    one_plus = 1.0 + x
    rounds_to_one = ops.equal(one_plus, 1.0)
    return ops.where(rounds_to_one, x,
                     ops.log(one_plus) * (x / ops.where(rounds_to_one, 1.0, one_plus - 1.0)))


def _dense_logistic_sums(scores, ranked):
    """`_logistic_sums` over the whole list and its gradient.

    With U_kj = 1{l_k > l_j}·σ(s_j − s_k), ∂/∂s_k = Σ_j U_jk g_j − g_k·Σ_j U_kj, one pass over
    the pairs of row k. Not compiled by XLA, each op is a pass over the pairs, σ is one sigmoid
    kernel, kept for the backward pass (a matmul, or products in short lists: `_column_sums`),
    and the values are softplus — or, in short lists (`elementwise_sums_apply`), where
    TensorFlow's softplus kernel is a large share of the step, max(d, 0) − ln σ(|d|) with σ(|d|)
    taken from the kept σ and one log per row, of the product of its pairs' σ(|d|). A row's
    value then adds at most about L·2^-23 of absolute
    error to what the sum of softplus makes (so a row of only tiny terms, pairs ordered by wide
    margins, may come out 0 instead of 1e-9), and its gradient is as exact as before.

    Compiled by XLA (JAX; TensorFlow with jit_compile), where the passes fuse and
    transcendental functions are the cost: with d = s_j − s_k and e = e^{−|d|} ≤ 1,
    ln(1 + e^d) = max(d, 0) + ln(1 + e), and one log serves the plan's `log_chunk` columns of
    a row,
    Σ ln(1 + e) = ln Π(1 + e), the product kept as 1 + E with E ← a + b(1 + a), which holds
    small e to a few ulps and stays below 2^log_chunk. e = min(e^d, e^{−d}) is a product of
    per-document factors (`_exponential_factors`) when every list spans at most 2·EXP_LIMIT,
    else one exp per pair (`_only_if`). The backward pass rebuilds p = e^d the same way and
    takes σ(d) = p·q and 1 − σ(d) = q = 1/(1 + p) (p capped at 1e30, where σ rounds to 1),
    keeping no [B, L, L] tensor from the forward pass (on JAX it writes its pulls once: "Select
    last").
    """
    if not xla_path("logistic sums"):
        difference = _differences(scores, scores)
        # pairs masked by a 0/1 product, cheaper than `ops.where` with its broadcast 0 (finite
        # scores make finite products)
        higher = ops.cast(ops.expand_dims(ranked, 2) > ops.expand_dims(ranked, 1), COMPUTE_DTYPE)
        sigmoid = ops.sigmoid(difference)
        upper = higher * sigmoid

        def gradient_from_sigmoid(upstream):  # (Uᵀg)_k − g_k·Σ_j U_kj
            return _column_sums(upper, upstream) - upstream * ops.sum(upper, axis=-1)

        # (the product below is ≥ 2^(1 − L): a normal float for L ≤ 127, whatever the setting)
        if not (elementwise_sums_apply(upper) and upper.shape[-1] <= 127):
            return ops.sum(higher * ops.softplus(difference), axis=-1), gradient_from_sigmoid
        # short lists: ln(1 + e^d) = max(d, 0) − ln σ(|d|), and a row's logs are one log of a
        # product of σ(|d|) = 1 − min(σ, 1 − σ) ≥ ½
        far_side = 1.0 - higher * ops.minimum(sigmoid, 1.0 - sigmoid)
        return (ops.sum(ops.relu(higher * difference), axis=-1)
                - ops.log(ops.prod(far_side, axis=-1))), gradient_from_sigmoid

    fixed = ops.stop_gradient(scores)
    fits, above, below = _exponential_factors(fixed)
    chunk = pair_plan.active().log_chunk
    chunked = _in_log_chunks(ops.stack([above, below], axis=-1), 1.0, chunk)

    def smalls_by_factors(difference):
        del difference  # the factors hold it
        return ops.minimum(ops.expand_dims(below, (1, 2)) * chunked[..., 0],
                           ops.expand_dims(above, (1, 2)) * chunked[..., 1])

    def smalls_by_pairs(difference):
        return ops.exp(-ops.abs(difference))

    def sums(smalls, scores, ranked):  # pairs [b, c, m, k]: column j = (c, m), row k last
        difference = _in_log_chunks(scores, 0.0, chunk) - ops.expand_dims(scores, (1, 2))
        higher = ops.expand_dims(ranked, (1, 2)) > _in_log_chunks(ranked, float("nan"), chunk)
        small = ops.where(higher, smalls(difference), 0.0)
        rise = ops.where(higher, ops.maximum(difference, 0.0), 0.0)
        width = chunk
        while width > 1:  # (1 + a)(1 + b) = 1 + (a + b(1 + a))
            width //= 2
            small = small[:, :, :width] + small[:, :, width:] * (1.0 + small[:, :, :width])
            rise = rise[:, :, :width] + rise[:, :, width:]
        return ops.sum(rise[:, :, 0] + _log1p(small[:, :, 0]), axis=1)

    def ratios_by_factors(scores):
        del scores  # the factors hold them
        return ops.expand_dims(below, 2) * ops.expand_dims(above, 1)

    def ratios_by_pairs(scores):
        return ops.exp(_differences(scores, scores))

    select_last = pair_plan.logistic_gradient_select_last()

    def gradient(ratios, scores, ranked, upstream):
        ratio = ops.minimum(ratios(scores), 1e30)  # e^{s_j − s_k}
        k_is_upper = ops.expand_dims(ranked, 2) > ops.expand_dims(ranked, 1)
        k_is_lower = ops.expand_dims(ranked, 2) < ops.expand_dims(ranked, 1)
        pulls = (ops.where(k_is_lower, ops.expand_dims(upstream, 1), 0.0)
                 - ops.where(k_is_upper, ratio * ops.expand_dims(upstream, 2), 0.0))
        pulls = pulls / (1.0 + ratio)
        if select_last:  # ("Select last")
            pulls = ops.where(ops.logical_or(k_is_upper, k_is_lower), pulls, 0.0)
        return ops.sum(pulls, axis=-1)  # one reduction: one fused pass

    def either(of, by_factors, by_pairs, *inputs):
        return _factored_or_per_pair(fits, lambda *given: of(by_factors, *given),
                                     lambda *given: of(by_pairs, *given), fixed, ranked, *inputs)

    return (either(sums, smalls_by_factors, smalls_by_pairs),
            lambda upstream: either(gradient, ratios_by_factors, ratios_by_pairs, upstream))


# Select last (JAX's XLA on CPU; "Separate passes" says what its library fusions take). A
# reduction whose operand ends in arithmetic is handed to the CPU library together with that
# arithmetic, which it evaluates op by op over tiles of the pairs; any select before it is first
# written out as a [B, L, L] tensor. RankNet's backward pass masks its pulls once more, by a
# select after the quotient, so that the library takes the reduction alone and XLA's loop
# emitter computes each pair's pull in registers and writes it once: the plan TensorFlow's XLA
# takes for the same pass unasked, so only JAX takes it (`pair_plan.logistic_gradient_select_last`).
# Remove this when XLA's CPU library fusions take selects.


def _in_log_chunks(columns, fill, chunk):
    """Returns `[B, L, ...]` columns as `[B, ⌈L/chunk⌉, chunk, 1, ...]` (chunk c holds
    columns c·chunk, c·chunk + 1, …), padded with `fill`. Pairs laid out as [b, c, m, k], rows k
    last, vectorise over the rows under XLA, whatever the list size."""
    shape = ops.shape(columns)
    chunks = (shape[1] + chunk - 1) // chunk
    padding = [(0, 0), (0, chunks * chunk - shape[1])] + [(0, 0)] * (len(shape) - 2)
    padded = ops.pad(columns, padding, constant_values=fill)
    return ops.expand_dims(ops.reshape(padded, (shape[0], chunks, chunk, *shape[2:])), 3)


def logistic_pair_sums(scores, labels, mask, pairwise="auto"):
    """Returns Σ_{j real: l_j < l_k} ln(1 + e^{−(s_k − s_j)}) for each real document k, `[B, L]`
    (0 on padded ones): the RankNet loss of the pairs in which k is the upper document.

    Summed in blocks of columns with a recomputing backward pass for long lists (`pairwise`).
    A padded document's label is NaN inside, so it is in no pair (no comparison with NaN holds).
    Its reference is `reference_logistic_pair_sums`.
    """
    ranked = ops.where(mask, labels, float("nan"))
    return _pair_sums(_logistic_sums, _logistic_sum_gradients, _dense_logistic_sums, scores,
                      (ranked,), (0.0, float("nan")), pairwise)


def reference_logistic_pair_sums(scores, labels, mask):
    """`logistic_pair_sums` as its formula: softplus of every difference of a pair, summed,
    differentiated by autodiff (`[B, L, L]` pairs, no custom gradient): the reference of the
    variants."""
    ranked = ops.stop_gradient(ops.where(mask, labels, float("nan")))
    return _logistic_sums(scores, ranked, scores, ranked)


def higher_counts(values, pairwise="auto"):
    """Returns #{real j: v_j > v_k} for each k, float `[B, L]` (padded slots hold −inf), dense (the
    reference) or in blocks of columns as `pairwise` says, so a long list never holds its
    `[L, L]` comparisons at once."""
    def higher_in(columns):
        higher = ops.greater(ops.expand_dims(columns, 1), ops.expand_dims(values, 2))
        return ops.sum(ops.cast(higher, COMPUTE_DTYPE), axis=-1)

    return _dense_or_blocked(
        pairwise, values, lambda: higher_in(values),
        lambda: _sum_over_column_blocks(lambda columns: higher_in(columns[0]),
                                        (values,), (float("-inf"),),
                                        pair_plan.active().pair_block))


def concordant_counts(labels, scores, pairwise="auto"):
    """Returns #{real j: l_j > l_k and s_j > s_k} for each k, float `[B, L]` (padded slots hold
    label −inf), dense or in blocks of columns as `pairwise` says, as `higher_counts`."""
    def concordant_in(column_labels, column_scores):
        above = ops.logical_and(
            ops.greater(ops.expand_dims(column_labels, 1), ops.expand_dims(labels, 2)),
            ops.greater(ops.expand_dims(column_scores, 1), ops.expand_dims(scores, 2)))
        return ops.sum(ops.cast(above, COMPUTE_DTYPE), axis=-1)

    return _dense_or_blocked(
        pairwise, labels, lambda: concordant_in(labels, scores),
        lambda: _sum_over_column_blocks(lambda columns: concordant_in(*columns),
                                        (labels, scores), (float("-inf"), 0.0),
                                        pair_plan.active().pair_block))


# Counted orders. XLA's sort is slow on CPU: under XLA, short lists of a static size are ordered
# by O(L²) comparisons instead (`pair_plan.order`). The reference is a stable sort
# (`tfapprox.ops.descending_order`).
def descending_positions_by_counting(values):
    """Returns the int32 0-based positions a stable descending sort gives each entry, in O(L²)
    comparisons: #{y: v_y > v_x, or v_y = v_x and y before x}; NaN counts as −inf, so the
    positions are a permutation."""
    values = ops.where(ops.isnan(values), float("-inf"), values)
    index = ops.arange(ops.shape(values)[1])
    value_k, value_j = ops.expand_dims(values, 2), ops.expand_dims(values, 1)  # [b, k, j]
    ahead = ops.logical_or(value_j > value_k, ops.logical_and(
        value_j == value_k, ops.expand_dims(index, 0) < ops.expand_dims(index, 1)))
    return ops.sum(ops.cast(ahead, "int32"), axis=-1)


def descending_order_by_counting(values):
    """Returns what a stable descending argsort of `values` does (NaN as −inf), by counting."""
    index = ops.arange(ops.shape(values)[1])
    placed = (ops.expand_dims(descending_positions_by_counting(values), 1)
              == ops.reshape(index, (1, -1, 1)))  # [b, position, document]
    return ops.sum(ops.where(placed, ops.reshape(index, (1, 1, -1)), 0), axis=-1)


# Sorting networks. XLA's CPU sort calls a comparator per comparison; a bitonic network of
# vectorised compare-exchanges over the whole batch is faster. Under XLA, lists of a static size
# whose sort keys are small non-negative integers (ListMLE's) go through the network, ahead of
# counting (`pair_plan.order`).
def _network_size(list_size):
    """Returns n, the power of two ≥ `list_size` (and ≥ 2) the network sorts."""
    return 2 ** max(list_size - 1, 1).bit_length()


def network_code_limit(list_size):
    """Returns the bound on the codes `descending_order_by_network` sorts in lists of
    `list_size`: they share an int32 with the index, in log2 n low bits."""
    return 2 ** 31 // _network_size(list_size)


def descending_order_by_network(codes):
    """Returns what a stable descending argsort of int32 `codes` `[B, L]` (each in
    [0, `network_code_limit(L)`), L static) does, by a bitonic sorting network (Batcher).

    Each code is packed with its index, code·n + (n − 1 − index), n = L rounded up to a power of
    two, so the packed values are distinct, their descending order is the stable order of the
    codes, and the network moves no payload. The lists are padded to n with −1 (sorted last).
    Merging sorted runs of k: each element of a run's first half against its mirror in the
    second (first half keeps the larger), then half-cleaners of stride k/4 … 1; log2 n rounds of
    merging, ½·log2 n·(log2 n + 1) compare-exchange steps over the whole batch."""
    list_size = codes.shape[1]
    size = _network_size(list_size)
    index = ops.arange(list_size, dtype="int32")
    packed = ops.cast(codes, "int32") * size + ops.expand_dims(size - 1 - index, 0)
    if size > list_size:
        packed = ops.pad(packed, ((0, 0), (0, size - list_size)), constant_values=-1)

    run = 2
    while run <= size:
        halves = ops.reshape(packed, (-1, size // run, 2, run // 2))
        first, mirror = halves[:, :, 0], ops.flip(halves[:, :, 1], axis=-1)
        higher, lower = ops.maximum(first, mirror), ops.minimum(first, mirror)
        packed = ops.reshape(ops.stack([higher, ops.flip(lower, axis=-1)], axis=2), (-1, size))
        stride = run // 4
        while stride >= 1:
            pairs = ops.reshape(packed, (-1, size // (2 * stride), 2, stride))
            first, second = pairs[:, :, 0], pairs[:, :, 1]
            packed = ops.reshape(ops.stack([ops.maximum(first, second),
                                            ops.minimum(first, second)], axis=2), (-1, size))
            stride //= 2
        run *= 2
    return (size - 1) - ops.mod(packed[:, :list_size], size)
