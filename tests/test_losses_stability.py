"""The Gumbel-sampled losses stay finite, value and gradient, for any finite scores.

0.50243497 is a score whose hashed uniform for sample 0 (seed None) has its top bits all ones:
before the fix that uniform was (2^24 − ½)/2^24, which rounds to 1 in float32, its Gumbel noise
−ln(−ln 1) = +∞ and the loss and gradient NaN (1 draw in 2^24: the B64 YetiLogisticLoss run on
YAHOO Fold2 drew one in epoch 16). ±3e38 with τ = ½ overflowed (s + g)/τ before the scores were
shifted by their maximum.
"""

import numpy as np
import pytest

from conftest import loss_and_grad, to_numpy
from tfapprox import losses
from tfapprox.losses import sampling

TOP_UNIFORM_SCORE = 0.50243497  # its sample-0 uniform is the largest one (k = all ones)
LABELS = np.array([[2.0, 1.0, 0.0, 1.0, -1.0],
                   [1.0, 0.0, 2.0, 0.0, -1.0]], np.float32)
SCORES = np.array([[TOP_UNIFORM_SCORE, 0.1, -0.3, 0.7, 0.0],
                   [3e38, -3e38, 1e30, 0.0, 3e38]], np.float32)  # the last column is padding

GUMBEL_LOSSES = [
    losses.YetiLogisticLoss(gumbel_temperature=0.5),
    losses.GumbelApproxNDCGLoss(gumbel_temperature=0.5),
]


def test_uniforms_stay_below_one_at_the_top_of_the_hash():
    u = to_numpy(sampling.uniforms(np.array([[TOP_UNIFORM_SCORE]], np.float32), 1, None))
    assert 0.0 < u.min() and u.max() < 1.0 and u.max() > 1.0 - 2.0 ** -23


@pytest.mark.parametrize("loss", GUMBEL_LOSSES, ids=lambda loss: type(loss).__name__)
def test_gumbel_losses_are_finite_at_extreme_uniforms_and_scores(loss):
    value, grad = loss_and_grad(loss, LABELS, SCORES)
    assert np.isfinite(value) and np.all(np.isfinite(grad)), (value, grad)
    assert np.all(grad[:, -1] == 0.0)  # padding takes no gradient
