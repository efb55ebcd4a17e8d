"""Parity with TF-Ranking 0.5.5: the same losses and metrics give the same values per list.

TF-Ranking needs TensorFlow 2.15 (Keras 2), so `.ci/tfranking-venv` builds a side virtualenv and
`tests/tfranking_reference.py` computes TF-Ranking's values there, once, for every batch, kept
beside the venv for later runs (tests/build_cache.py; `TFAPPROX_TFR_PYTHON` may name another
interpreter that imports TF-Ranking 0.5.5). When the venv
cannot be built the tests fail under CI (`CI=true`) and are skipped elsewhere.

The batches are random and padded: 1 to 16 lists, list sizes from 1 to 40, graded labels 0..4,
label −1 on random slots (with huge scores there), some lists with no relevant document, every
list with at least one real document, and no tied scores within a list (TF-Ranking's metrics
break ties at random, ours by list order). What each comparison normalises, and why:

- `ApproxNDCGLoss(alpha=a)` vs `ApproxNDCGLoss(temperature=1/a)`: TF-Ranking's unreduced loss
  is [B, 1], −ApproxNDCG times a weight that is 0 on lists without a positive label; ours is 0
  there too, and on lists whose real labels are all equal (which TF-Ranking scores), so the
  lists with two different labels are compared, as is.
- `RankNetLoss` vs `PairwiseLogisticLoss`: TF-Ranking's unreduced loss is [B, L], the pair
  losses ln(1 + e^{−(s_i − s_j)}) summed over the lower document j; its sum over the list is
  our per-list value. (Its default reduction then divides the total by B·L.)
- `LambdaRankLoss(topk=k)` vs `PairwiseLogisticLoss(lambda_weight=NDCGLambdaWeight(topn=k,
  smooth_fraction=1.0))`, k in NDCG_TOPNS: TF-Ranking's unreduced loss, summed over the list as
  for RankNet, is our per-list value times the padded list size L, by which its lambda weights
  are scaled (`DCGLambdaWeight.pair_weights`; so its value depends on padding). smooth_fraction=1
  selects LambdaRank's |ΔNDCG| weight; the default 0 is LambdaLoss' |D(|Δr|) − D(|Δr| + 1)|.
- `ListMLELoss` vs `ListMLELoss`, on labels without ties (`distinct_labels`): TF-Ranking gives
  each padded slot the logit ln 1e-10 and sorts it last, so its P padded slots add
  Σ_{m=1}^{P} ln m = ln P! to the loss (a TF-Ranking defect: the value depends on padding). We
  compare ours + ln P! to it. Our lists whose one real document has label 0 have no loss (0);
  TF-Ranking's term for them is ln 1 = 0, so they compare too.
- Metrics, per list: TF-Ranking's value is what its Keras metric averages (`_metric.compute`);
  ours is the `tfapprox.measures` formula our metric averages. Lists with a relevant document
  (label ≥ 1) are compared. `PrecisionMetric(topn=k)` divides by min(k, #real documents),
  `PrecisionAtK(k)` by k (trec_eval), so ours·k/min(k, n) is compared to it.
- Metrics, per batch: TF-Ranking weighs every list 1 (checked) and scores a list without a
  relevant document 0, i.e. our `empty_lists="zero"`; our default `"exclude"` is compared to
  TF-Ranking's per-list values averaged over the lists with a relevant document. For P@k the
  `"zero"` mean is compared only on batches whose lists all have ≥ k real documents.
"""

import json
import math
import os
import subprocess

import numpy as np
import pytest

from build_cache import CACHE_DIR, built_once, digest, venv_identity
from conftest import (REPO, backend, loss_and_grad, side_venv_environment, side_venv_python,
                      to_numpy)
from tfapprox import losses, measures, metrics
from tfapprox import ops as rank_ops
from tfapprox.losses import lambda_weights

pytestmark = [pytest.mark.parity, pytest.mark.slow]

REFERENCE_SCRIPT = REPO / "tests" / "tfranking_reference.py"

NUM_BATCHES = 120
LIST_SIZES = (1, 2, 3, 4, 5, 7, 10, 12, 16, 25, 40)
ALPHAS = (1.0, 10.0, 100.0)
NDCG_TOPNS = (None, 1, 5, 10)
PRECISION_TOPNS = (1, 3, 5, 10)
NEW_METRIC_BATCHES = 40  # the batches the metrics of `tfranking_reference.NEW_METRICS` see
CUTOFF_TOPNS = (None, 3)
NUM_SUBTOPICS = 3
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def make_batches(seed=20100413):
    """Returns the inputs of `tfranking_reference.py` (see its docstring), as numpy arrays."""
    rng = np.random.default_rng(seed)
    batches = {"num_batches": np.int64(NUM_BATCHES), "alphas": np.array(ALPHAS),
               "ndcg_topns": np.array([k or 0 for k in NDCG_TOPNS]),
               "precision_topns": np.array(PRECISION_TOPNS)}
    for i in range(NUM_BATCHES):
        list_size = LIST_SIZES[i % len(LIST_SIZES)]
        batch = int(rng.integers(1, 17))
        real = rng.random((batch, list_size)) >= rng.choice([0.0, 0.2, 0.5])
        real[np.arange(batch), rng.integers(0, list_size, size=batch)] = True
        labels = rng.choice(5, p=[0.45, 0.25, 0.15, 0.1, 0.05], size=(batch, list_size))
        labels[rng.random(batch) < 0.2] = 0  # lists without a relevant document
        # Distinct scores spread over [-2.5, 2.5]: a permutation of the slots, jittered.
        order = rng.permuted(np.tile(np.arange(list_size), (batch, 1)), axis=1)
        scores = (order + rng.uniform(-0.4, 0.4, size=order.shape)) * 5.0 / list_size - 2.5
        scores = np.where(real, scores, rng.normal(scale=1e3, size=scores.shape))
        distinct = np.stack([_distinct_labels(rng, row) for row in real])
        batches[f"labels_{i}"] = np.where(real, labels, -1).astype(np.float32)
        batches[f"scores_{i}"] = scores.astype(np.float32)
        batches[f"distinct_labels_{i}"] = distinct.astype(np.float32)
    batches.update(loss_case_inputs(batches, rng))
    subtopic_rng = np.random.default_rng(seed + 1)  # leaves the batches above as they were
    batches["num_new_metric_batches"] = np.int64(NEW_METRIC_BATCHES)
    batches["cutoff_topns"] = np.array([k or 0 for k in CUTOFF_TOPNS])
    for i in range(NEW_METRIC_BATCHES):
        real = batches[f"labels_{i}"] >= 0
        covers = subtopic_rng.random((*real.shape, NUM_SUBTOPICS)) < 0.3
        batches[f"subtopics_{i}"] = np.where(real[..., None], covers, -1).astype(np.float32)
    return batches


def _distinct_labels(rng, real):
    """Returns labels 0..n−1 in random order on the n real slots of a list, −1 elsewhere."""
    labels = np.full(real.shape, -1.0)
    labels[real] = rng.permutation(int(real.sum()))
    return labels


@pytest.fixture(scope="module")
def batches():
    return make_batches()


@pytest.fixture(scope="module")
def reference(batches, tmp_path_factory):
    """TF-Ranking's values for `batches`, computed once in the side venv and kept (`built_once`)
    under a digest of the script, the batches and the venv, so the xdist workers and later runs
    read them instead of starting TensorFlow 2.15 again."""
    python = side_venv_python()
    inputs = tmp_path_factory.mktemp("tfranking") / "inputs.npz"

    def compute(outputs):
        np.savez(inputs, **batches)
        run = subprocess.run([python, str(REFERENCE_SCRIPT), str(inputs), outputs],
                             capture_output=True, text=True, timeout=600,
                             env=side_venv_environment())
        if run.returncode != 0:
            pytest.fail(f"{REFERENCE_SCRIPT.name} failed under {python}:\n{run.stderr[-4000:]}",
                        pytrace=False)

    key = digest(REFERENCE_SCRIPT.read_bytes(), venv_identity(python), batches)
    path = os.path.join(CACHE_DIR, "tfranking-reference", f"{key}.npz")
    with np.load(built_once(path, compute)) as values:
        found = dict(values)
    assert list(found["versions"]) == ["2.15.1", "0.5.5"], found["versions"]
    return found


def each_batch(batches):
    for i in range(NUM_BATCHES):
        yield i, batches[f"labels_{i}"], batches[f"scores_{i}"]


def traced(function):
    """`function` in one tf.function on TensorFlow, traced at most twice for the batches' shapes
    (reduce_retracing; 120 batches run eagerly cost seconds a case), as it is elsewhere."""
    if backend() != "tensorflow":
        return function
    import tensorflow as tf

    return tf.function(function, reduce_retracing=True)


def per_list_loss(loss, labels, scores):
    return to_numpy(loss(labels, scores)).astype(np.float64)


def assert_close(ours, theirs, what):
    np.testing.assert_allclose(ours, theirs, **TOLERANCE, err_msg=what)


@pytest.mark.parametrize("alpha_index", range(len(ALPHAS)),
                         ids=[f"alpha={a:g}" for a in ALPHAS])
def test_approx_ndcg_loss(batches, reference, alpha_index):
    loss = traced(losses.ApproxNDCGLoss(alpha=ALPHAS[alpha_index], reduction=None))
    for i, labels, scores in each_batch(batches):
        ordered = to_numpy(rank_ops.has_label_pairs(labels, labels >= 0))
        ours = per_list_loss(loss, labels, scores)
        assert_close(ours[ordered], reference[f"approx_ndcg_{i}_{alpha_index}"][ordered],
                     f"batch {i}")
        assert np.all(ours[~ordered] == 0), f"batch {i}"


def test_ranknet_is_summed_pairwise_logistic_loss(batches, reference):
    loss = traced(losses.RankNetLoss(reduction=None))
    for i, labels, scores in each_batch(batches):
        assert_close(per_list_loss(loss, labels, scores), reference[f"pairwise_logistic_{i}"],
                     f"batch {i}")


@pytest.mark.parametrize("topn_index", range(len(NDCG_TOPNS)),
                         ids=[f"topn={k}" for k in NDCG_TOPNS])
def test_lambdarank_is_ndcg_lambda_weighted_pairwise_logistic_loss(batches, reference,
                                                                  topn_index):
    loss = traced(losses.LambdaRankLoss(topk=NDCG_TOPNS[topn_index], reduction=None))
    for i, labels, scores in each_batch(batches):
        assert_close(per_list_loss(loss, labels, scores) * labels.shape[1],
                     reference[f"lambdarank_{i}_{topn_index}"], f"batch {i}")


def test_listmle_without_label_ties(batches, reference):
    loss = traced(losses.ListMLELoss(reduction=None))
    for i, _, scores in each_batch(batches):
        labels = batches[f"distinct_labels_{i}"]
        padded = (labels < 0).sum(axis=1)
        tfr_padding_term = np.array([math.lgamma(p + 1.0) for p in padded])
        assert_close(per_list_loss(loss, labels, scores) + tfr_padding_term,
                     reference[f"listmle_{i}"], f"batch {i}")


@traced
def _measure_per_list(name, labels, scores):
    """Returns our per-list value of metric `name` (as in `tfranking_reference`), `[B]`."""
    labels, mask, scores = rank_ops.standardize(labels, scores)
    positions = measures.Positions.exact(scores, mask)
    relevance = rank_ops.binary_relevance(labels, mask, 1.0)
    kind, _, k = name.partition("_")
    if kind == "ndcg":
        value = measures.ndcg(labels, positions, int(k) or None)
    elif kind == "precision":
        value = measures.precision_at_k(relevance, positions, int(k))
    elif kind == "map":
        value = measures.average_precision(relevance, positions)
    else:
        value = measures.reciprocal_rank(relevance, positions)
    return value


def _our_metric(name, empty_lists):
    kind, _, k = name.partition("_")
    if kind == "ndcg":
        return metrics.NDCG(int(k) or None, empty_lists=empty_lists)
    if kind == "precision":
        return metrics.PrecisionAtK(int(k), empty_lists=empty_lists)
    if kind == "map":
        return metrics.MeanAveragePrecision(empty_lists=empty_lists)
    return metrics.MeanReciprocalRank(empty_lists=empty_lists)


def _precision_divisor_ratio(name, labels):
    """Returns k / min(k, #real documents) for `precision_k`, else ones: theirs/ours divisors."""
    kind, _, k = name.partition("_")
    if kind != "precision":
        return np.ones(len(labels))
    k = int(k)
    return k / np.minimum(k, (labels >= 0).sum(axis=1))


METRICS = ([f"ndcg_{k or 0}" for k in NDCG_TOPNS] + ["map", "mrr"]
           + [f"precision_{k}" for k in PRECISION_TOPNS])


@pytest.mark.parametrize("name", METRICS)
def test_metric_per_list(batches, reference, name):
    compared = 0
    for i, labels, scores in each_batch(batches):
        relevant = (labels >= 1).any(axis=1)
        ours = to_numpy(_measure_per_list(name, labels, scores)).astype(np.float64)
        ours = ours * _precision_divisor_ratio(name, labels)
        assert_close(ours[relevant], reference[f"{name}_{i}"][relevant], f"batch {i}")
        compared += relevant.sum()
    assert compared > 500


def batch_result(metric):
    """Returns `result(labels, scores)`: `metric`'s value over that one batch (its state reset
    first), traced as a compiled Keras step runs it (see `traced`)."""
    @traced
    def result(labels, scores):
        metric.reset_state()
        metric.update_state(labels, scores)
        return metric.result()

    return lambda labels, scores: float(to_numpy(result(labels, scores)))


@pytest.mark.parametrize("name", METRICS)
def test_metric_means(batches, reference, name):
    zero, exclude = (batch_result(_our_metric(name, kind)) for kind in ("zero", "exclude"))
    for i, labels, scores in each_batch(batches):
        theirs = reference[f"{name}_{i}"]
        np.testing.assert_array_equal(reference[f"{name}_weight_{i}"], 1.0)
        relevant = (labels >= 1).any(axis=1)
        k = int(name.partition("_")[2] or 0)
        if not name.startswith("precision") or (labels >= 0).sum(axis=1).min() >= k:
            assert_close(zero(labels, scores), reference[f"{name}_result_{i}"],
                         f"batch {i}, empty_lists='zero'")
        if relevant.any():
            ratio = _precision_divisor_ratio(name, labels)[relevant]
            assert_close(exclude(labels, scores), np.mean(theirs[relevant] / ratio),
                         f"batch {i}, empty_lists='exclude'")


# --- TF-Ranking's losses and lambda weights under their own names ---------------------------------
#
# Each case is built on both sides from the same class name and arguments (a migration is a
# rename of the import) and compared per list, value and gradient, on one padded batch: the first
# LOSS_BATCHES batches above, padded to the longest list. Lists whose real labels are all equal
# have no loss in tfapprox (every order of them is ideal) and are left out; the rest compare as
# they are, except where a convention differs (the `convention` column):
# - "size": the DCG-family lambda weights (DCG, NDCG, NDCGLambdaWeightV2, YetiDCG) are scaled by
#   the padded list size L in TF-Ranking and by the real documents n in tfapprox: ours · L/n;
# - "listmle": TF-Ranking's P padded slots add Σ_{k=1}^{P} D(n + k)·ln(P − k + 1) with
#   ListMLELambdaWeight's discount D (ln P! without a weight); added to ours. Its padded slots
#   (logit ln 1e-10) also take a share P·1e-10·e^{−s/T} of the gradient of the last real
#   documents, so ListMLE's gradients compare to 1e-4.
# Softmax is compared before TF-Ranking's reduction, which weighs each list by its labels' sum.
# OrdinalLoss takes logits [B, L, K] (huge on padded slots) and labels with fractions (both
# settings of `use_fraction_label`), and compares as the pointwise losses: the mean over the list.
LOSS_BATCHES = 2 * len(LIST_SIZES)
ORDINAL_SIZE = 4  # OrdinalLoss cases: K logits per document, the first `ordinal_size` of them
LOG2 = "fn:log2_inverse"
LOSS_CASES = [  # name, kind, class, kwargs, lambda weight, its kwargs, convention
    ("softmax", "softmax", "SoftmaxLoss", {}, None, {}, None),
    ("softmax_ndcg5_t05", "softmax", "SoftmaxLoss", {"temperature": 0.5},
     "NDCGLambdaWeight", {"topn": 5}, None),
    ("softmax_dcg", "softmax", "SoftmaxLoss", {}, "DCGLambdaWeight", {"smooth_fraction": 0.3},
     None),
    ("calibrated_softmax", "calibrated", "CalibratedSoftmaxLoss", {}, None, {}, None),
    ("calibrated_softmax_v1_ndcg", "calibrated", "CalibratedSoftmaxLoss", {"virtual_label": 1.0},
     "NDCGLambdaWeight", {}, None),
    ("unique_softmax", "listwise", "UniqueSoftmaxLoss", {}, None, {}, None),
    ("unique_softmax_t2", "listwise", "UniqueSoftmaxLoss", {"temperature": 2.0}, None, {}, None),
    ("hinge", "pairwise", "PairwiseHingeLoss", {}, None, {}, None),
    ("hinge_ndcg3_t2", "pairwise", "PairwiseHingeLoss", {"temperature": 2.0},
     "NDCGLambdaWeight", {"topn": 3}, "size"),
    ("hinge_dcg", "pairwise", "PairwiseHingeLoss", {}, "DCGLambdaWeight",
     {"topn": 5, "normalized": True, "smooth_fraction": 0.5}, "size"),
    ("hinge_yeti", "pairwise", "PairwiseHingeLoss", {}, "YetiDCGLambdaWeight", {}, "size"),
    ("logistic_t05", "pairwise", "PairwiseLogisticLoss", {"temperature": 0.5}, None, {}, None),
    ("logistic_ndcg_v2", "pairwise", "PairwiseLogisticLoss", {}, "NDCGLambdaWeightV2",
     {"topn": 3}, "size"),
    ("logistic_ndcg", "pairwise", "PairwiseLogisticLoss", {}, "NDCGLambdaWeight", {}, "size"),
    ("soft_zero_one", "pairwise", "PairwiseSoftZeroOneLoss", {}, None, {}, None),
    ("soft_zero_one_precision", "pairwise", "PairwiseSoftZeroOneLoss", {"temperature": 0.5},
     "PrecisionLambdaWeight", {"topn": 3}, None),
    ("mse", "pairwise", "PairwiseMSELoss", {}, None, {}, None),
    ("mse_label_diff", "pairwise", "PairwiseMSELoss", {}, "LabelDiffLambdaWeight", {}, None),
    ("sigmoid_cross_entropy", "pointwise", "SigmoidCrossEntropyLoss", {}, None, {}, None),
    ("mean_squared", "pointwise", "MeanSquaredLoss", {}, None, {}, None),
    ("ordinal", "pointwise", "OrdinalLoss", {"ordinal_size": ORDINAL_SIZE}, None, {}, None),
    ("ordinal_k3_fraction", "pointwise", "OrdinalLoss",
     {"ordinal_size": 3, "use_fraction_label": True}, None, {}, None),
    ("approx_mrr", "listwise", "ApproxMRRLoss", {}, None, {}, None),
    ("approx_mrr_t05", "listwise", "ApproxMRRLoss", {"temperature": 0.5}, None, {}, None),
    ("approx_ndcg_t05", "listwise", "ApproxNDCGLoss", {"temperature": 0.5}, None, {}, None),
    ("listmle_t05", "listwise", "ListMLELoss", {"temperature": 0.5}, None, {}, "listmle"),
    ("listmle_weighted", "listwise", "ListMLELoss", {}, "ListMLELambdaWeight",
     {"rank_discount_fn": LOG2}, "listmle"),
]
GUMBEL_SAMPLES = 2000
GUMBEL_CASES = [  # name, class, kwargs
    ("approx_ndcg", "GumbelApproxNDCGLoss", {}),
    ("approx_ndcg_t05_g05", "GumbelApproxNDCGLoss", {"temperature": 0.5,
                                                     "gumbel_temperature": 0.5}),
    ("yeti", "YetiLogisticLoss", {}),
    ("yeti_t05_g2", "YetiLogisticLoss", {"temperature": 0.5, "gumbel_temperature": 2.0}),
    ("rankdistil", "CoupledRankDistilLoss", {}),
    ("rankdistil_top3_t05", "CoupledRankDistilLoss", {"topk": 3, "temperature": 0.5}),
]


def _padded(arrays, width, fill):
    return np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill)
                           for a in arrays])


def loss_case_inputs(batches, rng):
    """The inputs of the loss cases: one padded batch and the Gumbel batch (no padding, every
    list with two different labels)."""
    chosen = range(LOSS_BATCHES)
    width = max(batches[f"labels_{i}"].shape[1] for i in chosen)
    gumbel_labels = rng.integers(0, 3, size=(8, 10)).astype(np.float32)
    gumbel_labels[:, 0], gumbel_labels[:, 1] = 2.0, 0.0
    found = {
        "loss_cases": np.array(json.dumps([case[:6] for case in LOSS_CASES])),
        "loss_labels": _padded([batches[f"labels_{i}"] for i in chosen], width, -1.0),
        "loss_distinct_labels": _padded([batches[f"distinct_labels_{i}"] for i in chosen],
                                        width, -1.0),
        "loss_scores": _padded([batches[f"scores_{i}"] for i in chosen], width, 0.0),
        "gumbel_cases": np.array(json.dumps([[name, cls, {**kwargs, "sample_size": GUMBEL_SAMPLES}]
                                             for name, cls, kwargs in GUMBEL_CASES])),
        "gumbel_labels": gumbel_labels,
        "gumbel_scores": rng.normal(size=(8, 10)).astype(np.float32),
    }
    # OrdinalLoss: half the real labels get a fraction; padded logits are huge.
    labels = found["loss_labels"]
    fractions = np.where(rng.random(labels.shape) < 0.5, rng.uniform(size=labels.shape), 0.0)
    found["loss_ordinal_labels"] = np.where(labels >= 0, labels + fractions, -1.0).astype(
        np.float32)
    logits = rng.normal(scale=2.0, size=(*labels.shape, ORDINAL_SIZE))
    found["loss_ordinal_scores"] = np.where(labels[..., None] >= 0, logits,
                                            rng.normal(scale=1e3, size=logits.shape)).astype(
                                                np.float32)
    return found


def _resolved(kwargs):
    return {key: getattr(lambda_weights, value[3:])
            if isinstance(value, str) and value.startswith("fn:") else value
            for key, value in kwargs.items()}


def our_loss(cls, kwargs, weight_cls, weight_kwargs):
    """Our loss of a case, built from TF-Ranking's class and argument names."""
    kwargs = _resolved(kwargs)
    if weight_cls:
        kwargs["lambda_weight"] = getattr(losses, weight_cls)(**_resolved(weight_kwargs))
    return getattr(losses, cls)(reduction=None, **kwargs)


def _listmle_padding_terms(labels, weight_cls):
    """TF-Ranking's ListMLE terms of the padded slots (see the case conventions), per list."""
    terms = []
    for row in labels:
        n, padded = int((row >= 0).sum()), int((row < 0).sum())
        discount = (lambda p: 1.0 / math.log2(1.0 + p)) if weight_cls else (lambda p: 1.0)
        terms.append(sum(discount(n + k) * math.log(padded - k + 1)
                         for k in range(1, padded + 1)))
    return np.array(terms)


@pytest.mark.parametrize("case", LOSS_CASES, ids=[case[0] for case in LOSS_CASES])
def test_loss_per_list_value_and_gradient(batches, reference, case):
    name, _, cls, kwargs, weight_cls, weight_kwargs, convention = case
    labels, scores = batches["loss_labels"], batches["loss_scores"]
    if cls == "ListMLELoss":
        labels = batches["loss_distinct_labels"]
    elif cls == "OrdinalLoss":  # logits [B, L, ordinal_size]
        labels = batches["loss_ordinal_labels"]
        scores = batches["loss_ordinal_scores"][..., :kwargs["ordinal_size"]]
    loss = our_loss(cls, kwargs, weight_cls, weight_kwargs)
    values = per_list_loss(loss, labels, scores)
    _, grad = loss_and_grad(lambda y, s: loss(y, s), labels, scores)
    real = labels >= 0
    compared = to_numpy(rank_ops.has_label_pairs(np.where(real, labels, 0.0), real))
    scale = np.ones(len(labels))
    if convention == "size":
        scale = labels.shape[1] / real.sum(axis=1)
    values = values * scale
    if convention == "listmle":
        values = values + _listmle_padding_terms(labels, weight_cls)
    assert compared.sum() > 100
    assert_close(values[compared], reference[f"case_{name}"][compared], f"{name} values")
    theirs = reference[f"case_{name}_grad"]
    atol = 1e-4 if convention == "listmle" else 1e-5
    for row in np.flatnonzero(compared):
        np.testing.assert_allclose(grad[row][real[row]] * scale[row], theirs[row][real[row]],
                                   rtol=1e-4, atol=atol, err_msg=f"{name} gradient, list {row}")


@pytest.mark.parametrize("case", GUMBEL_CASES, ids=[case[0] for case in GUMBEL_CASES])
def test_gumbel_sampled_loss_has_tfrankings_expectation(batches, reference, case):
    """Both average GUMBEL_SAMPLES samples per list (TF-Ranking's from tf.random, ours hashed):
    the two means agree within 5 standard errors of their difference (TF-Ranking's values are
    its samples, or for RankDistil equal-sized means of them)."""
    name, cls, kwargs = case
    theirs = reference[f"gumbel_{name}"]
    loss = getattr(losses, cls)(sample_size=GUMBEL_SAMPLES, seed=3, reduction=None, **kwargs)
    ours = per_list_loss(loss, batches["gumbel_labels"], batches["gumbel_scores"])
    error = 5 * math.sqrt(2) * theirs.std(axis=1) / math.sqrt(theirs.shape[1])
    assert np.all(np.abs(ours - theirs.mean(axis=1)) <= error + 1e-4), (ours, theirs.mean(1))
def _pair_counts(labels):
    """#{(i, j) real: y_i > y_j} per list."""
    real = labels >= 0
    upper = np.where(real, labels, -np.inf)[:, :, None]
    lower = np.where(real, labels, np.inf)[:, None, :]
    return np.sum(upper > lower, axis=(1, 2)).astype(np.float64)


def _precision_ia_divisor_ratio(labels, k):
    return np.ones(len(labels)) if k is None else k / np.minimum(k, (labels >= 0).sum(axis=1))


# Our metric, and per list: TF-Ranking's list weight (None: 1) and theirs/ours value ratio.
NEW_METRICS = {
    "recall": (metrics.Recall, None, None), "hits": (metrics.Hits, None, None),
    "dcg": (metrics.DCG, None, None), "map": (lambda **kw: metrics.MeanAveragePrecision(**kw),
                                              None, None),
    "mrr": (lambda **kw: metrics.MeanReciprocalRank(**kw), None, None),
    "arp": (metrics.ARP, lambda labels: np.where(labels >= 0, labels, 0).sum(axis=1), None),
    "opa": (metrics.OPA, _pair_counts, None),
    "alpha_dcg": (metrics.AlphaDCG, None, None),
    "precision_ia": (metrics.PrecisionIA, None, _precision_ia_divisor_ratio),
}
NEW_METRIC_NAMES = [name if name in ("arp", "opa") else f"{name}_{k or 0}"
                    for name in NEW_METRICS for k in ((None,) if name in ("arp", "opa")
                                                       else CUTOFF_TOPNS)]


@pytest.mark.parametrize("name", NEW_METRIC_NAMES)
def test_new_metric_per_list_and_mean(batches, reference, name):
    """Our metric's per-list values where it counts a list (elsewhere TF-Ranking's are 0 or
    weighted 0), TF-Ranking's list weights, and its `"zero"` mean against TF-Ranking's result.
    Pre-IA@k divides by k, TF-Ranking's by min(k, #real documents): the ratio is applied, and the
    means are compared on batches whose lists all have ≥ k real documents."""
    base, _, k = name.rpartition("_") if name[-1].isdigit() else (name, "", "")
    make, their_weights, ratio = NEW_METRICS[base]
    cutoff = {"topn": int(k) or None} if k else {}
    ours, zero = make(**cutoff), batch_result(make(empty_lists="zero", **cutoff))
    subtopic = base in ("alpha_dcg", "precision_ia")
    compared = 0
    for i in range(NEW_METRIC_BATCHES):
        labels, scores = batches[f"labels_{i}"], batches[f"scores_{i}"]
        given = batches[f"subtopics_{i}"] if subtopic else labels
        values, counted = (to_numpy(x) for x in ours.per_list(given, scores))
        scale = np.ones(len(labels)) if ratio is None else ratio(labels, cutoff.get("topn"))
        theirs = reference[f"{name}_{i}"]
        assert_close(values[counted] * scale[counted], theirs[counted], f"batch {i}")
        expected_weights = np.ones(len(labels)) if their_weights is None else their_weights(labels)
        assert_close(reference[f"{name}_weight_{i}"], expected_weights, f"batch {i} weights")
        assert np.all(theirs[~counted] * reference[f"{name}_weight_{i}"][~counted] == 0)
        if ratio is None or np.all(scale == 1):
            assert_close(zero(given, scores), reference[f"{name}_result_{i}"],
                         f"batch {i}, empty_lists='zero'")
        compared += counted.sum()
    assert compared > 150


def test_the_migration_guide_lists_tfrankings_own_keras_metrics(reference):
    from test_migrating_metrics import TFR_KERAS_METRICS

    assert sorted(reference["keras_metric_classes"]) == sorted(TFR_KERAS_METRICS)
