"""Which implementation each pair kernel of `tfapprox.pair_sums` takes, chosen in one place.

A pair kernel (σ pair sums, logistic pair sums, pair counts, orders) has a plain reference
implementation and faster variants. Which variant a trace takes depends on where the code is
traced (the Keras backend, whether XLA compiles it, the device) and on the static list shape, and
the thresholds for that are the fields of a frozen `PairPlan`. `DEFAULT` is the plan every trace
uses unless a block `with using(plan):` sets another, as tests and benchmarks do to take the
other variants; the plan is read while a function is traced, so it decides the traces made in
the block. The figures behind each default: docs/benchmarks.md#pair-paths.

Every choice is recorded for `recording_paths` while a function is traced, so a test or
`benchmarks/pair_paths.py` can see which variants a loss took without timing it.
"""

import contextlib
import dataclasses

import keras


@dataclasses.dataclass(frozen=True)
class PairPlan:
    """The thresholds that choose among the variants of the pair kernels.

    Pairs summed dense or in blocks (`pairwise="auto"`):
        blocked_above: lists longer than this are summed `pair_block` columns at a time, forward
            and backward, so no `[B, L, L]` tensor exists (memory O(B·L·pair_block)). Not on a
            GPU: there XLA fuses each pass over the pairs into its reduction, and dense is faster.
        pair_block: the columns of one block.
    Without XLA (TensorFlow graphs and eager):
        elementwise_sums_up_to: lists of a static size up to this sum their `[B, L, L]` pairs
            against per-document vectors by products and reductions, where TensorFlow's batched
            matmul of many small matrices costs more (0: always the matmul). The same lists take
            running sums by one triangular matmul instead of a cumulative sum, RankNet's one log
            per row, and ListMLE's pairs fallback.
    Under XLA, where the passes over the pairs fuse and transcendental functions are the cost:
        factored_exponentials: pair exponentials e^{v_k − v_j} come from two per-document factors
            where every list of the batch fits them (False: one exp per pair everywhere).
        per_pair_exps_on_gpu_up_to: on a GPU, lists of a static size up to this take one exp per
            pair: cheap there, where the factored path's loop of 0 or 1 steps is driven from the
            host.
        per_pair_sigmoid_exps_on_cpu_up_to: on JAX's CPU, the σ sums of batches of a static
            shape with at most this many pairs (B·L²) take one exp per pair: below it, the
            factored path's fixed cost a step exceeds the exps it saves.
        constant_free_above: on JAX, the σ sums' backward pass of lists longer than this (or of
            a `None` size) takes no scalar constant, which JAX's XLA on CPU would broadcast to a
            written `[B, L, L]` tensor; shorter lists keep it, cheaper while it stays in cache.
        log_chunk: RankNet's sums take one log per this many pairs (a power of two).
        counted_order_up_to: lists of a static size up to this are ordered by O(L²)
            comparisons instead of XLA's sort, slow on CPU (0: always sort).
        network_order_up_to: lists of a static size up to this whose sort keys are small
            non-negative integers (ListMLE's) are ordered by a bitonic sorting network, ahead of
            counting (0: never).
    On JAX:
        short_sinkhorn_on_jax_up_to: NeuralNDCG's lists of a static size up to this leave the
            row mask out of the Sinkhorn rounds' transposed products (their vectors are 0 on the
            empty rows already) and stack the gradient's row weights `[B, 2, L]`, which JAX's XLA
            on CPU fuses into the product forming ∂/∂logits; longer lists transpose them from
            `[B, L, 2]`, which the stacked form made 1.8× slower at L = 1000.
    device: the device the plan is for, "cpu" or "gpu"; None reads JAX's default backend (and
        "cpu" on TensorFlow, whose GPU paths are those of its CPU). Set to simulate a device.

    The thresholds for XLA orders and exponentials were measured on CPUs; on another device,
    time the other variants with `benchmarks/losses.py` (`--counted-order-up-to 0`,
    `--network-order-up-to 0`, `--per-pair-exps`) or `benchmarks/gpu.py --paths`.
    """

    blocked_above: int = 1024
    pair_block: int = 256
    elementwise_sums_up_to: int = 32
    factored_exponentials: bool = True
    per_pair_exps_on_gpu_up_to: int = 512
    per_pair_sigmoid_exps_on_cpu_up_to: int = 2 ** 15
    constant_free_above: int = 64
    log_chunk: int = 8
    counted_order_up_to: int = 128
    network_order_up_to: int = 2 ** 14
    short_sinkhorn_on_jax_up_to: int = 32
    device: str | None = None


DEFAULT = PairPlan()
_PLANS = [DEFAULT]  # the plans of the open `using` blocks, innermost last


def active():
    """Returns the plan of the innermost open `using` block, or `DEFAULT`."""
    return _PLANS[-1]


@contextlib.contextmanager
def using(plan):
    """Makes `plan` the active one for the functions traced inside the block (on every thread:
    a trainer may trace on another)."""
    if not isinstance(plan, PairPlan):
        raise TypeError(f"`plan` must be a PairPlan; got {type(plan).__name__}")
    _PLANS.append(plan)
    try:
        yield plan
    finally:  # this block's entry: plans equal in value may be open around it
        del _PLANS[max(i for i, open_plan in enumerate(_PLANS) if open_plan is plan)]


# Where the code is traced.

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


def device():
    """The device the code is traced for: the plan's, else JAX's default backend ("cpu",
    "gpu", ...), else "cpu"."""
    if active().device is not None:
        return active().device
    if keras.backend.backend() != "jax":
        return "cpu"
    import jax

    return jax.default_backend()


def on_jax_cpu():
    """Whether the code is traced for JAX on a CPU."""
    return keras.backend.backend() == "jax" and device() == "cpu"


# The record of choices: each one goes through `record` (whether XLA compiles it through
# `xla_path`), which appends it to every list that an open `recording_paths` block yields.
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
    """Yields a list that collects the choices made while tracing inside the block."""
    taken = []
    _RECORDINGS.append(taken)
    try:
        yield taken
    finally:
        _RECORDINGS.remove(taken)


# The choices. Each asks whether XLA compiles the code only where the static shape leaves the
# answer open, so that a trace records only the questions it asked.

def pairs(pairwise, list_size):
    """Returns how pairs of lists of `list_size` (None: unknown) are summed under `pairwise`
    ("auto", "dense" or "blocked"): "dense", "blocked", or "by size" (blocked above
    `blocked_above` documents, chosen when the graph runs)."""
    plan = active()
    if pairwise == "auto" and device() == "gpu":
        pairwise = "dense"
    if pairwise == "auto":
        if list_size is None:
            record("pairs", f"blocked above {plan.blocked_above} documents")
            return "by size"
        pairwise = "blocked" if list_size > plan.blocked_above else "dense"
    record("pairs", pairwise)
    return pairwise


def sums_by_products(list_size):
    """Whether, without XLA, the pairs of lists of `list_size` are summed by products and
    reductions instead of a matmul."""
    by_products = list_size is not None and list_size <= active().elementwise_sums_up_to
    record("sums without XLA", "products" if by_products else "matmul")
    return by_products


def short_list_without_xla(list_size):
    """Whether lists of `list_size` are short (`elementwise_sums_up_to`) and XLA does not compile
    them: there TensorFlow's per-op cost rules, and a small matmul beats a cumulative sum."""
    return (list_size is not None and list_size <= active().elementwise_sums_up_to
            and not xla_path("running sums"))


def factored_exponentials(batch_size, list_size, sigmoid_sums=False, seldom_fit=False):
    """Whether, under XLA, the pair exponentials of `[batch_size, list_size]` values come from
    per-document factors where the lists fit them, or one per pair: per pair for `seldom_fit`
    values (the caller's hint), on a GPU for lists up to `per_pair_exps_on_gpu_up_to`, and on
    JAX's CPU for the `sigmoid_sums` of batches of up to `per_pair_sigmoid_exps_on_cpu_up_to`
    pairs."""
    plan = active()
    if seldom_fit or list_size is None:
        per_pair = seldom_fit
    elif device() == "gpu":
        per_pair = list_size <= plan.per_pair_exps_on_gpu_up_to
    else:
        per_pair = (sigmoid_sums and batch_size is not None
                    and batch_size * list_size ** 2 <= plan.per_pair_sigmoid_exps_on_cpu_up_to
                    and on_jax_cpu())
    factored = plan.factored_exponentials and not per_pair
    record("exps", "factored where lists fit" if factored else "per pair")
    return factored


def sigmoid_gradient_without_constants(list_size):
    """Whether the σ sums' backward pass under XLA takes no scalar constant: on JAX, for lists
    longer than `constant_free_above` or of a `None` size."""
    without = keras.backend.backend() == "jax" and (
        list_size is None or list_size > active().constant_free_above)
    record("sigmoid gradient", "no constants" if without else "σ(1 − σ)")
    return without


def logistic_gradient_select_last():
    """Whether RankNet's backward pass under XLA masks its pulls by a last select (JAX's XLA
    then computes the pairs in one loop and hands only the reduction to its CPU library)."""
    select_last = keras.backend.backend() == "jax"
    record("logistic gradient", "select last" if select_last else "where-masked")
    return select_last


def short_sinkhorn_on_jax(list_size):
    """Whether NeuralNDCG's Sinkhorn rounds over lists of `list_size` (None: unknown) take their
    short-list form: on JAX, for static sizes up to `short_sinkhorn_on_jax_up_to`."""
    if keras.backend.backend() != "jax":
        return False
    short = list_size is not None and list_size <= active().short_sinkhorn_on_jax_up_to
    record("Sinkhorn", "short-list form" if short else "row-block form")
    return short


def order(list_size, network=False):
    """Returns how lists of `list_size` are ordered: "network" (for `network` keys, small
    non-negative integer codes), "counted" or "sorted". The first two only under XLA and for
    static sizes up to `network_order_up_to` and `counted_order_up_to`."""
    plan = active()
    if (network and list_size is not None and xla_path("network order")
            and list_size <= plan.network_order_up_to):
        record("order", "network")
        return "network"
    counted = (list_size is not None and xla_path("counted order")
               and list_size <= plan.counted_order_up_to)
    record("order", "counted" if counted else "sorted")
    return "counted" if counted else "sorted"
