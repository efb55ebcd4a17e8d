"""tfapprox: Keras 3 losses and metrics that directly optimise IR measures.

`tfapprox.losses` and `tfapprox.metrics` are imported here; the data pipeline, scorer and export
(`tfapprox.data`, `tfapprox.models`, `tfapprox.export`) are imported on demand.
"""

from tfapprox import _startup

with _startup.quiet_tensorflow_start():  # TensorFlow loads here; see _startup for when it is quiet
    from tfapprox import losses, metrics

__version__ = "0.1.0"
__all__ = ["losses", "metrics"]
