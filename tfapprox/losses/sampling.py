"""Gumbel sampling of scores (Bruch, Han, Bendersky & Najork, *A stochastic treatment of learning
to rank scoring functions*, WSDM 2020; TF-Ranking's `GumbelSampler`), stateless.

The noise is a hash of each score's float32 bits, the sample and the seed: no random state to
carry, so it runs the same eagerly, in graphs, under XLA and under JAX's jit, changes from step to
step as the scores move, and is reproducible for a seed; and, reading neither the position nor the
list, it leaves a loss unchanged by padding and by permuting a list. Documents with equal scores
get equal noise (and stay tied). TF-Ranking draws
from `tf.random.uniform`, so its samples and ours differ; their distributions are the same.
"""

from keras import ops

from tfapprox import ops as rank_ops
from tfapprox.losses import base

_GOLDEN = -1640531535  # 0x9E3779B1
_MIX_1 = -2048144789  # 0x85EBCA6B, MurmurHash3's finaliser
_MIX_2 = -1028477387  # 0xC2B2AE35
_SAMPLE_STEP = 374761393  # 0x165667B1
_SEED_STEP = 668265263  # 0x27D4EB2F


def _int32(value):
    return ops.convert_to_tensor(value, "int32")


def _logical_right_shift(hashes, bits):
    return ops.bitwise_and(ops.right_shift(hashes, bits), 2 ** (32 - bits) - 1)


def uniforms(scores, sample_size, seed, salt=None):
    """Returns u ∈ (0, 1) `[B, S, L]`, S = `sample_size`: a hash of (score bits, sample, seed,
    and the bits of `salt` [B, L] if given) through MurmurHash3's 32-bit finaliser, its top 23
    bits k as (k + ½)/2^23, exact in float32, so 2^−24 ≤ u ≤ 1 − 2^−24 and −ln(−ln u) is
    finite. (24 bits would not be: (2^24 − ½)/2^24 rounds to 1 in float32, and the Gumbel noise
    of 1 in 2^24 draws was +∞.)"""
    bits = rank_ops._float32_bits(ops.stop_gradient(scores))  # the scores' own hash input
    if salt is not None:
        bits = ops.bitwise_xor(bits * _int32(_MIX_1), rank_ops._float32_bits(salt))
    samples = ops.reshape(ops.arange(sample_size, dtype="int32"), (1, sample_size, 1))
    offset = ((seed or 0) * _SEED_STEP + 2 ** 31) % 2 ** 32 - 2 ** 31
    hashes = (ops.expand_dims(bits, 1) * _int32(_GOLDEN) + samples * _int32(_SAMPLE_STEP)
              + _int32(offset))
    for shift, multiplier in ((16, _MIX_1), (13, _MIX_2), (16, None)):
        hashes = ops.bitwise_xor(hashes, _logical_right_shift(hashes, shift))
        if multiplier is not None:
            hashes = hashes * _int32(multiplier)
    return (ops.cast(_logical_right_shift(hashes, 9), rank_ops.COMPUTE_DTYPE) + 0.5) / 2.0 ** 23


def gumbel_log_softmax(scores, mask, sample_size, gumbel_temperature, seed):
    """Returns `sample_size` samples of ln(softmax((s + g)/τ) + 1e-20) over the real documents of
    each list, g ~ Gumbel(0, 1) i.i.d. and τ = `gumbel_temperature` (TF-Ranking's
    `GumbelSampler.sample`), as `[B·S, L]` (the samples of list b in rows b·S … b·S + S − 1),
    and the mask repeated alike. The scores are shifted by their list's maximum first (softmax
    does not change), so the sum cannot overflow float32 for finite scores: |g| < 17."""
    noise = -ops.log(-ops.log(uniforms(scores, sample_size, seed)))
    shifted = scores - rank_ops.real_maximum(scores, mask)
    sampled = (ops.expand_dims(shifted, 1) + noise) / gumbel_temperature
    masks = ops.broadcast_to(ops.expand_dims(mask, 1), ops.shape(sampled))
    top = rank_ops.real_maximum(sampled, masks)
    exp = ops.where(masks, ops.exp(ops.where(masks, sampled - top, 0.0)), 0.0)
    total = ops.sum(exp, axis=-1, keepdims=True)
    log_probabilities = ops.log(exp / ops.where(total > 0, total, 1.0) + 1e-20)
    shape = (ops.shape(scores)[0] * sample_size, ops.shape(scores)[1])
    return ops.reshape(log_probabilities, shape), ops.reshape(masks, shape)


def repeat_lists(values, sample_size):
    """Returns `[B, L]` values with each list repeated `sample_size` times, `[B·S, L]`."""
    return ops.reshape(ops.repeat(ops.expand_dims(values, 1), sample_size, axis=1),
                       (ops.shape(values)[0] * sample_size, ops.shape(values)[1]))


ARGUMENTS = """
    Sampling, as TF-Ranking's `GumbelSampler`: `sample_size` samples (default 8),
    `gumbel_temperature` τ (default 1), `seed` (None is seed 0: the noise is a hash of the
    scores, reproducible; TF-Ranking draws it from `tf.random`). TF-Ranking returns the B·S
    sampled lists' losses, averaged by its reduction; ours averages each list's samples, so a
    list weighs the same with sampling as without.
"""


class GumbelSampled:
    """Mixin: the loss's per-list value averaged over `sample_size` Gumbel samples of the scores
    (`tfapprox.losses.sampling`; Bruch et al., WSDM 2020), each ln softmax((s + g)/τ), τ =
    `gumbel_temperature`, g stateless noise hashed from the scores and `seed` (`uniforms`). It
    comes first among the bases of a loss class, whose `__init__` calls `_init_sampling`."""

    def _init_sampling(self, sample_size, gumbel_temperature, seed):
        self.sample_size = base.check_cutoff("sample_size", sample_size, allow_none=False)
        self.gumbel_temperature = base.check_positive("gumbel_temperature", gumbel_temperature)
        self.seed = base.check_seed(seed, allow_none=True)

    def per_list(self, labels, mask, scores):
        sampled, sampled_mask = gumbel_log_softmax(
            scores, mask, self.sample_size, self.gumbel_temperature, self.seed)
        loss, has_loss = super().per_list(repeat_lists(labels, self.sample_size),
                                          sampled_mask, sampled)
        mean = ops.mean(ops.reshape(loss, (-1, self.sample_size)), axis=-1)
        if has_loss is None:
            return mean, None
        return mean, ops.any(ops.reshape(has_loss, (-1, self.sample_size)), axis=-1)

    def get_config(self):
        return {**super().get_config(), "sample_size": self.sample_size,
                "gumbel_temperature": self.gumbel_temperature, "seed": self.seed}
