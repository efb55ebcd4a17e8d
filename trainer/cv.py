"""Five-fold cross-validation over a LETOR set, with an optional hyperparameter grid.

For each fold, every grid point (a combination of values for dotted config keys, e.g.
`loss.params.alpha` × `loss.params.beta`) is trained as its own resumable run in
`<out>/FoldN/<point>/`; the point with the best validation value of `train.select_metric` is
selected and its test metrics are that fold's result. Rerunning the same command skips finished
runs and resumes an interrupted one. `<out>` is a directory the trainer made, as a run directory is
(trainer.run_files).

Writes `<out>/cv_results.json` (per fold: selected point, validation and test metrics, every
point's validation value; mean and std of the test metrics over folds) and `<out>/cv_results.md`.
The std is the sample standard deviation over folds (ddof=1; 0 for a single fold).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path
from typing import Any, Callable

import keras

from trainer import config as config_lib
from trainer import data, distribute, run_files, train
from trainer.config import Config

Printer = Callable[[str], None]


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Returns the cartesian product of the grid's axes as dotted-key assignments ([{}] if empty)."""
    keys = list(grid)
    for key in keys:
        if not isinstance(grid[key], list) or not grid[key]:
            raise ValueError(f"cv.grid[{key!r}] must be a non-empty list, got {grid[key]!r}")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_name(point: dict[str, Any]) -> str:
    """Returns a directory name for a grid point, e.g. `alpha=10,beta=1` ('default' if empty)."""
    if not point:
        return "default"
    text = ",".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in point.items())
    return re.sub(r"[^\w.,=@+-]", "_", text)


@dataclasses.dataclass
class FoldRun:
    """One training run of the cross-validation: a fold and a grid point."""

    fold: int
    point: dict[str, Any]
    config: Config


def plan(config: Config) -> list[FoldRun]:
    """Returns every run of the cross-validation, fold by fold, each with its complete config.

    Raises ValueError/KeyError for a bad grid and FileNotFoundError for a missing fold, before
    anything trains.
    """
    if config.data.dir is None:
        raise ValueError("cv needs --data-dir: a LETOR set directory (S1..S5.txt or Fold1..Fold5/)")
    folds = data.letor_folds(config.data.dir)
    out_dir = Path(config.cv.out_dir)
    runs = []
    for fold in config.cv.folds:
        if fold not in folds:
            raise FileNotFoundError(f"{config.data.dir}: no Fold{fold}; found folds {sorted(folds)}")
        train_paths, vali_paths, test_paths = folds[fold]
        for point in grid_points(config.cv.grid):
            values = config.to_dict()
            config_lib.apply_overrides(values, point)
            config_lib.apply_overrides(values, {
                "data.dir": None,
                "data.train": train_paths,
                "data.vali": vali_paths,
                "data.test": test_paths,
                "train.run_dir": str(out_dir / f"Fold{fold}" / point_name(point)),
                "export.enabled": False,
            })
            runs.append(FoldRun(fold, point, Config.from_dict(values)))
    return runs


def run(config: Config, *, fresh: bool = False, print_fn: Printer = print,
        dist: distribute.Distribution | None = None) -> dict[str, Any]:
    """Cross-validates `config` over `config.cv.folds` of the LETOR set in `config.data.dir`.

    `dist` is made from `config.runtime.strategy` when None.
    """
    runs = plan(config)
    dist = dist or distribute.make(config.runtime.strategy)
    if dist.is_chief:
        run_files.claim(config.cv.out_dir)
    select = config.train.select_metric
    candidates: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for fold_run in runs:
        print_fn(f"\n== Fold{fold_run.fold} {point_name(fold_run.point)} ==")
        keras.backend.clear_session()
        results = train.train(fold_run.config, fresh=fresh, print_fn=print_fn, dist=dist)
        candidates.setdefault(fold_run.fold, []).append((fold_run.point, results))
    per_fold = []
    for fold, fold_candidates in candidates.items():
        best_point, best = max(fold_candidates, key=lambda c: c[1]["validation"][select])
        per_fold.append({
            "fold": fold,
            "params": best_point,
            "run_dir": best["run_dir"],
            "best_epoch": best["best_epoch"],
            "validation": best["validation"],
            "test": best["test"],
            "grid": [{"params": p, f"validation_{select}": r["validation"][select]}
                     for p, r in fold_candidates],
        })
    return report(config, per_fold, _method(config), write=dist.is_chief, print_fn=print_fn)


def report(config: Config, per_fold: list[dict[str, Any]], method: str, *, write: bool = True,
           print_fn: Printer = print) -> dict[str, Any]:
    """Returns the summary of the folds' results (`per_fold`: each fold's selected run) with
    their test metrics' mean and std; writes and prints it when `write`."""
    out_dir = Path(config.cv.out_dir)
    summary = {
        "data_dir": config.data.dir,
        "select_metric": config.train.select_metric,
        "loss": {"name": config.loss.name, "params": config.loss.params},
        "method": method,
        "grid": config.cv.grid,
        "folds": per_fold,
        "mean": _aggregate(per_fold, _mean),
        "std": _aggregate(per_fold, _std),
    }
    if write:
        run_files.write_json(out_dir / "cv_results.json", summary)
        table = markdown(summary)
        run_files.write_text(out_dir / "cv_results.md", table + "\n")
        print_fn("\n" + table)
        print_fn(f"\nWrote {out_dir / 'cv_results.json'} and {out_dir / 'cv_results.md'}")
    return summary


def markdown(summary: dict[str, Any]) -> str:
    """Returns the per-fold test metrics and their mean ± std as a markdown table."""
    names = [n for n in summary["folds"][0]["test"] if n != "loss"]
    grid = bool(summary["grid"])
    header = ["fold"] + (["selected"] if grid else []) + names
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for fold in summary["folds"]:
        cells = [f"Fold{fold['fold']}"]
        if grid:
            cells.append(point_name(fold["params"]))
        cells += [f"{fold['test'][n]:.4f}" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["mean ± std"] + ([""] if grid else [])
    cells += [f"{summary['mean'][n]:.4f} ± {summary['std'][n]:.4f}" for n in names]
    lines.append("| " + " | ".join(cells) + " |")
    title = (f"Test metrics, {summary['method']}, selected on validation "
             f"{summary['select_metric']} ({summary['data_dir']})")
    return title + "\n\n" + "\n".join(lines)


def _method(config: Config) -> str:
    """Returns what trains, for the table's title: `approx_ndcg(alpha=10)` or `adarank(map)`."""
    if config.model.kind == "adarank":
        return f"adarank({config.model.adarank_measure})"
    params = ", ".join(f"{k}={v}" for k, v in config.loss.params.items())
    return f"{config.loss.name}({params})"


def _aggregate(per_fold: list[dict[str, Any]], reduce: Callable[[list[float]], float]) -> dict:
    names = per_fold[0]["test"].keys()
    return {n: reduce([fold["test"][n] for fold in per_fold]) for n in names}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
