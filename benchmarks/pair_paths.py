"""Which of `tfapprox.pair_plan`'s choices a loss's forward+backward step takes, as
`pair_plan.recording_paths` records them while the step is traced (traced only: nothing is
compiled or run). TensorFlow is imported only for `traced_on_tensorflow`, so `benchmarks/gpu.py`
runs where there is none.

Recorded: whether XLA compiles each choice (`pair_plan.xla_path`), how lists are ordered (sorting
network, counting, sort), how pairs are summed without XLA (products or matmul) and in blocks of
columns for long lists, whether pair exponentials come from per-document factors where the lists
fit them (`PairPlan.factored_exponentials`) or one per pair, and RankNet's backward pass (its pulls
masked by a last select on JAX, "select last", or where-masked).
"""

from tfapprox import pair_plan


def traced_on_jax(loss, labels, scores):
    """Returns {what: {path}} for `jax.jit(jax.value_and_grad(Σ loss))` traced on these lists
    (labels and scores passed as arguments, as Keras' JAX train step passes them)."""
    import jax
    import jax.numpy as jnp

    with pair_plan.recording_paths() as taken:
        jax.jit(jax.value_and_grad(lambda s, y: jnp.sum(loss(y, s)))).lower(
            jnp.asarray(scores), jnp.asarray(labels))
    return _by_choice(taken)


def traced_on_tensorflow(loss, labels, scores, jit_compile, unknown_list_size=False):
    """Returns {what: {path}} for a `tf.function` (XLA with `jit_compile`) of the loss and its
    gradient, traced on these lists, or for `[None, None]` inputs with `unknown_list_size`."""
    import tensorflow as tf

    def step(labels, scores):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            value = tf.reduce_sum(loss(labels, scores))
        return value, tape.gradient(value, scores)

    signature = [tf.TensorSpec((None, None), tf.float32)] * 2 if unknown_list_size else None
    with pair_plan.recording_paths() as taken:
        tf.function(step, jit_compile=jit_compile, input_signature=signature).get_concrete_function(
            tf.constant(labels), tf.constant(scores))
    return _by_choice(taken)


def _by_choice(taken):
    by_choice = {}
    for choice in taken:
        what, path = choice.rsplit(": ", 1)
        by_choice.setdefault(what, set()).add(path)
    return by_choice


def describe(by_choice):
    """Returns the paths as one line: the XLA choices grouped by XLA or not, then each other
    choice with the path or paths it took."""
    compiled = {}
    others = []
    for what, paths in sorted(by_choice.items()):
        if paths <= {"XLA", "no XLA"}:
            for path in paths:
                compiled.setdefault(path, []).append(what)
        else:
            others.append(f"{what}: {', '.join(sorted(paths))}")
    parts = [f"{path}: {', '.join(whats)}" for path, whats in sorted(compiled.items())]
    return "; ".join(parts + others) or "no compiled-mode choice"
