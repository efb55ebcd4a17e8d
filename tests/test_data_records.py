"""Record encodings and graph-only parsers: ELWC (ours and TF-Ranking's layout), SequenceExample."""

import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tensorflow.core.example import example_pb2, feature_pb2

from build_cache import CACHE_DIR, built_once, digest, venv_identity
from conftest import side_venv_environment, side_venv_python
from tfapprox.data import dataset, records


def _elwc_class():
    """TF Serving's ExampleListWithContext (input.proto) with real tensorflow.Example sub-messages."""
    pool = descriptor_pool.DescriptorPool()
    for module in (feature_pb2, example_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        pool.Add(proto)
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/apis/input.proto", package="tensorflow.serving", syntax="proto3",
        dependency=[example_pb2.DESCRIPTOR.name])
    message = proto.message_type.add(name="ExampleListWithContext")
    message.field.add(name="examples", number=1, label=field.LABEL_REPEATED, type=field.TYPE_MESSAGE,
                      type_name=".tensorflow.Example")
    message.field.add(name="context", number=2, label=field.LABEL_OPTIONAL, type=field.TYPE_MESSAGE,
                      type_name=".tensorflow.Example")
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.ExampleListWithContext"))


ELWC = _elwc_class()


def float_feature(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def vector_example(features, label=None):
    feature = {"features": float_feature(features)}
    if label is not None:
        feature["relevance"] = float_feature([label])
    return tf.train.Example(features=tf.train.Features(feature=feature))


def tfranking_elwc(features, labels, label_kind="int64", context=None):
    """An ELWC as TF-Ranking's LETOR examples write it: features "1".."F", label "relevance"."""
    elwc = ELWC()
    for row, label in zip(features, labels):
        feature = {str(j + 1): float_feature([v]) for j, v in enumerate(row) if v != 0}
        if label_kind == "int64":
            feature["relevance"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))
        else:
            feature["relevance"] = float_feature([label])
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        elwc.examples.add().ParseFromString(example.SerializeToString())
    if context:
        elwc.context.ParseFromString(tf.train.Example(features=tf.train.Features(feature={
            k: float_feature(v) for k, v in context.items()})).SerializeToString())
    return elwc.SerializeToString()


@pytest.fixture
def lists(rng):
    sizes = [5, 1, 3, 0]
    features = [rng.random((n, 7), dtype=np.float32) for n in sizes]
    labels = [rng.integers(0, 5, n).astype(np.float32) for n in sizes]
    return features, labels


def test_encodings_equal_protobuf_messages(lists):
    features, labels = lists
    for f, y in zip(features, labels):
        examples = records.encode_examples(f, y)
        assert [tf.train.Example.FromString(e) for e in examples] == [vector_example(r, l) for r, l in zip(f, y)]
        expected = ELWC()
        for r, l in zip(f, y):
            expected.examples.add().ParseFromString(vector_example(r, l).SerializeToString())
        expected.context.features.feature["qid"].bytes_list.value.append(b"q-1")
        assert ELWC.FromString(records.encode_elwc(f, y, qid="q-1")) == expected
        sequence = tf.train.SequenceExample.FromString(records.encode_sequence_example(f, y, qid=3))
        assert [list(x.float_list.value) for x in sequence.feature_lists.feature_list["features"].feature] == f.tolist()
        assert [x.float_list.value[0] for x in sequence.feature_lists.feature_list["relevance"].feature] == y.tolist()
        assert sequence.context.feature["qid"].bytes_list.value == [b"3"]
    assert tf.train.Example.FromString(records.encode_examples(features[0])[0]) == vector_example(features[0][0])


def test_parse_elwc_pads_masks_and_labels(lists):
    features, labels = lists
    serialized = tf.constant([records.encode_elwc(f, y, qid=i) for i, (f, y) in enumerate(zip(features, labels))])
    got_features, mask, got_labels = records.parse_elwc(serialized, 7)
    assert got_features.shape == (4, 5, 7) and mask.dtype == tf.bool and got_labels.dtype == tf.float32
    for i, (f, y) in enumerate(zip(features, labels)):
        n = len(y)
        np.testing.assert_array_equal(got_features[i, :n], f)
        np.testing.assert_array_equal(got_features[i, n:], 0.0)
        np.testing.assert_array_equal(mask[i], np.arange(5) < n)
        np.testing.assert_array_equal(got_labels[i, :n], y)
        np.testing.assert_array_equal(got_labels[i, n:], -1.0)


def test_parse_elwc_without_labels_is_a_serving_request(lists):
    features, _ = lists
    got, mask, labels = records.parse_elwc(tf.constant([records.encode_elwc(features[0])]), 7)
    np.testing.assert_array_equal(got[0], features[0])
    assert bool(tf.reduce_all(mask)) and bool(tf.reduce_all(labels == -1.0))


def test_sequence_example_parses_like_elwc(lists):
    features, labels = lists
    elwc = records.parse_elwc([records.encode_elwc(f, y) for f, y in zip(features, labels)], 7)
    sequence = records.parse_sequence_examples(
        [records.encode_sequence_example(f, y) for f, y in zip(features, labels)], 7)
    for a, b in zip(elwc, sequence):
        np.testing.assert_array_equal(a, b)


def test_parse_examples_vector_and_per_feature_layouts(rng):
    features = rng.random((4, 6), dtype=np.float32)
    features[1, 2] = 0.0
    vector = records.parse_examples(tf.constant(records.encode_examples(features)), 6)
    np.testing.assert_array_equal(vector, features)
    elwc = tfranking_elwc(features, [0, 1, 2, 3])
    examples, _ = records.split_elwc(elwc)
    per_feature, labels = records.parse_examples(examples, 6, layout="per_feature", label_dtype=tf.int64,
                                                 with_labels=True)
    np.testing.assert_array_equal(per_feature, features)  # the omitted "3" of document 1 reads 0
    np.testing.assert_array_equal(labels, [0, 1, 2, 3])
    assert records.describe_example(examples[0]) == {"layout": "per_feature", "num_features": 6,
                                                     "label_dtype": tf.int64}


@pytest.mark.parametrize("label_kind,label_dtype", [("int64", tf.int64), ("float", tf.float32)])
def test_tfranking_style_elwc_is_read(rng, label_kind, label_dtype):
    sizes = (3, 6, 2)
    features = [rng.random((n, 5), dtype=np.float32) for n in sizes]
    labels = [rng.integers(0, 3, n) for n in sizes]
    serialized = [tfranking_elwc(f, y, label_kind, context={"query_length": [3.0]})
                  for f, y in zip(features, labels)]
    assert dataset._describe_record(serialized[1]) == ("elwc", "per_feature", 5, label_dtype)
    got, mask, got_labels = records.parse_elwc(serialized, 5, layout="per_feature", label_dtype=label_dtype)
    for i, (f, y) in enumerate(zip(features, labels)):
        np.testing.assert_array_equal(got[i, :len(y)], f)
        np.testing.assert_array_equal(got_labels[i, :len(y)], y)
        assert int(tf.reduce_sum(tf.cast(mask[i], tf.int32))) == len(y)


def test_parse_elwc_runs_in_a_saved_model(tmp_path, lists):
    features, labels = lists

    class Serve(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def __call__(self, serialized):
            x, mask, _ = records.parse_elwc(serialized, 7)
            return tf.where(mask, tf.reduce_sum(x, axis=-1), 0.0)

    tf.saved_model.save(Serve(), str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    out = loaded(tf.constant([records.encode_elwc(features[0]), records.encode_elwc(features[2])]))
    np.testing.assert_allclose(out[0], features[0].sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(out[1, :3], features[2].sum(axis=1), rtol=1e-6)


def test_argument_and_format_errors():
    with pytest.raises(ValueError, match="num_features must be a positive integer; got 0"):
        records.parse_elwc(tf.constant([b""]), 0)
    with pytest.raises(ValueError, match="layout must be one of"):
        records.parse_examples(tf.constant([b""]), 3, layout="columns")
    with pytest.raises(ValueError, match=r"labels must have one entry per document: 2 documents, 3 labels"):
        records.encode_elwc(np.zeros((2, 3)), [1, 2, 3])
    with pytest.raises(ValueError, match=r"features must be a \[num_docs, num_features\] array; got shape \(3,\)"):
        records.encode_elwc(np.zeros(3))
    with pytest.raises(ValueError, match="record_format must be one of"):
        records.encode_list(np.zeros((1, 1)), [0], record_format="csv")
    with pytest.raises(ValueError, match="not an ExampleListWithContext"):
        records.split_elwc(b"\x0a\xff\xff")
    with pytest.raises(tf.errors.InvalidArgumentError):
        records.parse_elwc(tf.constant([records.encode_elwc(np.zeros((2, 4)))]), 5)  # 4 features, not 5


# --------------------------------------------------------------------------------------------------
# Interop with the real TF-Ranking 0.5.5 and tensorflow-serving-api (side virtualenv, like the
# parity tests): their ELWC -> our parser, our ELWC -> their parse_from_example_list.
# --------------------------------------------------------------------------------------------------
SIDE_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import tensorflow_ranking as tfr
    from tensorflow_serving.apis import input_pb2

    inputs = np.load(sys.argv[1])
    features, labels, sizes = inputs["features"], inputs["labels"], inputs["sizes"]
    num_features = features.shape[1]
    written, start = [], 0
    for n in sizes:
        elwc = input_pb2.ExampleListWithContext()
        elwc.context.features.feature["qid"].bytes_list.value.append(b"q")
        for row, label in zip(features[start:start + n], labels[start:start + n]):
            example = elwc.examples.add()
            for j, v in enumerate(row):
                example.features.feature[str(j + 1)].float_list.value.append(float(v))
            example.features.feature["relevance"].int64_list.value.append(int(label))
        written.append(elwc.SerializeToString())
        start += n
    ours = [r.numpy() for r in tf.data.TFRecordDataset(sys.argv[3])]
    parsed = tfr.data.parse_from_example_list(
        ours, list_size=int(max(sizes)),
        example_feature_spec={"features": tf.io.FixedLenFeature([num_features], tf.float32,
                                                          default_value=[0.0] * num_features),
                              "relevance": tf.io.FixedLenFeature([1], tf.float32, default_value=[-1.0])})
    with tf.io.TFRecordWriter(sys.argv[4]) as writer:
        for record in written:
            writer.write(record)
    np.savez(sys.argv[2], parsed_features=parsed["features"].numpy(), parsed_labels=parsed["relevance"].numpy())
""")


@pytest.mark.parity
def test_interop_with_tfranking_and_serving_api(tmp_path, rng):
    python = side_venv_python()
    sizes = np.array([4, 1, 6])
    features = rng.random((sizes.sum(), 5), dtype=np.float32)
    labels = rng.integers(0, 5, sizes.sum()).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ours = [records.encode_elwc(features[s:s + n], labels[s:s + n], qid=i)
            for i, (s, n) in enumerate(zip(starts, sizes))]
    inputs = {"features": features, "labels": labels, "sizes": sizes}
    np.savez(tmp_path / "in.npz", **inputs)
    with tf.io.TFRecordWriter(str(tmp_path / "ours.tfrecord")) as writer:
        for record in ours:
            writer.write(record)
    (tmp_path / "side.py").write_text(SIDE_SCRIPT)

    def run_side_script(partial):  # TF-Ranking's parse of our records, and its own records
        os.mkdir(partial)
        files = [tmp_path / "in.npz", Path(partial, "out.npz"), tmp_path / "ours.tfrecord",
                 Path(partial, "theirs.tfrecord")]
        run = subprocess.run([python, str(tmp_path / "side.py"), *map(str, files)],
                             capture_output=True, text=True, timeout=600,
                             env=side_venv_environment())
        assert run.returncode == 0, run.stderr[-4000:]

    # kept for later runs (tests/build_cache.py): TensorFlow 2.15 starts only when this changes
    key = digest(SIDE_SCRIPT, venv_identity(python), inputs, *ours)
    side = Path(built_once(os.path.join(CACHE_DIR, "tfranking-interop", key), run_side_script))
    theirs = [r.numpy() for r in tf.data.TFRecordDataset(str(side / "theirs.tfrecord"))]
    with np.load(side / "out.npz") as out:
        parsed_features, parsed_labels = out["parsed_features"], out["parsed_labels"]
    got, mask, got_labels = records.parse_elwc(theirs, 5, layout="per_feature", label_dtype=tf.int64)
    for i, (s, n) in enumerate(zip(starts, sizes)):
        np.testing.assert_array_equal(got[i, :n], features[s:s + n])
        np.testing.assert_array_equal(got_labels[i, :n], labels[s:s + n])
        np.testing.assert_array_equal(parsed_features[i, :n], features[s:s + n])
        np.testing.assert_array_equal(parsed_labels[i, :n, 0], labels[s:s + n])
        np.testing.assert_array_equal(parsed_labels[i, n:, 0], -1.0)


def test_a_document_without_features_is_an_error():
    empty = tf.train.Example().SerializeToString()
    elwc = records.encode_elwc(np.ones((2, 3))) + records._field(1, empty)
    with pytest.raises(tf.errors.InvalidArgumentError, match="has no 'features' feature"):
        records.parse_elwc(tf.constant([elwc]), 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="features"):
        records.parse_examples(tf.constant([empty]), 3)


def test_a_nan_or_infinite_label_is_an_error_not_padding():
    with pytest.raises(ValueError, match="labels must be finite"):
        records.encode_elwc(np.ones((2, 3)), [1.0, np.nan])
    for bad in (np.nan, np.inf):
        label = feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[bad]))
        document = example_pb2.Example()
        document.features.feature[records.FEATURES_KEY].float_list.value.extend([1.0, 2.0, 3.0])
        document.features.feature[records.LABEL_KEY].CopyFrom(label)
        elwc = records.encode_elwc(np.ones((1, 3)), [2.0]) + records._field(1, document.SerializeToString())
        with pytest.raises(tf.errors.InvalidArgumentError, match="a document's label is NaN or infinite"):
            records.parse_elwc(tf.constant([elwc]), 3)
    sequence = records.encode_list(np.ones((2, 3)), np.array([1.0, 0.0]), "q", "sequence_example")
    parsed = tf.train.SequenceExample.FromString(sequence)
    parsed.feature_lists.feature_list[records.LABEL_KEY].feature[1].float_list.value[0] = float("nan")
    with pytest.raises(tf.errors.InvalidArgumentError, match="a document's label is NaN or infinite"):
        records.parse_sequence_examples(tf.constant([parsed.SerializeToString()]), 3)
