"""`tfapprox.ensemble.ScoreEnsemble`: its scores against the formula, padding, save and load."""

import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import to_numpy
from tfapprox import models
from tfapprox.ensemble import NonFiniteScores, ScoreEnsemble

NUM_FEATURES = 5


def lists(seed, batch=6, size=7):
    """Returns random `{"features", "mask"}` lists, some of them padded (padded features huge)."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(batch, size, NUM_FEATURES)).astype("float32")
    mask = rng.random((batch, size)) < 0.7
    mask[:, 0] = True
    features[~mask] = 1e6
    return {"features": features, "mask": mask}


def members(seed=0):
    """Two small scorers with different weights and scales, built."""
    keras.utils.set_random_seed(seed)
    first = models.DNNScorer(hidden_units=(8,), name="first")
    second = models.DNNScorer(hidden_units=(), input_batch_norm=False, name="second")
    for member in (first, second):
        member(lists(0))
    second.set_weights([10.0 * w for w in second.get_weights()])
    return [first, second]


def test_scores_are_the_mean_of_members_standardised_by_their_moments_on_real_documents():
    ensemble = ScoreEnsemble(members())
    fitting = [lists(1), lists(2)]
    ensemble.adapt(fitting)
    real = [np.concatenate([to_numpy(m(x))[x["mask"]] for x in fitting]) for m in ensemble.members]
    np.testing.assert_allclose(to_numpy(ensemble.offsets), [r.mean() for r in real], rtol=1e-5)
    np.testing.assert_allclose(to_numpy(ensemble.scales), [r.std() for r in real], rtol=1e-5)

    x = lists(3)
    expected = np.mean([(to_numpy(m(x)) - r.mean()) / r.std()
                        for m, r in zip(ensemble.members, real)], axis=0)
    scores = to_numpy(ensemble(x))
    np.testing.assert_allclose(scores[x["mask"]], expected[x["mask"]], rtol=1e-4, atol=1e-5)
    assert np.all(scores[~x["mask"]] == 0.0)


def test_each_documents_score_is_its_own_and_padding_is_not_fitted():
    """Constants, not list statistics: a document scores the same alone and in its list; and
    padded slots (features 1e6) leave the fitted moments as they are without them."""
    ensemble = ScoreEnsemble(members())
    x = lists(4)
    ensemble.adapt([x])
    fitted = to_numpy(ensemble.offsets), to_numpy(ensemble.scales)
    one_a_list = [{"features": x["features"][x["mask"]][:, None, :],
                   "mask": np.ones((int(x["mask"].sum()), 1), bool)}]
    ensemble.adapt(one_a_list)
    np.testing.assert_allclose(to_numpy(ensemble.offsets), fitted[0], rtol=1e-5)
    np.testing.assert_allclose(to_numpy(ensemble.scales), fitted[1], rtol=1e-5)
    alone = to_numpy(ensemble(one_a_list[0]))[:, 0]
    np.testing.assert_allclose(alone, to_numpy(ensemble(x))[x["mask"]], rtol=1e-5, atol=1e-6)


def test_a_member_that_scores_every_document_alike_adds_nothing():
    constant = models.DNNScorer(hidden_units=(), input_batch_norm=False, name="constant")
    constant(lists(0))
    constant.set_weights([np.zeros((NUM_FEATURES, 1), "float32"), np.ones([1], "float32")])
    varying = members()[0]
    ensemble = ScoreEnsemble([varying, constant]).adapt([lists(5)])
    assert to_numpy(ensemble.scales)[1] == 1.0
    alone = ScoreEnsemble([varying]).adapt([lists(5)])
    x = lists(6)
    np.testing.assert_allclose(to_numpy(ensemble(x)), to_numpy(alone(x)) / 2, rtol=1e-5, atol=1e-6)


def test_save_and_load_keep_members_quantiles_and_constants(tmp_path):
    quantile = models.build_scorer("B64", input_transform="quantile")
    quantile(lists(0))
    quantile.adapt(np.random.default_rng(0).exponential(size=(50, NUM_FEATURES)) ** 3)
    ensemble = ScoreEnsemble([*members(), quantile]).adapt([lists(7)])
    ensemble.save(tmp_path / "ensemble.keras")
    loaded = keras.saving.load_model(tmp_path / "ensemble.keras")
    x = lists(8)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(ensemble(x)), rtol=1e-6, atol=1e-7)
    assert [m.name for m in loaded.members] == ["first", "second", quantile.name]


def test_a_fresh_interpreter_loads_a_saved_ensemble_after_import_tfapprox_alone(tmp_path):
    """Every registered class (the ensemble, its DNNScorer members, their layers) is known once
    `import tfapprox` has run: a user need not know which submodule registers which class."""
    ensemble = ScoreEnsemble(members()).adapt([lists(7)])
    ensemble.save(tmp_path / "ensemble.keras")
    x = lists(8)
    np.save(tmp_path / "features.npy", x["features"])
    np.save(tmp_path / "mask.npy", x["mask"])
    load = ("import keras, numpy as np, tfapprox, sys; d = sys.argv[1]; "
            "m = keras.saving.load_model(d + '/ensemble.keras'); "
            "x = {'features': np.load(d + '/features.npy'), 'mask': np.load(d + '/mask.npy')}; "
            "np.save(d + '/scores.npy', keras.ops.convert_to_numpy(m(x)))")
    subprocess.run([sys.executable, "-c", load, str(tmp_path)], check=True, capture_output=True)
    np.testing.assert_allclose(np.load(tmp_path / "scores.npy"), to_numpy(ensemble(x)),
                               rtol=1e-6, atol=1e-7)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one member"):
        ScoreEnsemble([])
    x = lists(0)
    with pytest.raises(ValueError, match="no documents"):
        ScoreEnsemble(members()).adapt([{**x, "mask": np.zeros_like(x["mask"])}])


def test_a_member_with_non_finite_scores_is_refused_by_index_and_name():
    """NaN weights (or a feature that overflows a member's layers) would make μ and σ NaN, and
    every score of the ensemble with them: refused, the constants left as they were."""
    broken = members()
    broken[1].set_weights([np.full_like(w, np.nan) for w in broken[1].get_weights()])
    ensemble = ScoreEnsemble(broken)
    with pytest.raises(NonFiniteScores, match=r"^ScoreEnsemble member 1 \(second\) scores (\d+) of "
                       r"\1 documents NaN or infinite$") as refused:
        ensemble.adapt([lists(1)])
    assert refused.value.member == 1
    np.testing.assert_array_equal(to_numpy(ensemble.offsets), [0.0, 0.0])
    np.testing.assert_array_equal(to_numpy(ensemble.scales), [1.0, 1.0])
