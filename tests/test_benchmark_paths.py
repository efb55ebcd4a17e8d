"""benchmarks/pair_paths.py names the paths of tfapprox.pair_plan that each loss takes
(the path column of benchmarks/losses.py and benchmarks/gpu.py)."""

import sys

import numpy as np
import pytest

from conftest import REPO
from tfapprox import losses
from tfapprox.pair_plan import DEFAULT, PairPlan, using

sys.path.insert(0, str(REPO / "benchmarks"))
from pair_paths import describe, traced_on_tensorflow  # noqa: E402  (benchmarks/pair_paths.py)
from tfranking_losses import GradientTimer, make_inputs  # noqa: E402


def _taken(loss, list_size, batch, jit_compile=True, unknown_list_size=False, scale=1.0):
    labels, scores = make_inputs(list_size, batch)
    return traced_on_tensorflow(loss, labels, scores * scale, jit_compile, unknown_list_size)


def test_orders_are_counted_or_networked_up_to_the_set_list_sizes():
    listmle = losses.ListMLELoss()
    assert _taken(listmle, 10, 4)["order"] == {"network"}
    assert _taken(listmle, 200, 2)["order"] == {"network"}
    assert _taken(listmle, 200, 2, unknown_list_size=True)["order"] == {"sorted"}
    assert _taken(listmle, 10, 4, jit_compile=False)["order"] == {"sorted"}
    with using(PairPlan(network_order_up_to=0)):
        assert _taken(listmle, 10, 4)["order"] == {"counted"}
        assert _taken(listmle, 200, 2)["order"] == {"sorted"}
    with using(PairPlan(network_order_up_to=0, counted_order_up_to=0)):
        assert _taken(listmle, 10, 4)["order"] == {"sorted"}


def test_pairs_of_short_lists_are_summed_by_products_without_xla():
    ranknet = losses.RankNetLoss()
    assert _taken(ranknet, 10, 4, jit_compile=False)["sums without XLA"] == {"products"}
    assert _taken(ranknet, 100, 2, jit_compile=False)["sums without XLA"] == {"matmul"}
    compiled = _taken(ranknet, 10, 4)
    assert "sums without XLA" not in compiled
    assert describe(compiled) == ("XLA: logistic sums; exps: factored where lists fit; "
                                  "logistic gradient: where-masked; pairs: dense")
    with using(PairPlan(elementwise_sums_up_to=0)):
        assert _taken(ranknet, 10, 4, jit_compile=False)["sums without XLA"] == {"matmul"}


def test_exponentials_and_blocks_are_named():
    assert _taken(losses.ApproxNDCGLoss(), 10, 4)["exps"] == {"factored where lists fit"}
    assert _taken(losses.ApproxAPLoss(), 10, 4)["exps"] == {"factored where lists fit",
                                                             "per pair"}  # (β·positions)
    assert _taken(losses.ApproxNDCGLoss(pairwise="blocked"), 10, 4)["pairs"] == {"blocked"}
    assert _taken(losses.ApproxNDCGLoss(), 10, 4, unknown_list_size=True)["pairs"] == {
        f"blocked above {DEFAULT.blocked_above} documents"}
    with using(PairPlan(factored_exponentials=False)):
        assert _taken(losses.ApproxNDCGLoss(), 10, 4)["exps"] == {"per pair"}


@pytest.mark.parametrize("name", ["approx_ndcg", "ranknet"])
def test_per_pair_exponentials_give_the_factored_values(name):
    labels, scores = make_inputs(12, 4)
    loss = losses.LOSSES[name]()

    def value_and_gradient():
        timer = GradientTimer(loss, labels, scores, 0.0, jit_compile=True)
        return [np.asarray(t) for t in timer.step(labels, scores)]

    factored = value_and_gradient()
    with using(PairPlan(factored_exponentials=False)):
        per_pair_steps = value_and_gradient()
    for per_pair, expected in zip(per_pair_steps, factored):
        np.testing.assert_allclose(per_pair, expected, rtol=1e-5, atol=1e-6)
