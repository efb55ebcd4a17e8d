"""Keras ranking losses, by family: `approx` (the approximation framework of Qin et al., and
SoftRank), `pairwise`, `listwise`, `structural` (SVM^map, PermuRank), over one base class
(`base.RankingLoss`, whose docstring gives the input conventions, what a list without a loss
contributes, and the reductions) and the weights of `lambda_weights`.

`get(name, **params)` builds a loss by its tfapprox name (a key of `LOSSES`).
"""

from tfapprox.losses.approx import ApproxAPLoss, ApproxNDCGLoss, ApproxPrecisionLoss, SoftRankLoss
from tfapprox.losses.base import RankingLoss
from tfapprox.losses.listwise import ListMLELoss, WeightedListMLELoss
from tfapprox.losses.pairwise import LambdaRankLoss, RankNetLoss, WeightedRankNetLoss
from tfapprox.losses.structural import PermuRankLoss, SVMMapLoss

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
}


def get(name, **params):
    """Returns the loss called `name` (a key of `LOSSES`), built with `params`."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name](**params)
