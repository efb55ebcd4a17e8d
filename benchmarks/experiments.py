"""Reproduces the papers' comparisons on LETOR sets, against LightGBM, with significance.

Data. The shared sets, LETOR 3.0 OHSUMED, LETOR 4.0 MQ2008 and LightGBM's sample of Yahoo! Set 1
YAHOO, and MQ2008_AGG (LETOR 4.0's MQ2008-agg: MQ2008's queries and labels, the ranks 25 search
systems gave each document as features, NULL where a system did not return it, read as missing)
(`--dataset`, read from --data), or
a set of your own (`--data-dir DIR --name NAME`): DIR holds Fold1..FoldN/ with train, vali and test
files (train.txt/vali.txt/test.txt or trainingset/validationset/testset.txt, optionally .gz), or
the five parts S1.txt..S5.txt of the standard folds (Fold k trains on parts k, k+1, k+2, validates
on k+3 and tests on k+4). Files are LETOR/SVMlight text (`label qid:Q 1:v ...`) or LightGBM text
without qid: and a group file beside each (`train.txt.query`, one query size a line). Everything is
read in place; nothing in DIR or --data is run or written.

Protocol. Cross-validation over the folds (default: all of the set's). Every run trains on a fold's
train files, picks its epoch on the fold's validation NDCG@10 (early stopping, patience epochs/4),
and is measured on the fold's test files with tfapprox.metrics, per query. Where a configuration
has a grid (α, β, LightGBM's leaves, DASALC's scorer options), each fold and seed picks the grid
point with the best validation NDCG@10. A figure is the mean over folds of the test metric,
computed for each seed; tables show mean ± std over seeds. A claim "A beats B" carries a paired
t-test over the test queries of all the folds (each query's value averaged over seeds). Queries
without a relevant document are left out of the means (a set that has such queries is also
reported with LETOR's convention, which counts them as 0). Neural runs use the trainer's preset
named like the set (ohsumed, mq2008; MQ2008_AGG: mq2008's) or else the trainer's defaults, with
the study's scorer and loss.

Studies (`--study`, any subset; the report has the sections of those given):
  chen         RankNet vs weighted RankNet, ListMLE vs weighted ListMLE; linear and B64 scorers
               (Chen et al., NIPS 2009, Table 1)
  qin          ApproxAP vs ApproxNDCG vs Approx P@10, α ∈ {10, 50, 100}, β ∈ {10, 50} chosen on
               validation (Qin et al. 2010, Tables 2-3)
  yilmaz       train on AP, P@10, NDCG, NDCG@10 -> test on AP, P@10, NDCG@10 (Yilmaz & Robertson)
  bruch_alpha  ApproxNDCG with α ∈ {1, 5, 10, 20, 50, 100} (Bruch et al., SIGIR 2019)
  bruch_depth  ApproxNDCG α = 10 with B64 ... B1024
  precision    B64 ApproxNDCG α = 10 trained in float32 and with --mixed-precision (bfloat16)
  lightgbm     LightGBM lambdarank, lr 0.05, leaves ∈ {15, 31, 63}, early stopping on vali NDCG@10
  gbdt         the references a neural ranker must beat, one thread each, early stopping on vali
               NDCG@10, grid chosen per fold on it: LightGBM lambdarank lr ∈ {0.05, 0.1} ×
               leaves ∈ {15, 31, 63}; XGBoost rank:ndcg eta ∈ {0.05, 0.1} × max_depth ∈ {4, 6, 8};
               CatBoost YetiRank lr 0.05, depth ∈ {4, 6, 8}. The reference is the best of the three
               on validation, per set
  dasalc       DASALC (Qin et al., ICLR 2021; --preset dasalc) with ApproxNDCG, ApproxAP and
               softmax_loss, its own loss
  dasalc_search  DASALC with the pairwise soft zero-one loss and one change each (run on YAHOO,
               where the gap to the GBDTs is widest): dropout 0.1 or 0.3, Adagrad's learning
               rate 0.2, yeti_logistic_loss or sigmoid_cross_entropy_loss instead
  dasalc_quantile  DASALC with the pairwise soft zero-one loss and the quantile input transform
               (each feature through its training quantiles to N(0, 1)) instead of log1p
  dasalc_quantile_search  that with Adagrad's learning rate 0.02 (not 0.05), or noise σ 3.0
               (not 1.5), run on YAHOO and MQ2008
  losses_quantile  B64 with the quantile input transform and each of the losses study's three
               best losses by validation over the three sets (unique_softmax_loss, RankNet,
               weighted RankNet)
  list_standardized  the trainer's recipes' three members (trainer/recipes.py) with each
               feature, after the quantile transform, also standardised within its list
  dasalc_ensemble  DASALC-ens (Qin et al., ICLR 2021): DASALC with the pairwise soft zero-one
               loss trained with 3 seeds, the mean of their scores standardised within each list;
               ensemble seed s is made of the single runs of seeds 3s, 3s+1, 3s+2 (ensemble
               seed 0: the dasalc study's seeds 0-2; so --seeds 0 reuses those, the default
               seeds train 3-8), trained and cached as dasalc's runs where missing, restored
               from their checkpoints in --work where there; and the same with quantile inputs
               (ensemble seed 0: dasalc_quantile's seeds 0-2)
  mixed_ensemble  ensembles of different settings (experiment_studies.ENSEMBLES), one for every
               set: the mean of their members' scores standardised within each list; ensemble
               seed s combines each member's run of seed s (of seeds 3s-3s+2 for a member of 3
               seeds), restored from its checkpoint in --work, trained there where missing.
               A recipe's members are the best three by validation of the studies it names;
               mixed_quantile_list_standardized is the trainer's recommended recipe
  recommended  the trainer's recommended recipe and its members: what a new set needs (with
               gbdt, the tuned GBDTs) for the summary
  dasalc_ablation  DASALC with ApproxNDCG without the log1p transform, without the input noise,
               without the self-attention, and the B256 tower with none of them
  dasalc_tuned DASALC with ApproxNDCG under the GBDTs' protocol, chosen per fold on validation
               NDCG@10: input_transform ∈ {log1p, none} × noise σ ∈ {1.5, 4.5}, and
               input_transform ∈ {log1p, none} × Adagrad's learning rate ∈ {0.05, 0.2}
  direct       the other direct-optimisation methods: LambdaRank, SoftRank, SVM^map, PermuRank (B64)
               and AdaRank.NDCG / AdaRank.MAP (linear, boosted single features)
  losses       every loss of tfapprox.losses (TF-Ranking's under TF-Ranking's keys) with its
               defaults on B64, against ApproxNDCG α = 10 and the GBDT reference

Every finished run is cached as a JSON file under --cache (default benchmarks/results/ for the
shared sets; runs/reports/NAME/cache/ for yours): a rerun skips it, so a killed run resumes where it
stopped; a cache file that holds no complete result counts as not run. `pack` moves a cache's files
into one xz-compressed JSON-lines file per set (CACHE/NAME.jsonl.xz; the shared sets' cache is
committed so), read like the files; `unpack` turns them back into files. A run whose training
diverges (a non-finite validation measure) is named on its line and left uncached, the others go
on, and `run` exits with status 1. `run` checks that --cache and --work take files before any run,
and stops at data the trainer would refuse (a malformed line, group sizes that do not fit) with
the trainer's one-line error. Runs on your sets are keyed by
the fingerprint of their fold's files (names, sizes, modification times) too: another DIR under the
same NAME, or DIR edited in place, never reads them. `report` rebuilds
results.md and its plots (docs/ for the shared sets, runs/reports/NAME/ for yours) from the cache
alone, saying which runs are missing.

  python -m benchmarks.experiments run --study chen lightgbm --dataset OHSUMED
  python -m benchmarks.experiments report
  python -m benchmarks.experiments pack            # before committing new runs of the shared sets
  python -m benchmarks.experiments run --data-dir ~/letor/mine --name mine --study qin lightgbm
  python -m benchmarks.experiments report --data-dir ~/letor/mine --name mine --study qin lightgbm
  python -m benchmarks.experiments run --study gbdt recommended --dataset MQ2008_AGG
  python -m benchmarks.experiments run --smoke     # a check: Fold1, seed 0, 1 epoch, temp dirs, report

Budget: a B64 run on an OHSUMED fold takes 10-30 s on one core of the 2-core CI machine, a LightGBM
run about 1 s; the whole set (both sets, 5 folds, 3 seeds) is about 1,100 neural runs, 5-8 CPU-hours.
Needs the `experiments` extra (LightGBM, XGBoost, CatBoost, matplotlib, scipy).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from benchmarks.experiment_runs import GBDTS, DataSet, data_key, execute
from benchmarks.experiment_studies import NEURAL_EPOCHS, runs_of, studies
from benchmarks.results_cache import pack, read_cached, unpack, write_cached
from trainer.run_lock import RunDirInUse

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("OHSUMED", "MQ2008", "YAHOO", "MQ2008_AGG")
SHARED_FOLDS = (1, 2, 3, 4, 5)


def run_all(settings, fold_files, folds, seeds, epochs, cache: Path, scratch: Path,
            data_keys) -> int:
    """Executes every missing run, caching each as soon as it finishes; returns how many diverged.

    A run that another process cached after the plan was made (two processes sharing a cache,
    say with disjoint `--loss` lists that overlap at the end) is skipped, not run again, and
    so is one that another process is running now (its run directory's lock held).
    A run whose training diverges (the trainer's FloatingPointError: a non-finite validation
    measure) is reported on its line, left uncached (the report shows it as not run) and the
    study goes on: one setting's divergence does not cost the rest of a long queue.
    An ensemble's members (`Run.member_runs`) are planned before it as runs of their own, so
    each is trained and cached as a single run, and the ensemble restores their checkpoints.
    `fold_files`: {set name: {fold: {split: files}}}; `data_keys`: as from `_data_keys`.
    """
    planned = list(dict.fromkeys(member for name in fold_files for setting in settings
                                 for run in runs_of(setting, name, folds, seeds, epochs,
                                                    data_keys.get(name))
                                 for member in (*run.member_runs(), run)))
    missing = [run for run in planned if read_cached(cache, run, print) is None]
    print(f"{len(planned)} runs planned, {len(planned) - len(missing)} cached, "
          f"{len(missing)} to run", flush=True)
    diverged = 0
    for i, run in enumerate(missing, 1):
        where = f"[{i}/{len(missing)}] {run.dataset} Fold{run.fold} seed{run.seed} {run.label()}"
        if read_cached(cache, run, lambda _: None) is not None:
            print(f"{where}: cached meanwhile by another process", flush=True)
            continue
        try:
            result = execute(run, fold_files[run.dataset][run.fold], scratch)
        except FloatingPointError as err:
            diverged += 1
            print(f"{where}: diverged, not cached: {err}", flush=True)
            continue
        except RunDirInUse:
            print(f"{where}: being run by another process, skipped", flush=True)
            continue
        write_cached(cache, run, result)
        print(f"{where}: {result['wall_seconds']} s", flush=True)
    if diverged:
        print(f"{diverged} of {len(missing)} runs diverged (listed above); the report shows them "
              "as not run", file=sys.stderr, flush=True)
    return diverged


def _counting_from(minimum: int):
    """Returns an argparse type: an integer of at least `minimum`."""
    def convert(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    convert.__name__ = "integer"  # argparse names it in "invalid integer value"
    return convert


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.experiments", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "report", "pack", "unpack"))
    parser.add_argument("--study", nargs="+", choices=sorted(studies()), default=sorted(studies()))
    parser.add_argument("--dataset", nargs="+", choices=DATASETS,
                        help="shared sets (default: all four, unless --data-dir)")
    parser.add_argument("--data-dir", type=Path, metavar="DIR",
                        help="a set of your own: Fold1..FoldN/ with train/vali/test files, or "
                             "S1.txt..S5.txt")
    parser.add_argument("--name", help="your set's name in the cache and the report (default: "
                                       "DIR's name)")
    parser.add_argument("--loss", nargs="+",
                        help="run only the studies' settings with these losses (or measures)")
    parser.add_argument("--folds", type=_counting_from(1), nargs="+", metavar="FOLD",
                        help="default: every fold of the set")
    parser.add_argument("--seeds", type=_counting_from(0), nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=_counting_from(1), default=NEURAL_EPOCHS)
    parser.add_argument("--cache", type=Path,
                        help="the cached runs (default: benchmarks/results/; with --data-dir, "
                             "runs/reports/NAME/cache/; with --smoke, the temporary directory)")
    parser.add_argument("--out", type=Path,
                        help="where results.md and results/*.png go (default: docs/; with "
                             "--data-dir, runs/reports/NAME/; with --smoke, the temporary "
                             "directory)")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                        help="where the shared sets are: DIR/OHSUMED/, DIR/MQ2008/, DIR/YAHOO/ and "
                             "DIR/MQ2008_AGG/, each "
                             "S1.txt..S5.txt or Fold1..Fold5/ (read in place; nothing is run)")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "experiments",
                        help="converted records and checkpoints (not kept)")
    parser.add_argument("--smoke", action="store_true",
                        help="the first fold, seed 0, 1 epoch, each grid cut to its first point, "
                             "sweeps to two points, Chen et al.'s study to the B64 scorer, "
                             "the direct methods to SoftRank, SVM^map and AdaRank.NDCG, "
                             "DASALC to ApproxNDCG, one ablation and an ensemble of 2, "
                             "the ensemble of different settings to two B64 losses, "
                             "on OHSUMED (or --data-dir), with cache and work in a temporary "
                             "directory that is removed at the end; then the report")
    return parser


def _data_sets(parser, args) -> list[DataSet]:
    if args.data_dir is None:
        if args.name is not None:
            parser.error("--name names a --data-dir set")
        names = args.dataset or (["OHSUMED"] if args.smoke else list(DATASETS))
        return [DataSet(name, args.data / name, shared=True) for name in names]
    if args.dataset:
        parser.error("--dataset and --data-dir exclude each other: run them separately")
    name = args.data_dir.resolve().name if args.name is None else args.name
    if not re.fullmatch(r"\w[\w.@+-]{0,99}", name):
        parser.error(f"--name {name!r}: use 1 to 100 letters, digits and _.@+- (it names a "
                     "folder)")
    return [DataSet(name, args.data_dir)]


def _fold_files(parser, args, data_sets) -> dict[str, dict[int, dict[str, list[str]]]]:
    """Returns {set name: {fold: {split: files}}}; only `run` reads the shared sets' data (their
    folds are the five): the other commands need only the cache."""
    found = {}
    for data_set in data_sets:
        if data_set.shared and args.command != "run":
            found[data_set.name] = dict.fromkeys(SHARED_FOLDS)
            continue
        try:
            found[data_set.name] = data_set.folds()
        except (OSError, ValueError) as err:
            parser.error(f"{'--data' if data_set.shared else '--data-dir'}: {err}")
    return found


def _data_keys(data_sets, fold_files) -> dict[str, dict[int, str]]:
    """Returns {set name: {fold: `data_key` of its files}} for the user's sets; a shared set's runs
    are keyed by its name alone (its files are the published ones, and its cache is committed)."""
    return {s.name: {fold: data_key(files) for fold, files in fold_files[s.name].items()}
            for s in data_sets if not s.shared}


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    data_sets = _data_sets(parser, args)
    fold_files = _fold_files(parser, args, data_sets)
    common = sorted(set.intersection(*(set(folds) for folds in fold_files.values())))
    for fold in args.folds or []:
        if fold not in common:
            parser.error(f"--folds {fold}: {', '.join(str(s.directory) for s in data_sets)} "
                         f"has folds {', '.join(map(str, common))}")
    args.folds = args.folds or common
    own = REPO / "runs" / "reports" / data_sets[0].name
    if not args.smoke:
        args.cache = args.cache or (own / "cache" if args.data_dir else
                                    REPO / "benchmarks" / "results")
        args.out = args.out or (own if args.data_dir else REPO / "docs")
        if args.command == "run":
            for flag, directory in (("--cache", args.cache), ("--work", args.work)):
                _check_writable(parser, flag, directory)
        return _execute(args, data_sets, fold_files, _data_keys(data_sets, fold_files))
    with tempfile.TemporaryDirectory(prefix="tfapprox-experiments-") as temp:
        args.folds, args.seeds, args.epochs = args.folds[:1], [0], 1
        args.cache, args.work = Path(temp) / "cache", Path(temp) / "work"
        args.out = args.out or Path(temp) / "docs"
        return _execute(args, data_sets, fold_files, _data_keys(data_sets, fold_files))


def _check_writable(parser, flag: str, directory: Path) -> None:
    """Exits with a one-line error unless `directory` exists or can be made, and takes files."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        parser.exit(2, f"{parser.prog}: error: {flag} {directory}: cannot write there "
                       f"({err.strerror or err})\n")


def _execute(args, data_sets, fold_files, data_keys) -> int:
    if args.command in ("pack", "unpack"):
        try:
            done = (pack if args.command == "pack" else unpack)(args.cache, print)
        except OSError as err:  # a cache it cannot write, a full disk
            print(f"python -m benchmarks.experiments {args.command}: error: {err}", file=sys.stderr)
            return 1
        print(f"{args.command}ed {done} runs in {args.cache}")
        return 0
    chosen = studies(smoke=args.smoke)
    if args.command == "run":
        settings = list(dict.fromkeys(s for name in args.study for s in chosen[name]
                                      if args.loss is None or s.loss in args.loss))
        try:
            diverged = run_all(settings, fold_files, args.folds, args.seeds, args.epochs,
                               args.cache, args.work, data_keys)
        except (OSError, ValueError) as err:  # as the trainer: bad data, unwritable files
            print(f"python -m benchmarks.experiments run: error: {err}", file=sys.stderr)
            return 1
        if diverged:
            return 1
        if not args.smoke:
            return 0
    from benchmarks import experiment_report

    written = experiment_report.write(chosen, args.study, args.cache, args.out, data_sets,
                                      args.folds, args.seeds, args.epochs, data_keys=data_keys)
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
