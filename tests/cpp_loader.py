"""TensorFlow's C++ SavedModel loader, as TF Serving uses it, driven from Python.

`build(cache_dir)` compiles `saved_model_runner.cc` against the installed TensorFlow wheel
(`libtensorflow_cc.so.2`, `libtensorflow_framework.so.2` and its headers) once per source, wheel
and compiler, keeping the binary in `cache_dir` (the tests': `CACHE_DIR`, kept across runs). The
binary names no directory: it finds the wheel's libraries through `LD_LIBRARY_PATH`, which
`CppLoader` sets to the running TensorFlow's, so one build serves every clone and virtualenv of
the same wheel (where the checkout or the virtualenv lives is not part of its cache key).
`CppLoader(binary, export_dir)` starts it on one SavedModel; `run(signature, inputs)` returns the
outputs as numpy arrays, or raises `CppError` with the status message the C++ session returned.
"""

import os
import shutil
import struct
import subprocess

import numpy as np

from build_cache import CACHE_DIR as _CACHE_ROOT
from build_cache import built_once, digest

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "saved_model_runner.cc")
CACHE_DIR = os.path.join(_CACHE_ROOT, "cpp_loader")


def signature_requests(features):
    """Returns `{signature: inputs}` that score the lists `features` [B, L, F] in every signature
    of a `tfapprox.export` SavedModel (vector-layout documents)."""
    from tfapprox import export
    from tfapprox.data import records

    lists, documents, num_features = features.shape
    elwc = np.array([records.encode_elwc(f) for f in features], dtype=object).reshape(lists)
    examples = records.encode_examples(features.reshape(lists * documents, num_features))
    examples = np.array(examples, dtype=object).reshape(lists * documents)
    return {
        "serving_default": {"elwc": elwc},
        "score_features": {"features": features},
        export.MASKED: {"features": features, "mask": np.ones((lists, documents), bool)},
        "score_examples": {"examples": examples},
        export.PREDICT: {"inputs": elwc},
        export.REGRESS: {"inputs": examples},
    }


class CppError(Exception):
    """A non-OK status returned by the C++ session (the request failed; the process lives on)."""


def compiler():
    """Returns the C++ compiler's path (`$CXX`, else g++ or c++ on PATH), or None."""
    candidates = [os.environ.get("CXX"), "g++", "c++"]
    return next((shutil.which(c) for c in candidates if c and shutil.which(c)), None)


def build(cache_dir):
    """Returns the path of the runner binary, compiling it into `cache_dir` unless it is there."""
    import tensorflow as tf

    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler: set CXX or install g++")
    library_dir = _library_dir()
    command = [
        cxx, "-O2", "-w", *tf.sysconfig.get_compile_flags(), SOURCE,
        # --no-as-needed keeps libtensorflow_cc, which registers the session factories that
        # nothing in the program references by name.
        "-Wl,--no-as-needed", f"-L{library_dir}", "-l:libtensorflow_cc.so.2",
        "-l:libtensorflow_framework.so.2",
    ]
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    # The key: what the binary is made of, without the directories it was made in (the wheel
    # stands in by its version and its libraries' sizes, which tell its builds apart).
    placed = [part.replace(library_dir, "<tensorflow>").replace(SOURCE, os.path.basename(SOURCE))
              for part in command]
    sizes = [str(os.path.getsize(os.path.join(library_dir, name)))
             for name in ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")]
    with open(SOURCE, "rb") as source:
        key = digest(source.read(), *placed, tf.__version__, *sizes, version)

    def compile_to(partial):
        built = subprocess.run(command + ["-o", partial], capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE} failed:\n{built.stderr[-4000:]}")

    return built_once(os.path.join(cache_dir, f"saved_model_runner-{key}"), compile_to)


def _library_dir():
    """The directory of the running TensorFlow's libraries (its package directory)."""
    import tensorflow as tf

    return os.path.dirname(tf.__file__)


class CppLoader:
    """One runner process serving the SavedModel at `export_dir`; a context manager."""

    def __init__(self, binary, export_dir, log=None):
        """`log`: a file the runner's TensorFlow log (its stderr, warnings and up) goes to."""
        search = [_library_dir(), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1",
               "LD_LIBRARY_PATH": os.pathsep.join(search)}
        self._process = subprocess.Popen(
            [binary, os.fspath(export_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if log is None else log, env=env,
        )
        status = self._read()
        if status:
            self.close()
            raise CppError(f"LoadSavedModel({export_dir}) failed: {status.decode()}")

    def run(self, signature, inputs, repetitions=1):
        """Returns `(outputs, latencies)`: `{key: array}` of the last run and the `repetitions`
        per-run latencies in microseconds; raises `CppError` with a failed run's status."""
        import tensorflow as tf
        from tensorflow.core.framework import tensor_pb2

        frames = [signature.encode(), str(len(inputs)).encode()]
        for key, value in inputs.items():
            proto = value if hasattr(value, "SerializeToString") else tf.make_tensor_proto(value)
            frames += [key.encode(), proto.SerializeToString()]
        frames.append(str(repetitions).encode())
        self._process.stdin.write(b"".join(struct.pack("<Q", len(f)) + f for f in frames))
        self._process.stdin.flush()
        status = self._read()
        if status:
            raise CppError(status.decode(errors="replace"))
        outputs = {}
        for _ in range(int(self._read())):
            key = self._read().decode()
            outputs[key] = tf.make_ndarray(tensor_pb2.TensorProto.FromString(self._read()))
        return outputs, np.frombuffer(self._read(), "<f8")

    def _read(self):
        header = self._process.stdout.read(8)
        if len(header) < 8:
            code = self._process.wait()
            raise RuntimeError(f"the C++ runner exited with status {code}")
        (size,) = struct.unpack("<Q", header)
        return self._process.stdout.read(size)

    def close(self):
        if self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
