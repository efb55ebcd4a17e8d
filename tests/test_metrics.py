"""Exact metrics against trec_eval (an independent implementation), streaming, edge cases, monitors."""

import doctest
import math

import keras
import numpy as np
import pytest

from conftest import backend, compiled_on_jax, random_batch, registered, to_numpy
from tfapprox import losses, metrics


def updater(metric):
    """`metric.update_state` as a function of (labels, scores); on JAX its stateless form,
    jitted (`conftest.compiled_on_jax`), once, so calls on one shape share its compile: an
    update of every metric on an empty batch 3.4 s -> 1.2 s. (Where many metrics update on one
    shape, op by op shares each primitive's compile between them and costs less: trec_eval's
    test.) The value checks only an eager update makes call `update_state` itself."""
    if backend() != "jax":
        return metric.update_state
    stateless = compiled_on_jax(metric.stateless_update_state)

    def update(labels, scores):
        updated = stateless([variable.value for variable in metric.variables], labels, scores)
        for variable, value in zip(metric.variables, updated):
            variable.assign(value)

    return update


def result(metric, labels, scores, sample_weight=None):
    metric.reset_state()
    metric.update_state(labels, scores, sample_weight=sample_weight)
    return float(to_numpy(metric.result()))


BURGES_GAINS = {1: 1, 2: 3, 3: 7}  # G(y) = 2^y − 1, our NDCG's gains, given to trec_eval as labels


def ideal_dcg(labels, k=None):
    """Σ_{i<k} (2^{y_(i)} − 1) / log2(i + 2) over `labels` sorted from the highest."""
    gains = 2.0 ** np.sort(labels)[::-1][:k] - 1.0
    return float(np.sum(gains / np.log2(np.arange(len(gains)) + 2.0)))


@pytest.mark.parametrize("seed", range(4))
def test_exact_metrics_agree_with_trec_eval(seed):
    """Against trec_eval (pytrec_eval, through ir-measures), an independent implementation: each
    query's value, and the mean over the queries with a relevant document (the others are left
    out, as ours leave them out). MRR@k, which trec_eval lacks, against ir-measures' MS MARCO
    evaluator; DCG against trec_eval's NDCG times the ideal DCG."""
    ir_measures = pytest.importorskip("ir_measures")
    from ir_measures import AP, P, R, RR, Success, nDCG

    rng = np.random.default_rng(seed)
    labels, scores = random_batch(rng, batch=32, list_size=int(rng.integers(5, 40)),
                                  max_label=3, pad_fraction=0.25, distinct=True)
    labels[0] = np.minimum(labels[0], 0.0)  # a list without a relevant document: left out
    ndcg = nDCG(gains=BURGES_GAINS)
    cases = {  # name: (ours, theirs)
        "ndcg": (metrics.NDCG(), ndcg), "ndcg@1": (metrics.NDCG(1), ndcg @ 1),
        "ndcg@5": (metrics.NDCG(5), ndcg @ 5), "ndcg@10": (metrics.NDCG(10), ndcg @ 10),
        "dcg@5": (metrics.DCG(5), ndcg @ 5), "dcg": (metrics.DCG(), ndcg),
        "map": (metrics.MeanAveragePrecision(), AP), "map@5": (metrics.get("map@5"), AP @ 5),
        "p@1": (metrics.PrecisionAtK(1), P @ 1), "p@5": (metrics.PrecisionAtK(5), P @ 5),
        "p@10": (metrics.PrecisionAtK(10), P @ 10), "mrr": (metrics.MeanReciprocalRank(), RR),
        "mrr@3": (metrics.get("mrr@3"), RR @ 3), "recall@5": (metrics.Recall(5), R @ 5),
        "recall": (metrics.Recall(), R @ labels.shape[1]),
        "hits@1": (metrics.Hits(1), Success @ 1), "hits@5": (metrics.Hits(5), Success @ 5),
    }
    dcg_cutoffs = {"dcg@5": 5, "dcg": None}  # DCG = trec_eval's NDCG × the ideal DCG
    qrels, run, real_labels = {}, {}, {}
    for q, (y, s) in enumerate(zip(labels, scores)):
        valid = y >= 0
        if not np.any(y[valid] >= 1):
            continue
        docs = [f"d{i}" for i in np.flatnonzero(valid)]
        qrels[q] = {d: int(label) for d, label in zip(docs, y[valid]) if label > 0}
        run[q] = {d: float(v) for d, v in zip(docs, s[valid])}
        real_labels[q] = y[valid]
    qrels, run = ({str(q): v for q, v in d.items()} for d in (qrels, run))
    trec_eval = {m for _, m in cases.values()} - {RR @ 3}
    theirs = {(value.measure, int(value.query_id)): value.value
              for provider, measures in ((ir_measures.pytrec_eval, trec_eval),
                                         (ir_measures.msmarco, [RR @ 3]))
              for value in provider.iter_calc(measures, qrels, run)}
    for name, (ours, measure) in cases.items():
        expected = {q: theirs[measure, q] * (ideal_dcg(y, dcg_cutoffs[name])
                                             if name in dcg_cutoffs else 1.0)
                    for q, y in real_labels.items()}
        values, counted = (to_numpy(x) for x in ours.per_list(labels, scores))
        assert np.flatnonzero(counted).tolist() == sorted(expected), name
        for q, value in expected.items():
            assert math.isclose(values[q], value, rel_tol=1e-6, abs_tol=1e-6), (name, q)
        assert math.isclose(result(ours, labels, scores), np.mean(list(expected.values())),
                            rel_tol=1e-6, abs_tol=1e-6), name


@pytest.mark.parametrize("topn", [None, 5])
def test_err_agrees_with_gdeval(topn):
    """ERR against TREC's gdeval.pl (through ir-measures): per query, grades 0..4, R(4) = 15/16.
    gdeval prints 5 decimals and breaks score ties by document name: the scores are distinct."""
    ir_measures = pytest.importorskip("ir_measures")
    rng = np.random.default_rng(7)
    labels, scores = random_batch(rng, batch=24, list_size=30, max_label=4, pad_fraction=0.25,
                                  distinct=True)
    labels[0] = np.minimum(labels[0], 0.0)  # a list without a relevant document
    qrels = [ir_measures.Qrel(str(q), f"d{i}", int(y)) for q, row in enumerate(labels)
             for i, y in enumerate(row) if y >= 0]
    run = [ir_measures.ScoredDoc(str(q), f"d{i}", float(s)) for q, (row, ys) in
           enumerate(zip(scores, labels)) for i, s in enumerate(row) if ys[i] >= 0]
    measure = ir_measures.ERR @ (topn or labels.shape[1])
    theirs = {int(m.query_id): m.value for m in ir_measures.gdeval.iter_calc([measure], qrels, run)}
    values, counted = (to_numpy(x) for x in metrics.ERR(topn, max_label=4).per_list(labels, scores))
    assert sorted(theirs) == list(range(len(labels))) and not counted[0]
    for q, value in theirs.items():
        assert math.isclose(values[q] if counted[q] else 0.0, value, abs_tol=6e-6), q


@keras.saving.register_keras_serializable(package="tfapprox_tests")
def linear_gain(labels):
    return labels


@keras.saving.register_keras_serializable(package="tfapprox_tests")
def reciprocal_discount(ranks):
    return 1.0 / ranks


def test_gain_and_discount_functions_are_used_and_saved():
    labels = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)
    scores = np.array([[0.3, 0.2, 0.9, 5.0]], np.float32)  # order: doc 2, doc 0, doc 1
    functions = dict(gain_fn=linear_gain, rank_discount_fn=reciprocal_discount)
    dcg = 2 / 2 + 1 / 3
    for metric, expected in ((metrics.DCG(**functions), dcg),
                             (metrics.NDCG(**functions), dcg / (2 / 1 + 1 / 2))):
        assert math.isclose(result(metric, labels, scores), expected, rel_tol=1e-6)
        rebuilt = keras.metrics.deserialize(keras.metrics.serialize(metric))
        assert rebuilt.gain_fn is linear_gain and rebuilt.rank_discount_fn is reciprocal_discount
        assert math.isclose(result(rebuilt, labels, scores), expected, rel_tol=1e-6)


def test_hand_computed_values():
    labels = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)
    scores = np.array([[0.3, 0.2, 0.9, 5.0]], np.float32)  # order: doc 2, doc 0, doc 1
    ndcg = (3 / math.log2(3) + 1 / math.log2(4)) / (3 + 1 / math.log2(3))
    assert math.isclose(result(metrics.NDCG(), labels, scores), ndcg, rel_tol=1e-6)
    assert math.isclose(result(metrics.MeanAveragePrecision(), labels, scores),
                        (1 / 2 + 2 / 3) / 2, rel_tol=1e-6)
    assert math.isclose(result(metrics.PrecisionAtK(2), labels, scores), 0.5, rel_tol=1e-6)
    assert math.isclose(result(metrics.MeanReciprocalRank(), labels, scores), 0.5, rel_tol=1e-6)


def test_ties_are_broken_by_list_order():
    scores = np.zeros((1, 3), np.float32)
    assert result(metrics.MeanReciprocalRank(), np.array([[1.0, 0.0, 0.0]]), scores) == 1.0
    assert math.isclose(result(metrics.MeanReciprocalRank(), np.array([[0.0, 0.0, 1.0]]),
                               scores), 1 / 3, rel_tol=1e-6)


def test_streaming_equals_one_big_batch_and_weights_are_per_list(rng):
    """Two halves of one shape (on JAX each new shape compiles every op of an update again)."""
    labels, scores = random_batch(rng, batch=10, list_size=12)
    for metric in (metrics.NDCG(5), metrics.MeanAveragePrecision(), metrics.PrecisionAtK(3),
                   metrics.MeanReciprocalRank()):
        whole = result(metric, labels, scores)
        metric.reset_state()
        metric.update_state(labels[:5], scores[:5])
        metric.update_state(labels[5:], scores[5:])
        assert math.isclose(float(to_numpy(metric.result())), whole, rel_tol=1e-6)
        weights = np.zeros(10, np.float32)
        weights[:5] = 1.0
        assert math.isclose(result(metric, labels, scores, weights),
                            result(metric, labels[:5], scores[:5]), rel_tol=1e-6)


def test_sample_weights_are_checked_as_the_losses_check_them(rng):
    """One weight ≥ 0 per list, `[B]` or `[B, 1]`: the same check and message for both."""
    labels, scores = random_batch(rng, batch=2, list_size=3, pad_fraction=0.0)
    labels[:, 0] = 1.0
    for update in (metrics.NDCG().update_state, losses.ApproxNDCGLoss()):
        with pytest.raises(ValueError, match=r"one weight per list, shape \[batch\] or "
                                             r"\[batch, 1\] with batch = 2; got shape \(2, 3\)"):
            update(labels, scores, sample_weight=np.ones((2, 3), np.float32))
        with pytest.raises(ValueError, match=r"got shape \(3,\)"):
            update(labels, scores, sample_weight=np.ones(3, np.float32))
        with pytest.raises(ValueError, match=r"sample_weight must be >= 0; got \[-1.0\] at "
                                             r"lists \[0\]"):
            update(labels, scores, sample_weight=np.array([-1.0, 1.0], np.float32))


def test_ragged_inputs_get_a_clear_error():
    tf = pytest.importorskip("tensorflow")
    ragged = tf.ragged.constant([[2.0, 0.0, 1.0], [1.0, 0.0]])
    dense = np.zeros((2, 3), np.float32)
    for update in (metrics.NDCG().update_state, losses.ApproxNDCGLoss()):
        with pytest.raises(ValueError, match=r"y_true \(labels\) is a RaggedTensor of shape "
                                             r"\(2, None\); pass a dense \[batch, list_size\]"):
            update(ragged, ragged)
        with pytest.raises(ValueError, match=r"y_pred \(scores\) is a RaggedTensor"):
            update(dense, ragged)


def test_ragged_lists_give_the_padded_values():
    """`ragged=True`: ragged labels and scores, or ragged labels beside a model's dense scores,
    give the values of the padded form, for a loss and metrics (subtopic labels too)."""
    tf = pytest.importorskip("tensorflow")
    if backend() != "tensorflow":
        pytest.skip("ragged tensors are TensorFlow's")
    rows = [[2.0, 0.0, 1.0], [1.0, 0.0], [0.0, 1.0, 3.0, 2.0]]
    score_rows = [[0.3, 0.9, 0.1], [0.2, 0.4], [0.5, 0.1, 0.7, 0.3]]
    labels, scores = tf.ragged.constant(rows), tf.ragged.constant(score_rows)
    padded_labels, padded_scores = labels.to_tensor(-1.0), scores.to_tensor(0.0)
    wider_scores = tf.pad(padded_scores, [[0, 0], [0, 2]])  # a model's [B, L], L ≥ the longest
    subtopics = tf.ragged.constant([[[y, 1.0 - y] for y in np.minimum(row, 1.0)] for row in rows],
                                   ragged_rank=1)
    for cls in (metrics.NDCG, metrics.OPA, metrics.ARP, metrics.ERR, metrics.AlphaDCG):
        expected = result(cls(), padded_labels, padded_scores)
        assert math.isclose(result(cls(ragged=True), labels, scores), expected, rel_tol=1e-6)
        assert math.isclose(result(cls(ragged=True), labels, wider_scores), expected,
                            rel_tol=1e-6)
    assert math.isclose(result(metrics.AlphaDCG(ragged=True), subtopics, scores),
                        result(metrics.AlphaDCG(), subtopics.to_tensor(-1.0), padded_scores),
                        rel_tol=1e-6)
    loss = losses.ApproxNDCGLoss(reduction=None, ragged=True)
    assert losses.ApproxNDCGLoss.from_config(loss.get_config()).ragged
    np.testing.assert_allclose(to_numpy(loss(labels, scores)),
                               to_numpy(losses.ApproxNDCGLoss(reduction=None)(padded_labels,
                                                                             padded_scores)),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="1 more entries than the dense tensor beside it"):
        metrics.NDCG(ragged=True).update_state(labels, padded_scores[:, :3])


def test_lists_without_relevant_documents_are_excluded_or_zero():
    labels = np.array([[1.0, 0.0], [0.0, 0.0], [-1.0, -1.0]], np.float32)
    scores = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], np.float32)
    for cls in (metrics.NDCG, metrics.MeanAveragePrecision, metrics.MeanReciprocalRank):
        assert result(cls(), labels, scores) == 1.0
        assert result(cls(empty_lists="zero"), labels, scores) == 0.5  # the padded list never counts
    assert result(metrics.NDCG(), labels[1:], scores[1:]) == 0.0  # nothing counted: 0, not NaN
    with pytest.raises(ValueError, match="`empty_lists` must be one of"):
        metrics.NDCG(empty_lists="drop")


def test_nan_scores_are_reported_not_hidden():
    labels = np.array([[1.0, 0.0, -1.0]], np.float32)
    assert result(metrics.NDCG(), labels, np.array([[1.0, 0.0, np.nan]], np.float32)) == 1.0
    assert math.isnan(result(metrics.NDCG(), labels, np.array([[np.nan, 0.0, 0.0]], np.float32)))


def test_nan_labels_on_real_documents_are_reported_not_taken_for_padding():
    scores = np.array([[1.0, 0.0, 0.5]], np.float32)
    for metric in registered(keras.metrics.Metric):
        assert math.isnan(result(metric, np.array([[0.0, np.nan, -1.0]], np.float32), scores))
        masked = {"labels": np.array([[1.0, np.nan, 0.0]], np.float32),
                  "mask": np.array([[True, False, True]])}
        assert math.isfinite(result(metric, masked, scores)), metric.name


EMPTY_SHAPES = ((0, 5), (3, 0), (0, 0))  # no lists, empty lists, nothing


def test_a_batch_of_no_lists_or_of_empty_lists_counts_nothing():
    """Each metric's update made once and run on every shape (on JAX one compile a shape)."""
    for metric in registered(keras.metrics.Metric):
        update = updater(metric)
        for shape in EMPTY_SHAPES:
            empty = np.zeros(shape, np.float32)
            metric.reset_state()
            update(np.ones((1, 2), np.float32), np.array([[1.0, 0.0]], np.float32))
            before = float(to_numpy(metric.result()))
            update(empty, empty)
            assert float(to_numpy(metric.result())) == before, (metric.name, shape)
    if backend() == "tensorflow":
        import tensorflow as tf
        for metric in registered(keras.metrics.Metric):
            update = tf.function(metric.update_state, jit_compile=True)  # a trace a shape
            for shape in EMPTY_SHAPES:
                update(np.zeros(shape, np.float32), np.zeros(shape, np.float32))
                assert float(to_numpy(metric.result())) == 0.0, (metric.name, shape)


def test_ndcg_of_labels_of_128_and_more_is_the_formula_not_nan():
    labels = np.array([[300.0, 0.0, 299.0, 130.0]], np.float32)
    scores = np.array([[0.1, 0.9, 0.5, 0.2]], np.float32)
    gains = 2.0 ** labels[0].astype(float) - 1  # float64 holds them exactly enough
    dcg = sum(g / math.log2(1 + r) for g, r in zip(gains, [4, 1, 2, 3]))
    ideal = sum(g / math.log2(2 + i) for i, g in enumerate(sorted(gains, reverse=True)))
    assert math.isclose(result(metrics.NDCG(), labels, scores), dcg / ideal, rel_tol=1e-6)
    assert 0.0 < result(metrics.ApproxNDCGMetric(alpha=100.0), labels, scores) <= 1.0


def test_single_document_lists():
    labels = np.array([[2.0], [0.0]], np.float32)
    scores = np.array([[0.5], [1.0]], np.float32)
    assert result(metrics.NDCG(), labels, scores) == 1.0


@pytest.mark.backend_neutral  # dtype rules, as the losses' half-precision test
def test_half_precision_scores_give_the_float32_value(rng):
    labels, scores = random_batch(rng, batch=8, list_size=16)
    for dtype in ("float16", "bfloat16"):
        half = keras.ops.cast(scores, dtype)
        expected = result(metrics.NDCG(5), labels, keras.ops.cast(half, "float32"))
        assert math.isclose(result(metrics.NDCG(5), labels, half), expected, rel_tol=1e-6)


def test_monitors_report_what_the_loss_optimises(rng):
    labels, scores = random_batch(rng, batch=6, list_size=9)
    labels[:, 0] = 1.0
    loss = losses.ApproxNDCGLoss(alpha=5.0, topk=4, beta=3.0)
    monitor = metrics.ApproxNDCGMetric(k=4, alpha=5.0, beta=3.0)
    assert math.isclose(result(monitor, labels, scores), -float(to_numpy(loss(labels, scores))),
                        rel_tol=1e-6)
    ap_loss = losses.ApproxAPLoss(alpha=5.0, beta=3.0)
    assert math.isclose(result(metrics.ApproxAPMetric(alpha=5.0, beta=3.0), labels, scores),
                        -float(to_numpy(ap_loss(labels, scores))), rel_tol=1e-6)
    steep = metrics.ApproxNDCGMetric(alpha=1e5)
    assert math.isclose(result(steep, labels, scores), result(metrics.NDCG(), labels, scores),
                        rel_tol=1e-5)


@pytest.mark.backend_neutral  # names and configs; the rebuilt metric runs the same ops
@pytest.mark.parametrize("name, cls, config", [
    ("ndcg@5", metrics.NDCG, {"k": 5}), ("ndcg", metrics.NDCG, {"k": None}),
    ("map", metrics.MeanAveragePrecision, {}), ("p@10", metrics.PrecisionAtK, {"k": 10}),
    ("mrr", metrics.MeanReciprocalRank, {}), ("approx_ndcg@3", metrics.ApproxNDCGMetric, {"k": 3}),
    ("approx_map", metrics.ApproxAPMetric, {}),
])
def test_get_by_short_name_and_serialize(name, cls, config, rng):
    metric = metrics.get(name)
    assert type(metric) is cls and metric.name == name
    assert all(metric.get_config()[key] == value for key, value in config.items())
    rebuilt = keras.metrics.deserialize(keras.metrics.serialize(metric))
    assert type(rebuilt) is cls and rebuilt.get_config() == metric.get_config()
    labels, scores = random_batch(rng)
    assert result(rebuilt, labels, scores) == result(metric, labels, scores)


@pytest.mark.backend_neutral
def test_get_passes_parameters():
    metric = metrics.get("approx_ndcg@5", alpha=20.0, beta=3.0)
    assert (metric.k, metric.alpha, metric.beta) == (5, 20.0, 3.0)
    assert metrics.get("map", relevance_threshold=2).relevance_threshold == 2.0


@pytest.mark.backend_neutral
@pytest.mark.parametrize("name", ["p", "arp@5", "ndcg@0", "ndcg@x", "bpref"])
def test_unknown_metric_names_are_rejected(name):
    with pytest.raises(ValueError, match="metric"):
        metrics.get(name)


@pytest.mark.backend_neutral  # two uses of one formula agree; its values: trec_eval's test
def test_per_list_values_are_what_the_mean_averages(rng):
    labels, scores = random_batch(rng, batch=12, list_size=9)
    labels[0] = 0.0  # a list without a relevant document
    real = np.where(labels >= 0, labels, 0.0)
    pairs = np.sum(real[:, :, None] > np.where(labels >= 0, labels, np.inf)[:, None, :], (1, 2))
    list_weights = {metrics.ARP: real.sum(axis=1), metrics.OPA: pairs}  # as TF-Ranking weighs
    for metric in registered(keras.metrics.Metric):
        values, counted = (to_numpy(x) for x in metric.per_list(labels, scores))
        assert values.shape == counted.shape == (12,) and not counted[0]
        weights = list_weights.get(type(metric), np.ones(12))[counted]
        assert math.isclose(float(np.average(values[counted], weights=weights)),
                            result(metric, labels, scores), rel_tol=1e-6), metric.name


@pytest.mark.backend_neutral  # checks the docstrings; the values: trec_eval's test
def test_docstring_examples_run():
    assert doctest.testmod(metrics, optionflags=doctest.ELLIPSIS).failed == 0
