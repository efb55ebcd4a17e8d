"""`python -m trainer [train|evaluate|export|cv|ensemble] [options]`: the trainer's command line.

With no arguments it trains the `demo` configuration on generated data, prints validation and test
metrics and exports `saved_models/tfapprox_demo/<version>/`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from trainer import config as config_lib

COMMANDS = ("train", "evaluate", "export", "cv", "ensemble")

# flag destination -> dotted config key
_FLAG_KEYS = {
    "data_dir": "data.dir",
    "train_files": "data.train",
    "vali_files": "data.vali",
    "test_files": "data.test",
    "num_features": "data.num_features",
    "feature_spec": "data.feature_spec",
    "list_size": "data.list_size",
    "buckets": "data.buckets",
    "bucket_sizes": "data.bucket_sizes",
    "model": "model.kind",
    "adarank_measure": "model.adarank_measure",
    "adarank_rounds": "model.adarank_rounds",
    "preset": "model.preset",
    "dropout": "model.dropout",
    "bn_momentum": "model.batch_norm_momentum",
    "input_transform": "model.input_transform",
    "list_standardize": "model.list_standardize",
    "noise_stddev": "model.noise_stddev",
    "attention_layers": "model.attention_layers",
    "loss": "loss.name",
    "optimizer": "optimizer.name",
    "learning_rate": "optimizer.learning_rate",
    "batch_size": "train.batch_size",
    "max_pairs": "train.max_pairs",
    "epochs": "train.epochs",
    "seed": "train.seed",
    "select_metric": "train.select_metric",
    "patience": "train.patience",
    "metrics": "train.metrics",
    "run_dir": "train.run_dir",
    "export_dir": "export.base_dir",
    "name": "export.name",
    "version": "export.version",
    "max_documents": "export.max_documents",
    "backend": "runtime.backend",
    "strategy": "runtime.strategy",
    "mixed_precision": "runtime.mixed_precision",
    "jit": "runtime.jit",
    "folds": "cv.folds",
    "out": "cv.out_dir",
}


def _list_size(text: str) -> int | None:
    """Returns a positive integer, or None for `full` (whole lists)."""
    if text.lower() == "full":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'full', got {text!r}")
    return int(text)


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _int_list(text: str) -> list[int]:
    return [int(item) for item in _comma_list(text)]


class _Parser(argparse.ArgumentParser):
    """Reports a command-line error in one line, pointing at --help, not under the whole usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Once(argparse.Action):
    """Stores a flag's value, refusing a second occurrence instead of silently keeping the last."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault("_given", set())
        if self.dest in given:
            previous = getattr(namespace, self.dest)
            raise argparse.ArgumentError(
                self, f"given twice ({previous!r}, then {values!r}); give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.register("action", None, _Once)  # a flag without an action= takes one value, once
    common.add_argument("--config", help="a YAML/JSON config file or a preset name "
                        f"({', '.join(config_lib.PRESETS)}; default demo)")
    common.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML and exit")
    common.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's start-up and C++ log messages (hidden by default)")

    g = common.add_argument_group("data")
    g.add_argument("--data-dir", help="LETOR fold directory (train.txt, vali.txt, test.txt); for cv a "
                   "set directory with S1..S5.txt or Fold1..Fold5/")
    g.add_argument("--train", dest="train_files", nargs="+", action="extend", metavar="PATH",
                   help="training files or globs: LETOR text (*.txt) or ELWC TFRecords (repeatable); "
                   "--train, --vali and --test each replace the --data-dir file of their split")
    g.add_argument("--vali", dest="vali_files", nargs="+", action="extend", metavar="PATH")
    g.add_argument("--test", dest="test_files", nargs="+", action="extend", metavar="PATH")
    g.add_argument("--feature-spec", metavar="FILE",
                   help="a feature spec (python -m tfapprox.data spec): --train, --vali and "
                   "--test are then TFRecords of ELWC or SequenceExample lists with named "
                   "features, read by it (docs/trainer.md, \"Named features\")")
    g.add_argument("--num-features", type=int, help="feature count (needed for TFRecords, and for "
                   "sparse text whose splits' highest feature indices differ)")
    g.add_argument("--list-size", type=_list_size,
                   help="training list size (lists cut/padded to it); 'full' keeps whole lists")
    g.add_argument("--buckets", type=int,
                   help="whole training lists: group by length and pad each batch to one of at "
                   "most this many sizes chosen from the lists' lengths, so --jit compiles at "
                   "most this many + 1 shapes (default 8; 0 pads each batch to its longest list)")
    g.add_argument("--bucket-sizes", type=_int_list, metavar="N,N,...",
                   help="whole training lists: the pad sizes themselves, e.g. 16,32,64,128")

    g = common.add_argument_group("model and loss")
    g.add_argument("--model", choices=config_lib.MODEL_KINDS,
                   help="dnn (default): a scorer trained on --loss; adarank: AdaRank (Xu & Li "
                   "2007), boosting single features on --adarank-measure, a linear scorer")
    g.add_argument("--adarank-measure", help="AdaRank's measure E: map (AdaRank.MAP), ndcg "
                   "(AdaRank.NDCG, whole list), ndcg@k, p@k, mrr (default ndcg)")
    g.add_argument("--adarank-rounds", type=int,
                   help="AdaRank's rounds at most (default 100); the best on validation is kept")
    g.add_argument("--preset", help="scorer preset: linear, B64, B128, B256, B512, B1024, or "
                   "dasalc (Qin et al. 2021: log1p inputs, input noise, self-attention over the "
                   "list; tfapprox.models.RECIPES)")
    g.add_argument("--dropout", type=float)
    g.add_argument("--bn-momentum", type=float, help="batch-norm momentum")
    g.add_argument("--input-transform", choices=("none", "log1p", "quantile"),
                   help="applied to the features before the input batch norm: log1p is "
                   "sign(x)·ln(1+|x|), quantile maps each feature through its training quantiles "
                   "to N(0, 1) (default: the preset's)")
    g.add_argument("--list-standardize", action="store_true", default=None,
                   help="append each (transformed) feature standardised within its list, "
                   "(x − list mean) / list std over the list's documents (default: the preset's, "
                   "off)")
    g.add_argument("--noise-stddev", type=float,
                   help="σ of Gaussian noise on the inputs in training, 0 for none (default: "
                   "the preset's)")
    g.add_argument("--attention-layers", type=int,
                   help="self-attention blocks over the list, 0 for none (default: the preset's)")
    g.add_argument("--loss", help="a tfapprox.losses name (approx_ndcg, approx_ap, ranknet, "
                   "listmle, lambdarank, softrank, svm_map, ...) or a TF-Ranking RankingLossKey "
                   "(softmax_loss, pairwise_hinge_loss, gumbel_approx_ndcg_loss, ...); "
                   "docs/losses.md lists them (a different loss than the config's drops the "
                   "config's loss parameters)")
    g.add_argument("--loss-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a loss parameter, e.g. alpha=10 (repeatable)")

    g = common.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=config_lib.OPTIMIZERS)
    g.add_argument("--learning-rate", "--lr", type=float)
    g.add_argument("--batch-size", type=int, help="lists per step, across all replicas")
    g.add_argument("--max-pairs", type=int,
                   help="models whose documents attend to each other (dasalc): most document "
                   "pairs, lists × list length², one training batch and one serving request may "
                   "hold (default: tfapprox.models.MAX_ATTENTION_PAIRS)")
    g.add_argument("--epochs", type=int)
    g.add_argument("--seed", type=int)
    g.add_argument("--select-metric", help="validation metric for model selection and early "
                   "stopping: a --metrics name that is better when larger (default ndcg@5)")
    g.add_argument("--patience", type=int, help="epochs without improvement before stopping; 0 never")
    g.add_argument("--metrics", type=_comma_list, action="extend",
                   help="reported metrics, comma-separated (repeatable): tfapprox.metrics.get "
                   "names, TF-Ranking's keys among them, with an optional @k cut-off, e.g. "
                   "ndcg@10,ordered_pair_accuracy,err,recall@10,arp")

    g = common.add_argument_group("run")
    g.add_argument("--run-dir", help="checkpoint, TensorBoard logs and results (default runs/demo); "
                   "a new or empty directory, or one the trainer made")
    g.add_argument("--fresh", action="store_true",
                   help="discard the run directory's checkpoint, results and logs instead of "
                   "resuming (other files in it are kept)")
    g.add_argument("--backend", choices=config_lib.BACKENDS,
                   help="the Keras backend (default $KERAS_BACKEND, else tensorflow); data come "
                   "through tf.data on both, and export runs on tensorflow")
    g.add_argument("--strategy", choices=config_lib.STRATEGIES,
                   help="tf.distribute strategy; multi_worker reads TF_CONFIG")
    g.add_argument("--mixed-precision", action="store_true", default=None,
                   help="mixed float16 (GPU) / bfloat16 (CPU) compute")
    g.add_argument("--jit", action="store_true", default=None,
                   help="XLA-compile the train step, once per batch shape (whole lists: one per "
                   "--buckets size, plus one). On a 2-core CPU it sped up B64 and B256 steps "
                   "1.2-1.9x and slowed B1024's (wide dense layers), and the first epoch pays "
                   "the compiles: measure before choosing it (docs/benchmarks.md)")

    g = common.add_argument_group("export")
    g.add_argument("--export-dir", help="SavedModel base directory (default saved_models)")
    g.add_argument("--name", help="model name under the export directory")
    g.add_argument("--version", type=int, help="version directory (default: next free)")
    g.add_argument("--max-documents", type=int,
                   help="most documents one serving request may hold, counting the padding of "
                        "every list to the longest (default: tfapprox.export.MAX_DOCUMENTS)")
    g.add_argument("--no-export", dest="export_enabled", action="store_false", default=None,
                   help="train without exporting")

    parser = _Parser(
        prog="python -m trainer",
        description="Train, evaluate, export and cross-validate tfapprox rankers. Options override "
        "the config; with no command, `train` runs.",
    )
    sub = parser.add_subparsers(dest="command")
    train = sub.add_parser("train", parents=[common],
                           help="train (or resume) a run, then evaluate and export")
    _add_recipe_flags(train)
    sub.add_parser("evaluate", parents=[common],
                   help="score a run's best weights on its validation/test data (or --vali/--test)")
    sub.add_parser("export", parents=[common], help="export a run's best weights as a SavedModel")
    cv = sub.add_parser("cv", parents=[common],
                        help="train Fold1..Fold5 of a LETOR set, optionally over a grid")
    cv.register("action", None, _Once)
    cv.add_argument("--folds", type=_int_list, action="extend",
                    help="folds to run, e.g. 1,2,3 (default all five; repeatable)")
    cv.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                    help="a grid axis over a config key, e.g. loss.params.alpha=1,10,100 (repeatable)")
    cv.add_argument("--out", help="directory for fold runs and cv_results.{json,md}")
    _add_recipe_flags(cv)
    sub.add_parser("ensemble", parents=[_ensemble_parser()],
                   help="combine trained runs into one model (the mean of their scores, each "
                   "standardised on validation), evaluate it and export it")
    return parser


def _add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    from trainer import recipes

    g = parser.add_argument_group("recipe")
    g.add_argument("--recipe", choices=recipes.names(), action=_Once,
                   help="train each member of a recipe (trainer/recipes.py) as a run of its own "
                   "in RUN_DIR/members/, then their ensemble, fitted on validation, into RUN_DIR "
                   f"(default runs/NAME) and one export; recommended is {recipes.RECOMMENDED}. "
                   "Flags other than the members' own settings (preset, loss, scorer options) "
                   "apply to every member, e.g. --epochs")
    g.add_argument("--members-in-parallel", type=int, default=1, action=_Once, metavar="N",
                   help="with --recipe: train members in N processes at once (one per core or "
                   "GPU; default 1, in this process)")


def _ensemble_parser() -> argparse.ArgumentParser:
    """The flags of `ensemble`: its members, the data it is fitted and scored on, its own run
    directory and export. The members' settings come from their runs."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.register("action", None, _Once)
    parser.set_defaults(config=None, print_config=False, loss_param=[])
    parser.add_argument("--members", nargs="+", required=True, metavar="RUN_DIR",
                        help="run directories of `train` (at least one); the first one's data "
                        "settings are the ensemble's unless --data-dir, --vali or --test is given")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's start-up and C++ log messages (hidden by default)")
    g = parser.add_argument_group("data")
    g.add_argument("--data-dir", help="LETOR fold directory (train.txt, vali.txt, test.txt)")
    g.add_argument("--vali", dest="vali_files", nargs="+", action="extend", metavar="PATH",
                   help="validation files: the standardisation is fitted on their documents")
    g.add_argument("--test", dest="test_files", nargs="+", action="extend", metavar="PATH")
    g = parser.add_argument_group("run and export")
    g.add_argument("--run-dir", default="runs/ensemble",
                   help="where ensemble.keras and results.json go (default runs/ensemble)")
    g.add_argument("--export-dir", help="SavedModel base directory (default: the first member's)")
    g.add_argument("--name", default="tfapprox_ensemble",
                   help="model name under the export directory (default tfapprox_ensemble)")
    g.add_argument("--version", type=int, help="version directory (default: next free)")
    g.add_argument("--max-documents", type=int,
                   help="most documents one serving request may hold (see train --help)")
    g.add_argument("--max-pairs", type=int,
                   help="members whose documents attend to each other (dasalc): most document "
                   "pairs one evaluation batch and one serving request may hold (default: the "
                   "first member's)")
    g.add_argument("--no-export", dest="export_enabled", action="store_false", default=True,
                   help="evaluate and save without exporting")
    return parser


def _overrides(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    overrides = {}
    given = getattr(args, "_given", set())  # flags stored by _Once, `--list-size full` (None) too
    for dest, key in _FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is not None or dest in given:
            overrides[key] = value
    if args.export_enabled is not None:
        overrides["export.enabled"] = args.export_enabled
    if "loss.name" in overrides and overrides["loss.name"] != base["loss"]["name"]:
        overrides["loss.params"] = {}
    for assignment in args.loss_param:
        key, value = config_lib.parse_assignment(assignment)
        overrides[f"loss.params.{key}"] = value
    if getattr(args, "grid", None):
        grid = dict(base["cv"]["grid"])
        for axis in args.grid:
            key, values = config_lib.parse_grid_axis(axis)
            grid[key] = values
        overrides["cv.grid"] = grid
    if args.data_dir is not None:  # replaces the config's split files, not the command line's
        for split in ("train", "vali", "test"):
            overrides.setdefault(f"data.{split}", None)
    return overrides


def _resolve(args: argparse.Namespace) -> config_lib.Config:
    source = args.config
    if args.command == "ensemble":
        from trainer.ensemble import member_config

        source = str(Path(args.members[0]) / "config.json")
        member_config(args.members[0])  # names the file if it is missing or not a trainer's
    if args.command in ("evaluate", "export") and source is None:
        run_dir = Path(args.run_dir or config_lib.TrainConfig().run_dir)
        saved = run_dir / "config.json"
        if not saved.exists():
            raise FileNotFoundError(f"{saved} not found: pass the --run-dir of a trained run")
        source = str(saved)
    values = config_lib.load_dict(source)
    overrides = _overrides(args, values)
    if getattr(args, "recipe", None):
        return _recipe_plan(args, values, overrides).ensemble
    if getattr(args, "members_in_parallel", 1) != 1:
        raise ValueError("--members-in-parallel trains the members of a --recipe: give one")
    # loss.params is replaced as a whole before single parameters are set
    if "loss.params" in overrides:
        values["loss"]["params"] = overrides.pop("loss.params")
    config_lib.apply_overrides(values, overrides)
    return config_lib.Config.from_dict(values)


def _recipe_plan(args: argparse.Namespace, values: dict[str, Any] | None = None,
                 overrides: dict[str, Any] | None = None):
    """Returns the `recipes.Plan` of `--recipe` with the command line's settings."""
    from trainer import recipes

    if getattr(args, "grid", None):
        raise ValueError("--grid and --recipe: a recipe fixes its members' settings; give one")
    if args.members_in_parallel < 1:
        raise ValueError(f"--members-in-parallel must be at least 1, got {args.members_in_parallel}")
    if values is None:
        values = config_lib.load_dict(args.config)
        overrides = _overrides(args, values)
    return recipes.plan(args.recipe, values, overrides)


def parse_args(argv: Sequence[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Returns the parsed command line; without a command, `train` is meant."""
    argv = list(argv)
    if not argv or argv[0] not in COMMANDS + ("-h", "--help"):
        argv = ["train", *argv]
    return (parser or _parser()).parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; user errors are one line on stderr: status 2 for arguments and
    settings (found before anything trains), 1 for what goes wrong while running."""
    parser = _parser()
    args = parse_args(sys.argv[1:] if argv is None else argv, parser)
    try:
        config = _resolve(args)
    except (KeyError, ValueError, FileNotFoundError) as err:
        parser.exit(2, _error_line(args.command, err))
    if args.print_config:
        shown = ({name: member.to_dict() for name, member in _recipe_plan(args).members.items()}
                 if getattr(args, "recipe", None) else config.to_dict())
        print(yaml.safe_dump(shown, sort_keys=False), end="")
        return 0

    # Keras reads its backend when first imported, so it is chosen before that. TensorFlow loads
    # next, after argument errors, quietly without --verbose (tfapprox/_startup.py); on JAX it is
    # the data pipeline's. A multi-worker strategy must exist before TensorFlow runs any op, so it
    # is made before the loss and metrics are checked.
    from trainer import backend

    try:
        backend.choose(config.runtime.backend, args.command)
    except ValueError as err:
        parser.exit(2, _error_line(args.command, err))
    from tfapprox import _startup

    with _startup.quiet_tensorflow_start():
        from trainer import checkpoint, distribute, interrupts, run_lock
    backend.keep_gpus_for_jax()

    strategy = config.runtime.strategy if args.command in ("train", "cv") else "default"
    try:
        dist = distribute.make(strategy)
        _check(args.command, config, dist, getattr(args, "members", []),
               _recipe_plan(args) if getattr(args, "recipe", None) else None)
    except (KeyError, ValueError, OSError) as err:
        parser.exit(2, _error_line(args.command, err))
    try:
        with interrupts.terminate_as_interrupt():
            _run(args, config, dist)
    except (checkpoint.CheckpointError, run_lock.RunDirInUse, OSError, ValueError,
            FloatingPointError) as err:
        sys.stderr.write(_error_line(args.command, err))
        return 1
    except KeyboardInterrupt as interrupt:
        signum = _signal_of(interrupt)
        sys.stderr.write(_interrupted_line(args.command, interrupt, signum))
        return 128 + signum  # as a shell reports a process the signal ended
    return 0


def _signal_of(interrupt: KeyboardInterrupt) -> int:
    """Returns the signal behind `interrupt`: SIGTERM (a VM shutting down) or SIGINT (Ctrl-C)."""
    from trainer import interrupts, train

    if isinstance(interrupt, train.Interrupted):
        return interrupt.signum
    return signal.SIGTERM if isinstance(interrupt, interrupts.Terminated) else signal.SIGINT


def _interrupted_line(command: str, interrupt: KeyboardInterrupt, signum: int) -> str:
    from trainer import train

    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    if command not in ("train", "cv"):
        return f"python -m trainer {command}: {what}\n"
    when = (f"after epoch {interrupt.epochs_done}" if isinstance(interrupt, train.Interrupted)
            else "before an epoch ended")
    return f"python -m trainer {command}: {what} {when}; rerun the same command to resume\n"


def _check(command: str, config: config_lib.Config, dist, members: Sequence[str] = (),
           recipe_plan=None) -> None:
    """Raises for settings that would otherwise fail only once training has begun, or after it:
    the scorer, loss and metrics of every run, the batch size across replicas, data paths, the
    export target, an ensemble's run directory (`members`: its members' run directories)."""
    from trainer import build, cv, data, export, run_files

    if config.data.feature_spec is not None and command == "cv":
        raise ValueError("`cv` does not take runs over named features (data.feature_spec): it "
                         "reads a LETOR fold layout; train each fold with `train --feature-spec`")
    if recipe_plan is not None and command == "train":
        from trainer import recipes

        recipes.check(recipe_plan)
    runs = [fold_run.config for fold_run in cv.plan(config)] if command == "cv" else [config]
    runs = runs if recipe_plan is None else runs + list(recipe_plan.members.values())
    for run in runs:
        build.check_components(run)
        if command in ("train", "cv"):
            dist.check_batch_size(run.train.batch_size)
    if command == "train":
        data.check_sources(config.data)
    # Only the chief writes there; another worker would see the chief's writes begin.
    if command == "train" and dist.is_chief:
        run_files.check_claimable(config.train.run_dir)
    if command == "cv" and dist.is_chief:
        run_files.check_claimable(config.cv.out_dir)
    if command == "ensemble":
        from trainer import ensemble

        ensemble.check_run_dir(config.train.run_dir, members)
        ensemble.check_same_inputs([ensemble.member_config(member) for member in members])
        run_files.check_claimable(config.train.run_dir)
    if command == "export" or (command in ("train", "ensemble") and config.export.enabled):
        export.check_export_target(config)


def _error_line(command: str, err: BaseException) -> str:
    message = err.args[0] if isinstance(err, KeyError) else err  # str(KeyError) adds quotes
    return f"python -m trainer {command}: error: {message}\n"


def _run(args: argparse.Namespace, config: config_lib.Config, dist) -> None:
    from trainer import build, cv, data, export, run_files, train

    if getattr(args, "recipe", None):
        from trainer import recipes

        run = recipes.run_cv if args.command == "cv" else recipes.run
        run(_recipe_plan(args), parallel=args.members_in_parallel, fresh=args.fresh, dist=dist)
    elif args.command == "train":
        train.train(config, fresh=args.fresh, dist=dist)
    elif args.command == "ensemble":
        from trainer import ensemble

        ensemble.run(config, args.members)
    elif args.command == "evaluate":
        run_dir = run_files.check_claimed(config.train.run_dir)
        splits = data.resolve(config.data, print_fn=print)
        results = train.evaluate(config, splits)
        run_files.write_json(run_dir / "evaluation.json", results)
    elif args.command == "export":
        built = build.restore_best(config)
        print(f"Exported {export.export(built.eval_model, config, built.num_features)}")
    else:
        cv.run(config, fresh=args.fresh, dist=dist)


if __name__ == "__main__":
    sys.exit(main())
