"""A run's selected model as a TF Serving SavedModel (`tfapprox.export`), and the check that the
export target can take it, made before training so that a long run never fails at its end."""

from __future__ import annotations

import os
from pathlib import Path

import keras

from trainer import named_data
from trainer.config import Config


def export(eval_model: keras.Model, config: Config, num_features: int | None) -> Path:
    """Writes `eval_model` as a TF Serving SavedModel; returns `base_dir/name/version`. A model
    over named features (`data.feature_spec`, `num_features` None) gets the signatures that parse
    requests by the spec's feature names, its vocabularies as assets."""
    from tfapprox.export import export_saved_model

    bound = {key: value for key, value in (("max_documents", config.export.max_documents),
                                           ("max_pairs", config.train.max_pairs))
             if value is not None}
    features = ({"feature_spec": named_data.load_spec(config.data.feature_spec)}
                if config.data.feature_spec is not None else {"num_features": num_features})
    return Path(export_saved_model(
        eval_model, config.export.base_dir, config.export.name,
        version=config.export.version, **features, **bound,
    ))


def check_export_target(config: Config) -> None:
    """Raises ValueError if exporting `config`'s model would fail, so that it fails before training.

    The version directory must not exist (versions are never overwritten) and the model directory
    must be creatable.
    """
    from tfapprox.export import next_version

    model_dir = Path(config.export.base_dir) / config.export.name
    version = config.export.version
    if version is not None and os.path.lexists(model_dir / str(version)):
        raise ValueError(
            f"export.version {version}: {model_dir / str(version)} already exists and an export "
            f"never overwrites one; pass another --version, or none for the next free one "
            f"({next_version(model_dir)})"
        )
    existing = next(p for p in (model_dir, *model_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"export.base_dir {config.export.base_dir}: cannot create {model_dir}: {existing} is "
            "not a writable directory"
        )
