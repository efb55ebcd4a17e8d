"""Records with named features (TF-Ranking's data): ranking_dataset by spec, spec inference, the
`spec` command, and the bad inputs each refused with one line naming the file and the feature."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tfapprox.data import (FeatureSpec, FeatureSpecError, RecordError, infer_spec, ranking_dataset,
                           synthetic, write_named_records)
from tfapprox.data.__main__ import main as data_command
from tfapprox.data.dataset import ranking_dataset_by_seed

from test_data_dataset import run_as_main

FORMATS = ["elwc", "sequence_example"]
LENGTHS = [1, 5, 3, 7, 2, 6, 4, 8, 1, 3]  # documents per list
MASK = "example_list_mask"
CONTEXT_SPEC = {
    "user_id": tf.io.FixedLenFeature([1], tf.int64),
    "query_tokens": tf.io.RaggedFeature(tf.string),
}
EXAMPLE_SPEC = {
    "doc_id": tf.io.FixedLenFeature([1], tf.float32, default_value=-7.0),
    "pair": tf.io.FixedLenFeature([2], tf.int64, default_value=[0, 0]),
    "site": tf.io.FixedLenFeature([1], tf.string, default_value="none"),
    "tags": tf.io.VarLenFeature(tf.int64),
    "tokens": tf.io.RaggedFeature(tf.string),
}
LABEL_SPEC = ("grade", tf.io.FixedLenFeature([1], tf.int64, default_value=-1))


def _document(q, i, record_format):
    document = {"doc_id": np.float32(q * 100 + i), "pair": np.int64([q, i]), "site": [f"s{i % 2}"],
                "tags": np.arange(i % 3, dtype=np.int64), "tokens": [f"t{q}.{i}.{k}" for k in range(i % 4)],
                "grade": np.int64(i % 3)}
    if i == 1 and record_format == "elwc":
        del document["site"]  # read as its default; a SequenceExample cannot leave it out
    return document


def _lists(record_format, lengths=LENGTHS):
    return [({"user_id": np.int64(q), "query_tokens": [f"q{q}.{k}" for k in range(q % 3 + 1)]},
             [_document(q, i, record_format) for i in range(n)]) for q, n in enumerate(lengths)]


@pytest.fixture(scope="module", params=FORMATS)
def records_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "lists.tfrecord"
    write_named_records(path, _lists(request.param), request.param)
    return request.param, path


def _dataset(path, batch_size=3, list_size=None, **options):
    options.setdefault("shuffle", False)
    return ranking_dataset(path, batch_size, list_size, context_feature_spec=CONTEXT_SPEC,
                           example_feature_spec=EXAMPLE_SPEC, label_spec=LABEL_SPEC, **options)


def _sparse_rows(sparse, b, n):
    rows = [[] for _ in range(n)]
    for (i, j, _), value in zip(sparse.indices.numpy(), sparse.values.numpy()):
        if i == b and j < n:
            rows[j].append(int(value))
    return rows


def _read(dataset):
    """Every list of ``dataset`` as ``(user, query tokens, documents)``, checking each batch's
    padding on the way: mask a prefix, labels -1 and defaults on padded slots."""
    out = []
    for features, labels in dataset:
        mask, labels = features[MASK].numpy(), labels.numpy()
        width = mask.shape[1]
        doc_id, pair, site = (features[k].numpy() for k in ("doc_id", "pair", "site"))
        tokens = features["tokens"].to_list()
        assert doc_id.shape[1:] == (width, 1) and pair.shape[1:] == (width, 2)
        assert [len(row) for row in tokens] == [width] * len(mask)
        assert features["tags"].dense_shape[1] == width
        for b, query in enumerate(features["query_tokens"].to_list()):
            n = int(mask[b].sum())
            assert mask[b, :n].all() and (labels[b, n:] == -1).all()
            assert (doc_id[b, n:] == -7.0).all() and (site[b, n:] == b"none").all()
            assert tokens[b][n:] == [[]] * (width - n)
            documents = [{
                "doc_id": float(doc_id[b, i, 0]), "pair": pair[b, i].tolist(),
                "site": site[b, i, 0].decode(), "tokens": [t.decode() for t in tokens[b][i]],
                "tags": tags, "grade": labels[b, i],
            } for i, tags in zip(range(n), _sparse_rows(features["tags"], b, n))]
            out.append((int(features["user_id"][b, 0]), [t.decode() for t in query], documents))
    return out


def _kept(dataset):
    """``[(user, [document index...]), ...]``, each list's documents as the dataset yields them."""
    out = []
    for features, _ in dataset:
        mask, doc_id = features[MASK].numpy(), features["doc_id"].numpy()[..., 0]
        for b, user in enumerate(features["user_id"].numpy()[:, 0]):
            ids = (doc_id[b][mask[b]] % 100).astype(int).tolist()
            out.append((int(user), ids))
    return out


def _expected(record_format, q, i):
    document = _document(q, i, record_format)
    return {"doc_id": float(q * 100 + i), "pair": [q, i], "site": document.get("site", ["none"])[0],
            "tokens": document["tokens"], "tags": document["tags"].tolist(), "grade": float(i % 3)}


def _check_list(record_format, user, query, documents, ids=None):
    assert query == [f"q{user}.{k}" for k in range(user % 3 + 1)]
    ids = range(LENGTHS[user]) if ids is None else ids
    assert documents == [_expected(record_format, user, i) for i in ids]


def test_every_spec_kind_reads_back_what_was_written(records_file):
    record_format, path = records_file
    lists = _read(_dataset(path))
    assert [user for user, _, _ in lists] == list(range(len(LENGTHS)))
    for user, query, documents in lists:
        _check_list(record_format, user, query, documents)


def test_the_format_is_detected_or_checked(records_file):
    record_format, path = records_file
    assert len(_read(_dataset(path, data_format=record_format))) == len(LENGTHS)
    other = FORMATS[1 - FORMATS.index(record_format)]
    with pytest.raises(RecordError, match=rf"{path}: records are .* but data_format says"):
        _dataset(path, data_format=other)


def test_list_size_keeps_the_head_in_evaluation_and_pads(records_file):
    record_format, path = records_file
    truncated = _dataset(path, list_size=4)
    lists = _read(truncated)
    for user, query, documents in lists:
        _check_list(record_format, user, query, documents, range(min(4, LENGTHS[user])))
    features, labels = truncated.element_spec
    assert features["doc_id"].shape.as_list() == [None, 4, 1], "static, for a compiled step"
    assert features["pair"].shape.as_list() == [None, 4, 2] and labels.shape.as_list() == [None, 4]
    assert features[MASK].shape.as_list() == [None, 4]


def test_list_size_in_training_keeps_a_random_subset_repeatably(records_file):
    record_format, path = records_file
    drawn = lambda seed: _kept(_dataset(path, batch_size=10, list_size=3, shuffle=True,  # noqa: E731
                                        seed=seed, repeat=True).take(12))
    first = drawn(5)
    assert first == drawn(5), "the same seed draws the same subsets"
    kept = {}
    for user, ids in first:
        assert len(ids) == min(3, LENGTHS[user]) and ids == sorted(set(ids))
        kept.setdefault(user, set()).update(ids)
    assert kept[7] == set(range(8)), "every document of a long list is drawn in some pass"
    for user, _, documents in _read(_dataset(path, batch_size=10, list_size=3, shuffle=True,
                                            seed=1)):
        _check_list(record_format, user, [f"q{user}.{k}" for k in range(user % 3 + 1)], documents,
                    [int(d["doc_id"]) % 100 for d in documents])


def test_length_buckets_pad_to_their_sizes(records_file):
    record_format, path = records_file
    ds = _dataset(path, batch_size=2, list_buckets=[2, 4, 8])
    widths = {int(features[MASK].shape[1]) for features, _ in ds}
    assert widths <= {2, 4, 8}
    lists = _read(ds)
    assert sorted(user for user, _, _ in lists) == list(range(len(LENGTHS)))
    for user, query, documents in lists:
        _check_list(record_format, user, query, documents)
    sizes = {int(f[MASK].shape[1]) for f, _ in _dataset(path, batch_size=2, list_buckets=2)}
    assert len(sizes) <= 2


def test_shuffling_by_seed(records_file):
    _, path = records_file
    by_seed = ranking_dataset_by_seed(path, 3, None, True, context_feature_spec=CONTEXT_SPEC,
                                      example_feature_spec=EXAMPLE_SPEC, label_spec=LABEL_SPEC)
    order = lambda seed: [u for u, _ in _kept(by_seed(seed))]  # noqa: E731
    first = order(3)
    assert first == order(3)
    assert sorted(first) == list(range(len(LENGTHS)))
    assert first != order(4), "another seed, another order"
    assert [u for u, _ in _kept(_dataset(path, shuffle=True, seed=3))] == first


def test_sharding_reads_disjoint_files(tmp_path):
    for half in range(2):
        write_named_records(tmp_path / f"part-{half}.tfrecord",
                            _lists("elwc")[half * 5:(half + 1) * 5])
    users = [sorted(u for u, _, _ in _read(_dataset(str(tmp_path / "*.tfrecord"), num_shards=2,
                                                    shard_index=i))) for i in range(2)]
    assert users == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_a_feature_spec_file_reads_like_the_tf_specs(tmp_path):
    path = tmp_path / "lists.tfrecord"
    write_named_records(path, _lists("elwc"))
    (tmp_path / "vocab.txt").write_text("s0\ns1\n")
    vocabularies = {"site": str(tmp_path / "vocab.txt"), "tokens": str(tmp_path / "vocab.txt"),
                    "query_tokens": str(tmp_path / "vocab.txt")}
    spec = infer_spec(path, "grade", vocabularies, spec_dir=tmp_path)
    spec.save(tmp_path / "spec.json")
    loaded = FeatureSpec.load(tmp_path / "spec.json")
    assert loaded == spec
    by_name = {f.name: f for f in loaded.context + loaded.document}
    assert (by_name["pair"].dtype, by_name["pair"].length) == ("int64", 2)
    assert by_name["tokens"].length is None and by_name["tags"].length is None
    assert by_name["site"].missing == 8  # the second document of each of the 8 lists of 2+
    assert by_name["site"].vocabulary == "vocab.txt"
    assert loaded.label_dtype == "int64" and loaded.label_missing == 0
    features, labels = next(iter(ranking_dataset(path, 10, shuffle=False,
                                                 feature_spec=tmp_path / "spec.json")))
    assert set(features) == {"user_id", "query_tokens", "doc_id", "pair", "site", "tags",
                             "tokens", MASK}
    np.testing.assert_array_equal(features["doc_id"].numpy()[1, :5, 0], [100, 101, 102, 103, 104])
    # Inferred, "site" defaults to "" and the ragged tags read as a ragged tensor.
    assert features["site"].numpy()[1, 1, 0] == b"" and isinstance(features["tags"],
                                                                  tf.RaggedTensor)
    np.testing.assert_array_equal(labels.numpy()[1, :5], [0, 1, 2, 0, 1])


def test_tf_ranking_like_numeric_data(tmp_path):
    paths = synthetic.write_named(tmp_path, "numeric", 10, 6, seed=2)
    spec = infer_spec(paths["train"], "utility")
    assert [f.name for f in spec.document] == [f"custom_features_{j}" for j in range(1, 137)]
    assert all(f.missing > 0 for f in spec.document), "each document holds only some features"
    features, labels = next(iter(ranking_dataset(paths["train"], 6, shuffle=False,
                                                 example_feature_spec=spec.example_feature_spec(),
                                                 label_spec=spec.label_spec())))
    values = np.concatenate([features[f"custom_features_{j}"] for j in range(1, 137)], axis=-1)
    mask = features[MASK].numpy()
    assert ((values[mask] == 0).mean() - 0.3) ** 2 < 0.05 ** 2  # 70% held, the rest default 0
    assert (labels.numpy()[mask] >= 0).all() and (labels.numpy()[~mask] == -1).all()


# --------------------------------------------------------------------------------------------------
# Bad input: one line naming the file and the feature
# --------------------------------------------------------------------------------------------------
def test_a_feature_no_record_holds(records_file):
    _, path = records_file
    with pytest.raises(RecordError, match=rf"{path}: no record holds the document feature 'typo'"):
        ranking_dataset(path, 2, example_feature_spec={"typo": tf.io.FixedLenFeature([1], tf.float32, 0.0)},
                        label_spec=LABEL_SPEC)


@pytest.mark.parametrize("record_format", FORMATS)
def test_another_dtype_or_length_than_the_spec(tmp_path, record_format):
    path = tmp_path / "lists.tfrecord"
    write_named_records(path, _lists(record_format), record_format)
    as_float = {**EXAMPLE_SPEC, "pair": tf.io.FixedLenFeature([2], tf.float32, [0.0, 0.0])}
    with pytest.raises(RecordError, match=rf"^{path}: feature 'pair': .*type"):
        ranking_dataset(path, 2, example_feature_spec=as_float, label_spec=LABEL_SPEC)
    shorter = {**EXAMPLE_SPEC, "pair": tf.io.FixedLenFeature([1], tf.int64, 0)}
    with pytest.raises(RecordError, match=rf"^{path}: feature 'pair' holds 2 values in \d+ documents; "
                                          r"the spec says 1"):
        ranking_dataset(path, 2, example_feature_spec=shorter, label_spec=LABEL_SPEC)


def test_documents_without_a_label_are_counted_and_read_as_padding(tmp_path, capsys):
    lists = _lists("elwc")
    for _, documents in lists[:2]:
        del documents[0]["grade"]
    path = tmp_path / "lists.tfrecord"
    write_named_records(path, lists)
    features, labels = next(iter(_dataset(path, batch_size=2)))
    line = capsys.readouterr().out.strip()
    assert line == (f"{path}: 2 of {sum(LENGTHS)} documents have no 'grade' label; they read as "
                    "the spec's default -1 (padding: in no loss and no metric)")
    assert labels.numpy()[0, 0] == -1 and labels.numpy()[1, 0] == -1
    assert features[MASK].numpy()[1, 0] and labels.numpy()[1, 1] == 1


def test_spec_file_refusals(tmp_path):
    good = {"label": "grade", "document": [{"name": "doc_id", "dtype": "float32"}]}
    (tmp_path / "unknown.json").write_text(json.dumps({**good, "labels": "x"}))
    with pytest.raises(FeatureSpecError, match=r"unknown\.json: unknown key\(s\) 'labels'"):
        FeatureSpec.load(tmp_path / "unknown.json")
    no_vocabulary = {**good, "document": [{"name": "tokens", "dtype": "string", "length": None}]}
    (tmp_path / "string.json").write_text(json.dumps(no_vocabulary))
    with pytest.raises(FeatureSpecError, match=r"string\.json: document\[0\]: feature 'tokens': "
                                               "a string feature needs a vocabulary file"):
        FeatureSpec.load(tmp_path / "string.json")
    (tmp_path / "empty.txt").write_text("\n")
    no_vocabulary["document"][0]["vocabulary"] = "empty.txt"
    (tmp_path / "empty.json").write_text(json.dumps(no_vocabulary))
    with pytest.raises(FeatureSpecError, match=r"empty\.json: feature 'tokens': vocabulary .*empty\.txt "
                                               "is empty"):
        FeatureSpec.load(tmp_path / "empty.json")


def test_spec_command(tmp_path, capsys):
    """`python -m tfapprox.data spec` on TF-Ranking-like token records (SequenceExample): refused
    without the vocabulary, written with it; the file reads back and drives ranking_dataset."""
    paths = synthetic.write_named(tmp_path / "data", "tokens", 12, record_format="sequence_example")
    arguments = ["spec", str(paths["train"]), "--label", "relevance", "--out",
                 str(tmp_path / "spec.json")]
    assert data_command(arguments) == 2 and not (tmp_path / "spec.json").exists()
    assert capsys.readouterr().err.strip() == (
        f"error: {paths['train']}: string feature 'query_tokens' needs a vocabulary: "
        "--vocabulary query_tokens=FILE (one value a line)")
    vocabulary = [f"--vocabulary={name}={paths['vocabulary']}"
                  for name in ("query_tokens", "document_tokens")]
    status, written = run_as_main(arguments + vocabulary), capsys.readouterr()
    assert status == 0, written.err
    spec = FeatureSpec.load(tmp_path / "spec.json")
    assert spec.record_format == "sequence_example" and spec.label_dtype == "int64"
    assert [(f.name, f.dtype, f.length) for f in spec.context + spec.document] == [
        ("query_tokens", "string", None), ("document_tokens", "string", None)]
    assert spec.vocabulary_path(spec.document[0]).resolve() == paths["vocabulary"].resolve()
    assert data_command(arguments + vocabulary) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path / 'spec.json'} exists; the spec "
                                               "goes to a new file")
    features, labels = next(iter(ranking_dataset(paths["train"], 4, shuffle=False,
                                                 feature_spec=tmp_path / "spec.json")))
    assert isinstance(features["document_tokens"], tf.RaggedTensor)
    assert labels.dtype == tf.float32 and set(np.unique(labels.numpy())) <= {-1, 0, 1, 2, 3, 4}
