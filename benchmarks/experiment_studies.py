"""What the experiments run: each study's settings (a scorer, a loss, fixed parameters and a grid
chosen on validation), and the `Run`s a setting needs on a set's folds and seeds."""

from __future__ import annotations

import dataclasses
import itertools

from benchmarks.experiment_runs import (GBDTS, METRICS, Run, ensemble_label, recipe_arguments,
                                        scorer_label, trainer_config)
from trainer.recipes import RECIPES, RECOMMENDED


@dataclasses.dataclass(frozen=True)
class Setting:
    """A configuration of a study: a model, a loss, fixed parameters, and a grid chosen on vali.

    A grid axis named `model.<option>` varies a scorer option (the trainer's `model.<option>`, as
    `scorer` fixes one), `optimizer.<option>` an optimiser option; any other a loss parameter.
    """

    model: str
    loss: str
    params: tuple = ()
    grid: tuple = ()  # ((name, (values...)), ...)
    precision: str = "float32"  # or "mixed_bfloat16"
    scorer: tuple = ()  # the scorer's options, ((name, value), ...): model.<name> in the trainer
    # An ensemble (`Run.member_runs`): k > 1, of the single runs of k seeds; or of these settings'
    # runs of the ensemble's seed (`ensemble_of`), a member with k > 1 its k runs of that seed
    members: int | tuple["Setting", ...] = 1

    @property
    def ensemble(self) -> bool:
        return self.members != 1

    def __post_init__(self):
        for member in self.members if isinstance(self.members, tuple) else ():
            if member.grid or isinstance(member.members, tuple):
                raise ValueError(f"an ensemble's member is a single run or an ensemble of seeds: "
                                 f"{member.label()} has a grid or members of its own")

    def label(self) -> str:
        if isinstance(self.members, tuple):
            return ensemble_label([dataclasses.replace(m, members=1).label()
                                   for m in self.members for _ in range(m.members)])
        def axes(group: str) -> list[str]:
            return [f"{option}∈{{{', '.join(map(str, values))}}}"
                    for (field, option), values in ((_axis(k), v) for k, v in self.grid)
                    if field == group]

        fixed = ", ".join(f"{k}={v}" for k, v in self.params)
        loss = ", ".join([fixed] * bool(fixed) + axes("params"))
        scorer = scorer_label(self.scorer).strip("[]")
        scorer = ", ".join([scorer] * bool(scorer) + axes("scorer"))
        optimizer = "".join(f" {axis}" for axis in axes("optimizer"))
        mixed = "" if self.precision == "float32" else f" {self.precision}"
        return (f"{self.model}{f'[{scorer}]' if scorer else ''} {self.loss}({loss})"
                f"{optimizer}{mixed}{ensemble_label(self.members)}")

    def first_point_only(self) -> "Setting":
        """The setting with each grid axis cut to its first value (for the smoke run)."""
        return dataclasses.replace(self, grid=tuple((k, v[:1]) for k, v in self.grid))

    def points(self) -> list[dict[str, dict]]:
        """Returns every grid point as {"params": loss parameters, "scorer": scorer options,
        "optimizer": optimiser options}, the setting's fixed ones included."""
        names = [k for k, _ in self.grid]
        found = []
        for combo in itertools.product(*(values for _, values in self.grid)):
            point = {"params": dict(self.params), "scorer": dict(self.scorer), "optimizer": {}}
            for name, value in zip(names, combo):
                field, option = _axis(name)
                point[field][option] = value
            found.append(point)
        return found


# The prefix of a grid axis that varies a scorer or an optimiser option, and the `Run` field it
# fills; an axis without one varies a loss parameter (`params`).
GRID_GROUPS = {"model.": "scorer", "optimizer.": "optimizer"}


def ensemble_of(name: str, *members: Setting) -> Setting:
    """Returns the ensemble `name` of the runs of `members` (settings without a grid): ensemble
    seed s combines each member's run of seed s, or, of a member that is an ensemble of k seeds,
    its runs of seeds k·s ... k·s + k − 1 (`experiment_runs.ensemble_scores`)."""
    return Setting("ensemble", name, members=members)


def _axis(name: str) -> tuple[str, str]:
    """Returns (the `Run` field a grid axis fills, the option's name there)."""
    for prefix, field in GRID_GROUPS.items():
        if name.startswith(prefix):
            return field, name.removeprefix(prefix)
    return "params", name


ALPHA_BETA = (("alpha", (10.0, 50.0, 100.0)), ("beta", (10.0, 50.0)))
BRUCH_ALPHAS = (1.0, 5.0, 10.0, 20.0, 50.0, 100.0)
SMOKE_ALPHAS = (1.0, 10.0)  # α = 10 is the tightness study's setting
BRUCH_PRESETS = ("B64", "B128", "B256", "B512", "B1024")
YILMAZ_MEASURES = ("AP", "P@10", "NDCG", "NDCG@10")  # what each row of Yilmaz's table trains on
# The GBDT references, each grid chosen per fold on validation NDCG@10 (../shared/data/README.md).
GBDT_SETTINGS = (
    Setting("lightgbm", "lambdarank",
            grid=(("learning_rate", (0.05, 0.1)), ("num_leaves", (15, 31, 63)))),
    Setting("xgboost", "rank:ndcg", grid=(("eta", (0.05, 0.1)), ("max_depth", (4, 6, 8)))),
    Setting("catboost", "YetiRank", (("learning_rate", 0.05),), (("depth", (4, 6, 8)),)),
)
# DASALC (tfapprox.models.RECIPES) with each loss (softmax_loss is the paper's; RankNet and the
# pairwise soft zero-one loss are the losses study's strongest on YAHOO's B64), and its
# ablation: with ApproxNDCG each of its pieces taken away, then the B256 tower it is built on
# with none of them.
DASALC_LOSSES = (("approx_ndcg", (("alpha", 10.0),)), ("approx_ap", (("alpha", 10.0),)),
                 ("softmax_loss", ()), ("ranknet", ()), ("pairwise_soft_zero_one_loss", ()))
DASALC_ABLATION = ((("input_transform", "none"),), (("noise_stddev", 0.0),),
                   (("attention_layers", 0),))
# DASALC with ApproxNDCG given the GBDTs' protocol: per fold, chosen on validation, the log1p
# transform or none, and either the recipe's noise σ = 1.5 or the 4.5 its authors used on Yahoo!,
# or Adagrad's learning rate 0.05 (the trainer's) or 0.2. The first point of each is the recipe,
# the third the ablation's run without log1p: both are cached already.
DASALC_GRIDS = ((("model.input_transform", ("log1p", "none")), ("model.noise_stddev", (1.5, 4.5))),
                (("model.input_transform", ("log1p", "none")),
                 ("optimizer.learning_rate", (0.05, 0.2))))
# The loss that comes closest to the GBDTs with one DASALC (the dasalc study's best on YAHOO's
# validation): what DASALC's search, its quantile inputs and its ensembles below train.
DASALC_LOSS = "pairwise_soft_zero_one_loss"
# Where the gap to the GBDTs on YAHOO is not: DASALC with that loss, with one thing changed each: the
# dropout the MQ2008 and OHSUMED presets give (0.1) and more (0.3), Adagrad's learning rate 0.2,
# and two losses nearer the GBDTs' objectives (yeti_logistic_loss, CatBoost's YetiRank as a
# neural loss; sigmoid cross-entropy, the best B64 loss on YAHOO's validation in the losses
# study). Run on YAHOO.
DASALC_SEARCH = (Setting("dasalc", DASALC_LOSS, scorer=(("dropout", 0.1),)),
                 Setting("dasalc", DASALC_LOSS, scorer=(("dropout", 0.3),)),
                 Setting("dasalc", DASALC_LOSS, grid=(("optimizer.learning_rate", (0.2,)),)),
                 Setting("dasalc", "yeti_logistic_loss"),
                 Setting("dasalc", "sigmoid_cross_entropy_loss"))
# What the YAHOO gap is: the input transform. DASALC with that loss and each
# feature mapped through its training quantiles to N(0, 1) (`input_transform="quantile"`) instead
# of log1p: monotone per feature, so trees are indifferent to it, but the network sees ranks.
DASALC_QUANTILE = Setting("dasalc", DASALC_LOSS, scorer=(("input_transform", "quantile"),))
# Quantile DASALC's validation peaks early and scatters (best epochs 1-37 of 40 on the three
# sets): the same with Adagrad's learning rate 0.02 instead of the trainer's 0.05 (a smoother
# descent) or twice the input noise (σ = 3.0, more regularisation). Run on YAHOO and MQ2008.
DASALC_QUANTILE_SEARCH = (
    dataclasses.replace(DASALC_QUANTILE, grid=(("optimizer.learning_rate", (0.02,)),)),
    Setting("dasalc", DASALC_LOSS, scorer=DASALC_QUANTILE.scorer + (("noise_stddev", 3.0),)))
# The B64 tower with quantile inputs: the losses study's three best losses by validation NDCG@10
# averaged over the three sets, each with the transform that lifted DASALC's validation on YAHOO
# and MQ2008 (dasalc_quantile).
QUANTILE_LOSSES = ("unique_softmax_loss", "ranknet", "weighted_ranknet")
LIST_STANDARDIZE = ("list_standardize", True)


def recipe_settings(name: str) -> tuple[Setting, ...]:
    """Returns the members of the trainer's recipe `name` (trainer/recipes.py) as settings."""
    return tuple(Setting(member.preset, member.loss, member.loss_params, scorer=member.scorer)
                 for member in RECIPES[name].members)


# The trainer's recipes' members with each (quantile-transformed) feature also standardised
# within its list: the list context a GBDT scoring documents one by one cannot use.
LIST_STANDARDIZED = recipe_settings(RECOMMENDED)
# DASALC-ens (Qin et al., ICLR 2021, their strongest): the mean of the standardised scores of
# DASALC trained with 3 seeds (`experiment_runs.ensemble_scores`), with DASALC_LOSS.
DASALC_ENSEMBLE = 3


@dataclasses.dataclass(frozen=True)
class Ensemble:
    """An ensemble of different settings (`ensemble_of`), one for every set.

    A recipe names the studies it was ranked from: its members are the settings of those studies
    with the best validation NDCG@10 averaged over the sets (each set's mean over its folds and
    seeds), among those run on every fold and seed, fixed before any of its test figures was
    read; the report checks that rule against the cache. A variant (`ranked_from` empty) is a
    changed recipe. `name` keys its runs in the cache.
    """

    name: str
    members: tuple[Setting, ...]
    provenance: str  # one line: where the members come from
    ranked_from: tuple[str, ...] = ()
    seeds_each: int = 1  # each member an ensemble of this many seeds

    def setting(self) -> Setting:
        return ensemble_of(self.name, *(dataclasses.replace(m, members=self.seeds_each)
                                        for m in self.members))


_DASALC = Setting("dasalc", DASALC_LOSS)
_B64_LOG1P = (_DASALC, Setting("B64", "unique_softmax_loss"), Setting("B64", "ranknet"))
_QUANTILE = recipe_settings("mixed_quantile")
ENSEMBLES = (
    Ensemble("dasalc_b64", _B64_LOG1P, "the best three of the dasalc and losses studies",
             ("dasalc", "losses")),
    Ensemble("dasalc_b64_best2", _B64_LOG1P[:2], "dasalc_b64 without its third member"),
    Ensemble("dasalc_b64_3seeds", _B64_LOG1P, "dasalc_b64 with 3 seeds of each member",
             seeds_each=3),
    Ensemble("dasalc_quantile_log1p_b64", (DASALC_QUANTILE, _DASALC, _B64_LOG1P[1]),
             "the best three with dasalc_quantile among the candidates too",
             ("dasalc", "dasalc_quantile", "losses")),
    Ensemble("mixed_quantile", _QUANTILE,
             "the best three with losses_quantile among the candidates too: the trainer's "
             "recipe mixed_quantile", ("dasalc", "dasalc_quantile", "losses", "losses_quantile")),
    Ensemble("mixed_quantile_3seeds", _QUANTILE, "mixed_quantile with 3 seeds of each member",
             seeds_each=3),
    Ensemble(RECOMMENDED, LIST_STANDARDIZED,
             "the best three with list_standardized among the candidates too: the trainer's "
             "recommended recipe", ("dasalc", "dasalc_quantile", "losses", "losses_quantile",
                                    "list_standardized")),
)
# The `losses` study: every loss of `tfapprox.losses.LOSSES`, by its key there (TF-Ranking's
# RankingLossKey where the class is TF-Ranking's; TF-Ranking's approx_ndcg_loss and list_mle_loss
# are `get`'s aliases of approx_ndcg and listmle), on B64 with its defaults. The parameters below
# restate defaults so that the runs are those other studies cached (bruch_alpha's α = 10, qin's
# α = β = 10 point); Approx P@k has no default k. The reference is ApproxNDCG α = 10.
LOSS_STUDY_PARAMS = {"approx_ndcg": (("alpha", 10.0),),
                     "approx_ap": (("alpha", 10.0), ("beta", 10.0)),
                     "approx_precision": (("alpha", 10.0), ("beta", 10.0), ("k", 10)),
                     "gumbel_approx_precision": (("k", 10),)}
LOSS_STUDY_REFERENCE = "approx_ndcg"
# The smoke run's ensemble of different settings: the two it trains for the losses study.
SMOKE_ENSEMBLE = Ensemble("smoke", tuple(Setting("B64", loss, LOSS_STUDY_PARAMS.get(loss, ()))
                                         for loss in (LOSS_STUDY_REFERENCE, "softmax_loss")),
                          "the smoke run's two settings of the losses study", ("losses",))
ENSEMBLES_BY_NAME = {e.name: e for e in (*ENSEMBLES, SMOKE_ENSEMBLE)}
# tfapprox's losses before TF-Ranking's were added, each compared with softmax_loss and with
# lambdarank (the LambdaLoss framework's NDCGLambdaWeight on the pairwise logistic loss).
SEED_LOSSES = ("approx_ndcg", "approx_ap", "approx_precision", "ranknet", "weighted_ranknet",
               "listmle", "weighted_listmle", "lambdarank", "softrank", "svm_map", "permurank")
SEED_CHALLENGERS = ("softmax_loss", "lambdarank")


# The studies run on a set that does not run them all: what resumes it.
SET_STUDIES = {"MQ2008_AGG": ("gbdt", "recommended")}


@dataclasses.dataclass(frozen=True)
class Table:
    """How the report draws studies: its heading, a table of each study's rows in `metrics` (none
    without metrics), and the row (a setting's label, of these studies or another) its rows are
    tested against, in which metrics. What else it says (comparisons not against one row, the
    published figures, plots) is the report's note on it (`experiment_report.NOTES`)."""

    title: str
    metrics: tuple[str, ...] = METRICS
    reference: str = ""
    tests: tuple[str, ...] = ()  # metrics of the paired tests against the reference
    studies: tuple[str, ...] = ()  # the studies it draws, if not the one it is named for
    # {set: {loss: {metric: figure}}}: published on that shared set's folds, which its note sets
    # beside ours
    published: dict = dataclasses.field(default_factory=dict)


# The studies the report draws as declared here, in its order (`experiment_report.declared`); the
# others have sections of their own, after these.
TABLES = {
    "chen": Table("Weighted vs plain RankNet and ListMLE (Chen et al. 2009, Table 1)",
                  published={"OHSUMED": {  # Table 1: linear models
                      loss: {"ndcg@5": at_5, "ndcg@10": at_10} for loss, at_5, at_10 in (
                          ("ranknet", 0.4568, 0.4414), ("weighted_ranknet", 0.4868, 0.4604),
                          ("listmle", 0.4471, 0.4347), ("weighted_listmle", 0.4588, 0.4453))}}),
    "qin": Table("ApproxAP vs ApproxNDCG vs Approx P@10 (Qin et al. 2010, Tables 2-3)"),
    "yilmaz": Table("Train on one measure, test on another (Yilmaz & Robertson, Table 2)", ()),
    "bruch": Table("ApproxNDCG: effect of α and of depth (Bruch et al. 2019)",
                   ("ndcg@5", "ndcg@10", "map"), studies=("bruch_alpha", "bruch_depth")),
    "direct": Table("Other direct-optimisation methods: LambdaRank, SoftRank, SVM^map, "
                    "PermuRank, AdaRank", reference="B64 ranknet()", tests=("ndcg@5", "ndcg@10"),
                    published={"OHSUMED": {  # SVM-MAP: Chen et al. Table 1; the rest: Qin et al.
                        "svm_map": {"ndcg@5": 0.4516, "ndcg@10": 0.4319},
                        "approx_ndcg": {"ndcg": 0.6698}, "softrank": {"ndcg": 0.6680}}}),
    "precision": Table("Training in bfloat16 (`--mixed-precision`) vs float32",
                       ("ndcg@5", "ndcg@10", "map"), reference="B64 approx_ndcg(alpha=10.0)",
                       tests=("ndcg@5", "ndcg@10", "map")),
    "lightgbm": Table("LightGBM lambdarank vs the best tfapprox model"),
}


def studies(smoke: bool = False) -> dict[str, list[Setting]]:
    """Returns the settings of every study; `yilmaz` is in the order of `YILMAZ_MEASURES`.

    `smoke` keeps what shows every table and plot working, at the least training: each grid cut
    to its first value per axis, each swept study to two points, Chen et al.'s study to the B64
    scorer (the direct methods' reference), the direct methods to the two the report quotes
    published figures for (SoftRank, SVM^map) and AdaRank.NDCG, DASALC to ApproxNDCG with
    the first piece of its ablation and its ensemble of two (one run more), its search to no
    run (DASALC with a changed option, as dasalc_quantile runs it), and so dasalc_quantile_search,
    losses_quantile to none (a B-net with that option), the study of
    every loss to the reference (the α = 10 run bruch_alpha makes) and softmax_loss, and the
    ensemble of different settings to those two (one run more, which trains none: it restores
    their checkpoints).
    """
    from tfapprox.losses import LOSSES

    qin = [Setting("B64", "approx_ap", grid=ALPHA_BETA),
           Setting("B64", "approx_ndcg", grid=ALPHA_BETA[:1]),
           Setting("B64", "approx_precision", (("k", 10),), ALPHA_BETA)]
    found = {
        "chen": [Setting(scorer, loss) for scorer in (("B64",) if smoke else ("linear", "B64"))
                 for loss in ("ranknet", "weighted_ranknet", "listmle", "weighted_listmle")],
        "qin": qin,
        "yilmaz": [qin[0], qin[2], qin[1],
                   Setting("B64", "approx_ndcg", (("topk", 10),), ALPHA_BETA)],
        "bruch_alpha": [Setting("B64", "approx_ndcg", (("alpha", a),))
                        for a in (SMOKE_ALPHAS if smoke else BRUCH_ALPHAS)],
        "bruch_depth": [Setting(p, "approx_ndcg", (("alpha", 10.0),))
                        for p in BRUCH_PRESETS[:2 if smoke else None]],
        "precision": [Setting("B64", "approx_ndcg", (("alpha", 10.0),), precision=precision)
                      for precision in ("float32", "mixed_bfloat16")],
        "lightgbm": [Setting("lightgbm", "lambdarank", grid=(("num_leaves", (15, 31, 63)),))],
        "direct": [Setting("B64", loss) for loss in ("lambdarank", "softrank", "svm_map",
                                                     "permurank")]
                  + [Setting("adarank", measure) for measure in ("ndcg", "map")],
    }
    found["losses"] = [Setting("B64", loss, LOSS_STUDY_PARAMS.get(loss, ()))
                       for loss in ((LOSS_STUDY_REFERENCE, "softmax_loss") if smoke else LOSSES)]
    ndcg, ndcg_params = DASALC_LOSSES[0]
    found["gbdt"] = list(GBDT_SETTINGS)
    found["dasalc"] = [Setting("dasalc", loss, params) for loss, params in DASALC_LOSSES]
    found["dasalc_ablation"] = ([Setting("dasalc", ndcg, ndcg_params, scorer=without)
                                 for without in DASALC_ABLATION]
                                + [Setting("B256", ndcg, ndcg_params)])
    found["dasalc_tuned"] = [Setting("dasalc", ndcg, ndcg_params, grid=grid)
                             for grid in DASALC_GRIDS]
    found["dasalc_search"] = list(DASALC_SEARCH)
    found["dasalc_quantile"] = [DASALC_QUANTILE]
    found["dasalc_quantile_search"] = list(DASALC_QUANTILE_SEARCH)
    found["losses_quantile"] = [Setting("B64", loss, scorer=DASALC_QUANTILE.scorer)
                                for loss in QUANTILE_LOSSES]
    found["list_standardized"] = list(LIST_STANDARDIZED)
    found["dasalc_ensemble"] = [Setting("dasalc", DASALC_LOSS, dict(DASALC_LOSSES)[DASALC_LOSS],
                                        members=DASALC_ENSEMBLE),
                                dataclasses.replace(DASALC_QUANTILE, members=DASALC_ENSEMBLE)]
    found["mixed_ensemble"] = [e.setting() for e in ((SMOKE_ENSEMBLE,) if smoke else ENSEMBLES)]
    found["recommended"] = [*LIST_STANDARDIZED, ENSEMBLES_BY_NAME[RECOMMENDED].setting()]
    if smoke:
        found["dasalc"] = found["dasalc"][:1]
        found["dasalc_ensemble"] = [dataclasses.replace(found["dasalc"][0], members=2)]
        found["dasalc_ablation"] = found["dasalc_ablation"][:1]
        found["dasalc_search"] = []  # DASALC with options, as dasalc_quantile runs it
        found["losses_quantile"] = []  # a B-net with an option, as dasalc_quantile runs DASALC
        found["dasalc_quantile_search"] = []  # options dasalc_quantile's run shows working
        found["list_standardized"] = found["recommended"] = []  # and so these
        found["direct"] = [s for s in found["direct"] if s.loss in ("softrank", "svm_map", "ndcg")]
        found = {name: [s.first_point_only() for s in settings]
                 for name, settings in found.items()}
    return found


NEURAL_EPOCHS, LIGHTGBM_ROUNDS = 40, 1000


def runs_of(setting: Setting, dataset: str, folds, seeds, epochs: int, data_keys=None):
    """Returns every `Run` a setting needs (each grid point, fold and seed); `data_keys`:
    {fold: `data_key` of its files} for a set of the user's, None for the shared sets.

    A scorer or optimiser option equal to what the run gets anyway (the recipe's, the trainer's
    configuration for the set) is left out, so such a point is the run without it, cached once.
    """
    if isinstance(setting.members, tuple):
        return [Run(dataset, fold, seed, setting.model, setting.loss, epochs=epochs,
                    data=(data_keys or {}).get(fold, ""),
                    members=tuple(single for member in setting.members
                                  for run in runs_of(member, dataset, [fold], [seed], epochs,
                                                     data_keys)
                                  for single in run.member_runs()))
                for fold in folds for seed in seeds]
    rounds = LIGHTGBM_ROUNDS if setting.model in GBDTS else epochs
    recipe, points = recipe_arguments(setting.model), setting.points()
    optimizer = trainer_config(dataset)["optimizer"] if any(p["optimizer"] for p in points) else {}

    def changed(options: dict, defaults: dict) -> tuple:
        return tuple(sorted((k, v) for k, v in options.items()
                            if k not in defaults or defaults[k] != v))

    return [Run(dataset, fold, seed, setting.model, setting.loss,
                tuple(sorted(point["params"].items())), rounds, precision=setting.precision,
                scorer=changed(point["scorer"], dict(recipe)),
                optimizer=changed(point["optimizer"], optimizer),
                data=(data_keys or {}).get(fold, ""), recipe=recipe, members=setting.members)
            for fold in folds for seed in seeds for point in points]
