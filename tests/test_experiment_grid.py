"""Grids over scorer and optimiser options in `benchmarks.experiments`: each point is its own run,
a point equal to the recipe and the trainer's configuration is the run without the option, and the
report picks per fold the point best on validation; a scorer option (list standardisation) is
compared with the same setting without it."""

import dataclasses
import json

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


def test_the_report_compares_a_list_standardized_setting_with_the_same_without(tmp_path):
    from benchmarks.experiment_studies import LIST_STANDARDIZED

    with_it = LIST_STANDARDIZED[1]
    without = dataclasses.replace(with_it, scorer=(("input_transform", "quantile"),))
    tests = {with_it: [0.6, 0.8, 0.5], without: [0.5, 0.8, 0.2]}  # three queries' ndcg@10
    for setting, values in tests.items():
        (run,) = runs_of(setting, "MQ2008", [1], [0], 40)
        path = run.cache_path(tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "validation": {"ndcg@10": 0.71 if setting is with_it else 0.70},
            "qids": ["a", "b", "c"], "test": {"values": {"ndcg@10": values},
                                              "relevant": [True] * 3},
            "wall_seconds": 1.0, "run": dataclasses.asdict(run)}))
    rows = [experiment_report.Selected(s, "MQ2008", tmp_path, [1], [0], 40, print) for s in tests]
    line = experiment_report._list_standardized_test(rows[0], rows, [1])
    assert line.endswith("− the same without the list standardisation: validation ndcg@10 "
                         "+0.0100, test NDCG@10 +0.1333 (p = 0.270, 3 queries).")
    assert "is not run" in experiment_report._list_standardized_test(rows[0], rows[:1], [1])
