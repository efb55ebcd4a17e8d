"""Writes TF-Ranking 0.5.5's loss and metric values for a set of ranking batches.

Run with the side virtualenv's python (`.ci/tfranking-venv` prints it), not the project's:

    python tests/tfranking_reference.py INPUTS.npz OUTPUTS.npz

INPUTS.npz holds `num_batches`; for each batch i, `labels_i` and `scores_i` (float32 [B, L],
label −1 on padded slots) and `distinct_labels_i` (the same padding, no tied labels within a
list, for ListMLE); and the settings `alphas` (ApproxNDCG slopes, temperature = 1/alpha),
`ndcg_topns` (0 = whole list) and `precision_topns`; for the batches i < `num_new_metric_batches`,
`subtopics_i` (float32 [B, L, T], 0/1 per subtopic on real documents, −1 on every subtopic of a
padded one), and `cutoff_topns` (0 = whole list), the cut-offs of the metrics listed last below.

OUTPUTS.npz holds, per batch i, TF-Ranking's raw values — no normalisation is undone here, so
the caller states and applies every convention:

- `approx_ndcg_i_j` [B]: `ApproxNDCGLoss(temperature=1/alphas[j], reduction=NONE)`, whose
  unreduced output is [B, 1] (0 on lists without a positive label).
- `pairwise_logistic_i` [B]: `PairwiseLogisticLoss(reduction=NONE)` returns [B, L], the pair
  losses already summed over the lower document; this is its sum over the list.
- `listmle_i` [B]: `ListMLELoss(reduction=NONE)` on `distinct_labels_i` ([B, 1] unreduced).
- `lambdarank_i_j` [B]: `PairwiseLogisticLoss(lambda_weight=NDCGLambdaWeight(topn=ndcg_topns[j],
  smooth_fraction=1.0), reduction=NONE)` summed over the list, as `pairwise_logistic_i`.
- For each metric `ndcg_k` (k from `ndcg_topns`), `map`, `mrr`, `precision_k`:
  `{metric}_i` [B] the per-list values and `{metric}_weight_i` [B] the per-list weights, both
  from the Keras metric's own `_metric.compute` (the values its `Mean` averages), and
  `{metric}_result_i` the Keras metric's result on the batch (its `update_state` feeds exactly
  these values and weights to `tf.keras.metrics.Mean`).
- The same three outputs, for the batches i < `num_new_metric_batches`, of `recall_k`,
  `hits_k`, `dcg_k`, `map_k`, `mrr_k`, `alpha_dcg_k`, `precision_ia_k` (k from `cutoff_topns`;
  the last two on `subtopics_i`), `arp` and `opa`.

It also stores `versions`, the TensorFlow and TF-Ranking versions it ran with, and
`keras_metric_classes`, the names of `tfr.keras.metrics`' metric classes.

With `loss_cases` (a JSON list of `[name, kind, class, kwargs, lambda_weight class or null,
lambda_weight kwargs]`, a string kwarg `"fn:NAME"` naming `tfr.keras.utils.NAME`), `loss_labels`,
`loss_scores` and `loss_distinct_labels` (one padded batch), it also writes for each case
`case_{name}` [B], TF-Ranking's per-list value, and `case_{name}_grad` [B, L], the gradient of
their sum with respect to the scores. What a per-list value is depends on `kind`: "pairwise" and
"pointwise" sum the unreduced [B, L] loss over the list ("pointwise" then divides by the real
documents), "listwise" takes the unreduced [B, 1], and "softmax" `_loss.compute_per_list` (its
cross-entropy before its reduction weighs the list by its labels' sum), "calibrated" the same
after appending the virtual document as `CalibratedSoftmaxLoss.__call__` does. ListMLE cases use
`loss_distinct_labels`; OrdinalLoss cases `loss_ordinal_labels` (with fractions) and the first
`ordinal_size` of the logits `loss_ordinal_scores` [B, L, K], their gradient [B, L, ordinal_size]. With `gumbel_cases` (a JSON list of `[name, class, kwargs]`, kwargs with
`sample_size` S) and `gumbel_labels`, `gumbel_scores`, it writes `gumbel_{name}` [B, S], each
list's S sampled losses (the unreduced loss summed over the list); for `CoupledRankDistilLoss`,
which averages its samples itself, [B, RANKDISTIL_CALLS] means of S/RANKDISTIL_CALLS samples.
"""

import json

import importlib.metadata
import sys

import numpy as np
import tensorflow as tf
import tensorflow_ranking as tfr

NONE = tf.keras.losses.Reduction.NONE
RANKDISTIL_CALLS = 20


def metrics_under_test(ndcg_topns, precision_topns):
    """Returns {output name: TF-Ranking Keras metric}."""
    found = {f"ndcg_{k}": tfr.keras.metrics.NDCGMetric(topn=k or None) for k in ndcg_topns}
    found["map"] = tfr.keras.metrics.MeanAveragePrecisionMetric()
    found["mrr"] = tfr.keras.metrics.MRRMetric()
    for k in precision_topns:
        found[f"precision_{k}"] = tfr.keras.metrics.PrecisionMetric(topn=k)
    return found


# The metrics of the batches i < num_new_metric_batches: name → (class, takes a cut-off).
NEW_METRICS = {
    "recall": (tfr.keras.metrics.RecallMetric, True), "hits": (tfr.keras.metrics.HitsMetric, True),
    "dcg": (tfr.keras.metrics.DCGMetric, True),
    "map": (tfr.keras.metrics.MeanAveragePrecisionMetric, True),
    "mrr": (tfr.keras.metrics.MRRMetric, True), "arp": (tfr.keras.metrics.ARPMetric, False),
    "opa": (tfr.keras.metrics.OPAMetric, False),
    "alpha_dcg": (tfr.keras.metrics.AlphaDCGMetric, True),
    "precision_ia": (tfr.keras.metrics.PrecisionIAMetric, True),
}
SUBTOPIC_METRICS = ("alpha_dcg", "precision_ia")


def new_metrics_under_test(cutoff_topns):
    """Returns {output name: TF-Ranking Keras metric} for the metrics of `NEW_METRICS`."""
    found = {}
    for name, (cls, takes_topn) in NEW_METRICS.items():
        for k in (cutoff_topns if takes_topn else [None]):
            found[name if k is None else f"{name}_{k}"] = (
                cls(topn=int(k) or None) if takes_topn else cls())
    return found


def compute(metric, labels, scores, mean):
    """Returns (per-list values, per-list weights, result) of `metric` on one batch: what
    `metric.update_state(labels, scores)` does, without its per-call autograph conversion
    (which takes most of the time): compute, then a weighted `Mean`."""
    values, weights = metric._metric.compute(labels, scores, None)
    mean.reset_state()
    mean.update_state(values, sample_weight=weights)
    return per_list(values), per_list(weights), np.float64(mean.result().numpy())


def per_list(values):
    return np.asarray(values, dtype=np.float64).reshape(-1)


def reference_values(inputs):
    """Returns {output name: array} for the batches in `inputs` (see the module docstring)."""
    alphas = inputs["alphas"]
    approx_ndcg = [tfr.keras.losses.ApproxNDCGLoss(temperature=1.0 / float(a), reduction=NONE)
                   for a in alphas]
    pairwise = tfr.keras.losses.PairwiseLogisticLoss(reduction=NONE)
    listmle = tfr.keras.losses.ListMLELoss(reduction=NONE)
    lambdarank = [tfr.keras.losses.PairwiseLogisticLoss(
        reduction=NONE, lambda_weight=tfr.keras.losses.NDCGLambdaWeight(
            topn=int(k) or None, smooth_fraction=1.0)) for k in inputs["ndcg_topns"]]
    metrics = metrics_under_test(inputs["ndcg_topns"], inputs["precision_topns"])
    new_metrics = new_metrics_under_test(inputs["cutoff_topns"])
    mean = tf.keras.metrics.Mean()
    out = {}
    for i in range(int(inputs["num_batches"])):
        labels = tf.constant(inputs[f"labels_{i}"], tf.float32)
        scores = tf.constant(inputs[f"scores_{i}"], tf.float32)
        for j, loss in enumerate(approx_ndcg):
            out[f"approx_ndcg_{i}_{j}"] = per_list(loss(labels, scores))
        unreduced = pairwise(labels, scores)
        assert unreduced.shape == labels.shape, unreduced.shape
        out[f"pairwise_logistic_{i}"] = per_list(tf.reduce_sum(unreduced, axis=1))
        for j, loss in enumerate(lambdarank):
            out[f"lambdarank_{i}_{j}"] = per_list(tf.reduce_sum(loss(labels, scores), axis=1))
        distinct = tf.constant(inputs[f"distinct_labels_{i}"], tf.float32)
        out[f"listmle_{i}"] = per_list(listmle(distinct, scores))
        for name, metric in metrics.items():
            out[f"{name}_{i}"], out[f"{name}_weight_{i}"], out[f"{name}_result_{i}"] = compute(
                metric, labels, scores, mean)
        if i >= int(inputs["num_new_metric_batches"]):
            continue
        subtopics = tf.constant(inputs[f"subtopics_{i}"], tf.float32)
        for name, metric in new_metrics.items():
            given = subtopics if name.startswith(SUBTOPIC_METRICS) else labels
            out[f"{name}_{i}"], out[f"{name}_weight_{i}"], out[f"{name}_result_{i}"] = compute(
                metric, given, scores, mean)
    out["keras_metric_classes"] = np.array(sorted(
        name for name, value in vars(tfr.keras.metrics).items() if isinstance(value, type)
        and issubclass(value, tf.keras.metrics.Metric) and not name.startswith("_")))
    if "loss_cases" in inputs:
        out.update(loss_case_values(inputs))
    out["versions"] = np.array([importlib.metadata.version("tensorflow"),
                                importlib.metadata.version("tensorflow-ranking")])
    return out


def _resolved(kwargs):
    return {key: getattr(tfr.keras.utils, value[3:])
            if isinstance(value, str) and value.startswith("fn:") else value
            for key, value in kwargs.items()}


def _build(cls, kwargs, weight_cls, weight_kwargs):
    kwargs = _resolved(kwargs)
    if weight_cls:
        kwargs["lambda_weight"] = getattr(tfr.keras.losses, weight_cls)(
            **_resolved(weight_kwargs))
    return getattr(tfr.keras.losses, cls)(reduction=NONE, **kwargs)


def _per_list(loss, kind, labels, scores):
    if kind == "calibrated":  # what its __call__ does before SoftmaxLoss's
        column = tf.ones_like(labels[:, :1])
        labels = tf.concat([labels, loss._virtual_label * column], axis=1)
        scores = tf.concat([scores, 0.0 * column], axis=1)
        kind = "softmax"
    if kind == "softmax":
        return loss._loss.compute_per_list(labels, scores, None)[0]
    values = loss(labels, scores)
    if kind == "pointwise":
        real = tf.reduce_sum(tf.cast(labels >= 0, tf.float32), axis=1)
        return tf.math.divide_no_nan(tf.reduce_sum(values, axis=1), real)
    return tf.reshape(tf.reduce_sum(values, axis=1), [-1])


def case_inputs(inputs, cls, kwargs):
    """Returns the (labels, scores) of a loss case (see the module docstring)."""
    if cls == "OrdinalLoss":
        return (inputs["loss_ordinal_labels"],
                inputs["loss_ordinal_scores"][..., :kwargs["ordinal_size"]])
    return (inputs["loss_distinct_labels" if cls == "ListMLELoss" else "loss_labels"],
            inputs["loss_scores"])


def loss_case_values(inputs):
    """Returns {`case_{name}`, `case_{name}_grad`, `gumbel_{name}`} (see the module docstring)."""
    out = {}
    for name, kind, cls, kwargs, weight_cls, weight_kwargs in json.loads(str(inputs["loss_cases"])):
        loss = _build(cls, kwargs, weight_cls, weight_kwargs)
        labels, scores = (tf.constant(x, tf.float32) for x in case_inputs(inputs, cls, kwargs))
        with tf.GradientTape() as tape:
            tape.watch(scores)
            values = _per_list(loss, kind, labels, scores)
            total = tf.reduce_sum(values)
        out[f"case_{name}"] = per_list(values)
        out[f"case_{name}_grad"] = tape.gradient(total, scores).numpy()
    labels = tf.constant(inputs["gumbel_labels"], tf.float32)
    scores = tf.constant(inputs["gumbel_scores"], tf.float32)
    for name, cls, kwargs in json.loads(str(inputs["gumbel_cases"])):
        if cls == "CoupledRankDistilLoss":  # it returns the mean of its samples: 20 means
            kwargs = {**kwargs, "sample_size": kwargs["sample_size"] // RANKDISTIL_CALLS}
            loss = tfr.keras.losses.CoupledRankDistilLoss(reduction=NONE, **kwargs)
            out[f"gumbel_{name}"] = np.concatenate(
                [loss(labels, scores).numpy() for _ in range(RANKDISTIL_CALLS)], axis=1)
            continue
        values = getattr(tfr.keras.losses, cls)(reduction=NONE, **kwargs)(labels, scores)
        out[f"gumbel_{name}"] = np.reshape(tf.reduce_sum(values, axis=1).numpy(),
                                           (labels.shape[0], kwargs["sample_size"]))
    return out


def main(argv):
    if len(argv) != 3:
        sys.exit(f"usage: {argv[0]} INPUTS.npz OUTPUTS.npz")
    with np.load(argv[1]) as inputs:
        out = reference_values(inputs)
    np.savez(argv[2], **out)


if __name__ == "__main__":
    main(sys.argv)
