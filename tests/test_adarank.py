"""AdaRank (tfapprox.adarank) against the paper's algorithm, its training bound, and the trainer."""

import json
import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from tfapprox import adarank
from trainer.__main__ import main

from test_trainer_run import write_letor_parts


# ---- Xu & Li (SIGIR 2007) Fig. 1 as plain loops, with measures written out afresh -----------------

def plain_order(scores):
    """Positions by descending score; ties keep list order (tfapprox's convention)."""
    return sorted(range(len(scores)), key=lambda j: -scores[j])


def plain_ap(labels, scores):
    found, total = 0, 0.0
    for position, j in enumerate(plain_order(scores), start=1):
        if labels[j] >= 1:
            found += 1
            total += found / position
    return total / found


def plain_ndcg(labels, scores):
    def dcg(ordered):
        return sum((2 ** y - 1) / math.log2(1 + p) for p, y in enumerate(ordered, start=1))

    return dcg([labels[j] for j in plain_order(scores)]) / dcg(sorted(labels, reverse=True))


PLAIN = {"map": plain_ap, "ndcg": plain_ndcg}


def plain_adarank(queries, measure, rounds):
    """Fig. 1 for queries `[(labels, features rows)]`, plus the module's one addition: a round that
    leaves every E(f_t) as it was is undone and its feature set aside until P changes."""
    E = PLAIN[measure]
    num_features = len(queries[0][1][0])
    m = len(queries)
    P = [1.0 / m] * m
    w = [0.0] * num_features
    previous, stalled, rounds_taken = None, set(), []
    while len(rounds_taken) < rounds and len(stalled) < num_features:
        phis = {k: sum(P[i] * E(y, [x[k] for x in X]) for i, (y, X) in enumerate(queries))
                for k in range(num_features) if k not in stalled}
        k = max(phis, key=lambda c: (phis[c], -c))  # the first of equals
        phi = min(phis[k], adarank.MAX_PHI)
        alpha = 0.5 * math.log((1 + phi) / (1 - phi))
        candidate = list(w)
        candidate[k] += alpha
        measured = [E(y, [sum(c * v for c, v in zip(candidate, x)) for x in X]) for y, X in queries]
        if previous is not None and measured == previous:
            stalled.add(k)
            continue
        stalled, w, previous = set(), candidate, measured
        Z = sum(math.exp(-e) for e in measured)
        P = [math.exp(-e) / Z for e in measured]
        rounds_taken.append((k, alpha, sum(measured) / m))
    return w, rounds_taken


def padded(queries):
    """Returns features [Q, L, F], labels [Q, L] (-1 padding), mask [Q, L] of `queries`."""
    width = max(len(y) for y, _ in queries)
    num_features = len(queries[0][1][0])
    features = np.zeros((len(queries), width, num_features), np.float32)
    labels = np.full((len(queries), width), -1.0, np.float32)
    for i, (y, X) in enumerate(queries):
        features[i, :len(y)] = X
        labels[i, :len(y)] = y
    return features, labels, labels >= 0


def random_queries(rng, num_queries, num_features, integer_features=False):
    """Queries of 3..7 documents, labels 0..2, each with a relevant document."""
    queries = []
    for _ in range(num_queries):
        size = int(rng.integers(3, 8))
        y = rng.integers(0, 3, size)
        y[rng.integers(size)] = max(1, y.max())
        X = (rng.integers(0, 3, (size, num_features)) if integer_features
             else rng.normal(size=(size, num_features)))
        queries.append(([int(v) for v in y], X.astype(np.float32).tolist()))
    return queries


@pytest.mark.parametrize("measure", ["map", "ndcg"])
@pytest.mark.parametrize("integer_features", [False, True])
def test_matches_the_papers_algorithm(measure, integer_features):
    queries = random_queries(np.random.default_rng(7), 6, 4, integer_features)
    expected_weights, expected_rounds = plain_adarank(queries, measure, rounds=8)
    fit = adarank.fit_adarank(*padded(queries), measure=measure, rounds=8)

    assert [h["feature"] for h in fit.history] == [k for k, _, _ in expected_rounds]
    np.testing.assert_allclose([h["alpha"] for h in fit.history],
                               [a for _, a, _ in expected_rounds], rtol=1e-5)
    np.testing.assert_allclose([h[measure] for h in fit.history],
                               [e for _, _, e in expected_rounds], rtol=1e-5)
    assert fit.best_round == len(fit.history)  # without validation, the last round
    np.testing.assert_allclose(fit.weights, expected_weights, rtol=1e-5)


def test_validation_keeps_the_best_round():
    rng = np.random.default_rng(3)
    train, vali = padded(random_queries(rng, 8, 5)), padded(random_queries(rng, 6, 5))
    fit = adarank.fit_adarank(*train, measure="ndcg", rounds=6, validation=vali, select="ndcg@3")
    values = [h["val_ndcg@3"] for h in fit.history]
    assert fit.best_round == 1 + int(np.argmax(values))
    weights = np.zeros(5)
    for h in fit.history[:fit.best_round]:
        weights[h["feature"]] += h["alpha"]
    np.testing.assert_array_equal(fit.weights, weights)
    assert adarank.mean_measure(adarank.measure_metric("ndcg@3"), fit.weights, *vali) == max(values)


def test_a_perfect_feature_is_kept_and_boosting_stops():
    """Feature 1 ranks every query perfectly: φ = 1 is clipped, and no later round changes P."""
    queries = [([0, 2, 1], [[0.3, 0.0], [0.1, 2.0], [0.2, 1.0]]),
               ([1, 0], [[0.0, 1.0], [1.0, 0.0]])]
    fit = adarank.fit_adarank(*padded(queries), measure="ndcg", rounds=5)
    assert [h["feature"] for h in fit.history] == [1]
    assert fit.history[0]["phi"] == 1.0 and fit.history[0]["ndcg"] == pytest.approx(1.0)
    assert fit.weights[1] == pytest.approx(0.5 * math.log((2 - 1e-6) / 1e-6))


def test_queries_without_a_relevant_document_are_left_out():
    queries = random_queries(np.random.default_rng(5), 5, 3)
    with_empty = queries + [([0, 0, 0], [[1.0, 2.0, 3.0]] * 3)]
    a = adarank.fit_adarank(*padded(queries), measure="map", rounds=4)
    b = adarank.fit_adarank(*padded(with_empty), measure="map", rounds=4)
    assert a.history == b.history
    with pytest.raises(ValueError, match="none of the 1 training queries has a relevant document"):
        adarank.fit_adarank(*padded([([0, 0], [[1.0], [2.0]])]), measure="map")


@pytest.mark.parametrize("kwargs, message", [
    ({"measure": "approx_ndcg"}, "measure must be an exact measure"),
    ({"measure": "recall"}, "measure must be one of .* got 'recall'"),
    ({"rounds": 0}, "rounds must be an integer >= 1, got 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        adarank.fit_adarank(*padded(random_queries(np.random.default_rng(0), 2, 2)), **kwargs)


# ---- lists of different lengths --------------------------------------------------------------------

def mixed_length_queries(rng, num_features=4):
    """Queries of 2..7 documents and two of 40 and 90, in random order, from the shortest on."""
    queries = random_queries(rng, 12, num_features) + [
        (list(rng.integers(0, 3, size)) + [2], rng.normal(size=(size + 1, num_features)).tolist())
        for size in (39, 89)]
    return [queries[i] for i in rng.permutation(len(queries))]


def test_lists_are_measured_in_length_buckets_not_padded_to_the_longest(monkeypatch):
    """Each metric call sees lists padded to less than twice their own length."""
    features, labels, mask = padded(mixed_length_queries(np.random.default_rng(2)))
    seen = []
    per_list = adarank.metrics.RankingMetric.per_list

    def recording(metric, y_true, y_pred):
        lengths = y_true["mask"].shape[1] - np.argmax(y_true["mask"][:, ::-1], axis=1)
        seen.append((y_true["mask"].shape[1], lengths.min()))
        return per_list(metric, y_true, y_pred)

    monkeypatch.setattr(adarank.metrics.RankingMetric, "per_list", recording)
    adarank.fit_adarank(features, labels, mask, measure="ndcg", rounds=3,
                        validation=(features, labels, mask))
    assert seen and all(width < 2 * shortest for width, shortest in seen), seen


@pytest.mark.parametrize("measure", ["map", "ndcg"])
def test_bucketed_fit_equals_the_padded_fit(measure, monkeypatch):
    """Measured in buckets, from padded arrays or from `length_buckets`, AdaRank takes the
    rounds it takes with every list padded to the longest (one bucket): the same features, and
    values equal up to float32 rounding (a list's measure may differ in its last bit with the
    width it is padded to, as it did before between splits of different longest lists)."""
    queries = sorted(mixed_length_queries(np.random.default_rng(4)), key=lambda q: len(q[0]))
    train, vali = padded(queries[::2]), padded(queries[1::2])
    buckets = adarank.length_buckets(*train)
    assert [b.shape[1] for b in buckets[1]] == sorted({b.shape[1] for b in buckets[1]})
    assert sum(len(b) for b in buckets[1]) == len(train[1])
    fits = [adarank.fit_adarank(*data, measure=measure, rounds=6, validation=vali)
            for data in (train, buckets)]
    monkeypatch.setattr(adarank, "_bucket_keys", lambda mask: np.zeros(len(mask), int))
    padded_fit = adarank.fit_adarank(*train, measure=measure, rounds=6, validation=vali)
    for fit in fits:
        assert fit.best_round == padded_fit.best_round
        assert [h.keys() for h in fit.history] == [h.keys() for h in padded_fit.history]
        for ours, expected in zip(fit.history, padded_fit.history):
            assert ours["feature"] == expected["feature"]
            np.testing.assert_allclose(list(ours.values()), list(expected.values()), rtol=1e-6)
        np.testing.assert_allclose(fit.weights, padded_fit.weights, rtol=1e-6)


# ---- Xu & Li Theorem 1 ----------------------------------------------------------------------------

@st.composite
def small_sets(draw):
    """Tiny ranking sets with ties (integer features), every query with a relevant document."""
    seed = draw(st.integers(0, 2**32 - 1))
    return random_queries(np.random.default_rng(seed), draw(st.integers(1, 5)),
                          draw(st.integers(1, 4)), integer_features=draw(st.booleans()))


@settings(max_examples=20, deadline=None)
@given(queries=small_sets(), measure=st.sampled_from(["map", "ndcg"]), rounds=st.integers(1, 6))
def test_training_bound_of_theorem_1(queries, measure, rounds):
    """Xu & Li, Theorem 1: for E in [−1, 1],

        (1/m) Σ_i E(π(q_i, d_i, f_T), y_i)  ≥  1 − Π_{t=1..T} e^{−δ_min^t} √(1 − φ(t)²),

    φ(t) = Σ_i P_t(i) E(π(q_i, d_i, h_t), y_i),  δ_min^t = min_i δ_i^t,
    δ_i^t = E(π(q_i, d_i, f_{t−1} + α_t h_t), y_i) − E(π(q_i, d_i, f_{t−1}), y_i) − α_t E(π(q_i, d_i, h_t), y_i),

    with E(π(·, f_0)) = 0 (which P_1 = 1/m presumes). The rounds are those AdaRank took; φ(t) is the
    clipped one that α_t was computed from (the proof needs α_t = ½ ln((1 + φ)/(1 − φ)), and it
    holds for a φ below the true one). P_t and φ(t) are recomputed here from E(f_{t−1}).
    """
    features, labels, mask = padded(queries)
    fit = adarank.fit_adarank(features, labels, mask, measure=measure, rounds=rounds)
    metric = adarank.measure_metric(measure)
    weak = adarank.weak_ranker_measures(metric, features, labels, mask)
    m = len(queries)
    previous, weights, product = np.zeros(m), np.zeros(features.shape[-1]), 1.0
    for t, entry in enumerate(fit.history, start=1):
        P = np.full(m, 1.0 / m) if t == 1 else np.exp(-previous) / np.exp(-previous).sum()
        h = weak[entry["feature"]]
        assert entry["phi"] == pytest.approx(P @ h, abs=1e-12)
        phi = min(entry["phi"], adarank.MAX_PHI)
        weights = weights.copy()
        weights[entry["feature"]] += entry["alpha"]
        current, _ = adarank.per_query(metric, adarank.linear_scores(features, weights), labels, mask)
        delta_min = np.min(current - previous - entry["alpha"] * h)
        product *= math.exp(-delta_min) * math.sqrt(1.0 - phi**2)
        previous = current
    np.testing.assert_array_equal(weights, fit.weights)
    assert previous.mean() >= 1.0 - product - 1e-9


# ---- through the trainer ----------------------------------------------------------------------------

@pytest.fixture
def config_file(tmp_path):
    """A config whose data cache is under `tmp_path` (there is no flag for it)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"data": {"cache_dir": str(tmp_path / "cache")}}))
    return str(path)


def test_cv_fits_restores_and_exports_adarank(tmp_path, config_file, capsys):
    """`cv --model adarank` on one fold: results like a neural run's, its table, the export of the
    restored weights, and a rerun that finds the run trained."""
    argv = ["cv", "--config", config_file, "--data-dir", str(write_letor_parts(tmp_path / "letor")),
            "--folds", "2", "--out", str(tmp_path / "cv"), "--model", "adarank",
            "--adarank-measure", "map", "--adarank-rounds", "5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best validation ndcg@5 at round" in out and "AdaRank (Xu & Li 2007) on map" in out
    assert "Test metrics, adarank(map), selected on validation ndcg@5" in out
    run_dir = tmp_path / "cv" / "Fold2" / "default"
    results = json.loads((run_dir / "results.json").read_text())
    assert 1 <= results["epochs_run"] <= 5 and len(results["history"]) == results["epochs_run"]
    assert list(results["test"]) == ["ndcg@5", "ndcg@1", "ndcg@10", "map", "p@10", "mrr"]
    best = results["history"][results["best_epoch"] - 1]
    assert results["validation"]["ndcg@5"] == pytest.approx(best["val_ndcg@5"], abs=1e-6)

    export = ["export", "--run-dir", str(run_dir), "--export-dir", str(tmp_path), "--name", "ada",
              "--version", "1"]
    assert main(export) == 0
    weights = np.array(results["feature_weights"], np.float32)
    features = np.random.default_rng(0).random((2, 6, len(weights))).astype(np.float32)
    loaded = tf.saved_model.load(str(tmp_path / "ada" / "1"))
    scores = loaded.signatures["score_features"](features=tf.constant(features))["scores"].numpy()
    np.testing.assert_allclose(scores, features @ weights, rtol=1e-5, atol=1e-6)

    assert main(argv) == 0
    assert "is already trained (" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--adarank-measure", "approx_map"], "measure must be an exact measure"),
    (["--adarank-rounds", "0"], "model.adarank_rounds must be >= 1, got 0"),
    (["--strategy", "mirrored"], "runtime.strategy must be default with model.kind adarank"),
])
def test_bad_adarank_settings_fail_before_training(tmp_path, config_file, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", config_file, "--model", "adarank",
              "--run-dir", str(tmp_path / "run"), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
