"""tfapprox.pair_plan: a frozen plan, set for a block, and every variant of a pair kernel equal to
its reference in values and gradients."""

import dataclasses
import re

import numpy as np
import pytest

from conftest import COMPILE_MODES, REPO, loss_and_grad
from tfapprox import pair_plan, pair_sums
from tfapprox.pair_plan import DEFAULT, PairPlan, using


@pytest.mark.backend_neutral
def test_a_plan_is_frozen_and_holds_for_its_block_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.pair_block = 4
    inner = PairPlan(pair_block=4)
    with using(PairPlan(pair_block=4)) as outer:
        with using(inner):
            assert pair_plan.active() is inner
        assert pair_plan.active() is outer
        with pytest.raises(RuntimeError), using(inner):
            raise RuntimeError
        assert pair_plan.active() is outer
    assert pair_plan.active() is DEFAULT
    with pytest.raises(TypeError, match="must be a PairPlan"):
        with using({"pair_block": 4}):
            pass


# Plans that take each fast variant of the σ and logistic pair sums on lists of 11: (plan, the
# `pairwise` mode it is called with, the compile modes where it differs from the default). Blocks
# of 4 columns (the last one padded), matmuls instead of products without XLA, and under XLA the
# factored or per-pair exponentials (JAX's CPU takes one per pair in batches this small), the
# backward passes without constants (JAX), logs of chunks of 2 pairs, and a GPU's choices.
ANY, WITHOUT_XLA, UNDER_XLA = ("eager", "graph", "xla", "jit"), ("eager", "graph"), ("xla", "jit")
VARIANTS = {
    "default": (DEFAULT, "auto", ANY),
    "blocked": (PairPlan(pair_block=4), "blocked", ANY),
    "matmul": (PairPlan(elementwise_sums_up_to=0), "dense", WITHOUT_XLA),
    "factored exps": (PairPlan(per_pair_sigmoid_exps_on_cpu_up_to=0), "dense", UNDER_XLA),
    "per-pair exps": (PairPlan(factored_exponentials=False), "dense", UNDER_XLA),
    "no constants": (PairPlan(constant_free_above=0), "dense", UNDER_XLA),
    "log chunks of 2": (PairPlan(log_chunk=2), "dense", UNDER_XLA),
    "gpu": (PairPlan(device="gpu"), "auto", UNDER_XLA),
}
KERNELS = {  # name -> (kernel(scores, labels, mask, pairwise), its reference)
    "sigmoid": (lambda s, y, m, pairwise: pair_sums.sigmoid_pair_sums(2.0 * s, y * m, pairwise),
                lambda s, y, m: pair_sums.reference_sigmoid_pair_sums(2.0 * s, y * m)),
    "logistic": (lambda s, y, m, pairwise: pair_sums.logistic_pair_sums(s, y, m, pairwise),
                 lambda s, y, m: pair_sums.reference_logistic_pair_sums(s, y, m)),
}


@pytest.mark.parametrize("mode", COMPILE_MODES)
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_variant_equals_the_reference(kernel, mode, rng):
    """Values and gradients of every variant against the reference, with padded documents and an
    uneven upstream, in one list whose scores are too far apart for the factored exponentials."""
    labels = rng.integers(0, 4, size=(3, 11)).astype(np.float32)
    mask = rng.random((3, 11)) > 0.3
    scores = rng.normal(size=(3, 11)).astype(np.float32)
    scores[-1] *= 100.0
    upstream = 1.0 + np.arange(11, dtype=np.float32)
    fast, reference = KERNELS[kernel]
    expected = loss_and_grad(lambda y, s: reference(s, y, mask) * upstream, labels, scores, mode)
    for name, (plan, pairwise, modes) in VARIANTS.items():
        if mode not in modes:
            continue
        with using(plan):
            value, gradient = loss_and_grad(lambda y, s: fast(s, y, mask, pairwise) * upstream,
                                            labels, scores, mode)
        assert value == pytest.approx(expected[0], rel=1e-5), name
        np.testing.assert_allclose(gradient, expected[1], rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.backend_neutral
def test_no_test_or_benchmark_patches_the_kernels_module():
    """Tests and benchmarks take other variants by passing a plan, never by setting attributes of
    `tfapprox.pair_sums` or `tfapprox.pair_plan`."""
    patch = re.compile(r"setattr\(\s*(pair_sums|pair_plan)\b"
                       r"|\b(pair_sums|pair_plan)\.[A-Za-z_]+\s*=[^=]")
    hits = [f"{path.relative_to(REPO)}:{number}" for folder in ("tests", "benchmarks")
            for path in sorted((REPO / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if patch.search(line) and path.name != "test_pair_plan.py"]
    assert not hits, hits


@pytest.mark.backend_neutral
def test_the_plan_is_the_only_table_of_thresholds():
    """`tfapprox.pair_sums` keeps no module-level number or switch but float32's exponent limit
    and its dtype."""
    settings = {name for name, value in vars(pair_sums).items()
                if name.isupper() and isinstance(value, (bool, int, float))}
    assert settings == {"EXP_LIMIT"}, settings
