"""Which of `tfapprox.pair_sums`' compiled-mode choices a loss takes, recorded while it runs, on any
Keras backend (no TensorFlow import: `benchmarks/gpu.py` runs where there is none).

Lists ordered by a sorting network, by counting or by a sort; pair exponentials from per-document
factors or one per pair (the share of calls whose lists fit the factors); pairs summed by products
or by a matmul; pairs summed in blocks of columns (lists of a static size over BLOCKED_ABOVE). The choosing helpers are wrapped inside `recording`, so only the calls traced in
its block are instrumented.
"""

import contextlib
from unittest import mock

from tfapprox import pair_sums


@contextlib.contextmanager
def recording(xla, read_traced):
    """Yields a function that returns the paths taken (", "-separated) by what ran in the block.

    `xla`: what `pair_sums.compiled_by_xla` answers meanwhile. `read_traced(value, append)` must call
    `append(bool(value))` once the traced boolean `value` is known (a `tf.py_function`, a
    `jax.debug.callback`).
    """
    orders, fitted, unfactored, by_products, blocked = [], [], [], [], []
    counted_order_applies = pair_sums.counted_order_applies
    network_order_applies = pair_sums.network_order_applies
    elementwise_sums_apply = pair_sums.elementwise_sums_apply
    factored_or_per_pair = pair_sums._factored_or_per_pair
    dense_sigmoid_sums = pair_sums._dense_sigmoid_sums
    dense_or_blocked = pair_sums._dense_or_blocked

    def order(values):
        counted = counted_order_applies(values)
        orders.append("counted order" if counted else "sorted")
        return counted

    def network(values):
        applies = network_order_applies(values)
        if applies:
            orders.append("network order")
        return applies

    def products(pairs):
        by_products.append(elementwise_sums_apply(pairs))
        return by_products[-1]

    def exponentials(fit, *args):
        read_traced(fit, fitted.append)
        return factored_or_per_pair(fit, *args)

    def sigmoid_sums(values, weights, factored=True):
        unfactored.append(xla and not factored)
        return dense_sigmoid_sums(values, weights, factored)

    def in_blocks(pairwise, like, dense, blocks):
        def traced_blocks():
            if like.shape[1] is not None:  # (an unknown size traces both branches)
                blocked.append(True)
            return blocks()

        return dense_or_blocked(pairwise, like, dense, traced_blocks)

    def described():
        found = sorted(set(orders))
        if blocked:
            found.append(f"blocked pair sums ({pair_sums.PAIR_BLOCK} columns)")
        if fitted and not pair_sums.FACTORED_EXPONENTIALS:
            found.append("per-pair exps")
        elif fitted:
            found.append("factored exps" if all(fitted) else
                         f"factored exps in {sum(fitted)}/{len(fitted)} calls, else per pair")
        if any(unfactored):
            found.append("per-pair exps (unfactored sums)")
        if by_products:
            found.append("pair sums by products" if all(by_products) else
                         "pair sums by matmul" if not any(by_products) else
                         f"pair sums by products in {sum(by_products)}/{len(by_products)}, else matmul")
        return ", ".join(found) or "no compiled-mode choice"

    with mock.patch.object(pair_sums, "compiled_by_xla", lambda: xla), \
            mock.patch.object(pair_sums, "counted_order_applies", order), \
            mock.patch.object(pair_sums, "network_order_applies", network), \
            mock.patch.object(pair_sums, "elementwise_sums_apply", products), \
            mock.patch.object(pair_sums, "_factored_or_per_pair", exponentials), \
            mock.patch.object(pair_sums, "_dense_sigmoid_sums", sigmoid_sums), \
            mock.patch.object(pair_sums, "_dense_or_blocked", in_blocks):
        yield described
