"""Reproduces the papers' comparisons on the shared LETOR sets, against LightGBM, with significance.

Protocol. Five-fold cross-validation on LETOR 3.0 OHSUMED and LETOR 4.0 MQ2008 (../shared/data,
folds written by its make_folds.sh). Every run trains on a fold's train file, picks its epoch on the
fold's validation NDCG@10 (early stopping, patience epochs/4), and is measured on the fold's test
file with tfapprox.metrics, per query. Where a configuration has a grid (α, β, LightGBM's leaves),
each fold and seed picks the grid point with the best validation NDCG@10. A figure is the mean over
folds of the test metric, computed for each seed; tables show mean ± std over seeds. A claim "A beats
B" carries a paired t-test over the test queries of all five folds (each query's value averaged over
seeds). Queries without a relevant document are left out of the means (MQ2008 is also reported with
LETOR's convention, which counts them as 0).

Studies (`--study`, any subset):
  chen         RankNet vs weighted RankNet, ListMLE vs weighted ListMLE; linear and B64 scorers
               (Chen et al., NIPS 2009, Table 1)
  qin          ApproxAP vs ApproxNDCG vs Approx P@10, α ∈ {10, 50, 100}, β ∈ {10, 50} chosen on
               validation (Qin et al. 2010, Tables 2-3)
  yilmaz       train on AP, P@10, NDCG, NDCG@10 -> test on AP, P@10, NDCG@10 (Yilmaz & Robertson)
  bruch_alpha  ApproxNDCG with α ∈ {1, 5, 10, 20, 50, 100} (Bruch et al., SIGIR 2019)
  bruch_depth  ApproxNDCG α = 10 with B64 ... B1024
  precision    B64 ApproxNDCG α = 10 trained in float32 and with --mixed-precision (bfloat16)
  lightgbm     LightGBM lambdarank, lr 0.05, leaves ∈ {15, 31, 63}, early stopping on vali NDCG@10
  direct       the other direct-optimisation methods: LambdaRank, SoftRank, SVM^map, PermuRank (B64)
               and AdaRank.NDCG / AdaRank.MAP (linear, boosted single features)

Every finished run is cached as JSON under --cache (default benchmarks/results/, committed): a
rerun skips it, so a killed run resumes where it stopped. `report` rebuilds docs/results.md and its
plots from the cache alone, saying which runs are missing.

  python -m benchmarks.experiments run --study chen lightgbm --dataset OHSUMED
  python -m benchmarks.experiments report
  python -m benchmarks.experiments run --smoke     # CI: Fold1, seed 0, 1 epoch, temp dirs, report

Budget: a B64 run on an OHSUMED fold takes 10-30 s on one core of the 2-core CI machine, a LightGBM
run about 1 s; the whole set (both sets, 5 folds, 3 seeds) is about 1,100 neural runs, 5-8 CPU-hours.
Needs the `experiments` extra (LightGBM, matplotlib, scipy).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("OHSUMED", "MQ2008")
FOLDS = (1, 2, 3, 4, 5)


@dataclasses.dataclass(frozen=True)
class Setting:
    """A configuration of a study: a model, a loss, fixed parameters, and a grid chosen on vali."""

    model: str
    loss: str
    params: tuple = ()
    grid: tuple = ()  # ((name, (values...)), ...)
    precision: str = "float32"  # or "mixed_bfloat16"

    def label(self) -> str:
        fixed = ", ".join(f"{k}={v}" for k, v in self.params)
        grid = ", ".join(f"{k}∈{{{', '.join(map(str, v))}}}" for k, v in self.grid)
        mixed = "" if self.precision == "float32" else f" {self.precision}"
        return f"{self.model} {self.loss}({', '.join(x for x in (fixed, grid) if x)}){mixed}"

    def first_point_only(self) -> "Setting":
        """The setting with each grid axis cut to its first value (for the smoke run)."""
        return dataclasses.replace(self, grid=tuple((k, v[:1]) for k, v in self.grid))

    def points(self) -> list[tuple]:
        """Returns every grid point's full parameter tuple (sorted by name)."""
        names = [k for k, _ in self.grid]
        combos = itertools.product(*(values for _, values in self.grid))
        return [tuple(sorted(self.params + tuple(zip(names, combo)))) for combo in combos]


ALPHA_BETA = (("alpha", (10.0, 50.0, 100.0)), ("beta", (10.0, 50.0)))
BRUCH_ALPHAS = (1.0, 5.0, 10.0, 20.0, 50.0, 100.0)
BRUCH_PRESETS = ("B64", "B128", "B256", "B512", "B1024")
YILMAZ_MEASURES = ("AP", "P@10", "NDCG", "NDCG@10")  # what each row of Yilmaz's table trains on


def studies(first_points_only: bool = False) -> dict[str, list[Setting]]:
    """Returns the settings of every study; `yilmaz` is in the order of `YILMAZ_MEASURES`.

    `first_points_only` cuts every grid to its first value per axis (the smoke run).
    """
    qin = [Setting("B64", "approx_ap", grid=ALPHA_BETA),
           Setting("B64", "approx_ndcg", grid=ALPHA_BETA[:1]),
           Setting("B64", "approx_precision", (("k", 10),), ALPHA_BETA)]
    found = {
        "chen": [Setting(scorer, loss) for scorer in ("linear", "B64")
                 for loss in ("ranknet", "weighted_ranknet", "listmle", "weighted_listmle")],
        "qin": qin,
        "yilmaz": [qin[0], qin[2], qin[1],
                   Setting("B64", "approx_ndcg", (("topk", 10),), ALPHA_BETA)],
        "bruch_alpha": [Setting("B64", "approx_ndcg", (("alpha", a),)) for a in BRUCH_ALPHAS],
        "bruch_depth": [Setting(p, "approx_ndcg", (("alpha", 10.0),)) for p in BRUCH_PRESETS],
        "precision": [Setting("B64", "approx_ndcg", (("alpha", 10.0),), precision=precision)
                      for precision in ("float32", "mixed_bfloat16")],
        "lightgbm": [Setting("lightgbm", "lambdarank", grid=(("num_leaves", (15, 31, 63)),))],
        "direct": [Setting("B64", loss) for loss in ("lambdarank", "softrank", "svm_map",
                                                     "permurank")]
                  + [Setting("adarank", measure) for measure in ("ndcg", "map")],
    }
    if first_points_only:
        found = {name: [s.first_point_only() for s in settings]
                 for name, settings in found.items()}
    return found


NEURAL_EPOCHS, LIGHTGBM_ROUNDS = 40, 1000


def runs_of(setting: Setting, dataset: str, folds, seeds, epochs: int):
    """Returns every `Run` a setting needs (each grid point, fold and seed)."""
    from benchmarks.experiment_runs import Run

    rounds = LIGHTGBM_ROUNDS if setting.model == "lightgbm" else epochs
    return [Run(dataset, fold, seed, setting.model, setting.loss, point, rounds,
                setting.precision)
            for fold in folds for seed in seeds for point in setting.points()]


def run_all(settings, datasets, folds, seeds, epochs, cache: Path, folds_root: Path,
            scratch: Path) -> None:
    """Executes every missing run, caching each as soon as it finishes."""
    from benchmarks.experiment_runs import execute, read_cached

    planned = list(dict.fromkeys(run for dataset in datasets for setting in settings
                                 for run in runs_of(setting, dataset, folds, seeds, epochs)))
    missing = [run for run in planned if read_cached(run.cache_path(cache), print) is None]
    print(f"{len(planned)} runs planned, {len(planned) - len(missing)} cached, "
          f"{len(missing)} to run", flush=True)
    for i, run in enumerate(missing, 1):
        result = execute(run, folds_root, scratch)
        path = run.cache_path(cache)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(result, separators=(",", ":")) + "\n")
        os.replace(partial, path)  # a killed run leaves no half-written result
        print(f"[{i}/{len(missing)}] {run.dataset} Fold{run.fold} seed{run.seed} {run.label()}: "
              f"{result['wall_seconds']} s", flush=True)


def write_folds(data: Path, root: Path, datasets) -> Path:
    """Writes the five-fold layout of each dataset under `root` with `data`/make_folds.sh."""
    for dataset in datasets:
        if not (root / dataset / "Fold5" / "test.txt").exists():
            subprocess.run([str(data / "make_folds.sh"), dataset, str(root / dataset)],
                           check=True, stdout=subprocess.DEVNULL)
    return root


def _counting_from(minimum: int):
    """Returns an argparse type: an integer of at least `minimum`."""
    def convert(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    convert.__name__ = "integer"  # argparse names it in "invalid integer value"
    return convert


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.experiments", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "report"))
    parser.add_argument("--study", nargs="+", choices=sorted(studies()), default=sorted(studies()))
    parser.add_argument("--dataset", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--loss", nargs="+",
                        help="run only the studies' settings with these losses (or measures)")
    parser.add_argument("--folds", type=int, nargs="+", choices=FOLDS, default=list(FOLDS),
                        metavar="FOLD", help="folds 1 to 5 (default: all)")
    parser.add_argument("--seeds", type=_counting_from(0), nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=_counting_from(1), default=NEURAL_EPOCHS)
    parser.add_argument("--cache", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--out", type=Path,
                        help="where results.md and results/*.png go (default: docs/; with "
                             "--smoke, the temporary directory)")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                        help="the shared LETOR data (MQ2008/, OHSUMED/, make_folds.sh)")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "experiments",
                        help="fold files, converted records and checkpoints (not kept)")
    parser.add_argument("--smoke", action="store_true",
                        help="Fold1, seed 0, 1 epoch, each grid cut to its first point, on "
                             "OHSUMED, with cache and work in a temporary directory that is "
                             "removed at the end; then the report")
    args = parser.parse_args(argv)
    if args.command == "run" and not (args.data / "make_folds.sh").is_file():
        parser.error(f"--data {args.data}: no make_folds.sh there")
    if not args.smoke:
        args.out = args.out or REPO / "docs"
        return _execute(args)
    with tempfile.TemporaryDirectory(prefix="tfapprox-experiments-") as temp:
        args.folds, args.seeds, args.epochs, args.dataset = [1], [0], 1, ["OHSUMED"]
        args.cache, args.work = Path(temp) / "cache", Path(temp) / "work"
        args.out = args.out or Path(temp) / "docs"
        return _execute(args)


def _execute(args) -> int:
    chosen = studies(first_points_only=args.smoke)
    if args.command == "run":
        settings = list(dict.fromkeys(s for name in args.study for s in chosen[name]
                                      if args.loss is None or s.loss in args.loss))
        folds_root = write_folds(args.data, args.work / "folds", args.dataset)
        run_all(settings, args.dataset, args.folds, args.seeds, args.epochs, args.cache,
                folds_root, args.work)
        if not args.smoke:
            return 0
    from benchmarks import experiment_report

    written = experiment_report.write(chosen, args.cache, args.out, args.dataset, args.folds,
                                      args.seeds, args.epochs)
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
