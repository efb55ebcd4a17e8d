"""The Keras backend a trainer process runs on (`--backend tensorflow|jax`), and what it runs on.

Keras reads its backend once, when it is first imported, so `choose` runs before anything imports
Keras and sets `KERAS_BACKEND` for the process. On either backend the data come through the same
tf.data pipeline (TensorFlow is a dependency of the trainer); on JAX, Keras feeds its batches to
jitted JAX steps as numpy arrays. Export writes a TensorFlow SavedModel, so a run trained on JAX is
exported by a second process on the TensorFlow backend, which loads the run's selected weights
from its checkpoint (`export_in_tensorflow_process`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainer.config import BACKENDS

_DEFAULT = "tensorflow"


def choose(requested: str | None, command: str) -> str:
    """Returns the backend of this process and sets `KERAS_BACKEND` to it; raises ValueError when
    it cannot be had here.

    `export` and `ensemble` (which exports) run on TensorFlow; other commands use `requested`
    (`runtime.backend`), else `$KERAS_BACKEND`, else TensorFlow. Keras imported already (the
    trainer called in-process) keeps its backend: a different one is refused.
    """
    environment = os.environ.get("KERAS_BACKEND")
    if command in ("export", "ensemble"):
        wanted, source = "tensorflow", f"{command} (a SavedModel is TensorFlow's)"
    elif requested is not None:
        wanted, source = requested, f"--backend {requested}"
    else:
        wanted, source = environment or _DEFAULT, f"KERAS_BACKEND={environment or _DEFAULT}"
    if wanted not in BACKENDS:
        raise ValueError(f"{source}: the trainer runs on {' or '.join(BACKENDS)}")
    if "keras" in sys.modules:
        running = sys.modules["keras"].backend.backend()
        if running != wanted:
            raise ValueError(
                f"{source} needs Keras on {wanted}, but this process already runs it on {running} "
                "and Keras's backend is fixed per process: run `python -m trainer` in a new process")
    os.environ["KERAS_BACKEND"] = wanted
    return wanted


def keep_gpus_for_jax() -> None:
    """On JAX, hides the GPUs from TensorFlow, whose tf.data pipeline runs on the CPU anyway:
    TensorFlow would otherwise reserve most of each GPU's memory when it starts."""
    import keras

    if keras.backend.backend() == "jax":
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")


def has_gpu() -> bool:
    """Whether the Keras backend computes on a GPU."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.default_backend() == "gpu"
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def jit_compile(requested: bool) -> bool:
    """Returns `compile(jit_compile=...)` for `runtime.jit`: as asked on TensorFlow; always on JAX,
    whose steps run op by op (far slower) when not jitted."""
    import keras

    return True if keras.backend.backend() == "jax" else requested


def describe(strategy, policy: str, jit: bool) -> str:
    """Returns the start-of-run line: backend, devices trained on, precision policy, XLA."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        first, *others = jax.local_devices()
        devices = [f"{first.platform.upper()}:{first.id} ({first.device_kind})"]
        if others:
            devices.append(f"not the {len(others)} other {first.platform.upper()}s (the trainer "
                           "runs JAX on one device)")
        xla = "XLA on (JAX compiles every step)"
    else:
        import tensorflow as tf

        if strategy is tf.distribute.get_strategy():  # the default: the first GPU, else the CPU
            placed = (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU"))
            names = [placed[0].name]
        else:
            names = strategy.extended.worker_devices
        devices = [_tensorflow_device(name) for name in names]
        xla = "XLA on (--jit)" if jit else "XLA off (--jit turns it on)"
    return (f"Training on {keras.backend.backend()}: {', '.join(devices)} | precision {policy} "
            f"| {xla}")


def _tensorflow_device(name: str) -> str:
    """Returns `GPU:0 (NVIDIA H100 80GB HBM3)` for `/job:localhost/.../device:GPU:0`."""
    import tensorflow as tf

    short = name.rpartition("device:")[2]
    kind, _, index = short.partition(":")
    physical = [d for d in tf.config.list_physical_devices(kind) if d.name.endswith(f":{index}")]
    details = tf.config.experimental.get_device_details(physical[0]) if physical else {}
    return f"{short} ({details['device_name']})" if "device_name" in details else short


def export_in_tensorflow_process(run_dir: str | os.PathLike) -> Path:
    """Exports the selected weights of the run in `run_dir` (its config.json and checkpoint.npz)
    by `python -m trainer export` on the TensorFlow backend; returns the export's path."""
    environment = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "export", "--run-dir", str(run_dir)],
        env=environment, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("Exported "):
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ValueError(f"exporting {run_dir} on the TensorFlow backend failed: {reason}")
    return Path(lines[-1].removeprefix("Exported "))
