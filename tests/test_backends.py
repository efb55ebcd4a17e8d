"""The backend-neutral core (`tfapprox.ops`, `losses`, `metrics`, `models`) runs on JAX in a process
where TensorFlow cannot be imported, as on a GPU machine that has JAX but no TensorFlow.

Each test starts its own JAX process, so it runs in the TensorFlow pass of the suite too.
"""

import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO

# Installed first in the child process: any `import tensorflow` (or of a submodule) raises.
_BLOCK_TENSORFLOW = textwrap.dedent("""
    import sys

    class _NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("tensorflow", "tensorflow_serving", "tf_keras"):
                raise ImportError(f"{name} is blocked: this process runs without TensorFlow")

    sys.meta_path.insert(0, _NoTensorFlow())
""")


def run_without_tensorflow(code, *, timeout=300):
    """Runs `code` in a fresh Python with KERAS_BACKEND=jax and TensorFlow unimportable; returns
    the CompletedProcess, and fails the test with its stderr if it exits non-zero."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO),
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _BLOCK_TENSORFLOW + textwrap.dedent(code)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


FIT_WITHOUT_TENSORFLOW = """
    import json
    import keras
    import numpy as np
    import tfapprox
    import tfapprox.models
    import tfapprox.ops

    rng = np.random.default_rng(0)
    batch, list_size, num_features = 8, 6, 5
    features = rng.normal(size=(batch, list_size, num_features)).astype("float32")
    labels = rng.integers(0, 3, size=(batch, list_size)).astype("float32")
    labels[:, 4:] = -1.0  # the last two slots of every list are padding
    labels[0, 1:] = -1.0  # and one list holds a single document
    mask = labels >= 0
    features[~mask] = 1e6  # padded features must reach neither the loss nor batch norm

    keras.utils.set_random_seed(0)
    model = tfapprox.models.build_scorer("LINEAR")
    model.compile(optimizer=keras.optimizers.Adagrad(0.1),
                  loss=tfapprox.losses.ApproxNDCGLoss(alpha=10.0),
                  metrics=[tfapprox.metrics.NDCG(5)])
    history = model.fit({"features": features, "mask": mask}, labels, batch_size=4, epochs=3,
                        shuffle=False, verbose=0)
    scores = keras.ops.convert_to_numpy(model({"features": features, "mask": mask}))
    print(json.dumps({
        "backend": keras.backend.backend(),
        "loss": history.history["loss"],
        "ndcg": history.history["ndcg@5"],
        "padded_scores": scores[~mask].tolist(),
        "finite_scores": bool(np.isfinite(scores).all()),
        "tensorflow_loaded": any(m.partition(".")[0] == "tensorflow" for m in sys.modules),
    }))
"""


def test_scorer_fits_on_jax_without_tensorflow():
    done = run_without_tensorflow(FIT_WITHOUT_TENSORFLOW)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["backend"] == "jax"
    assert not result["tensorflow_loaded"]
    assert len(result["loss"]) == 3 and all(-1.0 <= value <= 0.0 for value in result["loss"])
    assert result["loss"][-1] < result["loss"][0]  # it learns
    assert all(0.0 <= value <= 1.0 for value in result["ndcg"])
    assert result["finite_scores"] and result["padded_scores"] == [0.0] * len(result["padded_scores"])


def test_blocker_really_blocks_tensorflow():
    """The guard above is only meaningful if TensorFlow (installed here) fails to import."""
    done = run_without_tensorflow("""
        try:
            import tensorflow
        except ImportError as error:
            print("blocked:", error)
    """)
    assert "blocked: tensorflow is blocked" in done.stdout
