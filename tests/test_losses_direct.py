"""LambdaRank, SoftRank, SVM^map and PermuRank against their papers' definitions, written as plain
loops over one list (brute force over every permutation for the structural hinges), and their
bounds as properties. Padding, permutation and edge cases run in test_losses.py (ALL_LOSSES)."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import COMPILE_MODES, backend, loss_and_grad, to_numpy
from tfapprox import losses
from tfapprox import measures

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True)


def _ranking(s):
    """Document indices from the top: descending score, ties in list order."""
    return sorted(range(len(s)), key=lambda d: (-s[d], d))


def _dcg(y, order, k=None):
    return sum((2.0 ** y[d] - 1) / math.log2(2 + p) for p, d in enumerate(order)
               if k is None or p < k)


def _ndcg(y, order, k=None):
    return _dcg(y, order, k) / _dcg(y, sorted(range(len(y)), key=lambda d: -y[d]), k)


def _ap(relevant, order):
    hits, total = 0, 0.0
    for position, doc in enumerate(order, start=1):
        if relevant[doc]:
            hits += 1
            total += hits / position
    return total / hits


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


def soft_dcg(y, s, sigma):
    """SoftDCG, each rank distribution enumerated over which other documents beat j."""
    n = len(y)
    beat = [[0.5 * (1 + math.erf((s[i] - s[j]) / (2 * sigma))) for j in range(n)]
            for i in range(n)]
    total = 0.0
    for j in range(n):
        others = [i for i in range(n) if i != j]
        for beaten_by in itertools.product((False, True), repeat=len(others)):
            p = math.prod(beat[i][j] if b else 1 - beat[i][j] for i, b in zip(others, beaten_by))
            total += (2.0 ** y[j] - 1) * p / math.log2(2 + sum(beaten_by))
    return total


def softrank(y, s, sigma):
    """−SoftNDCG."""
    return -soft_dcg(y, s, sigma) / _dcg(y, sorted(range(len(y)), key=lambda d: -y[d]))


def svm_map(y, s):
    """max over every permutation of Δ_AP + F(y) − F(y*), F over relevant × non-relevant pairs."""
    relevant = [label >= 1 for label in y]
    pairs = [(i, j) for i in range(len(y)) for j in range(len(y))
             if relevant[i] and not relevant[j]]

    def f(order):
        position = {d: p for p, d in enumerate(order)}
        return sum((1 if position[i] < position[j] else -1) * (s[i] - s[j])
                   for i, j in pairs) / len(pairs)

    perfect = sum(s[i] - s[j] for i, j in pairs) / len(pairs)
    return max(1 - _ap(relevant, order) + f(order) - perfect
               for order in itertools.permutations(range(len(y))))


def permurank(y, s):
    """max over imperfect π of [(1 − AP(π)) − (F(π*) − F(π))]_+, F over all pairs, π* the perfect
    permutation of largest F."""
    n = len(y)
    relevant = [label >= 1 for label in y]

    def f(order):
        position = {d: p for p, d in enumerate(order)}
        return sum((1 if position[k] < position[l] else -1) * (s[k] - s[l])
                   for k, l in itertools.combinations(range(n), 2)) / (n * (n - 1))

    def is_perfect(order):
        return all(relevant[d] for d in order[:sum(relevant)])

    orders = list(itertools.permutations(range(n)))
    best_perfect = max(f(order) for order in orders if is_perfect(order))
    return max(0.0, max(1 - _ap(relevant, order) - (best_perfect - f(order))
                        for order in orders if not is_perfect(order)))


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


def _per_list(loss, lists, width):
    """Our per-list values for `lists`, computed as one batch padded to `width` documents."""
    labels = np.full((len(lists), width), -1.0, np.float32)
    scores = np.full((len(lists), width), np.nan, np.float32)
    for row, (y, s) in enumerate(lists):
        labels[row, :len(y)], scores[row, :len(s)] = y, s
    return to_numpy(loss.call(labels, scores))


@pytest.mark.parametrize("loss, reference, max_size", [
    (losses.LambdaRankLoss(), lambdarank, 9),
    (losses.LambdaRankLoss(topk=3), lambda y, s: lambdarank(y, s, 3), 9),
    (losses.SoftRankLoss(), lambda y, s: softrank(y, s, 1.0), 7),
    (losses.SoftRankLoss(sigma=0.3), lambda y, s: softrank(y, s, 0.3), 7),
    (losses.SVMMapLoss(), svm_map, 6),
    (losses.PermuRankLoss(), permurank, 6),
], ids=["lambdarank", "lambdarank@3", "softrank", "softrank-0.3", "svm_map", "permurank"])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_matches_the_paper_definition_written_as_loops(loss, reference, max_size, ties, rng):
    lists = list(_lists(rng, 12, 2, max_size, ties))
    expected = [reference([float(v) for v in y], [float(v) for v in s]) for y, s in lists]
    np.testing.assert_allclose(_per_list(loss, lists, max_size), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("loss", [
    losses.LambdaRankLoss(topk=4),
    losses.SoftRankLoss(sigma=0.5),
    losses.SVMMapLoss(),
    losses.PermuRankLoss(),
], ids=lambda l: type(l).__name__)
def test_gradient_is_the_derivative_away_from_ties(loss, rng):
    """Central differences: the fixed weights and argmaxes stay put for a small step."""
    labels = np.array([[2, 0, 1, 0, 3, 0, 1]], np.float32)
    scores = rng.permutation(7).astype(np.float64)[None] * 0.7 + 0.1
    _, grad = loss_and_grad(lambda y, s: loss.call(y, s), labels, scores.astype(np.float32))
    step = 1e-2
    moved = scores + np.concatenate([np.eye(7), -np.eye(7)]) * step  # each score up, then down
    values = to_numpy(loss.call(np.repeat(labels, 14, axis=0), moved.astype(np.float32)))
    np.testing.assert_allclose(grad[0], (values[:7] - values[7:]) / (2 * step), rtol=1e-3,
                               atol=1e-4)


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_softrank_keeps_the_highest_scored_documents_of_a_longer_list(mode, rng):
    """max_list_size = 4 on lists of 7: the loss of the 4 best-scored, over the whole list's N."""
    labels = np.array([[3, 0, 1, 2, 0, 1, 4], [0, 1, 0, 0, 2, 0, 1]], np.float32)
    scores = rng.normal(size=(2, 7)).astype(np.float32)
    value, grad = loss_and_grad(lambda y, s: losses.SoftRankLoss(max_list_size=4)(y, s),
                                labels, scores, mode)
    expected = []
    for y, s in zip(labels.astype(float), scores.astype(float)):
        top = _ranking(s)[:4]
        expected.append(-soft_dcg(y[top], s[top], 1.0)
                        / _dcg(y, sorted(range(7), key=lambda d: -y[d])))
    assert math.isclose(float(value), float(np.mean(expected)), rel_tol=1e-5)
    dropped = [d for d in range(7) if d not in _ranking(scores[0].astype(float))[:4]]
    assert np.all(grad[0, dropped] == 0) and np.all(np.isfinite(grad))


@pytest.mark.skipif(backend() != "tensorflow", reason="a None list dimension is TensorFlow's")
@pytest.mark.parametrize("xla", [False, True], ids=["graph", "xla"])
def test_softrank_cuts_lists_with_a_none_list_dimension(xla, rng):
    import tensorflow as tf

    loss = losses.SoftRankLoss(max_list_size=3)
    labels = rng.integers(0, 3, size=(3, 6)).astype(np.float32)
    labels[:, 0] = 2.0
    scores = rng.normal(size=(3, 6)).astype(np.float32)
    spec = tf.TensorSpec((None, None), tf.float32)
    compiled = tf.function(lambda y, s: loss.call(y, s), jit_compile=xla,
                           input_signature=[spec, spec])
    np.testing.assert_allclose(compiled(labels, scores).numpy(),
                               to_numpy(loss.call(labels, scores)), rtol=1e-5)


@pytest.mark.parametrize("make, message", [
    (lambda: losses.LambdaRankLoss(topk=0), "`topk` must be None or an int >= 1; got 0"),
    (lambda: losses.SoftRankLoss(sigma=0.0), "`sigma` must be a finite number > 0; got 0.0"),
    (lambda: losses.SoftRankLoss(max_list_size=None),
     "`max_list_size` must be an int >= 1; got None"),
    (lambda: losses.SVMMapLoss(relevance_threshold="1"), "`relevance_threshold`"),
    (lambda: losses.PermuRankLoss(relevance_threshold=float("inf")), "`relevance_threshold`"),
])
def test_bad_arguments_are_named_in_the_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- Bounds and limits ----------------------------------------------------------------------------
# Lists are padded to one width, so that each backend compiles its kernels once.

@st.composite
def padded_lists(draw, width, ties=True):
    """One list of 1..width documents, labels 0..4, padded to `width` (label −1)."""
    n = draw(st.integers(1, width))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    labels = np.full((1, width), -1.0, np.float32)
    labels[0, :n] = rng.integers(0, draw(st.integers(1, 4)) + 1, size=n)
    scores = rng.normal(scale=draw(st.sampled_from([0.1, 1.0, 10.0])), size=(1, width))
    if ties and draw(st.booleans()):
        scores = np.round(scores)
    if not ties:  # distinct, with gaps of at least 0.1
        scores[0, :n] = rng.permutation(n) * 0.1
    return labels, scores.astype(np.float32)


def _exact(labels, scores):
    return measures.Positions.exact(scores, labels >= 0)


@PROPERTY
@given(padded_lists(width=40))
def test_svm_map_and_permurank_bound_one_minus_ap(data):
    labels, scores = data
    relevance = (labels >= 1).astype(np.float32)
    ap = float(to_numpy(measures.average_precision(relevance, _exact(labels, scores)))[0])
    for loss in (losses.SVMMapLoss(reduction=None), losses.PermuRankLoss(reduction=None)):
        value = float(to_numpy(loss(labels, scores))[0])
        assert value >= 0.0
        if relevance.any() and (labels == 0).any():
            assert 1.0 - ap <= value + 1e-6, type(loss).__name__


@PROPERTY
@given(padded_lists(width=24, ties=False))
def test_softrank_tends_to_ndcg_as_sigma_goes_to_zero(data):
    labels, scores = data
    real = labels[labels >= 0]
    if not (real > 0).any() or (real == real[0]).all():  # a list with a loss (`losses`)
        return
    ndcg = measures.ndcg(np.maximum(labels, 0.0), _exact(labels, scores))
    soft = losses.SoftRankLoss(sigma=5e-4, reduction=None)(labels, scores)  # gaps ≥ 200σ
    np.testing.assert_allclose(-to_numpy(soft), to_numpy(ndcg), atol=1e-5)
