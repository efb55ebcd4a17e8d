"""benchmarks/losses.py names the compiled-mode paths of tfapprox.pair_sums that each loss takes."""

import re
import sys

import numpy as np
import pytest

from conftest import REPO
from tfapprox import losses, pair_sums

sys.path.insert(0, str(REPO / "benchmarks"))
from losses import paths_taken  # noqa: E402  (benchmarks/losses.py)
from tfranking_losses import GradientTimer, make_inputs  # noqa: E402


def test_orders_are_counted_or_networked_up_to_the_set_list_sizes(monkeypatch):
    listmle = losses.ListMLELoss()
    assert paths_taken(listmle, make_inputs(10, 4), jit_compile=True) == "network order"
    assert paths_taken(listmle, make_inputs(200, 2), jit_compile=True) == "network order"
    assert paths_taken(listmle, make_inputs(200, 2), jit_compile=True,
                       unknown_list_size=True) == "sorted"
    assert paths_taken(listmle, make_inputs(10, 4), jit_compile=False) == "sorted"
    monkeypatch.setattr(pair_sums, "NETWORK_ORDER_UP_TO", 0)
    assert paths_taken(listmle, make_inputs(10, 4), jit_compile=True) == "counted order"
    assert paths_taken(listmle, make_inputs(200, 2), jit_compile=True) == "sorted"
    monkeypatch.setattr(pair_sums, "COUNTED_ORDER_UP_TO", 0)
    assert paths_taken(listmle, make_inputs(10, 4), jit_compile=True) == "sorted"


def test_pairs_of_short_lists_are_summed_by_products_without_xla(monkeypatch):
    ranknet = losses.RankNetLoss()
    assert paths_taken(ranknet, make_inputs(10, 4), jit_compile=False) == "pair sums by products"
    assert paths_taken(ranknet, make_inputs(100, 2), jit_compile=False) == "pair sums by matmul"
    assert paths_taken(ranknet, make_inputs(10, 4), jit_compile=True) == "factored exps"
    monkeypatch.setattr(pair_sums, "ELEMENTWISE_SUMS_UP_TO", 0)
    assert paths_taken(ranknet, make_inputs(10, 4), jit_compile=False) == "pair sums by matmul"


def test_factored_exponentials_where_lists_fit_them(monkeypatch):
    approx_ndcg = losses.ApproxNDCGLoss()  # alpha 10: scores spanning > 17.4 do not fit
    labels, scores = make_inputs(10, 4)
    assert paths_taken(approx_ndcg, (labels, scores), jit_compile=True) == "factored exps"
    wide = paths_taken(approx_ndcg, (labels, scores * 100.0), jit_compile=True)
    assert re.fullmatch(r"factored exps in 0/\d+ calls, else per pair", wide)
    assert paths_taken(approx_ndcg, (labels, scores), jit_compile=False) == "pair sums by products"
    monkeypatch.setattr(pair_sums, "FACTORED_EXPONENTIALS", False)
    assert paths_taken(approx_ndcg, (labels, scores), jit_compile=True) == "per-pair exps"


@pytest.mark.parametrize("name", ["approx_ndcg", "ranknet"])
def test_per_pair_exponentials_give_the_factored_values(monkeypatch, name):
    labels, scores = make_inputs(12, 4)
    loss = losses.LOSSES[name]()

    def value_and_gradient():
        timer = GradientTimer(loss, labels, scores, 0.0, jit_compile=True)
        return [np.asarray(t) for t in timer.step(labels, scores)]

    factored = value_and_gradient()
    monkeypatch.setattr(pair_sums, "FACTORED_EXPONENTIALS", False)
    for per_pair, expected in zip(value_and_gradient(), factored):
        np.testing.assert_allclose(per_pair, expected, rtol=1e-5, atol=1e-6)
