"""Each loss trains a model through compile/fit; models with our losses and metrics save and load."""

import keras
import numpy as np
import pytest

from tfapprox import losses, metrics

NUM_FEATURES = 6


def toy_lists(rng, num_lists=64, list_size=10):
    """Features whose first coordinate decides the graded label; 20 % padded slots."""
    features = rng.normal(size=(num_lists, list_size, NUM_FEATURES)).astype(np.float32)
    labels = np.digitize(features[..., 0], [-0.5, 0.5, 1.2]).astype(np.float32)
    labels[rng.random(labels.shape) < 0.2] = -1.0
    return features, labels


def scorer():
    inputs = keras.Input((None, NUM_FEATURES))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    scores = keras.layers.Dense(1)(hidden)
    return keras.Model(inputs, keras.layers.Reshape((-1,))(scores))


LOSSES = [
    losses.ApproxNDCGLoss(), losses.ApproxNDCGLoss(topk=5), losses.ApproxAPLoss(),
    losses.ApproxPrecisionLoss(k=3), losses.RankNetLoss(), losses.WeightedRankNetLoss(),
    losses.ListMLELoss(), losses.WeightedListMLELoss(topk=5),
]


@pytest.fixture(scope="module")
def histories():
    """{index in LOSSES: that loss's values, epoch by epoch}: each loss trains a scorer of its own,
    the scorers side by side in one model (one output each), compiled and fitted once. Adam steps
    each weight by its own gradient, and a scorer's weights get only its own loss's gradient, so
    each scorer trains as it would alone."""
    rng = np.random.default_rng(7)
    features, labels = toy_lists(rng)
    keras.utils.set_random_seed(7)
    inputs = keras.Input((None, NUM_FEATURES))
    names = [f"loss{index}" for index in range(len(LOSSES))]
    model = keras.Model(inputs, {name: scorer()(inputs) for name in names})
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=dict(zip(names, LOSSES)),
                  metrics={name: [metrics.NDCG(5), metrics.ApproxNDCGMetric()] for name in names})
    # Keras on TensorFlow would build the compiled loss (a `<name>_loss` mean per output) and the
    # optimizer's slots in the first trace of the train step, which TensorFlow then traces again
    # for the variables it made: built here, the step is traced once.
    outputs = {name: keras.KerasTensor((None, None)) for name in names}
    model._compile_loss.build(outputs, outputs)
    model.optimizer.build(model.trainable_variables)
    history = model.fit(features, {name: labels for name in names}, batch_size=16, epochs=8,
                        verbose=0).history
    return {index: history[f"{name}_loss"] for index, name in enumerate(names)}


@pytest.mark.parametrize("index", range(len(LOSSES)), ids=[loss.name for loss in LOSSES])
def test_fit_lowers_the_loss(index, histories):
    values = histories[index]
    assert len(values) == 8
    assert values[-1] < values[0]
    assert all(np.isfinite(values))


def test_fit_accepts_labels_with_a_mask():
    rng = np.random.default_rng(3)
    features, labels = toy_lists(rng, num_lists=16)
    model = scorer()
    model.compile(optimizer="adam", loss=losses.ApproxNDCGLoss(), metrics=[metrics.NDCG(5)])
    targets = {"labels": np.maximum(labels, 0.0), "mask": labels >= 0}
    loss = losses.ApproxNDCGLoss()
    expected = float(keras.ops.convert_to_numpy(loss(labels, model.predict(features, verbose=0))))
    value = float(keras.ops.convert_to_numpy(loss(targets, model.predict(features, verbose=0))))
    assert value == pytest.approx(expected, rel=1e-6)


def test_model_compiled_with_our_losses_and_metrics_saves_and_loads(tmp_path):
    rng = np.random.default_rng(11)
    features, labels = toy_lists(rng, num_lists=16)
    model = scorer()
    model.compile(optimizer="adagrad",
                  loss=losses.WeightedListMLELoss(topk=4, seed=3),
                  metrics=[metrics.NDCG(5), metrics.MeanAveragePrecision(),
                           metrics.PrecisionAtK(3), metrics.MeanReciprocalRank(),
                           metrics.ApproxNDCGMetric(alpha=20.0), metrics.ApproxAPMetric()])
    model.optimizer.build(model.trainable_variables)  # not in the first trace, which it would redo
    model.fit(features, labels, batch_size=8, epochs=1, verbose=0)
    before = model.evaluate(features, labels, verbose=0, return_dict=True)
    path = tmp_path / "ranker.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.loss, losses.WeightedListMLELoss)
    assert loaded.loss.get_config() == model.loss.get_config()
    after = loaded.evaluate(features, labels, verbose=0, return_dict=True)
    assert after == pytest.approx(before, rel=1e-5)
