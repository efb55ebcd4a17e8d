"""A run's models, built from its configuration: the scorer compiled with its loss, optimiser and
metrics under the distribution strategy, and its float32 twin that validates, tests and exports.

Everything here is a function of the configuration (and, for `restore_best`, the checkpoint): the
training loop (trainer.train), ensembles and experiments build their models through it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from trainer import backend, checkpoint, data, distribute, named_data
from trainer.config import Config
from trainer.metric_names import eval_metric_names, metrics_named, train_metric_names

Printer = Callable[[str], None]

# The most training documents `adapt_inputs` reads, in file order: quantiles need a sample, not
# a web-scale split.
ADAPT_DOCUMENTS = 200_000


@dataclasses.dataclass
class Built:
    """What a run trains and evaluates with."""

    model: keras.Model  # trained, under the distribution strategy
    eval_model: keras.Model  # float32, outside any strategy: validation, test, export
    eval_metrics: list[str]  # metric names the evaluation model reports
    num_features: int  # the models' input width
    reports_loss: bool = True  # False for AdaRank, which is fitted on no loss


def build(config: Config, num_features: int, dist: distribute.Distribution,
          with_training_model: bool = True) -> Built:
    """Returns the run's models for inputs of `num_features` features: the training model (None
    unless `with_training_model`) compiled in `dist`'s scope, and the float32 evaluation model.
    With `data.feature_spec` the models take the spec's named features (`num_features` None)."""
    from tfapprox import losses, models

    eval_names = eval_metric_names(config)

    def scorer():
        if config.data.feature_spec is not None:
            return named_data.build_scorer(config.data.feature_spec, config.model.preset,
                                           **scorer_kwargs(config))
        if config.model.kind == "adarank":
            model = models.DNNScorer(hidden_units=(), input_batch_norm=False, name="adarank_scorer")
        else:
            model = models.build_scorer(config.model.preset, **scorer_kwargs(config))
        model({"features": np.zeros([1, 2, num_features], "float32"), "mask": np.ones([1, 2], bool)})
        return model

    model = None
    if with_training_model:
        with dist.strategy.scope():
            model = scorer()
            model.compile(
                optimizer=_optimizer(config),
                loss=losses.get(config.loss.name, **config.loss.params),
                metrics=metrics_named(train_metric_names(config), config),
                jit_compile=backend.jit_compile(config.runtime.jit),
            )
            model.optimizer.build(model.trainable_variables)
            if dist.distributed:
                _build_compiled_state(model, num_features)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        eval_model = scorer()
        eval_model.compile(  # AdaRank's too: Keras's evaluate needs a loss (not reported then)
            loss=losses.get(config.loss.name, **config.loss.params),
            metrics=metrics_named(eval_names, config),
        )
    finally:
        keras.config.set_dtype_policy(previous)
    return Built(model=model, eval_model=eval_model, eval_metrics=eval_names,
                 num_features=num_features, reports_loss=config.model.kind != "adarank")


def restore_best(config: Config, data_width: int | None = None) -> Built:
    """Returns the run's models with the best weights of its checkpoint in the evaluation model.

    The models take the feature count the run was trained on; data of another `data_width` is
    refused (ValueError)."""
    restored = checkpoint.load(config.train.run_dir)
    if restored is None or restored.state.epoch == 0:
        raise FileNotFoundError(
            f"no trained checkpoint in {config.train.run_dir}; run `python -m trainer train` first"
        )
    width = restored.state.num_features or config.data.num_features  # the latter: older runs
    if data_width is not None and data_width != width:
        raise ValueError(
            f"the run in {config.train.run_dir} was trained on {width} features, the data given "
            f"has {data_width}")
    built = build(config, width, distribute.make("default"), with_training_model=False)
    built.eval_model.set_weights(restored.best)
    return built


def evaluate_on(built: Built, dataset: tf.data.Dataset) -> dict[str, float]:
    """Returns the evaluation model's metrics on `dataset`, in configured order, then the loss."""
    values = built.eval_model.evaluate(dataset, verbose=0, return_dict=True)
    order = [*built.eval_metrics, *(["loss"] if built.reports_loss else [])]
    return {k: float(values[k]) for k in order if k in values}


def scorer_kwargs(config: Config) -> dict[str, Any]:
    """Returns the keyword arguments of `tfapprox.models.build_scorer` that `config` sets."""
    kwargs = {"dropout": config.model.dropout}
    for key in ("batch_norm_momentum", "input_transform", "list_standardize", "noise_stddev",
                "attention_layers", "handles_missing"):
        if getattr(config.model, key) is not None:
            kwargs[key] = getattr(config.model, key)
    return kwargs


def with_missing_values(config: Config, splits: data.Splits, say: Printer) -> Config:
    """Returns `config` with `model.handles_missing` set to whether the training data holds
    missing values, where the config leaves it open (None); the run's config.json keeps it."""
    if not splits.missing_values or config.model.handles_missing:
        return config
    if config.model.kind == "adarank":
        raise ValueError("the training data holds missing values (NaN), and AdaRank's weak rankers "
                         "(single features) take none: fill them in, or train a neural model")
    if config.model.handles_missing is False:
        raise ValueError("the training data holds missing values (NaN), and the config sets "
                         "model.handles_missing to false: remove it, or set it to true")
    say("The training data holds missing values (NaN): the scorer learns a fill value and a "
        "missing indicator per feature (model.handles_missing)")
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, handles_missing=True))


def check_components(config: Config) -> None:
    """Builds the configured scorer, loss and metrics once; raises ValueError naming a bad name or
    parameter."""
    from tfapprox import adarank, losses, models

    select = metrics_named([config.train.select_metric], config)[0]
    if not getattr(select, "larger_is_better", True):
        raise ValueError(f"select_metric {config.train.select_metric!r} is better when lower; "
                         "selection and early stopping keep the largest value: choose another")
    if config.model.kind == "adarank":
        adarank.measure_metric(config.model.adarank_measure)
        adarank.measure_metric(config.train.select_metric)
        metrics_named(eval_metric_names(config), config)
        return
    if config.data.feature_spec is not None:
        named_data.build_scorer(config.data.feature_spec, config.model.preset,
                                **scorer_kwargs(config))
    else:
        models.build_scorer(config.model.preset, **scorer_kwargs(config))
    try:
        loss = losses.get(config.loss.name, **config.loss.params)
    except TypeError as err:
        raise ValueError(f"loss {config.loss.name!r} does not take {config.loss.params}: {err}") from None
    if getattr(loss, "ordinal_size", 1) > 1:
        raise ValueError(
            f"loss {config.loss.name!r} with ordinal_size={loss.ordinal_size} needs "
            f"{loss.ordinal_size} logits per document, and the trainer's scorer, metrics and "
            "export have one score per document: use ordinal_size=1 here, or OrdinalLoss in your "
            "own Keras model (docs/migrating.md)")
    metrics_named(eval_metric_names(config), config)


def check_attention_fits(config: Config, model: keras.Model, splits: data.Splits) -> None:
    """Raises ValueError if `model` attends over lists and a training batch of the longest lists
    would exceed `train.max_pairs` document pairs (lists × L²)."""
    from tfapprox import models
    from tfapprox.data.dataset import list_lengths

    if not models.attends_within_lists(model):
        return
    lengths = (named_data.list_lengths(splits.train, splits.feature_spec)
               if splits.feature_spec is not None
               else list_lengths(splits.train, splits.num_features))
    length = config.data.list_size or int(max(lengths, default=0))
    models.check_attention_pairs(
        model, min(config.train.batch_size, splits.num_train_lists), length,
        config.train.max_pairs or models.MAX_ATTENTION_PAIRS,
        where="training", advice="shorter lists (--list-size), a smaller --batch-size or a larger "
        "--max-pairs")


def bound_evaluation(config: Config, model: keras.Model, splits: data.Splits) -> data.Splits:
    """Returns `splits` whose evaluation batches hold at most `train.max_pairs` document pairs
    when `model`'s documents attend to each other (`data.eval_dataset`), else `splits`. Raises
    ValueError if one validation or test list alone is over the bound."""
    from tfapprox import models

    if not models.attends_within_lists(model):
        return splits
    bounded = dataclasses.replace(
        splits, eval_max_pairs=config.train.max_pairs or models.MAX_ATTENTION_PAIRS)
    for paths in (splits.vali, splits.test):  # a list over the bound is refused now, not later
        if paths:
            data.eval_batch_size(paths, bounded)
    return bounded


def adapt_inputs(built: Built, splits: data.Splits, say: Printer) -> None:
    """Fits the scorer's input transform to the training documents (`DNNScorer.adapt`: the
    quantiles of `model.input_transform=quantile`), at most `ADAPT_DOCUMENTS` of them in file
    order; does nothing for the other transforms. The evaluation model takes them with the
    model's weights (each validation, the checkpoint), so a resumed run restores them and is not
    fitted again. A scorer over named features (`NamedFeatureScorer.adapt`) also fits the
    spec's quantile features."""
    if splits.feature_spec is not None:
        return _adapt_named_inputs(built, splits, say)
    if getattr(built.model, "quantile", None) is None:
        return
    rows, count = [], 0
    for inputs, _ in data.eval_dataset(splits.train, splits).as_numpy_iterator():
        rows.append(inputs["features"][inputs["mask"]])
        count += len(rows[-1])
        if count >= ADAPT_DOCUMENTS:
            break
    documents = np.concatenate(rows)[:ADAPT_DOCUMENTS]
    built.model.adapt(documents)
    say(f"Input quantiles fitted to {len(documents)} training documents")


def _adapt_named_inputs(built: Built, splits: data.Splits, say: Printer) -> None:
    model = built.model
    if not model.feature_inputs.quantiles and getattr(model.scorer, "quantile", None) is None:
        return
    batches, count = [], 0
    for features, labels in data.eval_dataset(splits.train, splits).as_numpy_iterator():
        batches.append(features)
        count += int((labels >= 0).sum())
        if count >= ADAPT_DOCUMENTS:
            break
    model.adapt(batches)
    say(f"Input quantiles fitted to {count} training documents")


def _optimizer(config: Config) -> keras.optimizers.Optimizer:
    lr = config.optimizer.learning_rate
    if config.optimizer.name == "adagrad":
        return keras.optimizers.Adagrad(learning_rate=lr)
    return keras.optimizers.Adam(learning_rate=lr)


def _build_compiled_state(model: keras.Model, num_features: int) -> None:
    """Builds the compiled loss and metrics from a plain batch, and skips Keras's per-fit build.

    Under a distribution strategy Keras 3's `fit` first all-reduces an input batch to build the
    model symbolically; that reduce fails for dict inputs under MultiWorkerMirroredStrategy
    (keras-team/keras#20329) and would average a boolean mask. Everything it would build is built
    here, in the strategy's scope, so the per-fit step has nothing left to do.
    """
    sample = (
        {"features": tf.zeros([1, 2, num_features]), "mask": tf.ones([1, 2], tf.bool)},
        tf.zeros([1, 2]),
    )
    model._symbolic_build(data_batch=sample)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
