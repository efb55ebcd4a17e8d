"""What the experiments run: each study's settings (a scorer, a loss, fixed parameters and a grid
chosen on validation), and the `Run`s a setting needs on a set's folds and seeds."""

from __future__ import annotations

import dataclasses
import itertools

from benchmarks.experiment_runs import GBDTS, Run, recipe_arguments, scorer_label

@dataclasses.dataclass(frozen=True)
class Setting:
    """A configuration of a study: a model, a loss, fixed parameters, and a grid chosen on vali.

    A grid axis named `model.<option>` varies a scorer option (the trainer's `model.<option>`, as
    `scorer` fixes one); any other axis varies a loss parameter.
    """

    model: str
    loss: str
    params: tuple = ()
    grid: tuple = ()  # ((name, (values...)), ...)
    precision: str = "float32"  # or "mixed_bfloat16"
    scorer: tuple = ()  # the scorer's options, ((name, value), ...): model.<name> in the trainer

    def label(self) -> str:
        def axes(scorer_axes: bool) -> list[str]:
            return [f"{k.removeprefix(SCORER_AXIS)}∈{{{', '.join(map(str, v))}}}"
                    for k, v in self.grid if k.startswith(SCORER_AXIS) == scorer_axes]

        fixed = ", ".join(f"{k}={v}" for k, v in self.params)
        loss = ", ".join([fixed] * bool(fixed) + axes(False))
        scorer = scorer_label(self.scorer).strip("[]")
        scorer = ", ".join([scorer] * bool(scorer) + axes(True))
        mixed = "" if self.precision == "float32" else f" {self.precision}"
        return f"{self.model}{f'[{scorer}]' if scorer else ''} {self.loss}({loss}){mixed}"

    def first_point_only(self) -> "Setting":
        """The setting with each grid axis cut to its first value (for the smoke run)."""
        return dataclasses.replace(self, grid=tuple((k, v[:1]) for k, v in self.grid))

    def points(self) -> list[tuple[tuple, tuple]]:
        """Returns every grid point as `(loss params, scorer options)`, each sorted by name; a
        scorer option equal to the recipe's own is left out, so the point is the recipe's run."""
        recipe = dict(recipe_arguments(self.model))
        names = [k for k, _ in self.grid]
        found = []
        for combo in itertools.product(*(values for _, values in self.grid)):
            point = dict(zip(names, combo))
            scorer = {k.removeprefix(SCORER_AXIS): v for k, v in point.items()
                      if k.startswith(SCORER_AXIS)}
            params = {k: v for k, v in point.items() if not k.startswith(SCORER_AXIS)}
            scorer = {k: v for k, v in {**dict(self.scorer), **scorer}.items()
                      if k not in recipe or recipe[k] != v}
            found.append((tuple(sorted({**dict(self.params), **params}.items())),
                          tuple(sorted(scorer.items()))))
        return found


SCORER_AXIS = "model."  # the prefix of a grid axis that varies a scorer option

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
# DASALC (tfapprox.models.RECIPES) with each loss (softmax_loss is the paper's),
# and its ablation: with ApproxNDCG each of its pieces taken away, then the B256 tower it is built
# on with none of them.
DASALC_LOSSES = (("approx_ndcg", (("alpha", 10.0),)), ("approx_ap", (("alpha", 10.0),)),
                 ("softmax_loss", ()))
DASALC_ABLATION = ((("input_transform", "none"),), (("noise_stddev", 0.0),),
                   (("attention_layers", 0),))
# DASALC with ApproxNDCG given the GBDTs' protocol: its scorer chosen per fold on validation among
# the log1p transform or none, and the recipe's noise σ = 1.5 or the 4.5 its authors used on
# Yahoo! (the first point is the recipe itself; the ablation ran the other σ = 1.5 point).
DASALC_GRID = (("model.input_transform", ("log1p", "none")), ("model.noise_stddev", (1.5, 4.5)))
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
# tfapprox's losses before TF-Ranking's (issue 29), each compared with softmax_loss and with
# lambdarank (the LambdaLoss framework's NDCGLambdaWeight on the pairwise logistic loss).
SEED_LOSSES = ("approx_ndcg", "approx_ap", "approx_precision", "ranknet", "weighted_ranknet",
               "listmle", "weighted_listmle", "lambdarank", "softrank", "svm_map", "permurank")
SEED_CHALLENGERS = ("softmax_loss", "lambdarank")


def studies(smoke: bool = False) -> dict[str, list[Setting]]:
    """Returns the settings of every study; `yilmaz` is in the order of `YILMAZ_MEASURES`.

    `smoke` keeps what shows every table and plot working, at the least training: each grid cut
    to its first value per axis, each swept study to two points, Chen et al.'s study to the B64
    scorer (the direct methods' reference), the direct methods to the two the report quotes
    published figures for (SoftRank, SVM^map) and AdaRank.NDCG, DASALC to ApproxNDCG with
    the first piece of its ablation, and the study of every loss to the reference (the α = 10
    run bruch_alpha makes) and softmax_loss.
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
    found["dasalc_tuned"] = [Setting("dasalc", ndcg, ndcg_params, grid=DASALC_GRID)]
    if smoke:
        found["dasalc"] = found["dasalc"][:1]
        found["dasalc_ablation"] = found["dasalc_ablation"][:1]
        found["direct"] = [s for s in found["direct"] if s.loss in ("softrank", "svm_map", "ndcg")]
        found = {name: [s.first_point_only() for s in settings]
                 for name, settings in found.items()}
    return found


NEURAL_EPOCHS, LIGHTGBM_ROUNDS = 40, 1000


def runs_of(setting: Setting, dataset: str, folds, seeds, epochs: int, data_keys=None):
    """Returns every `Run` a setting needs (each grid point, fold and seed); `data_keys`:
    {fold: `data_key` of its files} for a set of the user's, None for the shared sets."""
    rounds = LIGHTGBM_ROUNDS if setting.model in GBDTS else epochs
    return [Run(dataset, fold, seed, setting.model, setting.loss, params, rounds,
                precision=setting.precision, scorer=scorer,
                data=(data_keys or {}).get(fold, ""), recipe=recipe_arguments(setting.model))
            for fold in folds for seed in seeds for params, scorer in setting.points()]
