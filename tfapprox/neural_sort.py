"""NeuralSort's relaxed sort made doubly stochastic by Sinkhorn scaling (NeuralNDCG's sort), with
a gradient that keeps one `[L, L]` tensor, whatever the number of Sinkhorn rounds.

Sinkhorn's rounds only rescale rows and columns: after t rounds of normalising the rows, then the
columns, of P̂ `[B, L, L]` the matrix is diag(a_t)·P̂·diag(b_t), with

    a_t = 1/(P̂ b_{t−1}),   b_t = 1/(P̂ᵀ a_t),   b_0 = 1   (0 where the sum is 0),

so an empty row or column stays 0, as when the matrix itself is divided. The forward pass is 2T
matrix-vector products with P̂; it keeps P̂'s softmax (P̂ without its row mask) and the scalings
(2T vectors of L). The backward pass runs the rounds back through 2T more products; ∂/∂P̂ is a sum
of 2T + 1 outer products of those vectors, formed and reduced to ∂/∂scores a block of ROW_BLOCK
rows at a time, as are the sums over document pairs (Σ_k |s_j − s_k| forward, Σ_k sign(s_j − s_k)
backward). Time O(T·L²) per list both ways. Memory: P̂'s softmax, plus the logits it is made from
while it is made (2·4·L² bytes at the peak), plus O(ROW_BLOCK·L); autodiff through the rounds
would keep every round's matrices (O(T·L²): 3.5 GB for one list of 2,000 at T = 50). The forward
pass is cut off from every tape, so an eager `tf.GradientTape` keeps only what the gradient reads.
"""

import keras
from keras import ops

from tfapprox import ops as rank_ops
from tfapprox import pair_plan, pair_sums

# Lists longer than this many documents are reduced ROW_BLOCK rows (or columns) of their [L, L]
# pairs at a time in the backward pass and in the pair sums; shorter ones in one piece. A module
# setting read when a function is traced.
ROW_BLOCK = 1024


def _relaxed_sort(scores, mask, real, temperature):
    """Returns NeuralSort's relaxed permutation matrix P̂ `[B, L, L]` (Grover, Wang, Zweig &
    Ermon, ICLR 2019, eq. 5) over the n real documents of each list as its softmax S `[B, L, L]`
    and its row mask r `[B, L]` (P̂ = diag(r)·S), and the row weights n + 1 − 2i `[B, L]`:

        P̂[i, :] = softmax_j(((n + 1 − 2i)·s_j − Σ_{k real} |s_j − s_k|)/τ),   i = 1, …, n,

    whose row i is a soft one-hot of the document at position i; rows i > n are 0 (r_i = 0), and
    padded columns are 0 in S itself (their logit is the lowest float)."""
    count = ops.expand_dims(rank_ops.count_per_list(mask), -1)
    positions = ops.cast(ops.arange(1, ops.shape(scores)[1] + 1), rank_ops.COMPUTE_DTYPE)

    def spread_block(start, size, owned):  # Σ_{k in the block} |s_j − s_k|·real_k
        columns = _block_of(scores, start, size)
        return ops.sum(ops.abs(ops.expand_dims(scores, 2) - ops.expand_dims(columns, 1))
                       * ops.expand_dims(_block_of(real, start, size) * owned, 1), axis=-1)

    spread = _sum_over_blocks(scores, spread_block, ops.zeros_like(scores))
    weights = count + 1.0 - 2.0 * positions  # [B, L], row i
    # one product of [L, 2] and [2, L] factors: XLA writes no broadcast operand of [L, L]
    logits = ops.matmul(ops.stack([weights, ops.ones_like(weights)], axis=-1) / temperature,
                        ops.stack([scores, -spread], axis=1))
    logits = ops.where(ops.expand_dims(mask, 1), logits,
                       rank_ops.LOWEST_FLOAT32)  # finite: no NaN in empty rows
    rows = ops.cast(positions <= count, rank_ops.COMPUTE_DTYPE)
    return ops.softmax(logits, axis=-1), rows, weights


def _block_of(values, start, size):
    """Returns `values[:, start:start + size]` of `[B, L, ...]`."""
    shape = ops.shape(values)
    return ops.slice(values, (0, start) + (0,) * (len(shape) - 2),
                     (shape[0], size) + tuple(shape[2:]))


def _sum_over_blocks(like, block_terms, zeros):
    """Returns Σ_J `block_terms(start, size, owned)`, shaped as `zeros`, over the blocks J of
    ROW_BLOCK documents of lists `like` `[B, L]` (one block, no loop, for a shorter static L).

    A block is documents start … start + size − 1; the last starts at L − size, overlapping the
    one before, and `owned` `[size]` (1 or 0) marks the documents no earlier block had, by which
    `block_terms` must weigh each document's part. One block is alive at a time.
    """
    list_size = ops.shape(like)[1]
    if isinstance(list_size, int) and list_size <= ROW_BLOCK:
        return block_terms(0, list_size, ops.ones((list_size,), like.dtype))
    size = ops.minimum(list_size, ROW_BLOCK)
    if isinstance(list_size, int):
        size = min(list_size, ROW_BLOCK)

    def add_block(index, total):
        first = index * size
        start = ops.minimum(first, list_size - size)
        owned = ops.cast(start + ops.arange(size) >= first, like.dtype)
        return total + block_terms(start, size, owned)

    return pair_sums._one_step_at_a_time((list_size + size - 1) // size, add_block, zeros)


def _by_products(matrix):
    """Whether `_times` and `_times_transposed` multiply and reduce instead of calling a matmul:
    under XLA, which then fuses the whole step (a batch of small matmuls made NeuralNDCG's step
    on lists of 10 about 5× slower there), and for the short lists of
    `pair_sums.elementwise_sums_apply` without it. Not under TensorFlow's XLA for a static L
    above ROW_BLOCK: it writes each product's `[L, L]` tensor before reducing it (JAX's XLA fuses
    them, and a matmul there made it keep a second copy of P̂)."""
    if pair_plan.xla_path("Sinkhorn products"):
        return (keras.backend.backend() == "jax" or matrix.shape[-1] is None
                or matrix.shape[-1] <= ROW_BLOCK)
    return pair_sums.elementwise_sums_apply(matrix)


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
        # cut off from the tape: an eager tf.GradientTape would keep the forward's [L, L]
        # tensors (8 of them for one list of 10,000), though the gradient reads only `softmax`
        scores = ops.stop_gradient(scores)
        softmax, rows, weights = _relaxed_sort(scores, mask, real, temperature)

        def times(vector):  # P̂ v
            return rows * _times(softmax, vector)

        list_size = ops.shape(scores)[1]
        short = pair_plan.short_sinkhorn_on_jax(list_size if isinstance(list_size, int) else None)

        def times_transposed(vector):  # P̂ᵀ v
            if short:  # each v here is a multiple of a row scaling, 0 on the empty rows
                return _times_transposed(softmax, vector)
            return _times_transposed(softmax, rows * vector)

        def round_(scalings, _):
            row_scaling = rank_ops.safe_divide(1.0, times(scalings[1]))
            column_scaling = rank_ops.safe_divide(1.0, times_transposed(row_scaling))
            return (row_scaling, column_scaling), (row_scaling, column_scaling)

        ones = ops.ones_like(scores)
        (row_scaling, column_scaling), (row_stack, column_stack) = ops.scan(
            round_, (ones, ones), length=iterations)
        column_gains = column_scaling * gains
        unscaled = times(column_gains)

        def gradient(upstream):
            # ∂/∂b_T and ∂/∂a_T of a_T ⊙ P̂(b_T ⊙ G); then each round back: b = 1/q, q = P̂ᵀa,
            # a = 1/p, p = P̂ b_prev, which add ∂/∂P̂ = a ⊗ q̄ + p̄ ⊗ b_prev
            upstream_rows = upstream * row_scaling

            def back(pending, inputs):
                column_bar, row_extra = pending
                row_scaling, column_scaling = inputs
                column_sums_bar = -column_bar * column_scaling * column_scaling
                row_sums_bar = -(times(column_sums_bar) + row_extra) * row_scaling * row_scaling
                return ((times_transposed(row_sums_bar), ops.zeros_like(row_scaling)),
                        (column_sums_bar, row_sums_bar))

            _, (column_sums_bars, row_sums_bars) = ops.scan(
                back, (gains * times_transposed(upstream_rows), upstream * unscaled),
                xs=(row_stack, column_stack), reverse=True)
            previous_columns = ops.concatenate(
                [ops.expand_dims(ones, 0), column_stack[:-1]], axis=0)
            left = ops.concatenate([ops.expand_dims(upstream_rows, -1), _columns(row_stack),
                                    _columns(row_sums_bars)], axis=-1)
            right = ops.concatenate([ops.expand_dims(column_gains, -1),
                                     _columns(column_sums_bars), _columns(previous_columns)],
                                    axis=-1)
            return _scores_gradient(scores, real, softmax, rows, weights, temperature, left,
                                    right, short), ops.zeros_like(gains)

        return row_scaling * unscaled, gradient

    return placed(scores, ops.stop_gradient(gains))


def _scores_gradient(scores, real, softmax, rows, weights, temperature, left, right, stacked):
    """Returns ∂/∂scores `[B, L]` through `_relaxed_sort`, given ∂/∂P̂ = left·rightᵀ (`[B, L, R]`
    each): the softmax's ∂/∂logits = P̂ ⊙ (∂/∂P̂ − Σ_j P̂_ij·∂/∂P̂_ij), then logits_ij =
    (w_i·s_j − spread_j)/τ and spread_j = Σ_{k real} |s_j − s_k|.

    Both go a block of rows at a time (`_sum_over_blocks`): a block of ∂/∂P̂ is formed before its
    row sums are taken from it, so that they cancel it where a row of P̂ is (nearly) one-hot, as
    autodiff's do; taken from the factors they left float32 errors that a small τ magnified (1 %
    of the gradient at τ = 0.01). Rows i > n (r_i = 0) take no part. `stacked`: the row weights
    are stacked `[B, 2, L]` (`pair_plan.short_sinkhorn_on_jax`), else transposed from `[B, L, 2]`."""
    right_transposed = ops.swapaxes(right, 1, 2)
    row_weights = ops.stack([weights * rows, rows], axis=-1)  # [B, L, 2]: w_i·r_i and r_i

    def logits_block(start, size, owned):  # Σ_{i in the block} (w_i, 1)·r_i·∂/∂logits_ij
        softmax_rows = _block_of(softmax, start, size)
        pairs = ops.matmul(_block_of(left, start, size), right_transposed)  # ∂/∂P̂, its rows
        pairs = pairs - ops.sum(softmax_rows * pairs, axis=-1, keepdims=True)
        pairs = softmax_rows * pairs  # ∂/∂logits
        if stacked:
            block_rows = _block_of(rows, start, size) * owned
            return ops.matmul(ops.stack([_block_of(weights, start, size) * block_rows,
                                         block_rows], axis=1), pairs)
        block_weights = _block_of(row_weights, start, size) * ops.expand_dims(owned, -1)
        return ops.matmul(ops.swapaxes(block_weights, 1, 2), pairs)

    by_weights, by_spread = ops.unstack(_sum_over_blocks(
        scores, logits_block, ops.zeros_like(ops.swapaxes(row_weights, 1, 2))) / temperature,
        2, axis=1)
    spread_bar = -by_spread
    document_terms = ops.stack([real, spread_bar], axis=-1)  # [B, L, 2]

    def sign_block(start, size, owned):  # Σ_{k in the block} sign(s_j − s_k)·(real_k, s̄_k)
        signs = ops.sign(ops.expand_dims(scores, 2)
                         - ops.expand_dims(_block_of(scores, start, size), 1))
        return ops.matmul(signs, _block_of(document_terms, start, size)
                          * ops.expand_dims(owned, -1))

    sign_sums = _sum_over_blocks(scores, sign_block, ops.zeros_like(document_terms))
    return by_weights + spread_bar * sign_sums[..., 0] + real * sign_sums[..., 1]
