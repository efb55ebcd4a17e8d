"""Grids over scorer and optimiser options in `benchmarks.experiments`: each point is its own run,
a point equal to the recipe and the trainer's configuration is the run without the option, and the
report picks per fold the point best on validation; a scorer option (list standardisation) is
compared with the same setting without it; the smallest difference a paired test calls
significant."""

import copy
import dataclasses
import json
import re

import numpy as np
import pytest

from benchmarks import experiment_report
from benchmarks.experiment_studies import Setting, runs_of

NDCG = ("approx_ndcg", (("alpha", 10.0),))
TUNED = Setting("dasalc", *NDCG, grid=(("model.input_transform", ("log1p", "none")),
                             ("optimizer.learning_rate", (0.05, 0.2))))


def test_each_point_is_a_run_and_the_default_options_are_left_out():
    runs = runs_of(TUNED, "MQ2008", [1], [0], 40)  # the mq2008 preset: Adagrad, rate 0.05
    ablated = Setting("dasalc", *NDCG, scorer=(("input_transform", "none"),))
    assert [(r.scorer, r.optimizer) for r in runs] == [
        ((), ()), ((), (("learning_rate", 0.2),)), ((("input_transform", "none"),), ()),
        ((("input_transform", "none"),), (("learning_rate", 0.2),))]
    assert all(r.params == NDCG[1] for r in runs)
    # the recipe's point and the one without log1p are the runs those settings cache
    assert [runs[0], runs[2]] == (runs_of(Setting("dasalc", *NDCG), "MQ2008", [1], [0], 40)
                                  + runs_of(ablated, "MQ2008", [1], [0], 40))
    assert TUNED.label() == ("dasalc[input_transform∈{log1p, none}] approx_ndcg(alpha=10.0) "
                             "learning_rate∈{0.05, 0.2}")
    assert runs[3].label() == ("dasalc[input_transform=none] approx_ndcg(alpha=10.0) "
                               "learning_rate=0.2")


def test_the_report_chooses_per_fold_the_point_best_on_validation(tmp_path):
    validation = {(1, 1): 0.70, (1, 3): 0.72, (2, 0): 0.65, (2, 2): 0.61}  # (fold, point): ndcg@10
    for fold in (1, 2):
        for point, run in enumerate(runs_of(TUNED, "MQ2008", [fold], [0], 40)):
            path = run.cache_path(tmp_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({
                "validation": {"ndcg@10": validation.get((fold, point), 0.5)}, "qids": ["q"],
                "test": {"values": {"ndcg@10": [point / 10]}, "relevant": [True]},
                "wall_seconds": 1.0, "run": dataclasses.asdict(run)}))
    row = experiment_report.Selected(TUNED, "MQ2008", tmp_path, [1, 2], [0], 40, print)
    assert row.cell([1, 2], "ndcg@10") == (0.15, 0.0)  # points 3 and 0
    assert row.seconds_per_fold([1, 2]) == 4.0  # choosing cost every point's run
    assert experiment_report._points_chosen(row, [1, 2]).endswith(
        "chose Fold1 seed0: input_transform=none, learning_rate=0.2; Fold2 seed0: the recipe.")


def _cache_test_values(cache, setting, validation, values, dataset="MQ2008"):
    """Caches one run of `setting` (Fold1, seed 0) whose test queries a, b, c, … have these
    ndcg@10 values."""
    (run,) = runs_of(setting, dataset, [1], [0], 40)
    path = run.cache_path(cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "validation": {"ndcg@10": validation}, "qids": [chr(97 + i) for i in range(len(values))],
        "test": {"values": {"ndcg@10": values}, "relevant": [True] * len(values)},
        "wall_seconds": 1.0, "run": dataclasses.asdict(run)}))
    return experiment_report.Selected(setting, dataset, cache, [1], [0], 40, print)


def test_the_report_compares_a_list_standardized_setting_with_the_same_without(tmp_path):
    from benchmarks.experiment_studies import LIST_STANDARDIZED

    with_it = LIST_STANDARDIZED[1]
    without = dataclasses.replace(with_it, scorer=(("input_transform", "quantile"),))
    rows = [_cache_test_values(tmp_path, with_it, 0.71, [0.6, 0.8, 0.5]),
            _cache_test_values(tmp_path, without, 0.70, [0.5, 0.8, 0.2])]
    line = experiment_report._list_standardized_test(rows[0], rows, [1])
    assert line.endswith("− the same without the list standardisation: validation ndcg@10 "
                         "+0.0100, test NDCG@10 +0.1333 (p = 0.270, 3 queries).")
    assert "is not run" in experiment_report._list_standardized_test(rows[0], rows[:1], [1])


def test_the_least_significant_difference_is_where_the_paired_test_crosses_its_threshold(
        tmp_path):
    from scipy import stats

    from benchmarks.experiment_studies import LIST_STANDARDIZED

    rng = np.random.default_rng(0)
    ours, theirs = rng.uniform(size=40), rng.uniform(size=40)
    rows = [_cache_test_values(tmp_path, LIST_STANDARDIZED[0], 0.7, ours.tolist()),
            _cache_test_values(tmp_path, LIST_STANDARDIZED[1], 0.7, theirs.tolist())]
    pairs = experiment_report._per_query_pairs(*rows, [1], "ndcg@10", every_seed=False)
    needed = experiment_report.least_significant_difference(*pairs)
    # differences with the same spread, shifted to mean `needed`, test at exactly the threshold
    shifted = ours - theirs - np.mean(ours - theirs) + needed
    assert stats.ttest_1samp(shifted, 0.0).pvalue == pytest.approx(experiment_report.SIGNIFICANT)
    assert experiment_report.least_significant_difference(ours, ours) == 0


def test_the_bar_names_each_set_not_significantly_ahead_and_what_it_needs(tmp_path):
    from benchmarks.experiment_studies import Ensemble, Setting

    ensemble = Ensemble("two", (Setting("B64", "softmax_loss"),), "a variant for the test")
    gbdt = Setting("xgboost", "x")
    rng = np.random.default_rng(1)
    theirs, spread = rng.uniform(0.2, 0.8, size=60), rng.normal(0, 0.3, 60)
    ahead = {"A": theirs + 0.1 + rng.normal(0, 0.01, 60),  # far ahead
             "B": theirs + 0.1 + rng.normal(0, 0.01, 60),
             "C": theirs + 0.01 + spread - spread.mean()}  # ahead by 0.01, within noise
    by_set = {name: ({}, [_cache_test_values(tmp_path, ensemble.setting(), 0.7, ours.tolist(),
                                             name)],
                     _cache_test_values(tmp_path, gbdt, 0.7, theirs.tolist(), name))
              for name, ours in ahead.items()}
    text = experiment_report._mixed_ensemble([ensemble], by_set, [1])
    assert "| two | B64 softmax_loss() | variant: a variant for the test |" in text
    assert text.endswith("two: **met**.\n")
    by_set["B"] = by_set["C"]  # now significantly ahead on one set only
    text = experiment_report._mixed_ensemble([ensemble], by_set, [1])
    needed = experiment_report.least_significant_difference(*experiment_report._per_query_pairs(
        *by_set["C"][1], by_set["C"][2], [1], "ndcg@10", every_seed=True))
    assert "| two | C | " in text and f"| ±{needed:.4f} | level with it within noise |" in text
    assert re.search(rf"\*\*not met\*\*; above it but not significantly on B \(\+0\.\d{{4}} of the "
                     rf"\+{needed:.4f} it needs\), C \(", text), text[-400:]
    by_set["C"] = (by_set["C"][0], [copy.copy(by_set["A"][1][0])], by_set["C"][2])
    by_set["C"][1][0].by_fold_seed = {}  # not run on C: the bar is not met, and it says so
    text = experiment_report._mixed_ensemble([ensemble], by_set, [1])
    assert "two: **not met** (run on A, B only)" in text and "| two | C |" not in text


def test_a_recipe_is_also_set_against_the_gbdt_best_in_test(tmp_path):
    from benchmarks.experiment_studies import Ensemble, Setting

    ensemble = Ensemble("two", (Setting("B64", "softmax_loss"),), "a recipe for the test",
                        ("losses",))
    gbdts = [_cache_test_values(tmp_path, Setting(model, "x"), validation, values)
             for model, validation, values in (("xgboost", 0.8, [0.3, 0.4, 0.5]),
                                               ("catboost", 0.7, [0.5, 0.6, 0.6]))]
    ours = _cache_test_values(tmp_path, ensemble.setting(), 0.7, [0.4, 0.6, 0.5])
    by_set = {"MQ2008": ({"gbdt": gbdts}, [ours], gbdts[0])}  # xgboost: validation's reference
    line = experiment_report._against_test_best_gbdt(ensemble, 0, by_set, [1])
    assert line == ("Recipe two against the GBDT best in test NDCG@10 on each set (chosen in "
                    "hindsight, on test, so not the reference above): MQ2008: catboost 0.5667, "
                    "-0.0667 (p = 0.184).")
