"""SavedModel export for TF Serving: three scoring signatures, written atomically.

`export_saved_model(model, base_dir, name, num_features)` writes `base_dir/name/<version>/`, the
layout TF Serving watches (`--model_base_path=base_dir/name`). The SavedModel holds:

| signature         | input (name: dtype [shape])               | output `scores`         |
|-------------------|-------------------------------------------|-------------------------|
| `serving_default` | `elwc`: string [batch], serialized        | float32 [batch, list],  |
|                   | ExampleListWithContext (TF-Ranking's)     | 0 on padded slots       |
| `score_features`  | `features`: float32 [batch, list, F]      | float32 [batch, list]   |
| `score_examples`  | `examples`: string [n], serialized        | float32 [n]             |
|                   | tf.Example, one document each             |                         |

Documents are stored as in `tfapprox.data.records` (by default one float feature `"features"` of
length F per tf.Example). Parsing runs inside the graph, so a client sends raw protos; the served
model is loadable with `tf.saved_model.load` without tfapprox installed.

`score_features` declares F (`saved_model_cli` and TF Serving's metadata show `(-1, -1, F)`) and
also checks it in the graph, since TF Serving feeds a tensor without comparing its shape with the
signature's: a request with the wrong feature count fails with a message naming the expected F and
the received shape, rather than with a matrix-size error deep in the network. Every valid slot is
scored: the scores are per document, so a client pads short lists with any values and ignores their
scores. An empty batch gets empty scores from every signature. A string signature sent strings that
are not its proto kind (a tf.Example to `serving_default`, an ELWC to `score_examples`, any other
bytes) fails with an InvalidArgumentError naming the signature and the proto it expects; TF's own
parse errors would quote the raw bytes.

Each version also holds TF Serving's warm-up file, `assets.extra/tf_serving_warmup_requests`: a
TFRecord file of PredictionLog requests, every signature at two sizes, which TF Serving runs when it
loads the version so that the first real request does not pay for initialising the graph.

Versions are integers. Without `version`, the next integer after the largest existing version is
used (1 for a new model), so versions sort in export order and TF Serving serves the newest.
The SavedModel is written to a hidden temporary directory next to the version directories
(`base_dir/name/.tmp-...`, which TF Serving ignores because its name is not a number) and renamed
into place in one `os.rename`, so a watcher never sees a half-written version; a failed export
removes the temporary directory and leaves no version behind. One left by a killed export is removed
by the next export of the model once its writer, named in it, is gone (or after a day).

Export needs the TensorFlow backend. A model trained with another backend can be saved as `.keras`
and exported from a process running with `KERAS_BACKEND=tensorflow`.
"""

import os
import re
import shutil
import socket
import time
import uuid

import keras
import numpy as np

__all__ = ["SIGNATURES", "export_saved_model", "next_version"]

SIGNATURES = ("serving_default", "score_features", "score_examples")


def next_version(model_dir):
    """Returns the version `export_saved_model` would pick in `model_dir`: 1 + the largest integer
    directory name there, or 1 when there is none (or `model_dir` does not exist)."""
    try:
        names = os.listdir(model_dir)
    except FileNotFoundError:
        return 1
    versions = [int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(model_dir, n))]
    return max(versions, default=0) + 1


def _check_arguments(name, num_features, version, example_layout):
    from tfapprox.data import records

    if not isinstance(name, str) or not name or name.startswith(".") or os.sep in name or (
        os.altsep and os.altsep in name
    ):
        raise ValueError(
            f"name must be a non-empty directory name without path separators that does not start "
            f"with '.'; received name={name!r}."
        )
    if isinstance(num_features, bool) or not isinstance(num_features, (int, np.integer)) or (
        num_features < 1
    ):
        raise ValueError(f"num_features must be a positive integer; received {num_features!r}.")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0
    ):
        raise ValueError(
            f"version must be None or a non-negative integer (TF Serving versions are integers); "
            f"received version={version!r}."
        )
    if example_layout not in records.EXAMPLE_LAYOUTS:
        raise ValueError(
            f"example_layout must be one of {records.EXAMPLE_LAYOUTS}; "
            f"received example_layout={example_layout!r}."
        )


def _check_model_accepts(model, num_features):
    """Builds `model` on a one-document batch, failing clearly if it cannot take F features."""
    probe = {
        "features": np.zeros((1, 1, num_features), "float32"),
        "mask": np.ones((1, 1), bool),
    }
    try:
        scores = model(probe, training=False)
    except Exception as error:  # noqa: BLE001 - re-raised with the export context
        raise ValueError(
            f"The model cannot score documents with num_features={num_features}: calling it on "
            f"{{'features': [1, 1, {num_features}], 'mask': [1, 1]}} failed with: {error}"
        ) from error
    if tuple(scores.shape) != (1, 1):
        raise ValueError(
            "The model must return scores [batch, list]; for features [1, 1, "
            f"{num_features}] it returned shape {tuple(scores.shape)}."
        )


# A key no document has: asking for it makes tf.io.parse_example check every Example's wire format
# (Example, Features, map entries) without reading a feature value.
_WIRE_CHECK_KEY = "tfapprox.wire_check"


def _count_documents(examples):
    """Returns the number of serialized tf.Example `examples`, or fails if one does not parse."""
    import tensorflow as tf

    parsed = tf.io.parse_example(
        tf.reshape(examples, [-1]), {_WIRE_CHECK_KEY: tf.io.VarLenFeature(tf.string)}
    )
    return parsed[_WIRE_CHECK_KEY].dense_shape[0]


def _count_list_slots(elwc):
    """Returns the number of document slots of the serialized ELWC `elwc` (lists times the longest
    list), or fails if a list or one of its documents does not parse."""
    from tfapprox.data import records

    examples, _ = records.decode_elwc(elwc)
    return _count_documents(examples)


def _parses(serialized, count):
    """Returns a bool scalar: whether `count(serialized)` runs without error.

    It is tried inside tf.data, whose `ignore_errors` is the only way a graph can catch an op's
    error: TF's parsers quote the request's raw bytes in theirs, which clients cannot even decode.
    """
    import tensorflow as tf

    attempt = tf.data.Dataset.from_tensors(serialized).map(lambda s: count(s) >= 0)
    fallback = tf.data.Dataset.from_tensors(False)
    return attempt.ignore_errors().concatenate(fallback).take(1).get_single_element()


def _build_archive(model, num_features, example_layout):
    """Returns a `keras.export.ExportArchive` holding the three scoring signatures."""
    import tensorflow as tf

    from tfapprox.data import records

    def score(features, mask):
        scores = model({"features": features, "mask": mask}, training=False)
        scores = tf.cast(tf.reshape(scores, tf.shape(mask)), tf.float32)
        return tf.where(mask, scores, tf.zeros_like(scores))

    def score_elwc(elwc):
        # DecodeProtoV2 refuses an empty batch: one empty list is appended and its row dropped.
        padded = tf.concat([elwc, [""]], axis=0)
        check = tf.debugging.Assert(
            _parses(padded, _count_list_slots),
            [
                "serving_default expects `elwc`: serialized ExampleListWithContext protos, one "
                "per list; some of the strings received are not (a serialized tf.Example per "
                "document goes to score_examples). Number of strings received:",
                tf.size(elwc),
            ],
        )
        with tf.control_dependencies([check]):
            features, mask, _ = records.parse_elwc(padded, num_features, layout=example_layout)
        return {"scores": score(features, mask)[:-1]}

    def score_features(features):
        received = tf.shape(features)
        check = tf.debugging.Assert(
            tf.equal(received[-1], num_features),
            [
                f"score_features expects float32 features [batch, list, {num_features}]; "
                "received shape",
                received,
            ],
            summarize=3,
        )
        with tf.control_dependencies([check]):
            features = tf.identity(features)
        mask = tf.ones(tf.shape(features)[:2], dtype=tf.bool)
        return {"scores": score(features, mask)}

    def score_examples(examples):
        check = tf.debugging.Assert(
            _parses(examples, _count_documents),
            [
                "score_examples expects `examples`: serialized tf.Example protos, one per "
                "document; some of the strings received are not (a serialized "
                "ExampleListWithContext goes to serving_default). Number of strings received:",
                tf.size(examples),
            ],
        )
        with tf.control_dependencies([check]):
            features = records.parse_examples(examples, num_features, layout=example_layout)
        mask = tf.ones([tf.shape(features)[0], 1], dtype=tf.bool)
        return {"scores": score(features[:, None, :], mask)[:, 0]}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default", score_elwc, [tf.TensorSpec([None], tf.string, name="elwc")]
    )
    archive.add_endpoint(
        "score_features",
        score_features,
        [tf.TensorSpec([None, None, num_features], tf.float32, name="features")],
    )
    archive.add_endpoint(
        "score_examples", score_examples, [tf.TensorSpec([None], tf.string, name="examples")]
    )
    return archive


# TF Serving replays this file's requests when it loads a version (its "SavedModel warmup").
_WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# (lists, documents per list) of the warm-up requests: a single document and a small batch.
_WARMUP_SIZES = ((1, 1), (4, 10))


def _warmup_requests(num_features):
    """Yields `(signature, inputs)`: every signature at every `_WARMUP_SIZES`, all features 0.

    The documents are vector-layout Examples; a `"per_feature"` model reads them as all-zero
    documents too (it ignores their `"features"` key).
    """
    from tfapprox.data import records

    for lists, documents in _WARMUP_SIZES:
        features = np.zeros((lists, documents, num_features), "float32")
        elwc = [records.encode_elwc(list_features) for list_features in features]
        examples = records.encode_examples(features.reshape(-1, num_features))
        yield "serving_default", {"elwc": np.array(elwc, dtype=object)}
        yield "score_features", {"features": features}
        yield "score_examples", {"examples": np.array(examples, dtype=object)}


def _prediction_log(signature, inputs):
    """Returns a serialized `tensorflow.serving.PredictionLog` holding one PredictRequest.

    Written in the protobuf wire format, so that tensorflow-serving-api is not needed; the field
    numbers are those of tensorflow_serving/apis: PredictionLog.predict_log = 6,
    PredictLog.request = 1, PredictRequest.model_spec = 1 and .inputs = 2 (map entries: key = 1,
    value = 2, a TensorProto), ModelSpec.signature_name = 3. The model name is left out: TF Serving
    runs warm-up requests on the version it is loading, whatever name it serves it under.
    """
    import tensorflow as tf

    from tfapprox.data.records import _field

    model_spec = _field(1, _field(3, signature.encode()))
    entries = (
        _field(1, name.encode()) + _field(2, tf.make_tensor_proto(value).SerializeToString())
        for name, value in inputs.items()
    )
    request = model_spec + b"".join(_field(2, entry) for entry in entries)
    return _field(6, _field(1, request))


def _write_warmup_requests(saved_model_dir, num_features):
    """Writes TF Serving's warm-up file (TFRecords of PredictionLog) into `saved_model_dir`."""
    import tensorflow as tf

    path = os.path.join(saved_model_dir, _WARMUP_FILE)
    os.mkdir(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for signature, inputs in _warmup_requests(num_features):
            writer.write(_prediction_log(signature, inputs))


def export_saved_model(
    model, base_dir, name, num_features, version=None, *, example_layout="vector"
):
    """Returns the path `base_dir/name/<version>` of a TF Serving SavedModel, written atomically.

    Args:
        model: A scorer taking `{"features": [B, L, F], "mask": [B, L]}` and returning `[B, L]`
            (e.g. `tfapprox.models.DNNScorer`); built here if it is not yet.
        base_dir: Directory holding one subdirectory per served model (created if missing).
        name: The model's name: `base_dir/name` is TF Serving's `--model_base_path`.
        num_features: F, the number of features per document.
        version: Non-negative integer version; default: one more than the largest existing one
            (1 for a new model). An existing version is never overwritten.
        example_layout: How a document's features are stored in the tf.Example protos the
            string signatures receive: `"vector"` (one float feature `"features"` of length F) or
            `"per_feature"` (scalar features `"1"` .. `"F"`), as in `tfapprox.data.records`.

    Raises:
        ValueError: for invalid arguments, or a model that cannot score F features.
        FileExistsError: if `base_dir/name/<version>` already exists.
        RuntimeError: if the Keras backend is not TensorFlow.
    """
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "export_saved_model needs the TensorFlow backend; the Keras backend is "
            f"{keras.backend.backend()!r}. Save the model with model.save('scorer.keras') and "
            "export it from a process run with KERAS_BACKEND=tensorflow."
        )
    _check_arguments(name, num_features, version, example_layout)
    num_features = int(num_features)
    _check_model_accepts(model, num_features)

    model_dir = os.path.join(os.fspath(base_dir), name)
    os.makedirs(model_dir, exist_ok=True)
    version = next_version(model_dir) if version is None else int(version)
    target = os.path.join(model_dir, str(version))
    if os.path.lexists(target):
        raise FileExistsError(f"Version {version} of model {name!r} already exists: {target}")

    _remove_stale_staging(model_dir)
    # os.mkdir (unlike tempfile.mkdtemp's 0700) honours the umask, so the renamed version is
    # readable by a TF Serving process running as another user.
    staging = os.path.join(
        model_dir, f".tmp-{version}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"
    )
    os.mkdir(staging)
    try:
        _build_archive(model, num_features, example_layout).write_out(staging, verbose=False)
        _write_warmup_requests(staging, num_features)
        if os.path.lexists(target):
            raise FileExistsError(
                f"Version {version} of model {name!r} appeared during export: {target}"
            )
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# A staging directory names its writer: .tmp-<version>-<host>-<pid>-<random hex>.
_STAGING_NAME = re.compile(r"\.tmp-\d+-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{32}")
_STAGING_MAX_AGE_SECONDS = 24 * 3600


def _remove_stale_staging(model_dir):
    """Deletes the staging directories of killed exports: those whose writer on this host is no
    longer running, and any untouched for a day (another host's, or named before writers were)."""
    for name in os.listdir(model_dir):
        path = os.path.join(model_dir, name)
        if not name.startswith(".tmp-"):
            continue
        match = _STAGING_NAME.fullmatch(name)
        writer_gone = (
            match is not None
            and match["host"] == socket.gethostname()
            and not _is_running(int(match["pid"]))
        )
        try:
            too_old = time.time() - os.path.getmtime(path) > _STAGING_MAX_AGE_SECONDS
        except FileNotFoundError:  # its export just finished or failed
            continue
        if writer_gone or too_old:
            shutil.rmtree(path, ignore_errors=True)


def _is_running(pid):
    if os.name != "posix":  # os.kill(pid, 0) would signal it there; rely on age
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        pass
    return True
