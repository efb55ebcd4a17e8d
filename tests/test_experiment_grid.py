"""Grids over scorer options in `benchmarks.experiments`: each point is its own run, a point equal
to the recipe is the recipe's run, and the report picks per fold the point best on validation."""

import dataclasses
import json

from benchmarks import experiment_report
from benchmarks.experiment_studies import Setting, runs_of

GRID = (("model.input_transform", ("log1p", "none")), ("model.noise_stddev", (1.5, 4.5)))
TUNED = Setting("dasalc", "approx_ndcg", (("alpha", 10.0),), GRID)


def test_scorer_axes_make_one_run_per_point_and_the_recipe_point_is_the_recipe_run():
    runs = runs_of(TUNED, "MQ2008", [1], [0], 40)
    assert [r.scorer for r in runs] == [
        (), (("noise_stddev", 4.5),), (("input_transform", "none"),),
        (("input_transform", "none"), ("noise_stddev", 4.5))]
    assert all(r.params == (("alpha", 10.0),) for r in runs)
    recipe = runs_of(Setting("dasalc", "approx_ndcg", (("alpha", 10.0),)), "MQ2008", [1], [0], 40)
    ablated = runs_of(Setting("dasalc", "approx_ndcg", (("alpha", 10.0),),
                              scorer=(("input_transform", "none"),)), "MQ2008", [1], [0], 40)
    assert [runs[0], runs[2]] == recipe + ablated  # both read the runs those settings cached
    assert TUNED.label() == ("dasalc[input_transform∈{log1p, none}, noise_stddev∈{1.5, 4.5}] "
                             "approx_ndcg(alpha=10.0)")


def test_the_report_chooses_per_fold_the_scorer_point_best_on_validation(tmp_path):
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
    assert experiment_report._points_chosen(row).endswith(
        "chose Fold1 seed0: [input_transform=none, noise_stddev=4.5]; Fold2 seed0: the recipe.")
