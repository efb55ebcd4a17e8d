"""LambdaRank against its paper's definition, written as plain loops over one list. Padding,
permutation and edge cases run in test_losses.py (ALL_LOSSES)."""

import itertools
import math

import numpy as np
import pytest

from conftest import loss_and_grad, to_numpy
from tfapprox import losses


def _ranking(s):
    """Document indices from the top: descending score, ties in list order."""
    return sorted(range(len(s)), key=lambda d: (-s[d], d))


def _dcg(y, order, k=None):
    return sum((2.0 ** y[d] - 1) / math.log2(2 + p) for p, d in enumerate(order)
               if k is None or p < k)


def _ndcg(y, order, k=None):
    return _dcg(y, order, k) / _dcg(y, sorted(range(len(y)), key=lambda d: -y[d]), k)


def lambdarank(y, s, topk=None):
    """Σ_{y_i > y_j} |ΔNDCG@k| · ln(1 + e^{−(s_i − s_j)}), |ΔNDCG| by swapping i and j."""
    order = _ranking(s)
    total = 0.0
    for i, j in itertools.permutations(range(len(y)), 2):
        if y[i] > y[j]:
            swapped = [j if d == i else i if d == j else d for d in order]
            change = abs(_ndcg(y, swapped, topk) - _ndcg(y, order, topk))
            total += change * math.log1p(math.exp(-(s[i] - s[j])))
    return total


def _lists(rng, count, min_size, max_size, ties):
    """Random lists (labels 0..3, at least one relevant and one not) with random scores."""
    for _ in range(count):
        n = int(rng.integers(min_size, max_size + 1))
        y = rng.integers(0, 4, size=n).astype(np.float32)
        y[0], y[-1] = max(y[0], 1.0), 0.0
        y = rng.permutation(y)
        s = rng.normal(size=n).astype(np.float32)
        if ties:
            s = np.round(s * 2) / 2
        yield y, s


def _per_list(loss, lists):
    """Our per-list values for `lists`, computed as one batch padded to the longest list."""
    width = max(len(y) for y, _ in lists)
    labels = np.full((len(lists), width), -1.0, np.float32)
    scores = np.full((len(lists), width), np.nan, np.float32)
    for row, (y, s) in enumerate(lists):
        labels[row, :len(y)], scores[row, :len(s)] = y, s
    return to_numpy(loss.call(labels, scores))


@pytest.mark.parametrize("loss, reference, max_size", [
    (losses.LambdaRankLoss(), lambdarank, 9),
    (losses.LambdaRankLoss(topk=3), lambda y, s: lambdarank(y, s, 3), 9),
], ids=["lambdarank", "lambdarank@3"])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_matches_the_paper_definition_written_as_loops(loss, reference, max_size, ties, rng):
    lists = list(_lists(rng, 12, 2, max_size, ties))
    expected = [reference([float(v) for v in y], [float(v) for v in s]) for y, s in lists]
    np.testing.assert_allclose(_per_list(loss, lists), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("loss", [
    losses.LambdaRankLoss(topk=4),
], ids=lambda l: type(l).__name__)
def test_gradient_is_the_derivative_away_from_ties(loss, rng):
    """Central differences: the fixed weights and argmaxes stay put for a small step."""
    labels = np.array([[2, 0, 1, 0, 3, 0, 1]], np.float32)
    scores = rng.permutation(7).astype(np.float64)[None] * 0.7 + 0.1
    _, grad = loss_and_grad(lambda y, s: loss.call(y, s), labels, scores.astype(np.float32))
    step = 1e-2
    numeric = np.zeros(7)
    for d in range(7):
        up, down = scores.copy(), scores.copy()
        up[0, d] += step
        down[0, d] -= step
        numeric[d] = (to_numpy(loss.call(labels, up.astype(np.float32)))[0]
                      - to_numpy(loss.call(labels, down.astype(np.float32)))[0]) / (2 * step)
    np.testing.assert_allclose(grad[0], numeric, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("make, message", [
    (lambda: losses.LambdaRankLoss(topk=0), "`topk` must be None or an int >= 1; got 0"),
])
def test_bad_arguments_are_named_in_the_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


