"""Every registered loss, metric and layer trains through `model.fit` on batches whose list
dimension is `None` and changes from batch to batch — the shape whole LETOR lists have in the
trainer — as a graph function and under XLA (TensorFlow), or jit (JAX). Eager execution has no
`None` list dimension (every eager tensor has its size), and each loss runs op by op eagerly in
tests/test_losses.py, so no eager fit here but the list weights' eager refusal."""

import keras
import numpy as np
import pytest

from conftest import COMPILE_MODES, registered, registered_losses_in_modes, to_numpy
from tfapprox import losses, metrics, models, pair_plan
from tfapprox.ensemble import ScoreEnsemble

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

NUM_FEATURES = 5
# One batch each; the list dimension changes from batch to batch, and back (under XLA each size
# is a compile of its own, so two sizes).
LIST_SIZES = (4, 12, 4, 12)


def variable_length_batches(seed=0, batch=4):
    """Yields ({"features", "mask"}, labels) batches of different list sizes, with padded slots
    (label −1) and a list without any relevant document in each batch."""
    rng = np.random.default_rng(seed)
    for list_size in LIST_SIZES:
        features = rng.normal(size=(batch, list_size, NUM_FEATURES)).astype(np.float32)
        labels = np.digitize(features[..., 0], [0.0, 1.0]).astype(np.float32)
        labels[0] = 0.0
        labels[1:, list_size // 2:][rng.random((batch - 1, list_size - list_size // 2)) < 0.4] = -1
        yield {"features": features, "mask": labels >= 0}, labels


def dataset(batches=variable_length_batches, weight_shape=None):
    """The batches as the trainer feeds them: a tf.data pipeline with a `None` list dimension
    (and sample weights of `weight_shape`, if the batches carry them)."""
    import tensorflow as tf

    spec = ({"features": tf.TensorSpec((None, None, NUM_FEATURES), tf.float32),
             "mask": tf.TensorSpec((None, None), tf.bool)},
            tf.TensorSpec((None, None), tf.float32))
    if weight_shape is not None:
        spec += (tf.TensorSpec(weight_shape, tf.float32),)
    return tf.data.Dataset.from_generator(batches, output_signature=spec)


INPUT_SHAPES = {"features": (None, None, NUM_FEATURES), "mask": (None, None)}


def fit(loss, mode, metric_list=(), data=None, callbacks=()):
    """Trains a scorer built beforehand, as the trainer builds it (an unbuilt model creates its
    variables in the first trace of the train step, which TensorFlow then traces again)."""
    keras.utils.set_random_seed(1)
    model = models.DNNScorer(hidden_units=(8, 4))
    model.build(INPUT_SHAPES)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss, metrics=list(metric_list),
                  run_eagerly=mode == "eager", jit_compile=mode in ("xla", "jit"))
    history = model.fit(dataset() if data is None else data, epochs=1, verbose=0,
                        callbacks=list(callbacks))
    return model, history.history


def with_nan_feature():
    """The batches, with a NaN feature (so a NaN score) on a real document of the second."""
    for index, (inputs, labels) in enumerate(variable_length_batches()):
        if index == 1:
            inputs["features"][2, 0, 0] = np.nan
        yield inputs, labels


def with_equal_labels():
    """The batches with every list's real labels replaced by one label (0, 1, 2 or 3)."""
    for inputs, labels in variable_length_batches():
        equal = np.arange(len(labels), dtype=np.float32)[:, None] * np.ones_like(labels)
        yield inputs, np.where(labels >= 0, equal, -1.0)


def with_list_weights(weights):
    """The batches with `weights(batch, list_size)` as their sample weights."""
    def batches():
        for inputs, labels in variable_length_batches():
            yield inputs, labels, weights(*labels.shape)

    return batches


def test_every_registered_loss_is_selectable_by_name():
    assert {type(loss) for loss in registered(keras.losses.Loss)} == set(losses.LOSSES.values())


def untrained_scorer():
    keras.utils.set_random_seed(1)
    scorer = models.DNNScorer(hidden_units=(8, 4))
    scorer.build(INPUT_SHAPES)
    return scorer


# Compiled: the trainer's default (a graph function), and XLA, Keras' default on TensorFlow.
FIT_MODES = [mode for mode in COMPILE_MODES if mode != "eager"]
# Compiled by XLA (what the trainer runs), a model also shows, on the batches it has compiled for,
# behaviour every loss shares (checked op by op in every mode in test_losses.py): lists whose labels
# are all equal give loss 0 and no gradient, and a NaN score stops training.
XLA_MODES = [mode for mode in COMPILE_MODES if mode in ("xla", "jit")]


# Every registered metric updates in the fit of this loss (a fit of its own would compile the
# loss a second time).
METRICS_WITH = losses.ApproxNDCGLoss


# Losses whose train step, traced for a `None` list size, makes no compile-mode choice: the code
# asks whether XLA compiles it only through `pair_plan.xla_path`, so traced as a graph function
# they run the same Python and build the same ops as under XLA (their XLA fit checks that they
# make none), and the TensorFlow kernels of those ops run op by op in tests/test_losses.py. They
# train under XLA only, as conftest.SKELETON_VARIANTS do (the trainer's mode; jit on JAX); every
# other loss also as a graph function, where its fit checks that it takes a path of its own.
NO_COMPILE_MODE_CHOICE = {"ListMLELoss", "SoftmaxLoss", "UniqueSoftmaxLoss",
                          "CoupledRankDistilLoss", "PairwiseHingeLoss", "SigmoidCrossEntropyLoss",
                          "SVMMapLoss", "PermuRankLoss"}
LOSSES_IN_FIT_MODES = [param for param in registered_losses_in_modes(FIT_MODES, XLA_MODES)
                       if param.values[1] in XLA_MODES
                       or type(param.values[0]).__name__ not in NO_COMPILE_MODE_CHOICE]


def compile_mode_choices(paths):
    """The `pair_plan.xla_path` choices among paths recorded by `pair_plan.recording_paths`."""
    return {path for path in paths if path.endswith((": XLA", ": no XLA"))}


class RecordingPaths(keras.losses.Loss):
    """`loss` as Keras calls it, keeping the `pair_plan` choices it makes when traced."""

    def __init__(self, loss):
        super().__init__(name=loss.name)
        self.loss, self.paths = loss, []

    def __call__(self, y_true, y_pred, sample_weight=None):
        with pair_plan.recording_paths() as paths:
            value = self.loss(y_true, y_pred, sample_weight)
        self.paths.extend(paths)
        return value


class ScaledScores(keras.layers.Layer):
    """`a · scores` with a learnt scalar `a` (initially 1): one loss's own copy of shared scores,
    moved by that loss's gradient alone."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

    def call(self, scores):
        return self.scale * scores


class ScorerOfManyLosses(keras.Model):
    """One scorer, built beforehand as the trainer builds it, and a `ScaledScores` output per
    loss: one compiled train step (one trace of the scorer, one XLA compile per list size) trains
    every loss, each with its own output, `<name>_loss` value and scale."""

    def __init__(self, names):
        super().__init__()
        self.scorer = untrained_scorer()
        self.names = list(names)
        self.scales = [ScaledScores(name=f"{name}_scale") for name in self.names]
        for scale in self.scales:
            scale.build(None)
        self.build(INPUT_SHAPES)

    def call(self, inputs, training=False):
        scores = self.scorer(inputs, training=training)
        return {name: scale(scores) for name, scale in zip(self.names, self.scales)}


def fit_every_loss(named_losses, mode, metrics_of):
    """Trains `ScorerOfManyLosses` on `named_losses` {output name: loss}, `metrics_of` {output
    name: metrics}: returns the model and a function of batches that fits them (labels to every
    output) and returns the history."""
    model = ScorerOfManyLosses(named_losses)
    # Each loss weighs 1/n: the scorer steps as far as with one loss, which keeps the scale of the
    # mean squared loss, say, from diverging on scores that the pairwise losses spread apart.
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=named_losses, metrics=metrics_of,
                  loss_weights={name: 1.0 / len(named_losses) for name in named_losses},
                  jit_compile=mode in ("xla", "jit"))
    # Keras on TensorFlow builds the compiled loss (a `<name>_loss` mean per loss) in the first
    # trace of the train step, and TensorFlow traces a step that created variables again: built
    # here, the step of every loss is traced once.
    outputs = {name: keras.KerasTensor((None, None)) for name in named_losses}
    model._compile_loss.build(outputs, outputs)

    def fit_on(batches, callbacks=()):
        data = dataset(batches).map(lambda inputs, labels: (
            inputs, {name: labels for name in named_losses}))
        return model.fit(data, epochs=1, verbose=0, callbacks=list(callbacks)).history

    return model, fit_on


# The losses each mode's fit trains, by name.
LOSSES_BY_MODE = {mode: {type(param.values[0]).__name__: param.values[0]
                         for param in LOSSES_IN_FIT_MODES if param.values[1] == mode}
                  for mode in FIT_MODES}


@pytest.mark.parametrize("mode", FIT_MODES)
def test_every_loss_trains_on_variable_length_lists(mode):
    """Every loss of the mode through one fit of one scorer (see `ScorerOfManyLosses`): each
    loss's value, scale and traced choices are its own, and a failure names each loss that
    failed."""
    recorded = {name: RecordingPaths(loss) for name, loss in LOSSES_BY_MODE[mode].items()}
    metrics_of = {METRICS_WITH.__name__: registered(keras.metrics.Metric)}
    model, fit_on = fit_every_loss(recorded, mode, metrics_of)
    history = fit_on(variable_length_batches)
    failures = []

    def expect(ok, name, what):
        if not ok:
            failures.append(f"{name}: {what}")

    unbounded = (metrics.DCG, metrics.AlphaDCG, metrics.ARP)  # sums of gains; a mean position
    for (name, loss), scale in zip(recorded.items(), model.scales):
        if mode == "xla" and name in NO_COMPILE_MODE_CHOICE:
            expect(not compile_mode_choices(loss.paths), name, "it needs its graph-mode fit back")
        if mode == "graph":
            expect(compile_mode_choices(loss.paths), name, "its graph-mode fit repeats its XLA fit")
        values = history[f"{name}_loss"]
        # not 0 either: a `<name>_loss` that was never updated reads 0, as with equal labels
        expect(len(values) == 1 and np.isfinite(values[0]) and values[0] != 0.0, name,
               f"loss {values}")
        moved = float(to_numpy(scale.scale))
        expect(np.isfinite(moved) and moved != 1.0, name,
               f"no gradient reached its scores (scale {moved})")
        for metric in metrics_of.get(name, []):
            values = history[f"{name}_{metric.name}"]
            upper = np.inf if isinstance(metric, unbounded) else 1.0
            expect(np.all(np.isfinite(values)) and 0.0 < values[-1] <= upper, name,
                   f"metric {metric.name} {values}")
    assert not failures, "\n".join(failures)
    assert len(history["loss"]) == 1 and np.all(np.isfinite(history["loss"]))
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    assert not np.allclose(to_numpy(model.scorer.hidden_dense[0].kernel),
                           to_numpy(untrained_scorer().hidden_dense[0].kernel)), (
        "no gradient reached the scorer")
    if mode not in XLA_MODES:
        return

    # SGD without momentum: no gradient, no step (batch-norm statistics move, as they do anyway)
    before = [to_numpy(w) for w in model.trainable_weights]
    scales = [float(to_numpy(scale.scale)) for scale in model.scales]
    equal = fit_on(with_equal_labels)
    for name, scale, was in zip(recorded, model.scales, scales):
        expect(equal[f"{name}_loss"] == [0.0], name, f"equal labels: loss {equal[f'{name}_loss']}")
        expect(float(to_numpy(scale.scale)) == was, name, "equal labels: a gradient")
    assert not failures, "\n".join(failures)
    assert equal["loss"] == [0.0]
    for after, weight in zip(model.trainable_weights, before):
        np.testing.assert_array_equal(to_numpy(after), weight, err_msg=after.path)

    with_nan = fit_on(with_nan_feature, [keras.callbacks.TerminateOnNaN()])
    for name in recorded:
        expect(np.isnan(with_nan[f"{name}_loss"][0]), name, "a NaN score left the loss finite")
    assert not failures, "\n".join(failures)
    assert np.isnan(with_nan["loss"][0])


# Every lambda weight, through a loss that takes it (the registered defaults have none).
LAMBDA_WEIGHTED = [
    losses.SoftmaxLoss(lambda_weight=losses.NDCGLambdaWeight(topn=3)),
    losses.PairwiseLogisticLoss(lambda_weight=losses.NDCGLambdaWeightV2(topn=3)),
    losses.PairwiseHingeLoss(lambda_weight=losses.DCGLambdaWeight(normalized=True,
                                                                  smooth_fraction=0.5)),
    losses.PairwiseSoftZeroOneLoss(lambda_weight=losses.PrecisionLambdaWeight(topn=2)),
    losses.PairwiseMSELoss(lambda_weight=losses.LabelDiffLambdaWeight()),
    losses.ListMLELoss(lambda_weight=losses.ListMLELambdaWeight()),
    losses.YetiLogisticLoss(lambda_weight=losses.YetiDCGLambdaWeight(topn=2, normalized=True)),
]


class SumOfLosses(keras.losses.Loss):
    """The sum of several losses' reduced values: one compiled model trains them all."""

    def __init__(self, parts):
        super().__init__(name="sum_of_losses")
        self.parts = parts

    def __call__(self, y_true, y_pred, sample_weight=None):
        return sum(part(y_true, y_pred, sample_weight) for part in self.parts)


@pytest.mark.parametrize("mode", XLA_MODES)
def test_every_lambda_weight_trains_on_variable_length_lists(mode):
    model, history = fit(SumOfLosses(LAMBDA_WEIGHTED), mode)
    assert np.all(np.isfinite(history["loss"])) and history["loss"][0] > 0
    assert not np.allclose(to_numpy(model.hidden_dense[0].kernel),
                           to_numpy(untrained_scorer().hidden_dense[0].kernel))


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_list_weights_must_be_one_per_list_and_not_negative(mode):
    """[B, L] weights are refused when traced; a negative weight eagerly, and traced (where
    its value is unknown) it makes the loss and the metric NaN."""
    with pytest.raises(ValueError, match=r"one weight per list, shape \[batch\] or \[batch, 1\]"):
        fit(losses.ApproxNDCGLoss(), mode, [metrics.NDCG()],
            dataset(with_list_weights(lambda *shape: np.ones(shape, np.float32)), (None, None)))
    negative = with_list_weights(lambda batch, _: -np.ones(batch, np.float32))
    if mode == "eager":
        with pytest.raises(ValueError, match="sample_weight must be >= 0"):
            fit(losses.ApproxNDCGLoss(), mode, [metrics.NDCG()], dataset(negative, (None,)))
        return
    _, history = fit(losses.ApproxNDCGLoss(), mode, [metrics.NDCG()], dataset(negative, (None,)))
    assert np.isnan(history["loss"][0]) and np.isnan(history["ndcg"][0])


@pytest.mark.backend_neutral
def test_metrics_on_variable_length_lists_equal_those_on_one_padded_batch():
    """Streaming over batches of different list sizes gives what one padded batch gives."""
    batches = list(variable_length_batches())
    longest = max(labels.shape[1] for _, labels in batches)
    padded = np.concatenate([np.pad(labels, ((0, 0), (0, longest - labels.shape[1])),
                                    constant_values=-1.0) for _, labels in batches])
    rng = np.random.default_rng(5)
    scores = [rng.normal(size=labels.shape).astype(np.float32) for _, labels in batches]
    padded_scores = np.concatenate([np.pad(s, ((0, 0), (0, longest - s.shape[1])))
                                    for s in scores])
    for metric in registered(keras.metrics.Metric):
        for (_, labels), batch_scores in zip(batches, scores):
            metric.update_state(labels, batch_scores)
        streamed = float(metric.result())
        metric.reset_state()
        metric.update_state(padded, padded_scores)
        assert streamed == pytest.approx(float(metric.result()), rel=1e-5), metric.name


def trailing_padding_batches(ragged):
    """The batches with their padding moved to each list's end, and labels ragged `[B, (L)]` (if
    `ragged`) or padded with −1: what a tf.data pipeline that batches whole lists gives."""
    def batches():
        import tensorflow as tf

        for inputs, labels in list(variable_length_batches())[:2]:  # one of each size
            lengths = (labels >= 0).sum(axis=1)
            order = np.argsort(labels < 0, axis=1, kind="stable")
            labels = np.take_along_axis(labels, order, axis=1)
            features = np.take_along_axis(inputs["features"], order[..., None], axis=1)
            mask = np.arange(labels.shape[1])[None] < lengths[:, None]
            targets = (tf.RaggedTensor.from_tensor(labels, lengths=lengths) if ragged
                       else labels)
            yield {"features": features, "mask": mask}, targets

    return batches


def test_ragged_targets_train_as_padded_ones():
    """TensorFlow: `model.fit` takes ragged targets (`tf.RaggedTensorSpec` in tf.data) for a loss
    and metrics built with `ragged=True`, and trains exactly as on the padded labels, under XLA
    (`tfapprox.ops._ragged_to_dense` avoids RaggedTensorToTensor, which XLA lacks; eagerly in
    test_metrics.py)."""
    if "xla" not in COMPILE_MODES:
        pytest.skip("ragged tensors are TensorFlow's")
    import tensorflow as tf

    mode = "xla"

    def trained(ragged):
        spec = tf.RaggedTensorSpec((None, None), tf.float32, 1) if ragged else None
        data = dataset(trailing_padding_batches(ragged))
        if ragged:
            data = tf.data.Dataset.from_generator(trailing_padding_batches(True),
                                                  output_signature=(data.element_spec[0], spec))
        return fit(losses.SoftmaxLoss(ragged=ragged), mode, [metrics.NDCG(5, ragged=ragged)], data)[1]

    padded, ragged = trained(False), trained(True)
    assert ragged.keys() == padded.keys()
    for name, values in padded.items():
        np.testing.assert_allclose(ragged[name], values, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", XLA_MODES)
def test_dasalc_scorer_trains_on_variable_length_lists(mode):
    """DASALC's pieces (log1p inputs, input noise, self-attention with latent cross) through fit,
    compiled, on lists whose size changes from batch to batch."""
    keras.utils.set_random_seed(1)
    model = models.DNNScorer(hidden_units=(8, 4), input_transform="log1p", noise_stddev=1.5,
                             attention_layers=1, attention_heads=2, attention_units=8)
    model.build(INPUT_SHAPES)
    before = [to_numpy(w) for w in model.interaction.trainable_weights]
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=losses.ApproxNDCGLoss(),
                  jit_compile=True)
    history = model.fit(dataset(), epochs=1, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    after = [to_numpy(w) for w in model.interaction.trainable_weights]
    assert all(np.all(np.isfinite(w)) for w in after)
    assert any(not np.allclose(a, b) for a, b in zip(after, before)), "attention got no gradient"


@pytest.mark.parametrize("mode", XLA_MODES)
def test_quantile_inputs_train_on_variable_length_lists(mode):
    """The quantile input transform, fitted to the batches' documents, through fit, compiled, on
    lists whose size changes from batch to batch."""
    keras.utils.set_random_seed(1)
    model = models.DNNScorer(hidden_units=(8, 4), input_transform="quantile")
    model.build(INPUT_SHAPES)
    model.adapt(np.concatenate([inputs["features"][inputs["mask"]]
                                for inputs, _ in variable_length_batches()]))
    fitted = to_numpy(model.quantile.quantiles)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=losses.ApproxNDCGLoss(),
                  jit_compile=True)
    history = model.fit(dataset(), epochs=1, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    np.testing.assert_array_equal(to_numpy(model.quantile.quantiles), fitted)  # not trained


@pytest.mark.parametrize("mode", XLA_MODES)
def test_list_standardized_inputs_train_on_variable_length_lists(mode):
    """Each feature standardised within its list beside the features, through fit, compiled, on
    lists whose size changes from batch to batch: the standardised half's weights learn."""
    keras.utils.set_random_seed(1)
    model = models.DNNScorer(hidden_units=(8, 4), list_standardize=True)
    model.build(INPUT_SHAPES)
    num_features = INPUT_SHAPES["features"][-1]
    before = to_numpy(model.hidden_dense[0].kernel)[num_features:]
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=losses.ApproxNDCGLoss(),
                  jit_compile=True)
    history = model.fit(dataset(), epochs=1, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    after = to_numpy(model.hidden_dense[0].kernel)[num_features:]
    assert np.all(np.isfinite(after)) and not np.allclose(after, before)


@pytest.mark.parametrize("mode", XLA_MODES)
def test_score_ensemble_trains_on_variable_length_lists(mode):
    """An ensemble of two scorers, its standardisation fitted to the batches' documents, trained
    end to end through fit, compiled, on lists whose size changes from batch to batch: both
    members learn, the fitted constants stay."""
    keras.utils.set_random_seed(1)
    members = [models.DNNScorer(hidden_units=(8, 4)), models.DNNScorer(hidden_units=(4,))]
    ensemble = ScoreEnsemble(members)
    ensemble.build(INPUT_SHAPES)
    ensemble.adapt(inputs for inputs, _ in variable_length_batches())
    fitted = to_numpy(ensemble.offsets), to_numpy(ensemble.scales)
    before = [to_numpy(m.trainable_weights[0]) for m in members]
    ensemble.compile(optimizer=keras.optimizers.SGD(0.05), loss=losses.ApproxNDCGLoss(),
                     jit_compile=True)
    history = ensemble.fit(dataset(), epochs=1, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    assert all(not np.allclose(to_numpy(m.trainable_weights[0]), b)
               for m, b in zip(members, before)), "a member got no gradient"
    np.testing.assert_array_equal(to_numpy(ensemble.offsets), fitted[0])
    np.testing.assert_array_equal(to_numpy(ensemble.scales), fitted[1])


class OrdinalScorer(keras.Model):
    """K logits per document, `[B, L, K]`: what `OrdinalLoss(ordinal_size=K)` trains."""

    def __init__(self, ordinal_size):
        super().__init__()
        self.logits = keras.layers.Dense(ordinal_size)

    def build(self, input_shape):
        self.logits.build(input_shape["features"])

    def call(self, inputs):
        return self.logits(inputs["features"])


@pytest.mark.parametrize("mode", XLA_MODES)
def test_ordinal_loss_trains_k_outputs_per_document_on_variable_length_lists(mode):
    keras.utils.set_random_seed(1)
    model = OrdinalScorer(3)
    model.build(INPUT_SHAPES)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=losses.OrdinalLoss(ordinal_size=3),
                  jit_compile=True)
    first = model.fit(dataset(), epochs=1, verbose=0).history["loss"]
    second = model.fit(dataset(), epochs=1, verbose=0).history["loss"]
    assert np.isfinite(first[0]) and second[0] < first[0]
    inputs, labels = next(variable_length_batches())
    scores = to_numpy(losses.OrdinalLoss.expected_labels(model(inputs)))
    assert scores.shape == labels.shape and np.all((scores >= 0) & (scores <= 3))
