"""NeuralSort's relaxed sort made doubly stochastic by Sinkhorn scaling (NeuralNDCG's sort), with
a gradient that keeps no `[L, L]` tensor per Sinkhorn round.

Sinkhorn's rounds only rescale rows and columns: after t rounds of normalising the rows, then the
columns, of P̂ `[B, L, L]` the matrix is diag(a_t)·P̂·diag(b_t), with

    a_t = 1/(P̂ b_{t−1}),   b_t = 1/(P̂ᵀ a_t),   b_0 = 1   (0 where the sum is 0),

so an empty row or column stays 0, as when the matrix itself is divided. The forward pass is 2T
matrix-vector products with P̂; it keeps P̂ and the scalings (2T vectors of L). The backward pass
runs the rounds back through 2T more products, and ∂/∂P̂ is a sum of 2T + 1 outer products of
those vectors, formed in one `[L, 2T+1] × [2T+1, L]` product. Time O(T·L²) per list both ways;
memory O(L²), whatever T is: the code holds P̂ and at most two more `[L, L]` tensors at once
(what a backend allocates besides is in docs/benchmarks.md). Autodiff through
the rounds would keep every round's matrices (O(T·L²): 3.5 GB for one list of 2,000 at T = 50).
"""

import keras
from keras import ops

from tfapprox import direct_ops
from tfapprox import ops as rank_ops
from tfapprox import pair_sums


def _relaxed_sort(scores, mask, real, temperature):
    """Returns NeuralSort's relaxed permutation matrix P̂ `[B, L, L]` (Grover, Wang, Zweig &
    Ermon, ICLR 2019, eq. 5) over the n real documents of each list, and the row weights
    n + 1 − 2i `[B, L]`:

        P̂[i, :] = softmax_j(((n + 1 − 2i)·s_j − Σ_{k real} |s_j − s_k|)/τ),   i = 1, …, n,

    whose row i is a soft one-hot of the document at position i; rows i > n and padded columns
    are 0."""
    count = ops.expand_dims(rank_ops.count_per_list(mask), -1)
    positions = ops.cast(ops.arange(1, ops.shape(scores)[1] + 1), rank_ops.COMPUTE_DTYPE)
    spread = ops.sum(ops.abs(direct_ops.pair_differences(scores)) * ops.expand_dims(real, 1),
                     axis=-1)  # Σ_k |s_j − s_k| over real k
    weights = count + 1.0 - 2.0 * positions  # [B, L], row i
    # one product of [L, 2] and [2, L] factors: XLA writes no broadcast operand of [L, L]
    logits = ops.matmul(ops.stack([weights, ops.ones_like(weights)], axis=-1) / temperature,
                        ops.stack([scores, -spread], axis=1))
    logits = ops.where(ops.expand_dims(mask, 1), logits,
                       rank_ops.LOWEST_FLOAT32)  # finite: no NaN in empty rows
    rows = ops.expand_dims(ops.cast(positions <= count, rank_ops.COMPUTE_DTYPE), -1)
    return ops.softmax(logits, axis=-1) * rows * ops.expand_dims(real, 1), weights


def _by_products(matrix):
    """Whether `_times` and `_times_transposed` multiply and reduce instead of calling a matmul:
    under XLA, which fuses the products into the reduction (a batch of small matmuls made
    NeuralNDCG's step on lists of 10 about 5× slower there), and for the short lists of
    `pair_sums.elementwise_sums_apply` without it."""
    return pair_sums.xla_path("Sinkhorn products") or pair_sums.elementwise_sums_apply(matrix)


def _times(matrix, vector):
    """Returns Σ_j M_ij·v_j, `[B, L]`, for `matrix` `[B, L, L]` and `vector` `[B, L]`."""
    if _by_products(matrix):
        return ops.sum(matrix * ops.expand_dims(vector, 1), axis=-1)
    return ops.squeeze(ops.matmul(matrix, ops.expand_dims(vector, -1)), -1)


def _times_transposed(matrix, vector):
    """Returns Σ_i v_i·M_ij, `[B, L]`."""
    if _by_products(matrix):
        return ops.sum(matrix * ops.expand_dims(vector, 2), axis=1)
    return ops.squeeze(ops.matmul(ops.expand_dims(vector, 1), matrix), 1)


def _columns(stacked):
    """`[T, B, L]` vectors, one per round, as `[B, L, T]`."""
    return ops.transpose(stacked, (1, 2, 0))


def sorted_gains(scores, mask, gains, temperature, iterations):
    """Returns Σ_j P_ij·G_j `[B, L]`, the gains NeuralNDCG places at each position i: P is
    NeuralSort's P̂ (`_relaxed_sort`, slope 1/τ) after `iterations` rounds of Sinkhorn scaling,
    computed as the module docstring says, with the same values and gradient with respect to
    `scores` as autodiff through the rounds (ties aside: there |s_j − s_k|'s slope is taken as
    0). `gains` get no gradient."""
    real = ops.cast(mask, rank_ops.COMPUTE_DTYPE)

    @ops.custom_gradient
    def placed(scores, gains):
        relaxed, weights = _relaxed_sort(scores, mask, real, temperature)

        def round_(scalings, _):
            rows = rank_ops.safe_divide(1.0, _times(relaxed, scalings[1]))
            columns = rank_ops.safe_divide(1.0, _times_transposed(relaxed, rows))
            return (rows, columns), (rows, columns)

        ones = ops.ones_like(scores)
        (row_scaling, column_scaling), (row_stack, column_stack) = ops.scan(
            round_, (ones, ones), length=iterations)
        column_gains = column_scaling * gains
        unscaled = _times(relaxed, column_gains)

        def gradient(upstream):
            # ∂/∂b_T and ∂/∂a_T of a_T ⊙ P̂(b_T ⊙ G); then each round back: b = 1/q, q = P̂ᵀa,
            # a = 1/p, p = P̂ b_prev, which add ∂/∂P̂ = a ⊗ q̄ + p̄ ⊗ b_prev
            upstream_rows = upstream * row_scaling

            def back(pending, inputs):
                column_bar, row_extra = pending
                rows, columns = inputs
                column_sums_bar = -column_bar * columns * columns
                row_sums_bar = -(_times(relaxed, column_sums_bar) + row_extra) * rows * rows
                return ((_times_transposed(relaxed, row_sums_bar), ops.zeros_like(rows)),
                        (column_sums_bar, row_sums_bar))

            _, (column_sums_bars, row_sums_bars) = ops.scan(
                back, (gains * _times_transposed(relaxed, upstream_rows), upstream * unscaled),
                xs=(row_stack, column_stack), reverse=True)
            previous_columns = ops.concatenate(
                [ops.expand_dims(ones, 0), column_stack[:-1]], axis=0)
            left = ops.concatenate([ops.expand_dims(upstream_rows, -1), _columns(row_stack),
                                    _columns(row_sums_bars)], axis=-1)
            right = ops.concatenate([ops.expand_dims(column_gains, -1),
                                     _columns(column_sums_bars), _columns(previous_columns)],
                                    axis=-1)
            return _scores_gradient(scores, real, relaxed, weights, temperature, left,
                                    right), ops.zeros_like(gains)

        return row_scaling * unscaled, gradient

    return placed(scores, ops.stop_gradient(gains))


def _scores_gradient(scores, real, relaxed, weights, temperature, left, right):
    """Returns ∂/∂scores `[B, L]` through `_relaxed_sort`, given ∂/∂P̂ = left·rightᵀ (`[B, L, R]`
    each): the softmax's ∂/∂logits = P̂ ⊙ (∂/∂P̂ − Σ_j P̂_ij·∂/∂P̂_ij), then logits_ij =
    (w_i·s_j − spread_j)/τ and spread_j = Σ_{k real} |s_j − s_k|.

    ∂/∂P̂ is formed before its row sums are taken from it, so that they cancel it where a row of
    P̂ is (nearly) one-hot, as autodiff's do; taken from the factors they left float32 errors
    that a small τ magnified (1 % of the gradient at τ = 0.01). One name is rebound at each step
    so that at most three `[B, L, L]` tensors, P̂ among them, are alive at once."""
    pairs = ops.matmul(left, ops.swapaxes(right, 1, 2))  # ∂/∂P̂
    pairs = pairs - ops.sum(relaxed * pairs, axis=-1, keepdims=True)
    pairs = relaxed * pairs  # ∂/∂logits
    by_weights, by_spread = ops.unstack(
        ops.matmul(ops.stack([weights, ops.ones_like(weights)], axis=1), pairs) / temperature,
        2, axis=1)
    del pairs
    spread_bar = -by_spread
    signs = ops.sign(direct_ops.pair_differences(_after(scores, spread_bar)))  # sign(s_j − s_k)
    sign_sums = ops.matmul(signs, ops.stack([real, spread_bar], axis=-1))
    return by_weights + spread_bar * sign_sums[..., 0] + real * sign_sums[..., 1]


def _after(value, dependency):
    """Returns `value`, read only once `dependency` has been computed.

    Backend fallback: a TensorFlow graph runs independent ops at once, so the backward pass
    built its sign matrix while ∂/∂logits was alive (one list of 10,000: 1.9 GB above the
    framework instead of 1.2). Eager TensorFlow, XLA and JAX run them one after the other anyway.
    """
    if keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf

    with tf.control_dependencies([dependency]):
        return tf.identity(value)
