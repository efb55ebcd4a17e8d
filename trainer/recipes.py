"""Recipes: named ensembles of trainer runs, trained, combined and exported by one command.

`python -m trainer train --recipe NAME` trains each member of the recipe as a run of its own in
`RUN_DIR/members/<member>/` (resumable as any run is: a rerun of the command skips finished members
and resumes the one it stopped in), then combines their best weights with `trainer.ensemble.run`
(the mean of their scores, each standardised on validation), scores validation and test and
exports one SavedModel from `RUN_DIR`.

A member fixes its scorer preset and options and its loss; the settings the members share (the
experiments' protocol: 40 epochs, patience 10, selection on validation NDCG@10) are defaults that
the command line's flags override, on top of `--config` (data, optimiser, batch size, dropout).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from trainer import config as config_lib
from trainer.config import Config

Printer = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Member:
    """One run of a recipe: a scorer preset with options (`model.<option>`) and a loss."""

    preset: str
    loss: str
    scorer: tuple[tuple[str, Any], ...] = ()
    loss_params: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.preset.lower()}_{self.loss}"

    def settings(self) -> dict[str, Any]:
        """Returns the dotted config keys this member fixes (loss.params is set whole)."""
        return {"model.kind": "dnn", "model.preset": self.preset, "loss.name": self.loss,
                **{f"model.{option}": value for option, value in self.scorer}}


@dataclasses.dataclass(frozen=True)
class Recipe:
    description: str
    members: tuple[Member, ...]


QUANTILE = (("input_transform", "quantile"),)
QUANTILE_LIST_STANDARDIZED = QUANTILE + (("list_standardize", True),)
# What every member trains with unless a flag says otherwise: the experiments' protocol.
SHARED = {"train.epochs": 40, "train.patience": 10, "train.select_metric": "ndcg@10"}

# The experiments' best three settings by validation (docs/results.md): three losses, two scorers.
MIXED = (("dasalc", "pairwise_soft_zero_one_loss"), ("B64", "weighted_ranknet"),
         ("B64", "unique_softmax_loss"))
MIXED_DESCRIPTION = ("DASALC on the pairwise soft zero-one loss, B64 on weighted RankNet and B64 "
                     "on the unique softmax loss; quantile inputs")

RECIPES = {
    "mixed_quantile_list_standardized": Recipe(
        MIXED_DESCRIPTION + ", each feature also standardised within its list",
        tuple(Member(preset, loss, QUANTILE_LIST_STANDARDIZED) for preset, loss in MIXED)),
    "mixed_quantile": Recipe(MIXED_DESCRIPTION,
                             tuple(Member(preset, loss, QUANTILE) for preset, loss in MIXED)),
}
RECOMMENDED = "mixed_quantile_list_standardized"  # at or above tuned GBDTs on the shared sets


def names() -> list[str]:
    return ["recommended", *RECIPES]


def get(name: str) -> tuple[str, Recipe]:
    """Returns (the recipe's own name, the recipe) of `name` or of `recommended`."""
    own = RECOMMENDED if name == "recommended" else name
    if own not in RECIPES:
        raise ValueError(f"--recipe {name!r} is not a recipe; recipes are {', '.join(names())}")
    return own, RECIPES[own]


@dataclasses.dataclass
class Plan:
    """A recipe's runs: each member's complete config, and the ensemble's (its run directory,
    data and export)."""

    name: str
    members: dict[str, Config]
    ensemble: Config

    @property
    def run_dir(self) -> Path:
        return Path(self.ensemble.train.run_dir)


def plan(name: str, values: dict[str, Any], overrides: dict[str, Any]) -> Plan:
    """Returns the runs of recipe `name` on top of the config `values` (a `--config`'s) with the
    command line's `overrides` (dotted keys), which win over `SHARED` but may not change what a
    member fixes. `--run-dir` defaults to runs/<recipe>, `--name` to tfapprox_<recipe>."""
    own, recipe = get(name)
    fixed = {key for member in recipe.members for key in member.settings()} | {"loss.params"}
    for key in overrides:
        if any(key == f or key.startswith(f + ".") for f in fixed):
            raise ValueError(f"--recipe {name} sets {key} for each member: drop that flag, or "
                             "train a run of your own without --recipe")
    overrides = {"train.run_dir": f"runs/{own}", "export.name": f"tfapprox_{own}", **overrides}
    run_dir = Path(overrides["train.run_dir"])

    def config(member: Member, extra: dict[str, Any]) -> Config:
        member_values = copy.deepcopy(values)
        config_lib.apply_overrides(member_values, {**SHARED, **member.settings()})
        member_values["loss"]["params"] = dict(member.loss_params)
        config_lib.apply_overrides(member_values, {**overrides, **extra})
        return Config.from_dict(member_values)

    members = {m.name: config(m, {"train.run_dir": str(run_dir / "members" / m.name),
                                  "export.enabled": False})
               for m in recipe.members}
    return Plan(own, members, config(recipe.members[0], {}))


def check(recipe_plan: Plan) -> None:
    """Raises for run directories that would be refused only after members have trained: the
    members' and the recipe's (one the trainer made, not a training run's)."""
    from trainer import ensemble, run_files

    for config in recipe_plan.members.values():
        run_files.check_claimable(config.train.run_dir)
    run_files.check_claimable(recipe_plan.run_dir)
    ensemble.check_run_dir(str(recipe_plan.run_dir),
                           [c.train.run_dir for c in recipe_plan.members.values()])


def run(recipe_plan: Plan, *, parallel: int = 1, fresh: bool = False,
        print_fn: Printer = print, dist=None) -> dict[str, Any]:
    """Trains (or resumes) the members, `parallel` at a time in subprocesses when above 1, then
    fits, scores and exports their ensemble; prints and returns the ensemble's results with each
    member's validation and test metrics and wall time."""
    import keras

    from trainer import data, ensemble, run_files, train

    run_dir = run_files.claim(recipe_plan.run_dir)
    run_files.real_directory(run_dir / "members")
    print_fn(f"Recipe {recipe_plan.name}: {RECIPES[recipe_plan.name].description}")
    data.resolve(recipe_plan.ensemble.data, print_fn=print_fn)  # converted once, for every member
    if parallel > 1:
        _train_in_processes(recipe_plan, parallel, fresh, print_fn)
    else:
        for name, config in recipe_plan.members.items():
            print_fn(f"\n== member {name} ==")
            keras.backend.clear_session()
            train.train(config, fresh=fresh, print_fn=print_fn, dist=dist)
    member_results = {name: json.loads((Path(c.train.run_dir) / "results.json").read_text())
                      for name, c in recipe_plan.members.items()}
    keras.backend.clear_session()
    print_fn(f"\n== ensemble of {len(member_results)} members ==")
    results = ensemble.run(recipe_plan.ensemble,
                           [c.train.run_dir for c in recipe_plan.members.values()], print_fn)
    results["recipe"] = recipe_plan.name
    results["member_runs"] = {name: {key: r.get(key) for key in
                                     ("run_dir", "epochs_run", "best_epoch", "validation", "test",
                                      "wall_seconds")}
                              for name, r in member_results.items()}
    run_files.write_json(run_dir / "results.json", results)
    print_fn("\n" + summary(results))
    return results


def run_cv(recipe_plan: Plan, *, parallel: int = 1, fresh: bool = False,
           print_fn: Printer = print, dist=None) -> dict[str, Any]:
    """Runs the recipe on each fold of `cv.folds` of the LETOR set in `data.dir`, into
    `cv.out_dir`/FoldN (members under FoldN/members/, no export), and reports the ensembles'
    test metrics per fold with their mean and std as `trainer cv` does (`cv.report`)."""
    from trainer import cv, run_files

    run_files.claim(recipe_plan.ensemble.cv.out_dir)
    member_folds = {name: cv.plan(config) for name, config in recipe_plan.members.items()}
    per_fold = []
    for i, fold_run in enumerate(cv.plan(recipe_plan.ensemble)):
        fold_dir = Path(recipe_plan.ensemble.cv.out_dir) / f"Fold{fold_run.fold}"
        fold_plan = Plan(recipe_plan.name,
                         {name: _in_run_dir(runs[i].config, fold_dir / "members" / name)
                          for name, runs in member_folds.items()},
                         _in_run_dir(fold_run.config, fold_dir))
        print_fn(f"\n==== Fold{fold_run.fold} ====")
        results = run(fold_plan, parallel=parallel, fresh=fresh, print_fn=print_fn, dist=dist)
        per_fold.append({"fold": fold_run.fold, "params": {}, "run_dir": str(fold_dir),
                         "best_epoch": None, "validation": results["validation"],
                         "test": results["test"], "grid": []})
    return cv.report(recipe_plan.ensemble, per_fold, f"recipe {recipe_plan.name}",
                     print_fn=print_fn)


def _in_run_dir(config: Config, run_dir: Path) -> Config:
    return dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                 run_dir=str(run_dir)))


def summary(results: dict[str, Any]) -> str:
    """Returns each member's and the ensemble's validation and test metrics and wall time."""
    rows = [*results["member_runs"].items(), ("ensemble", results)]
    names = [n for n in results["validation"] if n != "loss"]
    lines = [f"Recipe {results['recipe']} in {results['run_dir']}:",
             "| run | split | " + " | ".join(names) + " | seconds |",
             "|---" * (len(names) + 3) + "|"]
    for name, run_results in rows:
        for split in ("validation", "test"):
            scores = run_results.get(split) or {}
            cells = [f"{scores[n]:.4f}" if scores.get(n) is not None else "-" for n in names]
            seconds = (f"{run_results['wall_seconds']:.0f}"
                       if split == "validation" and run_results.get("wall_seconds") else "")
            lines.append(f"| {name} | {split} | " + " | ".join(cells) + f" | {seconds} |")
    if "export_path" in results:
        lines.append(f"Exported {results['export_path']}")
    return "\n".join(lines)


def _train_in_processes(recipe_plan: Plan, parallel: int, fresh: bool, print_fn: Printer) -> None:
    """Trains the members in up to `parallel` `python -m trainer train` processes at once, each
    writing its output to RUN_DIR/members/<member>.log. Ctrl-C or SIGTERM is passed on to each
    running process (which stops at a step, as a run does), then raised here once they have
    ended. Raises ValueError naming the members whose process failed."""
    pending = list(recipe_plan.members.items())
    running: dict[str, tuple[subprocess.Popen, Path]] = {}
    slots: dict[str, int] = {}  # a running member's process slot, 0 .. parallel - 1
    gpus = _visible_gpus()
    failed = []
    with tempfile.TemporaryDirectory(prefix="tfapprox-recipe-") as configs:
        try:
            while pending or running:
                while pending and len(running) < parallel and not failed:
                    name, config = pending.pop(0)
                    slots[name] = min(set(range(parallel)) - {slots[r] for r in running})
                    gpu = gpus[slots[name] % len(gpus)] if gpus else None
                    running[name] = _start(name, config, Path(configs), fresh, recipe_plan.run_dir,
                                           gpu)
                    print_fn(f"member {name}: training in process {running[name][0].pid}, "
                             f"output in {running[name][1]}")
                if failed and not running:
                    break
                time.sleep(0.5)
                for name, (process, log) in list(running.items()):
                    if process.poll() is None:
                        continue
                    del running[name], slots[name]
                    if process.returncode == 0:
                        print_fn(f"member {name}: trained")
                    else:
                        failed.append(f"{name} (exit {process.returncode}: {_last_line(log)}; "
                                      f"see {log})")
        except KeyboardInterrupt as interrupt:
            _stop(running, interrupt)
            raise
    if failed:
        raise ValueError(f"member {'; member '.join(failed)}")


def _visible_gpus() -> list[str]:
    """Returns the CUDA_VISIBLE_DEVICES entry of each GPU this process sees ([] on none)."""
    import tensorflow as tf

    count = len(tf.config.list_physical_devices("GPU"))
    listed = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (listed or [str(i) for i in range(count)])[:count]


def _start(name: str, config: Config, configs: Path, fresh: bool, run_dir: Path,
           gpu: str | None) -> tuple[subprocess.Popen, Path]:
    """Starts `python -m trainer train` for one member, in a session of its own (so that a
    terminal's Ctrl-C reaches it once, passed on by `_stop`), on GPU `gpu` alone if given."""
    config_file = configs / f"{name}.json"
    config_file.write_text(json.dumps(config.to_dict()))
    log = run_dir / "members" / f"{name}.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    command = [sys.executable, "-m", "trainer", "train", "--config", str(config_file)]
    try:
        process = subprocess.Popen(command + ["--fresh"] * fresh, stdout=fd,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True,
                                   env={**os.environ, **({"CUDA_VISIBLE_DEVICES": gpu}
                                                         if gpu is not None else {})})
    finally:
        os.close(fd)
    return process, log


def _stop(running: dict[str, tuple[subprocess.Popen, Path]], interrupt: KeyboardInterrupt) -> None:
    """Passes the interrupt's signal to every running member and waits for them; another
    interrupt meanwhile is passed on too (a second Ctrl-C stops a run at once)."""
    from trainer import interrupts

    def forward(caught: KeyboardInterrupt) -> None:
        signum = signal.SIGTERM if isinstance(caught, interrupts.Terminated) else signal.SIGINT
        for process, _ in running.values():
            if process.poll() is None:
                process.send_signal(signum)

    forward(interrupt)
    while any(process.poll() is None for process, _ in running.values()):
        try:
            time.sleep(0.2)
        except KeyboardInterrupt as again:
            forward(again)


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"
