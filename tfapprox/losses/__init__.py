"""Keras ranking losses, by family: `approx` (the approximation framework of Qin et al., its
Gumbel-sampled forms, and SoftRank), `pairwise`, `listwise` (softmax, ListMLE), `pointwise`,
`structural` (SVM^map, PermuRank), over one base class (`base.RankingLoss`, whose docstring gives
the input conventions, what a list without a loss contributes, and the reductions) and the
LambdaLoss weights of `lambda_weights`.

`get(key, **params)` builds a loss by its tfapprox name (a key of `LOSSES`) or by its TF-Ranking
`RankingLossKey` string (a key of `RANKING_LOSS_KEYS`), with the class's (TF-Ranking's) keyword
arguments. docs/migrating.md maps every TF-Ranking loss and argument to ours.
"""

from tfapprox.losses.approx import (ApproxAPLoss, ApproxMRRLoss, ApproxNDCGLoss,
                                    ApproxPrecisionLoss, GumbelApproxAPLoss,
                                    GumbelApproxNDCGLoss, GumbelApproxPrecisionLoss,
                                    NeuralNDCGLoss, SoftRankLoss)
from tfapprox.losses.base import RankingLoss
from tfapprox.losses.lambda_weights import (DCGLambdaWeight, LabelDiffLambdaWeight,
                                            ListMLELambdaWeight, NDCGLambdaWeight,
                                            NDCGLambdaWeightV2, PrecisionLambdaWeight,
                                            YetiDCGLambdaWeight)
from tfapprox.losses.listwise import (CalibratedSoftmaxLoss, CoupledRankDistilLoss, ListMLELoss,
                                      SoftmaxLoss, UniqueSoftmaxLoss, WeightedListMLELoss)
from tfapprox.losses.pairwise import (LambdaRankLoss, PairwiseHingeLoss, PairwiseLogisticLoss,
                                      PairwiseMSELoss, PairwiseSoftZeroOneLoss, RankNetLoss,
                                      WeightedRankNetLoss, YetiLogisticLoss)
from tfapprox.losses.pointwise import MeanSquaredLoss, OrdinalLoss, SigmoidCrossEntropyLoss
from tfapprox.losses.structural import PermuRankLoss, SVMMapLoss

# tfapprox's names: one per class, the TF-Ranking key where the class is TF-Ranking's.
LOSSES = {
    "approx_ndcg": ApproxNDCGLoss,
    "approx_ap": ApproxAPLoss,
    "approx_precision": ApproxPrecisionLoss,
    "ranknet": RankNetLoss,
    "weighted_ranknet": WeightedRankNetLoss,
    "listmle": ListMLELoss,
    "weighted_listmle": WeightedListMLELoss,
    "lambdarank": LambdaRankLoss,
    "softrank": SoftRankLoss,
    "svm_map": SVMMapLoss,
    "permurank": PermuRankLoss,
    "softmax_loss": SoftmaxLoss,
    "calibrated_softmax_loss": CalibratedSoftmaxLoss,
    "unique_softmax_loss": UniqueSoftmaxLoss,
    "coupled_rankdistil_loss": CoupledRankDistilLoss,
    "pairwise_logistic_loss": PairwiseLogisticLoss,
    "pairwise_hinge_loss": PairwiseHingeLoss,
    "pairwise_soft_zero_one_loss": PairwiseSoftZeroOneLoss,
    "pairwise_mse_loss": PairwiseMSELoss,
    "yeti_logistic_loss": YetiLogisticLoss,
    "sigmoid_cross_entropy_loss": SigmoidCrossEntropyLoss,
    "mean_squared_loss": MeanSquaredLoss,
    "ordinal_loss": OrdinalLoss,
    "approx_mrr_loss": ApproxMRRLoss,
    "gumbel_approx_ndcg_loss": GumbelApproxNDCGLoss,
    "gumbel_approx_ap": GumbelApproxAPLoss,
    "gumbel_approx_precision": GumbelApproxPrecisionLoss,
    "neural_ndcg": NeuralNDCGLoss,
}

# TF-Ranking 0.5.5's `RankingLossKey` strings that are not already keys of LOSSES.
RANKING_LOSS_KEYS = {
    "approx_ndcg_loss": ApproxNDCGLoss,
    "list_mle_loss": ListMLELoss,
}

# TF-Ranking's `tf.keras.losses.Reduction` values, as ours.
_REDUCTIONS = {"auto": "sum_over_batch_size", "sum_over_batch_size": "sum_over_batch_size"}


def get(key, **params):
    """Returns the loss called `key` (a key of `LOSSES` or a TF-Ranking `RankingLossKey` string
    of `RANKING_LOSS_KEYS`), built with `params`. As `tfr.keras.losses.get`: `reduction="auto"` is
    ours `"sum_over_batch_size"`, and `lambda_weight=None` and `name=None` are left out (so
    they may be passed to every loss)."""
    params = {key: value for key, value in params.items()
              if not (key in ("lambda_weight", "name") and value is None)}
    found = LOSSES.get(key) or RANKING_LOSS_KEYS.get(key)
    if found is None:
        raise ValueError(f"unknown loss {key!r}; expected one of "
                         f"{sorted(LOSSES) + sorted(RANKING_LOSS_KEYS)}")
    if "reduction" in params:
        params["reduction"] = _REDUCTIONS.get(params["reduction"], params["reduction"])
    return found(**params)
