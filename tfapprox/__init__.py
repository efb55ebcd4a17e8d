"""tfapprox: Keras 3 losses and metrics that directly optimise IR measures.

`tfapprox.losses`, `tfapprox.metrics`, the scorer (`tfapprox.models`), its inputs from named
features (`tfapprox.named_inputs`) and `tfapprox.ensemble` are imported here, so every class
registered under package `tfapprox` is known to `keras.saving.load_model` after
`import tfapprox`; the data pipeline and export (`tfapprox.data`,
`tfapprox.export`, TensorFlow only) are imported on demand.
"""

from tfapprox import _startup

with _startup.quiet_tensorflow_start():  # TensorFlow loads here; see _startup for when it is quiet
    from tfapprox import ensemble, losses, metrics, models, named_inputs

__version__ = "0.1.0"
__all__ = ["ensemble", "losses", "metrics", "models", "named_inputs"]
