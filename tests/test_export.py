"""Tests for tfapprox.export: TF Serving layout, the three signatures, isolation and atomicity."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras import ops

from tfapprox import export, export_signatures
from tfapprox.data import records
from tfapprox.models import DNNScorer
from tfapprox.signature_archive import SignatureArchive

pytestmark = pytest.mark.slow  # builds and exports SavedModels: `-m "not slow"` skips it

NUM_FEATURES = 7
LENGTHS = (2, 5, 3)
MAX_DOCUMENTS = 60  # the module's export: above every request here but the one that tests it
SAVED_MODEL_CLI = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
needs_tensorflow = pytest.mark.skipif(not ON_TENSORFLOW, reason="export needs the TF backend")


def _lists(seed=0):
    """Returns (features [B, L, F], mask [B, L]) for lists of LENGTHS, padding filled with 9."""
    rng = np.random.default_rng(seed)
    mask = np.arange(max(LENGTHS))[None, :] < np.array(LENGTHS)[:, None]
    features = rng.normal(size=mask.shape + (NUM_FEATURES,)).astype("float32")
    features[~mask] = 9.0
    return features, mask


def _trained_scorer():
    features, mask = _lists(1)
    labels = np.where(mask, np.arange(mask.shape[1]) % 3, -1).astype("float32")
    model = DNNScorer((16, 8), batch_norm_momentum=0.5)
    model.compile(
        optimizer="adam",
        loss=lambda y, s: ops.sum(ops.where(y >= 0, ops.square(y - s), 0.0), axis=-1),
        run_eagerly=True,  # a traced step costs a second, for nothing the export tests look at
    )
    for _ in range(3):  # moves weights and moving statistics away from their initial values
        model.train_on_batch({"features": features, "mask": mask}, labels)
    return model


def _expected_scores(model, features, mask):
    return ops.convert_to_numpy(model({"features": features, "mask": mask}, training=False))


def _requests(features, mask):
    """Returns (serialized ELWC [B], serialized tf.Example [N]) for the valid documents."""
    elwc = [records.encode_elwc(f[m]) for f, m in zip(features, mask)]
    examples = records.encode_examples(features[mask])
    return elwc, examples


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    if not ON_TENSORFLOW:
        pytest.skip("export needs the TF backend")
    model = _trained_scorer()
    base_dir = tmp_path_factory.mktemp("saved_models")
    path = export.export_saved_model(model, base_dir, "ranker", NUM_FEATURES,
                                     max_documents=MAX_DOCUMENTS)
    return model, base_dir, path


@pytest.fixture(scope="module")
def loaded(exported):
    import tensorflow as tf

    return tf.saved_model.load(exported[2])


@needs_tensorflow
def test_layout_is_base_name_version(exported):
    _, base_dir, path = exported
    assert path == os.path.join(str(base_dir), "ranker", "1")
    assert os.listdir(os.path.join(base_dir, "ranker")) == ["1"]
    assert os.path.isfile(os.path.join(path, "saved_model.pb"))
    assert os.path.isdir(os.path.join(path, "variables"))


@needs_tensorflow
def test_every_signature_matches_the_in_memory_model(exported, loaded):
    import tensorflow as tf

    model = exported[0]
    features, mask = _lists(2)
    expected = _expected_scores(model, features, mask)
    elwc, examples = _requests(features, mask)
    signatures = loaded.signatures
    assert set(signatures) == set(export.SIGNATURES)

    lists = signatures["serving_default"](elwc=tf.constant(elwc))["scores"].numpy()
    assert lists.shape == mask.shape
    np.testing.assert_allclose(lists[mask], expected[mask], atol=1e-5)
    assert np.all(lists[~mask] == 0.0)

    raw = signatures["score_features"](features=tf.constant(features))["scores"].numpy()
    np.testing.assert_allclose(raw[mask], expected[mask], atol=1e-5)

    features[~mask] = np.nan  # a padded slot may hold anything where the mask is sent
    masked = signatures[export.MASKED](features=tf.constant(features), mask=tf.constant(mask))
    np.testing.assert_allclose(masked["scores"].numpy()[mask], expected[mask], atol=1e-5)
    assert np.all(masked["scores"].numpy()[~mask] == 0.0)

    documents = signatures["score_examples"](examples=tf.constant(examples))["scores"].numpy()
    assert documents.shape == (int(mask.sum()),)
    np.testing.assert_allclose(documents, expected[mask], atol=1e-5)


@needs_tensorflow
def test_saved_model_cli_lists_the_signatures_and_the_feature_count(fresh_process):
    shown = (_finished(fresh_process, "saved_model_cli show") / "show.txt").read_text()
    for name, argument in [
        ("serving_default", "elwc"),
        ("score_features", "features"),
        (export.MASKED, "mask"),
        ("score_examples", "examples"),
    ]:
        assert f"signature_def['{name}']" in shown
        assert f"inputs['{argument}']" in shown
    assert shown.count("outputs['scores']") == 4
    score_features = shown.split("signature_def['score_features']")[1].split("signature_def[")[0]
    assert f"shape: (-1, -1, {NUM_FEATURES})" in score_features


@needs_tensorflow
def test_signatures_declare_the_feature_count(loaded):
    declared = loaded.signatures["score_features"].structured_input_signature[1]["features"]
    assert declared.shape.as_list() == [None, None, NUM_FEATURES]


@needs_tensorflow
def test_saved_model_cli_run_scores_a_sample(exported, fresh_process):
    folder = _finished(fresh_process, "saved_model_cli run")
    features, mask = _lists(3)
    scores = np.load(folder / "out" / "scores.npy")
    expected = _expected_scores(exported[0], features, mask)
    np.testing.assert_allclose(scores[mask], expected[mask], atol=1e-5)


_SECRET = b"SeCr"  # a feature value whose bytes are printable, to be looked for in the log


def _wrong_protos():
    """Returns `[(signature, argument, strings)]`: requests whose strings are not the proto the
    signature reads, each carrying `_SECRET`."""
    features = np.full((2, 3, NUM_FEATURES), np.frombuffer(_SECRET, "<f4")[0], "float32")
    elwc, examples = _requests(features, np.ones((2, 3), bool))
    return [
        ("serving_default", "elwc", examples[:2]),  # a tf.Example per document, to the ELWC one
        ("serving_default", "elwc", [b"\xff" + _SECRET * 4]),
        ("score_examples", "examples", elwc),
        ("score_examples", "examples", [b"\x0a\x05" + _SECRET * 3]),
    ]


@pytest.fixture(scope="module")
def fresh_process(exported, tmp_path_factory):
    """Returns `(result, folder)` of one new Python process, where tfapprox cannot be imported,
    that does with the export what a server and a user of saved_model_cli do (one TensorFlow start
    serves five tests; `result` is the finished process). Each part's outcome, "ok" or the
    traceback that ended it, is in `folder/parts.json`:
    - "scored": loads it as a server does and scores `_lists(4)` through three signatures
      (`folder/response.npz`), then checks that tfapprox was never imported;
    - "refused": sends `_wrong_protos()`, TensorFlow logging everything (`result.stderr`);
    - "saved_model_cli show": runs `saved_model_cli show --all` (`folder/show.txt`);
    - "saved_model_cli run": runs `saved_model_cli run` on serving_default with `_lists(3)`'s
      ELWC (`folder/out/scores.npy`).
    saved_model_cli runs as its console script does (`runpy`), with the arguments a shell gives it.
    """
    import tensorflow as tf

    folder = tmp_path_factory.mktemp("fresh_process")
    features, mask = _lists(4)
    elwc, examples = _requests(features, mask)
    np.savez(folder / "request.npz", features=features, elwc=np.array(elwc, dtype=object),
             examples=np.array(examples, dtype=object))
    np.save(folder / "wrong.npy", np.array(_wrong_protos(), dtype=object), allow_pickle=True)
    np.save(folder / "elwc.npy", np.array(_requests(*_lists(3))[0], dtype=object),
            allow_pickle=True)
    site_packages = os.path.dirname(os.path.dirname(tf.__file__))
    script = folder / "serve.py"
    script.write_text(textwrap.dedent(f"""
        import contextlib, importlib.util, json, runpy, sys, traceback
        sys.path.append({site_packages!r})
        assert importlib.util.find_spec("tfapprox") is None, "tfapprox must not be importable"
        import numpy as np
        import tensorflow as tf
        parts = {{}}

        @contextlib.contextmanager
        def part(name):
            try:
                yield
            except BaseException:
                parts[name] = traceback.format_exc()
            else:
                parts[name] = "ok"

        def saved_model_cli(*arguments):
            sys.argv = [{SAVED_MODEL_CLI!r}, *arguments]
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
            except SystemExit as exit:
                if exit.code not in (None, 0):
                    raise

        with part("scored"):
            request = np.load("request.npz", allow_pickle=True)
            signatures = tf.saved_model.load({exported[2]!r}).signatures
            lists = signatures["serving_default"](elwc=tf.constant(list(request["elwc"])))
            raw = signatures["score_features"](features=tf.constant(request["features"]))
            documents = signatures["score_examples"](
                examples=tf.constant(list(request["examples"])))
            np.savez("response.npz", lists=lists["scores"], raw=raw["scores"],
                     documents=documents["scores"])
            assert "tfapprox" not in sys.modules
        with part("refused"):
            for signature, argument, strings in np.load("wrong.npy", allow_pickle=True):
                try:
                    signatures[signature](**{{argument: tf.constant(list(strings))}})
                except tf.errors.InvalidArgumentError as error:
                    assert "expects `" + argument + "`" in error.message, error.message
                else:
                    raise AssertionError(signature + " accepted a wrong proto")
        with part("saved_model_cli show"), open("show.txt", "w") as shown:
            with contextlib.redirect_stdout(shown):
                saved_model_cli("show", "--all", "--dir", {exported[2]!r})
        with part("saved_model_cli run"):
            saved_model_cli("run", "--dir", {exported[2]!r}, "--tag_set", "serve",
                            "--signature_def", "serving_default", "--inputs", "elwc=elwc.npy",
                            "--outdir", "out")
        with open("parts.json", "w") as out:
            json.dump(parts, out)
    """))
    # -I: no PYTHONPATH, no script or working directory on sys.path; -S: no site-packages .pth
    # files, so the editable install's import hook for tfapprox is not there.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}  # the server's log, warnings included
    result = subprocess.run([sys.executable, "-I", "-S", str(script)], capture_output=True,
                            cwd=folder, env=env, timeout=300)
    return result, folder


def _finished(fresh_process, part):
    """Returns the fresh process's folder once `part` of it has run to its end."""
    result, folder = fresh_process
    parts = (folder / "parts.json").read_text() if (folder / "parts.json").exists() else "{}"
    outcome = json.loads(parts).get(part, "did not run")
    assert outcome == "ok", f"{part}: {outcome}\n{result.stderr[-3000:].decode(errors='replace')}"
    return folder


@needs_tensorflow
def test_fresh_process_loads_it_without_tfapprox(exported, fresh_process):
    response = np.load(_finished(fresh_process, "scored") / "response.npz")
    features, mask = _lists(4)
    expected = _expected_scores(exported[0], features, mask)
    np.testing.assert_allclose(response["lists"][mask], expected[mask], atol=1e-5)
    np.testing.assert_allclose(response["raw"][mask], expected[mask], atol=1e-5)
    np.testing.assert_allclose(response["documents"], expected[mask], atol=1e-5)


@needs_tensorflow
def test_wrong_feature_count_gets_a_clear_error(loaded):
    import tensorflow as tf

    features, mask = _lists(5)
    narrow = features[..., :5]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[batch, list, 7\].*\[3 5 5\]"):
        loaded.signatures["score_features"](features=tf.constant(narrow))
    elwc, examples = _requests(narrow, mask)
    message = r"Key: features.*Values size: 5 but output shape: \[7\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        loaded.signatures["serving_default"](elwc=tf.constant(elwc))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        loaded.signatures["score_examples"](examples=tf.constant(examples))


@needs_tensorflow
def test_wrong_dtype_gets_a_clear_error(loaded):
    import tensorflow as tf

    features, _ = _lists(6)
    expected_float = "expected to be a float tensor but is a double"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected_float):
        loaded.signatures["score_features"](features=tf.constant(features, tf.float64))
    expected_string = "expected to be a string tensor but is a float"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected_string):
        loaded.signatures["serving_default"](elwc=tf.constant(features[:, 0, 0]))


@needs_tensorflow
def test_empty_requests_get_empty_scores(loaded):
    import tensorflow as tf

    signatures = loaded.signatures
    requests = {
        "serving_default": {"elwc": tf.constant([], tf.string)},
        "score_features": {"features": tf.zeros([0, 0, NUM_FEATURES])},
        "score_examples": {"examples": tf.constant([], tf.string)},
    }
    for name, inputs in requests.items():
        scores = signatures[name](**inputs)["scores"]
        assert scores.dtype == tf.float32 and scores.shape[0] == 0, name


_NOT_A_PROTO = b"\xff\xfe not a protobuf"
_EXPECTED_PROTOS = {  # signature: (argument, start of its error)
    "serving_default": ("elwc", "serving_default expects `elwc`: serialized ExampleListWith"),
    "score_examples": ("examples", "score_examples expects `examples`: serialized tf.Example"),
}


@needs_tensorflow
@pytest.mark.parametrize(
    "signature, sent",
    [
        ("serving_default", "tf.Example"),
        ("serving_default", "random bytes"),
        ("score_examples", "ELWC"),
        ("score_examples", "random bytes"),
    ],
)
def test_wrong_proto_kind_gets_a_clear_error(loaded, signature, sent):
    import tensorflow as tf

    features, mask = _lists(7)
    elwc, examples = _requests(features, mask)
    strings = {"tf.Example": examples[:2], "ELWC": elwc[:2], "random bytes": [_NOT_A_PROTO]}[sent]
    argument, expected = _EXPECTED_PROTOS[signature]
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected) as raised:
        loaded.signatures[signature](**{argument: tf.constant(strings)})
    message = str(raised.value)
    assert f"Number of strings received:] [{len(strings)}]" in message
    for raw_bytes in ("Could not parse", "not a protobuf", "features"):  # the requests' own text
        assert raw_bytes not in message


@needs_tensorflow
def test_warmup_requests_run_on_every_signature(exported, loaded):
    import tensorflow as tf

    prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")
    path = os.path.join(exported[2], "assets.extra", "tf_serving_warmup_requests")
    logs = [
        prediction_log_pb2.PredictionLog.FromString(record)
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator()
    ]
    assert 0 < len(logs) <= 1000  # TF Serving reads at most 1000
    warmed = []
    for log in logs:
        assert log.WhichOneof("log_type") == "predict_log"
        request = log.predict_log.request
        signature = loaded.signatures[request.model_spec.signature_name]
        inputs = {name: tf.make_ndarray(tensor) for name, tensor in request.inputs.items()}
        assert set(inputs) == set(signature.structured_input_signature[1])
        outputs = signature(**{name: tf.constant(value) for name, value in inputs.items()})
        (scores,) = outputs.values()
        assert scores.shape[0] == len(next(iter(inputs.values())))
        warmed.append(request.model_spec.signature_name)
    assert sorted(set(warmed)) == sorted(export.SIGNATURES)
    assert len(warmed) > len(export.SIGNATURES)  # more than one request size each


def _watch_write_out(monkeypatch):
    """Wraps SignatureArchive.write_out to record what a watcher of the model dir sees meanwhile."""
    seen = []
    real_write_out = SignatureArchive.write_out

    def write_out(self, filepath, **kwargs):
        model_dir = os.path.dirname(filepath)
        seen.append(sorted(os.listdir(model_dir)))
        real_write_out(self, filepath, **kwargs)
        seen.append(sorted(os.listdir(model_dir)))

    monkeypatch.setattr(SignatureArchive, "write_out", write_out)
    return seen


def _age(path, days):
    old = os.stat(path).st_mtime - days * 24 * 3600
    os.utime(path, (old, old), follow_symlinks=False)


class MissingAsZero(keras.Model):
    """A linear scorer that reads NaN as a missing value (0 here), as a scorer trained on data
    with missing values does; its `handles_missing` is set by `version_history`."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, inputs):
        features = inputs["features"]
        return ops.squeeze(self.dense(ops.where(ops.isnan(features), 0.0, features)), -1)


_NOTE = "a note, not a version"
_NOT_VERSIONS = ("\u00b2", "\u0662\u0660", "70b")  # superscript two, Arabic-Indic 20, 70b
_LINKED = f".tmp-1-otherhost-4343-{'b' * 32}"  # a link named like a staging directory


@pytest.fixture(scope="module")
def version_history(exported, tmp_path_factory):
    """Returns `(model_dir, history)` after two exports into a model directory that already holds
    version 10, a file named "12", directories named like versions in other digits than ASCII's
    (`_NOT_VERSIONS`), and staging-like directories two days old: the user's `.tmp-notes`, a
    killed export's of another host and a link (`_LINKED`) to a directory outside. The first
    export takes the next version (umask 022), the second version 3; a watcher looks at the
    directory just before and just after each SavedModel is written.

    A full export costs seconds, so the versioning tests share these two, and they are the
    exports two other tests read: the first is of a `MissingAsZero` that handles missing values,
    the second of the module's scorer in the per_feature example layout.

    `history`: "next", next_version before the exports; "first" and "second", their paths;
    "mode", the first's permission bits; "seen", {version: [listing before, listing after]};
    "after", the listing once both are done; "missing_as_zero", the first's model.
    """
    base = tmp_path_factory.mktemp("versions")
    model_dir = base / "ranker"
    (model_dir / "10").mkdir(parents=True)
    (model_dir / "10" / "keep").write_text("x")
    (model_dir / "12").write_text(_NOTE)
    for name in _NOT_VERSIONS:
        (model_dir / name).mkdir()
    mine = model_dir / ".tmp-notes"  # the user's, named like a staging directory
    (mine / "sub").mkdir(parents=True)
    (mine / "sub" / "keep").write_text("x")
    killed = model_dir / f".tmp-1-otherhost-4242-{'a' * 32}"  # another host's killed export
    killed.mkdir()
    outside = base / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (model_dir / _LINKED).symlink_to(outside, target_is_directory=True)
    for path in (mine, killed, model_dir / _LINKED):
        _age(path, 2)
    history = {"next": export.next_version(model_dir), "missing_as_zero": MissingAsZero()}
    history["missing_as_zero"].handles_missing = True
    with pytest.MonkeyPatch.context() as monkeypatch:
        seen = _watch_write_out(monkeypatch)
        old_umask = os.umask(0o022)
        try:
            history["first"] = export.export_saved_model(history["missing_as_zero"], base,
                                                         "ranker", NUM_FEATURES)
        finally:
            os.umask(old_umask)
        history["second"] = export.export_saved_model(exported[0], base, "ranker", NUM_FEATURES,
                                                      version=3, example_layout="per_feature")
    history["mode"] = os.stat(history["first"]).st_mode & 0o777
    history["seen"] = {int(os.path.basename(history["first"])): seen[:2], 3: seen[2:]}
    history["after"] = sorted(os.listdir(model_dir))
    return model_dir, history


@needs_tensorflow
def test_only_ascii_digit_directories_are_versions(version_history):
    model_dir, history = version_history
    assert history["next"] == 13  # after 10 and the file 12; not 21 (Arabic-Indic 20) nor 71
    assert history["first"] == str(model_dir / "13")
    assert set(_NOT_VERSIONS) <= set(history["after"])


@needs_tensorflow
def test_files_named_like_versions_are_stepped_past(version_history):
    model_dir, history = version_history
    assert history["first"] == str(model_dir / "13")  # not 11: the file 12 cannot become 12/
    assert (model_dir / "12").read_text() == _NOTE


@needs_tensorflow
def test_export_deletes_only_its_own_staging(version_history):
    model_dir, history = version_history
    staging_like = [name for name in history["after"] if name.startswith(".")]
    assert sorted(staging_like) == sorted([".tmp-notes", _LINKED])  # the killed export's is gone
    assert (model_dir / ".tmp-notes" / "sub" / "keep").read_text() == "x"
    assert (model_dir.parent / "outside" / "keep").read_text() == "x"


@needs_tensorflow
def test_no_version_is_visible_before_it_is_complete(version_history):
    model_dir, history = version_history
    assert history["second"] == str(model_dir / "3")
    for version, seen in history["seen"].items():
        assert len(seen) == 2, version
        for listing in seen:  # its hidden staging directory, never the version itself
            assert str(version) not in listing, (version, listing)
            staging = [name for name in listing if name.startswith(f".tmp-{version}-")]
            assert len(staging) == 1, (version, listing)
        assert str(version) in history["after"]


@needs_tensorflow
def test_failed_export_leaves_nothing(tmp_path, monkeypatch):
    def write_out(self, filepath, **kwargs):  # the disk fills up halfway through the SavedModel
        os.mkdir(os.path.join(filepath, "variables"))
        with open(os.path.join(filepath, "saved_model.pb"), "wb") as partial:
            partial.write(b"\x08\x01")
        raise OSError("disk full")

    monkeypatch.setattr(SignatureArchive, "write_out", write_out)
    with pytest.raises(OSError, match="disk full"):
        export.export_saved_model(DNNScorer((4,)), tmp_path, "ranker", NUM_FEATURES)
    assert os.listdir(tmp_path / "ranker") == []


@needs_tensorflow
def test_versions_count_up_and_are_never_overwritten(version_history):
    model_dir, history = version_history
    assert history["mode"] == 0o755  # readable by a server running as another user
    assert history["first"] == str(model_dir / "13")  # one more than the largest version
    assert history["second"] == str(model_dir / "3")  # as asked, below the largest
    for version in (10, 13):
        with pytest.raises(FileExistsError,
                           match=f"Version {version} of model 'ranker' already exists"):
            export.export_saved_model(DNNScorer((4,)), model_dir.parent, "ranker", NUM_FEATURES,
                                      version=version)
    assert (model_dir / "10" / "keep").read_text() == "x"
    assert sorted(os.listdir(model_dir)) == history["after"]
    assert [name for name in history["after"] if name.isascii() and name.isdigit()] == [
        "10", "12", "13", "3"]


@needs_tensorflow
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "a/b"}, "name must be a non-empty directory name"),
        ({"name": ".hidden"}, "name must be a non-empty directory name"),
        ({"version": -1}, "version must be None or a non-negative integer"),
        ({"version": "2"}, "version must be None or a non-negative integer"),
        ({"version": True}, "version must be None or a non-negative integer"),
        ({"num_features": 0}, "num_features must be a positive integer"),
        ({"example_layout": "csv"}, "example_layout must be one of"),
        ({"max_documents": 0}, "max_documents must be a positive integer"),
        ({"max_pairs": 2.5}, "max_pairs must be a positive integer"),
    ],
)
def test_invalid_arguments_are_named(tmp_path, kwargs, message):
    arguments = {"name": "ranker", "num_features": NUM_FEATURES, **kwargs}
    with pytest.raises(ValueError, match=message):
        export.export_saved_model(DNNScorer((4,)), tmp_path, **arguments)
    assert not (tmp_path / "ranker").exists()


@needs_tensorflow
def test_model_built_for_other_features_is_refused(tmp_path):
    model = DNNScorer((4,))
    model(np.zeros((1, 2, 5), "float32"))
    with pytest.raises(ValueError, match="cannot score documents with num_features=7"):
        export.export_saved_model(model, tmp_path, "ranker", NUM_FEATURES)
    assert not (tmp_path / "ranker").exists()


@pytest.mark.skipif(ON_TENSORFLOW, reason="checks the message other backends get")
def test_other_backends_get_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="needs the TensorFlow backend"):
        export.export_saved_model(DNNScorer((4,)), tmp_path, "ranker", NUM_FEATURES)


@needs_tensorflow
@pytest.mark.parametrize("shape", [(3, NUM_FEATURES), (2, 3, 4, NUM_FEATURES), (NUM_FEATURES,)])
def test_score_features_of_another_rank_gets_the_shape_error(loaded, shape):
    import tensorflow as tf

    features = tf.zeros(shape)
    score_features = loaded.signatures["score_features"]
    received = " ".join(str(size) for size in shape)
    expected = rf"expects float32 features \[batch, list, 7\]; received shape\] \[{received}\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        # Fed as TF Serving feeds it: without comparing its shape with the signature's.
        score_features._call_flat([features], score_features.captured_inputs)


def _nan_requests(position):
    """Returns {signature: inputs} holding one document whose feature `position` is NaN."""
    features, mask = _lists(8)
    features[1, 2, position] = np.nan
    elwc, examples = _requests(features, mask)
    return {
        "serving_default": {"elwc": elwc},
        "score_examples": {"examples": examples},
        "score_features": {"features": features},
    }


@needs_tensorflow
@pytest.mark.parametrize("position", [0, 3])
@pytest.mark.parametrize("signature", ["serving_default", "score_examples", "score_features"])
def test_nan_features_are_refused_by_every_signature(loaded, signature, position):
    import tensorflow as tf

    inputs = _nan_requests(position)[signature]
    expected = f"{signature}: feature values must be finite.*that do:\\] \\[1\\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})


@needs_tensorflow
def test_a_model_that_handles_missing_values_takes_nan_but_not_infinity(version_history):
    import tensorflow as tf

    _, history = version_history
    model = history["missing_as_zero"]
    signatures = tf.saved_model.load(history["first"]).signatures
    features, mask = _lists(8)
    features[1, 2, 3] = np.nan
    scores = _expected_scores(model, np.nan_to_num(features, nan=0.0), mask)
    expected = {"serving_default": np.where(mask, scores, 0.0), "score_examples": scores[mask],
                "score_features": _expected_scores(model, np.nan_to_num(features, nan=0.0),
                                                   np.ones_like(mask))}
    for signature, inputs in _nan_requests(3).items():
        (got,) = signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()}).values()
        np.testing.assert_allclose(got.numpy(), expected[signature], atol=1e-5)
    features[1, 2, 3] = np.inf
    for signature, inputs in {"score_features": {"features": features},
                              export.MASKED: {"features": features, "mask": mask}}.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=(
                f"{signature}: feature values must not be infinite; some documents hold infinite "
                r"values. Documents that do:\] \[1\]")):
            signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})


@needs_tensorflow
def test_a_document_without_features_is_named(loaded):
    import tensorflow as tf

    features, mask = _lists(9)
    elwc, _ = _requests(features, mask)
    elwc[2] = records._field(1, b"") + elwc[2]  # list 2 starts with an Example without features
    with pytest.raises(tf.errors.InvalidArgumentError, match="serving_default: a document has no"):
        loaded.signatures["serving_default"](elwc=tf.constant(elwc))


@needs_tensorflow
@pytest.mark.parametrize("signature", ["serving_default", "score_features"])
def test_finite_features_that_overflow_the_scores_are_refused(loaded, signature):
    import tensorflow as tf

    features, mask = _lists(12)
    features[1, 2] = 3e38 * np.where(np.arange(NUM_FEATURES) % 2, 1, -1)
    inputs = {"serving_default": {"elwc": _requests(features, mask)[0]},
              "score_features": {"features": features}}[signature]
    expected = f"{signature}: scores are not finite.*documents.*\\] \\[1\\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})


def _per_feature_documents(features, skip=()):
    """Returns one serialized per_feature tf.Example per row of `features` [n, F], keys "1".."F",
    leaving out the 1-based keys in `skip`."""
    import tensorflow as tf

    documents = []
    for row in features:
        example = tf.train.Example()
        for i, value in enumerate(row, 1):
            if i not in skip:
                example.features.feature[str(i)].float_list.value.append(value)
        documents.append(example.SerializeToString())
    return documents


@needs_tensorflow
def test_per_feature_export_refuses_documents_without_its_keys(exported, version_history):
    import tensorflow as tf

    model = exported[0]
    signatures = tf.saved_model.load(version_history[1]["second"]).signatures
    features, mask = _lists(13)
    features[0, 1, 3] = 0.0  # key "4" is left out of every document: it reads as 0
    documents = _per_feature_documents(features[mask], skip=(4,))
    expected = _expected_scores(model, np.where(mask[:, :, None], features, 0), mask)[mask]
    scores = signatures["score_examples"](examples=tf.constant(documents))["scores"].numpy()
    assert np.all(np.isfinite(scores))
    np.testing.assert_allclose(scores[1], expected[1], atol=1e-5)
    vector_layout_elwc, vector_layout_examples = _requests(features, mask)
    for signature, inputs in [("serving_default", {"elwc": vector_layout_elwc}),
                              ("score_examples", {"examples": vector_layout_examples})]:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"{signature}: a document holds none of the features "):
            signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
    nan = _per_feature_documents(np.full((1, NUM_FEATURES), np.nan, "float32"), skip=(2,))
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature values must be finite"):
        signatures["score_examples"](examples=tf.constant(nan))
    for signature, inputs in export._warmup_requests(
            export._vector_requests(NUM_FEATURES, "per_feature"), export._Bounds(60, None)):
        (scores,) = signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()}).values()
        assert np.all(np.isfinite(scores.numpy()))


@needs_tensorflow
def test_requests_beyond_the_document_bound_are_refused(loaded):
    """Lists are padded to the longest: 3 lists of 30, 1 and 1 documents pad to 90 > 60."""
    import tensorflow as tf

    features = np.random.default_rng(14).normal(size=(3, 30, NUM_FEATURES)).astype("float32")
    lengths = (30, 1, 1)
    canonical = [records.encode_elwc(f[:n]) for f, n in zip(features, lengths)]
    parsed = [_protobuf_lists(f[None, :n], extra="other")[0] for f, n in zip(features, lengths)]
    message = ("serving_default: a request may hold at most 60 documents.*longest.*"
               "this one: 3 lists of up to 30")
    for elwc in (canonical, parsed):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            loaded.signatures["serving_default"](elwc=tf.constant(elwc))
        for one in elwc:  # each list on its own fits
            loaded.signatures["serving_default"](elwc=tf.constant([one]))
    examples = records.encode_examples(np.zeros((61, NUM_FEATURES), "float32"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="score_examples: a request may hold"):
        loaded.signatures["score_examples"](examples=tf.constant(examples))
    with pytest.raises(tf.errors.InvalidArgumentError, match="score_features: a request may hold"):
        loaded.signatures["score_features"](features=tf.zeros([3, 30, NUM_FEATURES]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{export.MASKED}: a request may hold"):
        loaded.signatures[export.MASKED](features=tf.zeros([3, 30, NUM_FEATURES]),
                                         mask=tf.ones([3, 30], tf.bool))


def _protobuf_lists(features, context=None, extra=None):
    """Returns one ELWC per list of `features` [B, L, F] serialized by protobuf (TF Serving's
    input_pb2), documents holding "features" (and `extra`, a feature of one float, if given)."""
    import tensorflow as tf

    input_pb2 = pytest.importorskip("tensorflow_serving.apis.input_pb2")
    serialized = []
    for list_features in features:
        message = input_pb2.ExampleListWithContext()
        if context is not None:
            message.context.CopyFrom(context)
        for document in list_features:
            feature = message.examples.add().features.feature
            feature[records.FEATURES_KEY].float_list.value.extend(document)
            if extra is not None:
                feature[extra].float_list.value.append(1.0)
        serialized.append(message.SerializeToString())
    return serialized


def _read_canonical(strings, lists):
    import tensorflow as tf

    fits, features, mask = export_signatures._read_canonical(
        tf.constant(strings, tf.string), NUM_FEATURES, lists,
        export_signatures._Bounds(MAX_DOCUMENTS, None))
    return bool(fits), features.numpy(), mask.numpy()


@needs_tensorflow
def test_canonical_requests_are_read_as_bytes():
    import tensorflow as tf

    features = np.random.default_rng(10).normal(size=(3, 4, NUM_FEATURES)).astype("float32")
    features[1, 2] = np.nan  # read as it is, refused afterwards
    empty_features = tf.train.Example()
    empty_features.features.SetInParent()
    list_requests = {
        "encode_elwc": [records.encode_elwc(f[:n]) for f, n in zip(features, (2, 4, 0))],
        "protobuf": _protobuf_lists(features[:, :3]),
        "protobuf, empty context": _protobuf_lists(features[:, :3], tf.train.Example()),
        "protobuf, empty context features": _protobuf_lists(features[:, :3], empty_features),
    }
    for name, strings in list_requests.items():
        fits, read, mask = _read_canonical(strings, lists=True)
        lengths = (2, 4, 0) if name == "encode_elwc" else (3, 3, 3)
        assert fits, name
        np.testing.assert_array_equal(mask.sum(axis=1), lengths)
        np.testing.assert_array_equal(read[mask], features[:, : mask.shape[1]][mask])
    documents = features.reshape(-1, NUM_FEATURES)
    example = tf.train.Example()
    example.features.feature[records.FEATURES_KEY].float_list.value.extend(documents[0])
    for strings, expected in [
        (records.encode_examples(documents), documents),
        ([example.SerializeToString()], documents[:1]),
        ([], documents[:0]),
    ]:
        fits, read, mask = _read_canonical(strings, lists=False)
        assert fits and mask.all()
        np.testing.assert_array_equal(read[:, 0], expected)
    assert _read_canonical([], lists=True)[0]


@needs_tensorflow
def test_other_requests_are_not_read_as_bytes():
    import tensorflow as tf

    features = np.random.default_rng(11).normal(size=(2, 3, NUM_FEATURES)).astype("float32")
    documents = features.reshape(-1, NUM_FEATURES)
    context = tf.train.Example()
    context.features.feature["qid"].bytes_list.value.append(b"q1")
    labels = np.ones(3)
    list_requests = {
        "qid": [records.encode_elwc(f, qid=7) for f in features],
        "labels": [records.encode_elwc(f, labels) for f in features],
        "protobuf, qid context": _protobuf_lists(features, context),
        "protobuf, another feature": _protobuf_lists(features, extra="other"),
        "other F": [records.encode_elwc(f[:, :-1]) for f in features],
        "tf.Examples": records.encode_examples(documents),
        "one ELWC, one with qid": [records.encode_elwc(features[0]),
                                   records.encode_elwc(features[1], qid=1)],
    }
    for name, strings in list_requests.items():
        assert not _read_canonical(strings, lists=True)[0], name
    one = records.encode_examples(documents[:1])[0]
    example_requests = {
        "labels": records.encode_examples(documents, np.ones(len(documents))),
        "other F": records.encode_examples(documents[:, :-1]),
        "ELWC": [records.encode_elwc(f) for f in features],
        "two documents in one string": [one + one],
        "one canonical, one empty": [one, b""],
    }
    for name, strings in example_requests.items():
        assert not _read_canonical(strings, lists=False)[0], name


@needs_tensorflow
@pytest.mark.parametrize("lists", [True, False])
def test_every_byte_but_the_floats_is_checked(lists):
    features = np.arange(2 * NUM_FEATURES, dtype="float32").reshape(2, NUM_FEATURES)
    if lists:
        request = records.encode_elwc(features)
        header, _ = records._cached_layout("elwc_entry", NUM_FEATURES, False).parts
    else:
        request = records.encode_examples(features[:1])[0]
        header, _ = records._cached_layout("example", NUM_FEATURES, False).parts
    width = len(header) + 4 * NUM_FEATURES
    assert _read_canonical([request], lists)[0]
    for position in range(len(request)):
        changed = bytearray(request)
        changed[position] ^= 0x40  # 0x0a '\n' becomes 0x4a 'J', the float 0.0 becomes 2.0
        is_float = position < len(request) // width * width and position % width >= len(header)
        fits, read, _ = _read_canonical([bytes(changed)], lists)
        assert fits == is_float, position
        if is_float:  # exactly that document's value changed
            assert (read[0] != features[: len(read[0])]).sum() == 1
    for changed in (request[:-1], request + b"\x00", b"\x00" + request):
        assert not _read_canonical([changed], lists)[0]


@needs_tensorflow
def test_off_layout_requests_are_parsed_to_the_same_scores(exported, loaded):
    import tensorflow as tf

    features, mask = _lists(12)
    expected = _expected_scores(exported[0], features, mask)
    canonical, examples = _requests(features, mask)
    off_layout = {
        "qid": [records.encode_elwc(f[m], qid=3) for f, m in zip(features, mask)],
        "labels": [records.encode_elwc(f[m], np.ones(m.sum())) for f, m in zip(features, mask)],
    }
    serving_default = loaded.signatures["serving_default"]
    fast = serving_default(elwc=tf.constant(canonical))["scores"].numpy()
    np.testing.assert_allclose(fast[mask], expected[mask], atol=1e-5)
    for name, elwc in off_layout.items():
        assert not _read_canonical(elwc, lists=True)[0]
        np.testing.assert_array_equal(serving_default(elwc=tf.constant(elwc))["scores"], fast)
    score_examples = loaded.signatures["score_examples"]
    fast = score_examples(examples=tf.constant(examples))["scores"].numpy()
    labelled = records.encode_examples(features[mask], np.ones(mask.sum()))
    np.testing.assert_array_equal(score_examples(examples=tf.constant(labelled))["scores"], fast)
    features[0, 1, 2] = np.inf  # refused by the parsing path too
    elwc = [records.encode_elwc(f[m], qid=3) for f, m in zip(features, mask)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="serving_default: feature values"):
        serving_default(elwc=tf.constant(elwc))


@needs_tensorflow
def test_wrong_protos_keep_the_request_out_of_the_log(fresh_process):
    _finished(fresh_process, "refused")
    result, _ = fresh_process
    assert _SECRET not in result.stderr, result.stderr[-3000:]


@needs_tensorflow
def test_export_refuses_a_linked_model_directory(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "ranker").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="is a symbolic link, and export does not write through"):
        export.export_saved_model(DNNScorer((4,)), tmp_path / "base", "ranker", NUM_FEATURES)
    assert os.listdir(elsewhere) == []
