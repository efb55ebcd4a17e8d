"""How the pair sums, pair counts and orders of `tfapprox.ops` are made fast: dense or blocked,
custom gradients, and the backend and compiler work-arounds, each in a block with its reason.

What is computed lives in `tfapprox.ops`; this module holds how. The tricks, and what justified
them (figures from docs/benchmarks.md, "How" and "Long lists"):

- Blocked sums (`pairwise`, PAIR_BLOCK, BLOCKED_ABOVE): lists longer than 1024 documents are
  summed 256 columns at a time, so no `[B, L, L]` tensor exists (one list of 60,000 would need
  14 GB per such tensor; blocked, ApproxNDCG's peak RSS was 925 MiB). Not on a GPU (JAX), whose
  XLA writes no such tensor dense: there dense ran 2–2.9× as fast.
- One block at a time on TensorFlow (`_one_step_at_a_time`): with up to 10 loop steps in flight
  (TensorFlow's default) a list of 60,000 peaked at 1.6 GB instead of 1.1 GB.
- Custom gradients (`_pair_sums`): the backward pass is one pass over the pairs (a matmul, or
  one fused reduction under XLA), not a second trip through autodiff's broadcast graph.
- Factored exponentials under XLA (FACTORED_EXPONENTIALS, `_exponential_factors`): e^{v_k − v_j}
  as a product of two per-document factors, two exps per document instead of one per pair, where
  every list spans at most 2·EXP_LIMIT; chosen from CPU measurements. On a GPU (JAX), lists up
  to PER_PAIR_EXPS_ON_GPU_UP_TO (512) take one exp per pair, faster there; on JAX's CPU, the σ
  sums of batches of up to PER_PAIR_SIGMOID_EXPS_ON_CPU_UP_TO (2^15) pairs do (ApproxAP's step
  1.15–1.32× less CPU time in batches of 6,400 to 25,600 pairs).
- Loops of 0 or 1 steps under XLA (`_only_if`): the per-pair fallback runs only for the batches
  that need it; XLA turns an `ops.cond` of plain arithmetic into a select that computes both.
- Elementwise sums without XLA (ELEMENTWISE_SUMS_UP_TO, `_row_sums`): lists of a static size up
  to 32 sum their pairs by products instead of TensorFlow's batched matmul of small matrices
  (ApproxNDCG and RankNet 1.26× faster at list 10).
- Separate passes under XLA (`_dense_sigmoid_sums`): the σ sums' forward and backward passes
  take different factor sets and no select, so that JAX's XLA fuses each whole instead of first
  writing [B, L, L] tensors (ApproxNDCG on JAX at list 1000 about 7× faster); no pair-shaped
  constant either, which XLA shares between the passes and writes (ApproxAP about 2.4×).
- Select last on JAX (`select_last_applies`): RankNet's backward pass ends in a select, so that
  JAX's XLA hands only its reduction to YNNPACK and computes the pairs in one loop (RankNet's
  step on JAX 1.3–1.9× less CPU time at lists 100 to 1000).
- Log chunks under XLA (LOG_CHUNK, `_log1p`): RankNet takes one log per 8 pairs, 3.92× TF-Ranking
  at list 1000 where one log per pair gave 1.80×.
- Counted orders under XLA (COUNTED_ORDER_UP_TO): lists of a static size up to 128 are ordered by
  O(L²) comparisons instead of XLA's sort, slow on CPU (ListMLE 1.2× faster at list 10, 1.5× at
  100, 0.4× at 1000).
- Network orders under XLA (NETWORK_ORDER_UP_TO): lists of a static size with small integer
  sort keys (ListMLE's) are ordered by a bitonic network of vectorised compare-exchanges instead
  of XLA's sort or a count (ListMLE at list 1000 4,300 → 11,000 lists/s, at 100 1.5× counting).

FACTORED_EXPONENTIALS, PER_PAIR_EXPS_ON_GPU_UP_TO, PER_PAIR_SIGMOID_EXPS_ON_CPU_UP_TO,
COUNTED_ORDER_UP_TO, NETWORK_ORDER_UP_TO, ELEMENTWISE_SUMS_UP_TO, BLOCKED_ABOVE and PAIR_BLOCK are
module settings read when a function is traced (`benchmarks/losses.py` and
`benchmarks/gpu.py --paths` time the other paths).
"""

import contextlib

import keras
import numpy as np
from keras import ops

COMPUTE_DTYPE = "float32"


def compiled_by_xla():
    """Whether the code being traced is compiled by XLA: always on JAX; on TensorFlow inside a
    `tf.function(jit_compile=True)` (a TensorFlow-internal check, False if it is unavailable)."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        return backend == "jax"
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))
    except (ImportError, AttributeError):
        return False


# Paths taken: every compiled-mode choice goes through `xla_path`, and every other choice of how
# (orders, blocks, exps, sums, RankNet's gradient) through `record`, which record it for
# `recording_paths` while a function is traced, so a test (or benchmarks/pair_paths.py) can see
# which paths a loss took under `jax.jit` or `jit_compile=True` without timing it.
_RECORDINGS = []


def record(what, path):
    """Records that `what` took `path` in every `recording_paths` block open."""
    for taken in _RECORDINGS:
        taken.append(f"{what}: {path}")


def xla_path(what):
    """Returns `compiled_by_xla()`, recording "`what`: XLA" or "`what`: no XLA"."""
    compiled = compiled_by_xla()
    record(what, "XLA" if compiled else "no XLA")
    return compiled


@contextlib.contextmanager
def recording_paths():
    """Yields a list that collects the `xla_path` choices made while tracing inside the block."""
    taken = []
    _RECORDINGS.append(taken)
    try:
        yield taken
    finally:
        _RECORDINGS.remove(taken)


# Pairwise sums (Σ_j f(x_k, x_j) for every k) over lists longer than BLOCKED_ABOVE documents are
# computed PAIR_BLOCK columns at a time, forward and backward (pairwise="auto"): memory
# O(B·L·PAIR_BLOCK) instead of O(B·L²). "dense" and "blocked" force either way.
# On a GPU (JAX) "auto" is dense at every size: there XLA fuses each pass over the pairs into its
# reduction and writes no [B, L, L] tensor. On an H200, ApproxNDCG, ApproxAP and RankNet over one
# list of 60,000 documents planned 57, 113 and 56 MiB of temporaries dense (61, 62 and 61 MiB
# blocked) and ran 2.4×, 2.0× and 2.6× as fast as blocked; 2.1–2.9× at 4 lists of 10,000
# (docs/benchmarks.md, "GPU").
PAIRWISE_MODES = ("auto", "dense", "blocked")
BLOCKED_ABOVE = 1024
PAIR_BLOCK = 256


def _dense_or_blocked(pairwise, like, dense, blocked):
    """Returns `dense()` or `blocked()`, as `pairwise` says; "auto" takes `blocked()` for lists
    of `like` [B, L] longer than BLOCKED_ABOVE (chosen when tracing if L is static, else when
    the graph runs), except on a GPU (`on_gpu`), where it is always dense."""
    if pairwise == "auto" and on_gpu():
        pairwise = "dense"
    if pairwise == "auto":
        list_size = like.shape[1]
        if list_size is None:
            record("pairs", f"blocked above {BLOCKED_ABOVE} documents")
            return ops.cond(ops.shape(like)[1] > BLOCKED_ABOVE, blocked, dense)
        pairwise = "blocked" if list_size > BLOCKED_ABOVE else "dense"
    if pairwise not in PAIRWISE_MODES:
        raise ValueError(f"`pairwise` must be one of {PAIRWISE_MODES}; got {pairwise!r}")
    record("pairs", pairwise)
    return blocked() if pairwise == "blocked" else dense()


def _sum_over_column_blocks(block_sums, columns, fills):
    """Returns Σ_J block_sums([c[:, J] for c in columns]) over blocks J of PAIR_BLOCK columns.

    `columns` are `[B, L]`; they are padded with `fills` to a whole number of blocks, and
    `block_sums` must give 0 for a padded column. It returns `[B, L]` row sums over one block's
    `[B, L, PAIR_BLOCK]` pairs, so one block of pairs is alive at a time. The loop runs with a
    `None` list dimension (a while loop in a TensorFlow graph, which XLA compiles too).
    """
    batch_size, list_size = ops.shape(columns[0])
    num_blocks = (list_size + PAIR_BLOCK - 1) // PAIR_BLOCK
    padding = ((0, 0), (0, num_blocks * PAIR_BLOCK - list_size))
    padded = [ops.pad(column, padding, constant_values=fill)
              for column, fill in zip(columns, fills)]

    def add_block(index, total):
        start = (0, index * PAIR_BLOCK)
        return total + block_sums(
            [ops.slice(column, start, (batch_size, PAIR_BLOCK)) for column in padded])

    return _one_step_at_a_time(num_blocks, add_block,
                               ops.zeros_like(columns[0], dtype=COMPUTE_DTYPE))


def _one_step_at_a_time(num_steps, body, initial):
    """Returns `ops.fori_loop(0, num_steps, body, initial)`, its steps never overlapping.

    Backend fallback: a TensorFlow graph runs up to 10 steps of a while loop at once (each with
    its own block of pairs: 1.6 GB instead of 1.1 GB peak for a list of 60,000), so on
    TensorFlow the loop is `tf.while_loop(parallel_iterations=1)`. JAX, XLA and eager loops run
    one step at a time anyway.
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
        total = _sum_over_column_blocks(lambda columns: row_sums(*fixed, *columns), fixed, fills)

        def gradient(upstream):
            # ties upstream's `None` dimensions to the rows': XLA cannot slice it otherwise when
            # it comes from another pair sum's matmul (ApproxAP's truncation)
            upstream = ops.reshape(upstream, ops.shape(rows[0]))
            return _sum_over_column_blocks(
                lambda columns: row_sum_gradients(*rows, upstream, *columns),
                (*rows, upstream), (*fills, 0.0))

        return total, gradient

    return _dense_or_blocked(pairwise, values, lambda: with_gradient(dense_sums),
                             lambda: with_gradient(blocked_sums))


# Elementwise sums (TensorFlow without XLA, on CPU): a batched matmul of many small matrices
# costs more than the products it replaces, so lists of a static size up to this sum
# [B, L, L] pairs against per-document vectors by products and reductions (forward+backward at
# list 10: ApproxNDCG and RankNet 1.26× faster; ApproxNDCG at 32 1.12–1.18×, at 100 0.82–0.98×);
# longer ones, and a `None` size, by matmul. 0 always takes the matmul. Under XLA the pairs fuse
# and no matmul is used. The same lists take RankNet's one log per row (`_dense_logistic_sums`,
# up to 127 whatever this says) and ListMLE's pairs fallback
# (`tfapprox.ops.suffix_logsumexp_minus_self`).
ELEMENTWISE_SUMS_UP_TO = 32


def elementwise_sums_apply(pairs):
    """Whether `_row_sums` and `_column_sums` of `pairs` [B, L, L] take products and reductions."""
    by_products = pairs.shape[-1] is not None and pairs.shape[-1] <= ELEMENTWISE_SUMS_UP_TO
    record("sums without XLA", "products" if by_products else "matmul")
    return by_products


def short_list_without_xla(values):
    """Whether lists `[B, L]` have a static size up to ELEMENTWISE_SUMS_UP_TO and XLA does not
    compile them: there TensorFlow's per-op cost rules, and a small matmul beats a cumulative
    sum (`running_sums`)."""
    return (values.shape[1] is not None and values.shape[1] <= ELEMENTWISE_SUMS_UP_TO
            and not xla_path("running sums"))


def running_sums(values, reverse=False):
    """Returns Σ_{i ≤ p} v_i at each position p of `values` [B, L] (Σ_{i ≥ p} with `reverse`):
    a cumulative sum (between flips for `reverse`), or for short lists without XLA
    (`short_list_without_xla`) one matmul with a triangular matrix of ones (at list 10 a
    cumulative sum over 256 lists took about 14 µs, the matmul ~5 µs, and no flips)."""
    list_size = values.shape[1]
    if short_list_without_xla(values):
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


# Under XLA, pair exponentials come from per-document factors where the lists fit them (measured
# faster on CPU); False takes one exp per pair everywhere, to compare on another device.
FACTORED_EXPONENTIALS = True
# Per-pair exps on a GPU (JAX): there an exp per pair is cheap, and the factored path adds a loop
# of 0 or 1 steps (`_only_if`), which XLA on a GPU drives from the host (the likely cost; not
# profiled). On an H200, one exp per pair ran
# ApproxNDCG, ApproxAP and RankNet 1.3×, 2.0× and 1.3× as fast at list 10 (batch 4096) and
# 1.1–1.2× at 100, and 0.88–0.93× as fast at 1000 (docs/benchmarks.md, "GPU"); so lists of a
# static size up to this take it there.
PER_PAIR_EXPS_ON_GPU_UP_TO = 512


# Per-pair σ exps in small batches on JAX's CPU. Beyond its two exps per document, the factored
# path costs a fixed amount a step: the factors, the test whether every list fits them, and two
# loops of 0 or 1 steps (`_only_if`) with the copies they make (ApproxAP's step at lists of 10,
# batch 256, compiles to 38 fusions and 2 while loops, per pair to 30 fusions and none). Where a
# batch holds few pairs, that costs more than the exps it saves. Interleaved A/B on JAX's CPU,
# median CPU time a step, per pair against the factors (docs/benchmarks.md, "Fourth round"):
# ApproxAP 1.15–1.32× less from 6,400 to 25,600 pairs a batch (lists of 8 and 10), the same at
# 32,768 (1.02×), 0.84–0.94× from 36,864 and 0.80–0.82× at lists of 100 (batch 64); ApproxNDCG
# within the noise (0.95–1.10×, identical settings differing by up to 8 %). So the σ sums of
# batches of a static shape with at most this many pairs (B·L²) take one exp per pair on JAX's
# CPU. RankNet's logistic sums keep the factors (per pair 0.60–0.95× at the same sizes), and so
# does TensorFlow (not measured there).
PER_PAIR_SIGMOID_EXPS_ON_CPU_UP_TO = 2 ** 15


def jax_platform():
    """JAX's default backend ("cpu", "gpu", ...) where the code is traced for JAX, else None."""
    if keras.backend.backend() != "jax":
        return None
    import jax

    return jax.default_backend()


def on_gpu():
    """Whether the code is traced for JAX on a GPU."""
    return jax_platform() == "gpu"


def factored_exponentials_apply(values, sigmoid_sums=False):
    """Whether pair exponentials of the `[B, L]` values come from per-document factors where the
    lists fit them (FACTORED_EXPONENTIALS): on a GPU, only lists longer than
    PER_PAIR_EXPS_ON_GPU_UP_TO; on JAX's CPU, for `sigmoid_sums`, only batches of more than
    PER_PAIR_SIGMOID_EXPS_ON_CPU_UP_TO pairs."""
    batch_size, list_size = values.shape
    if list_size is None:
        per_pair = False
    elif on_gpu():
        per_pair = list_size <= PER_PAIR_EXPS_ON_GPU_UP_TO
    else:
        per_pair = (sigmoid_sums and batch_size is not None
                    and batch_size * list_size ** 2 <= PER_PAIR_SIGMOID_EXPS_ON_CPU_UP_TO
                    and jax_platform() == "cpu")
    factored = FACTORED_EXPONENTIALS and not per_pair
    record("exps", "factored where lists fit" if factored else "per pair")
    return factored


def _factored_or_per_pair(fits, by_factors, by_pairs, *inputs, sigmoid_sums=False):
    """Returns `by_factors(*inputs)` where the bool scalar `fits` is True, else
    `by_pairs(*inputs)` (`first_or_fallback`); always the latter where factored exponentials do
    not apply to the first input's lists (`factored_exponentials_apply`)."""
    if not factored_exponentials_apply(inputs[0], sigmoid_sums):
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


# Separate passes (an XLA-on-CPU work-around, for JAX's XLA: jaxlib 0.10 does this, TensorFlow
# 2.21's XLA does not). XLA hands every reduction over 4096 or more elements to YNNPACK, whose
# fusions take float arithmetic and exp/log (no compare or select) and share no pair-shaped
# operand with another fusion: whatever a fusion cannot take is first written out as a [B, L, L]
# tensor. With the forward and backward passes of the σ sums broadcasting the same per-document
# factors (which XLA then multiplies once, for both), ApproxNDCG's step wrote two (list 64) or
# three (list 1000) such tensors. So the σ sums below take σ(v_j − v_k) = a_j / (a_j + a_k)
# forward and σ' = u(1 − u), u = b_k / (b_j + b_k), backward (a = e^{v−c}, b = e^{c−v}), and
# broadcast w forward, −w backward. A scalar constant is a shared operand too: XLA broadcasts it
# to [B, L, L] once for every fusion that uses it, so "1 − u" or "1 / x" in two passes wrote a
# tensor of ones (ApproxAP at list 1000: 148 → 347 lists/s without); on JAX the backward passes
# below take no constant. `tests/test_ops.py` checks from the compiled HLO that no [B, L, L] tensor is
# written under `jax.jit`. Short lists keep the constants: a tensor of ones that stays in cache
# costs less than the quotient or exp more per pair (interleaved A/B on JAX, ApproxAP and
# ApproxNDCG without against with: 0.9× and 0.9× at list 10, 0.75× and 0.9× at 32, 1.1× and 1.0×
# at 64, 1.1× and 1.2× at 100, 2.2× and 1.05× at 1000), so lists of a static size up to
# CONSTANT_FREE_ABOVE do. RankNet's
# backward pass has its own plan ("Select last"). Remove this when XLA's CPU library fusions
# take selects and shared operands.
CONSTANT_FREE_ABOVE = 64


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
    where σ' < 1e-30). On JAX, above CONSTANT_FREE_ABOVE, it takes no constant ("Separate
    passes"): σ' = u·(1 − u)
    from two quotients, and per pair 1 / (r + 1/r)², r = e^{(v_j − v_k)/2} and 1/r each from an
    exp (σ' rounds to 0 where either overflows); under TensorFlow's XLA these ran 0.8× as fast.
    Both ways σ' is accurate where σ is near 0 and near 1.
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

    list_size = values.shape[1]
    without_constants = keras.backend.backend() == "jax" and (  # ("Separate passes")
        list_size is None or list_size > CONSTANT_FREE_ABOVE)
    record("sigmoid gradient", "no constants" if without_constants else "σ(1 − σ)")

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
        if not factored:
            record("exps", "per pair")
            return by_pairs(fixed, *inputs)
        return _factored_or_per_pair(fits, by_factors, by_pairs, fixed, *inputs,
                                     sigmoid_sums=True)

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
    exactly 0.
    """
    weights = ops.ones_like(values) if weights is None else weights
    return _pair_sums(_weighted_sigmoid_sums, _weighted_sigmoid_sum_gradients,
                      lambda values, weights: _dense_sigmoid_sums(values, weights, factored),
                      values, (weights,), (float("-inf"), 0.0), pairwise)


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
    TensorFlow's softplus kernel was a third of RankNet's step at list 10, max(d, 0) − ln σ(|d|)
    with σ(|d|) taken from the kept σ and one log per row, of the product of its pairs' σ(|d|):
    RankNet 1.17–1.23× faster there. A row's value then adds at most about L·2^-23 of absolute
    error to what the sum of softplus makes (so a row of only tiny terms, pairs ordered by wide
    margins, may come out 0 instead of 1e-9), and its gradient is as exact as before.

    Compiled by XLA (JAX; TensorFlow with jit_compile), where the passes fuse and
    transcendental functions are the cost: with d = s_j − s_k and e = e^{−|d|} ≤ 1,
    ln(1 + e^d) = max(d, 0) + ln(1 + e), and one log serves LOG_CHUNK columns of a row,
    Σ ln(1 + e) = ln Π(1 + e), the product kept as 1 + E with E ← a + b(1 + a), which holds
    small e to a few ulps and stays below 2^LOG_CHUNK. e = min(e^d, e^{−d}) is a product of
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
    chunked = _in_log_chunks(ops.stack([above, below], axis=-1), 1.0)

    def smalls_by_factors(difference):
        del difference  # the factors hold it
        return ops.minimum(ops.expand_dims(below, (1, 2)) * chunked[..., 0],
                           ops.expand_dims(above, (1, 2)) * chunked[..., 1])

    def smalls_by_pairs(difference):
        return ops.exp(-ops.abs(difference))

    def sums(smalls, scores, ranked):  # pairs [b, c, m, k]: column j = (c, m), row k last
        difference = _in_log_chunks(scores, 0.0) - ops.expand_dims(scores, (1, 2))
        higher = ops.expand_dims(ranked, (1, 2)) > _in_log_chunks(ranked, float("nan"))
        small = ops.where(higher, smalls(difference), 0.0)
        rise = ops.where(higher, ops.maximum(difference, 0.0), 0.0)
        width = LOG_CHUNK
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

    select_last = select_last_applies()

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
# reduction whose operand ends in arithmetic is handed to YNNPACK together with that arithmetic,
# which it appears to evaluate op by op over tiles of the pairs (fewer quotients made the pass no
# faster, fewer ops did);
# any select before it is first written out as a [B, L, L] tensor. RankNet's backward pass masks
# its pulls once more, by a select after the quotient, so that YNNPACK takes the reduction alone
# and XLA's loop emitter computes each pair's pull in registers and writes it once: the plan
# TensorFlow 2.21's XLA takes for the same pass unasked (its YNNPACK fusions take additions
# only). On JAX, interleaved A/B against the arithmetically gated pass this replaces (no tensor
# written, a dozen ops per pair inside YNNPACK): CPU time per step 1.3–1.4× lower at list 1000,
# 1.5× at 300, and against the where-masked pass (masks and pulls written) 1.8–1.9× lower at
# lists 100 and 150, the same at 10. TensorFlow's XLA already compiles this plan without the
# select (not measured with it), so only JAX takes it. Remove this when XLA's CPU library fusions
# take selects.


def select_last_applies():
    """Whether RankNet's backward pass masks its pulls by a last select ("Select last")."""
    select_last = keras.backend.backend() == "jax"
    record("logistic gradient", "select last" if select_last else "where-masked")
    return select_last


# Log chunks (XLA on CPU): one log per LOG_CHUNK pairs in `_dense_logistic_sums`; RankNet at list
# 1000 ran 3.92× TF-Ranking with it, 1.80× with one log per pair.
LOG_CHUNK = 8


def _in_log_chunks(columns, fill):
    """Returns `[B, L, ...]` columns as `[B, ⌈L/LOG_CHUNK⌉, LOG_CHUNK, 1, ...]` (chunk c holds
    columns c·LOG_CHUNK, c·LOG_CHUNK + 1, …), padded with `fill`. Pairs laid out as
    [b, c, m, k], rows k last, vectorise over the rows under XLA, whatever the list size."""
    shape = ops.shape(columns)
    chunks = (shape[1] + LOG_CHUNK - 1) // LOG_CHUNK
    padding = [(0, 0), (0, chunks * LOG_CHUNK - shape[1])] + [(0, 0)] * (len(shape) - 2)
    padded = ops.pad(columns, padding, constant_values=fill)
    return ops.expand_dims(ops.reshape(padded, (shape[0], chunks, LOG_CHUNK, *shape[2:])), 3)


def logistic_pair_sums(scores, labels, mask, pairwise="auto"):
    """Returns Σ_{j real: l_j < l_k} ln(1 + e^{−(s_k − s_j)}) for each real document k, `[B, L]`
    (0 on padded ones): the RankNet loss of the pairs in which k is the upper document.

    Summed in blocks of columns with a recomputing backward pass for long lists (`pairwise`).
    A padded document's label is NaN inside, so it is in no pair (no comparison with NaN holds).
    """
    ranked = ops.where(mask, labels, float("nan"))
    return _pair_sums(_logistic_sums, _logistic_sum_gradients, _dense_logistic_sums, scores,
                      (ranked,), (0.0, float("nan")), pairwise)


def higher_counts(values, pairwise="auto"):
    """Returns #{real j: v_j > v_k} for each k, float `[B, L]` (padded slots hold −inf), dense or
    in blocks of columns as `pairwise` says, so a long list never holds its `[L, L]` comparisons
    at once."""
    def higher_in(columns):
        higher = ops.greater(ops.expand_dims(columns, 1), ops.expand_dims(values, 2))
        return ops.sum(ops.cast(higher, COMPUTE_DTYPE), axis=-1)

    return _dense_or_blocked(
        pairwise, values, lambda: higher_in(values),
        lambda: _sum_over_column_blocks(lambda columns: higher_in(columns[0]),
                                        (values,), (float("-inf"),)))


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
                                        (labels, scores), (float("-inf"), 0.0)))


# Counted orders. XLA's sort is slow on CPU: under XLA, lists of up to this static size are
# ordered by O(L²) comparisons instead (0 always sorts). Measured on CPU only (module docstring);
# on a device with a fast sort, check it with `benchmarks/losses.py --counted-order-up-to 0`.
COUNTED_ORDER_UP_TO = 128


def counted_order_applies(values):
    """Whether `values` [B, L] are ordered by counting (`descending_positions_by_counting`)."""
    counted = (values.shape[1] is not None and xla_path("counted order")
               and values.shape[1] <= COUNTED_ORDER_UP_TO)
    record("order", "counted" if counted else "sorted")
    return counted


def descending_positions_by_counting(values):
    """Returns the int32 0-based positions a stable descending sort gives each entry, in O(L²)
    comparisons: #{y: v_y > v_x, or v_y = v_x and y before x}; NaN counts as −inf, so the
    positions are a permutation. Under XLA on CPU, ListMLE's forward+backward ran 1.2× (list 10)
    and 1.5× (list 100) faster with this than with its sort, and 0.4× at list 1000."""
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


# Sorting networks. XLA's CPU sort calls a comparator per comparison: 8 lists of 1000 took
# 1.1 ms, where a bitonic network of vectorised compare-exchanges took 0.2 ms. Under XLA, lists
# of a static size up to this whose sort keys are small non-negative integers (ListMLE's) go
# through the network, ahead of counting (ListMLE at list 100: 100k lists/s, counted 67k, sorted
# 64k; at 10 all three within 7 %); 0 never. Measured on CPU only; on a device with a fast sort,
# check it with `benchmarks/losses.py --network-order-up-to 0`.
NETWORK_ORDER_UP_TO = 2 ** 14


def network_order_applies(values):
    """Whether integer codes `[B, L]` are ordered by `descending_order_by_network`."""
    list_size = values.shape[1]
    applies = (list_size is not None and xla_path("network order")
               and list_size <= NETWORK_ORDER_UP_TO)
    if applies:
        record("order", "network")
    return applies


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
