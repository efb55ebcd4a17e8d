"""Converter, spec, tf.data pipeline and generated data: round trips, padding, truncation, sharding."""

import itertools
import json
import os
import pathlib
import re
import runpy
import subprocess
import sys
import tracemalloc
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from tfapprox.data import converter, dataset, letor, records, shards, synthetic
from tfapprox.data.__main__ import main as cli
from tfapprox.data.shards import RecordError

from conftest import START_UP_NOTICES
from test_data_letor import lightgbm_copy

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
requires_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"LETOR data not found at {SHARED_DATA}")


def lists_of(ds):
    """Returns [(labels [n], features [n, F])] of every list in ``ds``, padding stripped."""
    found = []
    for inputs, labels in ds:
        features, mask, labels = inputs["features"].numpy(), inputs["mask"].numpy(), labels.numpy()
        assert features.dtype == np.float32 and mask.dtype == bool and labels.dtype == np.float32
        for f, m, y in zip(features, mask, labels):
            n = int(m.sum())
            assert m[:n].all() and not m[n:].any(), "real documents come first"
            np.testing.assert_array_equal(y[n:], -1.0)
            np.testing.assert_array_equal(f[n:], 0.0)
            found.append((y[:n], f[:n]))
    return found


def assert_lists_equal(got, queries):
    assert len(got) == len(queries)
    for (labels, features), query in zip(got, queries):
        np.testing.assert_array_equal(labels, query.labels, err_msg=query.qid)
        np.testing.assert_array_equal(features, query.features, err_msg=query.qid)


def signature(labels, features):
    return labels.tobytes() + features.tobytes()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Generated 60-query train/vali/test text, and its train split converted to 3 shards."""
    root = tmp_path_factory.mktemp("small")
    paths = synthetic.write_splits(root / "text", 100, 12, 6, seed=5)
    spec = converter.convert(paths["train"], root / "records", num_shards=3)
    return {"paths": paths, "records": root / "records", "spec": spec,
            "queries": list(letor.read_queries(paths["train"], 6))}


# --------------------------------------------------------------------------------------------------
# Converter and spec
# --------------------------------------------------------------------------------------------------
def test_spec_counts_what_was_read_and_written(small):
    spec, queries = small["spec"], small["queries"]
    assert json.loads((small["records"] / "spec.json").read_text()) == spec
    labels = np.concatenate([q.labels for q in queries])
    assert spec["format"] == "elwc" and spec["example_layout"] == "vector" and spec["num_features"] == 6
    assert spec["num_lists"] == len(queries) == 60
    assert spec["num_docs"] == len(labels)
    assert (spec["label_min"], spec["label_max"]) == (labels.min(), labels.max())
    assert spec["label_counts"] == {str(int(v)): int(c) for v, c in zip(*np.unique(labels, return_counts=True))}
    assert [s["num_lists"] for s in spec["shards"]] == [20, 20, 20]
    assert sum(s["num_docs"] for s in spec["shards"]) == spec["num_docs"]
    for shard in spec["shards"]:
        assert (small["records"] / shard["file"]).stat().st_size == shard["bytes"]
    assert dataset.check_records(dataset.describe(small["records"]).files) == {
        "num_lists": 60, "num_docs": spec["num_docs"], "num_features": 6}


def test_cli_convert_check_and_overwrite(tmp_path, small, capsys):
    train = str(small["paths"]["train"])
    assert cli(["convert", train, "--output", str(tmp_path / "out"), "--shards", "2", "--num-features", "8"]) == 0
    assert "60 lists" in capsys.readouterr().out
    assert shards.read_spec(tmp_path / "out")["num_features"] == 8
    assert cli(["convert", train, "--output", str(tmp_path / "out")]) == 2
    assert "already holds part-00000-of-00002.tfrecord" in capsys.readouterr().err
    assert cli(["convert", train, "--output", str(tmp_path / "out"), "--overwrite"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part-00000-of-00001.tfrecord", "spec.json"]
    assert cli(["check", str(tmp_path / "out")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["num_lists"] == 60
    assert cli(["convert", train, "--output", str(tmp_path / "o2"), "--num-features", "3", "--overwrite"]) == 2
    assert "feature index 4 is above num_features=3" in capsys.readouterr().err


def test_failed_overwrite_keeps_the_previous_set(tmp_path, small, capsys):
    out = tmp_path / "out"
    assert cli(["convert", str(small["paths"]["train"]), "--output", str(out), "--shards", "2"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.txt"
    bad.write_text("1 qid:1 1:0.5\nx qid:1 1:0.2\n")
    assert cli(["convert", str(bad), "--output", str(out), "--overwrite"]) == 2
    assert "bad.txt:2: non-numeric label 'x'" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "old set intact, nothing mixed in"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "out"], "no staging left behind"
    assert cli(["check", str(out)]) == 0
    # A successful overwrite replaces the whole set (2 shards -> 1) and leaves nothing beside it.
    assert cli(["convert", str(small["paths"]["vali"]), "--output", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["part-00000-of-00001.tfrecord", "spec.json"]
    assert shards.read_spec(out)["num_lists"] == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "out"]


def test_output_directory_with_other_files_is_refused(tmp_path, small):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    with pytest.raises(FileExistsError, match=r"out holds notes\.md, which convert did not write"):
        converter.convert(small["paths"]["train"], out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["notes.md"]


def test_cli_label_limit_and_non_integer_labels(tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("0 qid:1 1:1\n100 qid:1 1:2\n")
    assert cli(["convert", str(text), "--output", str(tmp_path / "a")]) == 2
    assert "in.txt:2: label 100 is above max_label=31" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    for limit in ("100", "none"):
        assert cli(["convert", str(text), "--output", str(tmp_path / limit), "--max-label", limit]) == 0
        assert "labels 0..100 (integers)" in capsys.readouterr().out
        assert shards.read_spec(tmp_path / limit)["label_max"] == 100
    text.write_text("0.5 qid:1 1:1\n2 qid:1 1:2\n")
    assert cli(["convert", str(text), "--output", str(tmp_path / "b")]) == 0
    assert "labels 0.5..2 (not all integers)" in capsys.readouterr().out


def test_cli_converts_a_fold_tree(tmp_path, capsys):
    for fold in (1, 2):
        synthetic.write_splits(tmp_path / "text" / f"Fold{fold}", 9, 5, 4, seed=fold)
    assert cli(["convert", str(tmp_path / "text"), "--output", str(tmp_path / "out")]) == 0
    for fold in ("Fold1", "Fold2"):
        for split, n in (("train", 5), ("vali", 2), ("test", 2)):
            assert shards.read_spec(tmp_path / "out" / fold / split)["num_lists"] == n
    assert cli(["synthetic", str(tmp_path / "gen"), "--queries", "10", "--docs", "4", "--features", "3"]) == 0
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["test.txt", "train.txt", "vali.txt"]


def run_as_main(argv):
    """The exit status of `python -m tfapprox.data ARGV`: its __main__.py run as __main__ in this
    process, as `python -m` runs it, without a fresh interpreter's seconds of TensorFlow import
    (test_python_dash_m_entry_point starts one)."""
    with mock.patch.object(sys, "argv", ["tfapprox.data", *argv]), pytest.raises(SystemExit) as exited:
        runpy.run_path(str(REPO / "tfapprox" / "data" / "__main__.py"), run_name="__main__")
    return exited.value.code


def test_python_dash_m_entry_point(tmp_path, small, capsys):
    assert run_as_main(["convert", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o")]) == 2
    assert "no such LETOR file" in capsys.readouterr().err
    # A conversion keeps TensorFlow's start-up notices off
    # the terminal, with TF_CPP_MIN_LOG_LEVEL unset as in a user's shell.
    quiet = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    run = subprocess.run(
        [sys.executable, "-m", "tfapprox.data", "convert", str(small["paths"]["vali"]), "--output",
         str(tmp_path / "records")], capture_output=True, text=True, timeout=300, env=quiet)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "records" / "spec.json").is_file()
    assert not [notice for notice in START_UP_NOTICES if notice in run.stderr], run.stderr[-3000:]


def test_a_huge_feature_index_is_refused_before_allocating(tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("1 qid:1 1:0.1 1000000000:0.2\n")
    tracemalloc.start()
    try:
        assert cli(["convert", str(text), "--output", str(tmp_path / "out")]) == 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"{peak} bytes allocated"
    error = capsys.readouterr().err
    assert re.search(r"in\.txt:1: feature index 1000000000 is far beyond the others; without num_features the "
                     r"width F is inferred only up to 1000 here \(.* never above 100000\).*--num-features", error)
    assert cli(["convert", str(text), "--output", str(tmp_path / "out"), "--num-features", "5"]) == 2
    assert "in.txt:1: feature index 1000000000 is above num_features=5" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"], "nothing written"


def test_text_and_records_mixed_in_either_order_are_named(tmp_path, small, capsys):
    text = small["paths"]["vali"]
    shard = small["records"] / "part-00000-of-00003.tfrecord"
    message = f"inputs mix LETOR text ({text}) and TFRecord files ({shard}); give one kind"
    for inputs in ([text, shard], [shard, text]):
        with pytest.raises(letor.LetorFormatError) as caught:
            converter.convert(inputs, tmp_path / "out")
        assert str(caught.value).startswith(message)
        with pytest.raises(ValueError) as caught:
            dataset.describe(inputs)
        assert str(caught.value).startswith(message)
        assert cli(["convert", *map(str, inputs), "--output", str(tmp_path / "out")]) == 2
        error = capsys.readouterr().err
        assert message in error and "\\x00" not in error
    assert cli(["convert", str(shard), "--output", str(tmp_path / "out")]) == 2
    assert f"{shard}: binary data, not LETOR text (a TFRecord file?" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_text_with_a_byte_order_mark_is_text(tmp_path, small):
    """The trainer asks inspect_file whether its input is text; a BOM must not make it a TFRecord."""
    text = tmp_path / "bom.txt"
    text.write_bytes(b"\xef\xbb\xbf" + small["paths"]["train"].read_bytes())
    assert dataset.inspect_file(text).kind == "letor"
    assert_lists_equal(lists_of(dataset.ranking_dataset(text, 8, shuffle=False)), small["queries"])


def symlinked_output(tmp_path, small):
    """``out`` -> ``real/``, which holds a converted set; returns (link, {name: bytes} of the set)."""
    real = tmp_path / "real"
    converter.convert(small["paths"]["vali"], real)
    (tmp_path / "out").symlink_to(real)
    return tmp_path / "out", {p.name: p.read_bytes() for p in real.iterdir()}


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_symlinked_output_is_refused_before_writing(tmp_path, small, capsys, overwrite):
    link, before = symlinked_output(tmp_path, small)
    argv = ["convert", str(small["paths"]["train"]), "--output", str(link)] + ["--overwrite"] * overwrite
    assert cli(argv) == 2
    assert f"error: {link} is a symbolic link (to {tmp_path / 'real'}); convert never writes through a link" in (
        capsys.readouterr().err)
    assert link.is_symlink() and {p.name: p.read_bytes() for p in link.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "real"], "nothing left beside it"
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "train.txt").symlink_to(small["paths"]["train"])
    for name in ("vali", "test"):
        (tmp_path / "text" / f"{name}.txt").symlink_to(small["paths"][name])
    with pytest.raises(FileExistsError, match="out is a symbolic link"):
        converter.convert_tree(tmp_path / "text", link, overwrite=overwrite)
    assert {p.name: p.read_bytes() for p in link.iterdir()} == before


def test_convert_deletes_only_what_it_wrote(tmp_path, small, monkeypatch):
    """Leftover-looking names beside the output, and links inside it, are the user's: kept."""
    monkeypatch.setattr(os, "getpid", lambda: 4242)  # the names an older version would have reused
    out = tmp_path / "out"
    converter.convert(small["paths"]["vali"], out)
    for name in (".out.converting-4242", ".out.replaced-4242"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mine.txt").write_text("mine")
    assert converter.convert(small["paths"]["train"], out, overwrite=True)["num_lists"] == 60
    for name in (".out.converting-4242", ".out.replaced-4242"):
        assert (tmp_path / name / "mine.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.converting-4242", ".out.replaced-4242", "out"]
    notes = tmp_path / "notes.md"
    notes.write_text("mine")
    (out / "spec.json").unlink()
    (out / "spec.json").symlink_to(notes)
    with pytest.raises(FileExistsError, match=r"out holds spec\.json, which convert did not write"):
        converter.convert(small["paths"]["vali"], out, overwrite=True)
    assert (out / "spec.json").is_symlink() and notes.read_text() == "mine"


def test_non_contiguous_input_converts_grouped(tmp_path):
    text = "1 qid:b 1:1\n0 qid:a 1:2\n2 qid:b 1:3\n0 qid:c 1:4\n1 qid:a 1:5\n"
    (tmp_path / "in.txt").write_text(text)
    spec = converter.convert(tmp_path / "in.txt", tmp_path / "out")
    assert (spec["num_lists"], spec["num_docs"], spec["min_list_size"], spec["max_list_size"]) == (3, 5, 1, 2)
    got = lists_of(dataset.ranking_dataset(tmp_path / "out", 8, shuffle=False))
    assert [y.tolist() for y, _ in got] == [[1, 2], [0, 1], [0]]
    assert [f[:, 0].tolist() for _, f in got] == [[1, 3], [2, 5], [4]]
    with pytest.raises(letor.LetorFormatError, match=r"in\.txt:3: query id 'b' appears again"):
        converter.convert(tmp_path / "in.txt", tmp_path / "strict", assume_contiguous=True)


def test_lightgbm_layout_converts_and_reads_like_letor(tmp_path, small, capsys):
    copy = lightgbm_copy(small["paths"]["train"], tmp_path)
    want = lists_of(dataset.ranking_dataset(small["paths"]["train"], 8, shuffle=False))
    assert_lists_equal(lists_of(dataset.ranking_dataset(copy, 8, shuffle=False)), small["queries"])
    assert cli(["convert", str(copy), "--output", str(tmp_path / "auto"), "--shards", "2"]) == 0
    assert "60 lists" in capsys.readouterr().out
    spec = shards.read_spec(tmp_path / "auto")
    assert spec["group_files"] == [str(copy) + ".query"]
    got = lists_of(dataset.ranking_dataset(tmp_path / "auto", 8, seed=0))
    assert sorted(signature(*x) for x in got) == sorted(signature(*x) for x in want)
    sizes = pathlib.Path(str(copy) + ".query").rename(tmp_path / "train.groups")
    assert cli(["convert", str(copy), "--output", str(tmp_path / "given"), "--query-file", str(sizes)]) == 0
    assert_lists_equal(lists_of(dataset.ranking_dataset(tmp_path / "given", 8, shuffle=False)), small["queries"])
    assert cli(["convert", str(copy), str(copy), "--output", str(tmp_path / "x"), "--query-file", str(sizes)]) == 2
    assert "got 1 query files for 2 inputs" in capsys.readouterr().err
    assert cli(["convert", str(copy), "--output", str(tmp_path / "x")]) == 2
    assert "no group file beside the file" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--query-file goes with input files"):
        cli(["convert", str(tmp_path), "--output", str(tmp_path / "x"), "--query-file", str(sizes)])


def test_sequence_example_format_reads_like_elwc(tmp_path, small):
    converter.convert(small["paths"]["train"], tmp_path / "seq", record_format="sequence_example", num_shards=2)
    assert dataset.describe(tmp_path / "seq").record_format == "sequence_example"
    got = lists_of(dataset.ranking_dataset(tmp_path / "seq", 7, list_size=12, shuffle=False))
    assert sorted(signature(*a) for a in got) == sorted(
        signature(q.labels[:12], q.features[:12]) for q in small["queries"])


# --------------------------------------------------------------------------------------------------
# Bad records
# --------------------------------------------------------------------------------------------------
def copy_records(src, dst):
    dst.mkdir()
    for path in src.iterdir():
        (dst / path.name).write_bytes(path.read_bytes())
    return dst


def test_truncated_shard_is_named(tmp_path, small):
    bad = copy_records(small["records"], tmp_path / "bad")
    shard = bad / "part-00001-of-00003.tfrecord"
    os.truncate(shard, shard.stat().st_size - 7)
    with pytest.raises(RecordError, match=r"part-00001-of-00003\.tfrecord: \d+ bytes, but .*spec\.json records"):
        dataset.ranking_dataset(bad, 4, verify=False)
    (bad / "spec.json").unlink()  # without the spec: the CRC read names it
    with pytest.raises(RecordError, match=r"part-00001-of-00003\.tfrecord: corrupt or truncated TFRecord file "
                                          r"\(truncated record at \d+"):
        dataset.ranking_dataset(bad, 4)
    with pytest.raises(RecordError, match=r"part-00001-of-00003\.tfrecord: corrupt or truncated"):
        dataset.check_records(sorted(bad.glob("*.tfrecord")))


def test_corrupt_shard_is_named(tmp_path, small):
    bad = copy_records(small["records"], tmp_path / "bad")
    shard = bad / "part-00002-of-00003.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(RecordError, match=r"part-00002-of-00003\.tfrecord: corrupt or truncated TFRecord file "
                                          r"\(corrupted record at \d+\)"):
        dataset.ranking_dataset(bad, 4)
    data[5] ^= 0xFF  # the first record's length: already the format probe fails
    shard.write_bytes(bytes(data))
    with pytest.raises(RecordError, match=r"part-00002-of-00003\.tfrecord: corrupt or truncated"):
        dataset.describe(bad)


def test_shards_disagreeing_on_feature_count_are_named(tmp_path, small):
    mixed = copy_records(small["records"], tmp_path / "mixed")
    with tf.io.TFRecordWriter(str(mixed / "part-00002-of-00003.tfrecord")) as writer:
        writer.write(records.encode_elwc(np.zeros((2, 5)), [0, 1]))
    with pytest.raises(RecordError, match=r"part-00002-of-00003\.tfrecord: documents have 5 features, "
                                          r"but .*spec\.json has 6; all shards must agree"):
        dataset.ranking_dataset(mixed, 4)
    (mixed / "spec.json").unlink()
    (mixed / "part-00002-of-00003.tfrecord").rename(mixed / "part-00009-of-00009.tfrecord")
    with pytest.raises(RecordError, match=r"part-00009-of-00009\.tfrecord: documents have 5 features, "
                                          r"but .*part-00000-of-00003\.tfrecord has 6"):
        dataset.ranking_dataset(str(mixed / "*.tfrecord"), 4)
    with pytest.raises(RecordError, match=r"part-00009-of-00009\.tfrecord: documents have 5 features, but 6"):
        dataset.check_records(sorted(mixed.glob("*.tfrecord")))


def test_a_shard_the_spec_does_not_list_is_refused(tmp_path, small, capsys):
    out = copy_records(small["records"], tmp_path / "out")
    stray = out / "backup.tfrecord"
    stray.write_bytes((out / "part-00000-of-00003.tfrecord").read_bytes())
    message = r"backup\.tfrecord: not listed in .*out/spec\.json"
    for pattern in (out, str(out / "*.tfrecord"), stray):
        with pytest.raises(RecordError, match=message):
            dataset.ranking_dataset(pattern, 4)
    with pytest.raises(RecordError, match=message):
        dataset.check_records(sorted(out.glob("*.tfrecord")))
    assert cli(["check", str(out)]) == 2
    assert re.search(message, capsys.readouterr().err)
    stray.unlink()
    (out / "part-00001-of-00003.tfrecord").unlink()
    with pytest.raises(RecordError, match=r"out/spec\.json lists part-00001-of-00003\.tfrecord, which is missing"):
        dataset.ranking_dataset(out, 4)
    assert dataset.describe(out / "part-00002-of-00003.tfrecord").num_lists == 20, "a subset named on purpose"


def test_a_nan_label_is_named_by_check(tmp_path, capsys):
    document = tf.train.Example()
    document.features.feature[records.FEATURES_KEY].float_list.value.extend([1.0, 2.0])
    document.features.feature[records.LABEL_KEY].float_list.value.append(float("nan"))
    with tf.io.TFRecordWriter(str(tmp_path / "x.tfrecord")) as writer:
        writer.write(records.encode_elwc(np.ones((1, 2)), [1.0]) + records._field(1, document.SerializeToString()))
    assert cli(["check", str(tmp_path)]) == 2
    assert ("x.tfrecord: a record is not a valid ranking list (a document's label is NaN or infinite"
            in capsys.readouterr().err)


def test_not_a_ranking_record_and_missing_files(tmp_path):
    with tf.io.TFRecordWriter(str(tmp_path / "x.tfrecord")) as writer:
        writer.write(b"\x08\x01")
    with pytest.raises(RecordError, match=r"x\.tfrecord: first record is not a ranking list"):
        dataset.describe(tmp_path / "x.tfrecord")
    with pytest.raises(FileNotFoundError, match="no files match"):
        dataset.ranking_dataset(str(tmp_path / "nothing-*.tfrecord"), 4)
    with pytest.raises(ValueError, match="batch_size must be a positive integer; got 0"):
        dataset.ranking_dataset(tmp_path / "x.tfrecord", 0)
    with pytest.raises(ValueError, match="list_size must be None or a positive integer; got -3"):
        dataset.ranking_dataset(tmp_path / "x.tfrecord", 2, list_size=-3)


# --------------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_shard(small, tmp_path_factory):
    """`small`'s train split converted to a single shard."""
    out = tmp_path_factory.mktemp("one_shard") / "one"
    converter.convert(small["paths"]["train"], out)
    return out


def test_one_shard_round_trip_in_order(one_shard, small):
    got = lists_of(dataset.ranking_dataset(one_shard, 7, shuffle=False))
    assert_lists_equal(got, small["queries"])


def test_text_input_gives_the_same_batches(one_shard, small):
    from_text = dataset.ranking_dataset(small["paths"]["train"], 7, shuffle=False)
    from_records = dataset.ranking_dataset(one_shard, 7, shuffle=False)
    for (a, y), (b, z) in zip(from_text, from_records, strict=True):
        for key in ("features", "mask"):
            np.testing.assert_array_equal(a[key], b[key])
        np.testing.assert_array_equal(y, z)


def test_padding_to_the_longest_list_of_each_batch(small):
    sizes = [len(q.labels) for q in small["queries"]]
    ds = dataset.ranking_dataset(small["paths"]["train"], 8, shuffle=False)
    for i, (inputs, labels) in enumerate(ds):
        batch_sizes = sizes[8 * i: 8 * i + 8]
        assert inputs["features"].shape == (len(batch_sizes), max(batch_sizes), 6)
        assert labels.shape == inputs["mask"].shape == (len(batch_sizes), max(batch_sizes))
        np.testing.assert_array_equal(inputs["mask"].numpy().sum(axis=1), batch_sizes)
    assert ds.element_spec[0]["features"].shape.as_list() == [None, None, 6]


def test_truncation_in_evaluation_keeps_heads(small):
    ds = dataset.ranking_dataset(small["records"], 5, list_size=9, shuffle=False, cycle_length=1)
    assert ds.element_spec[0]["features"].shape.as_list() == [None, 9, 6]
    full = lists_of(dataset.ranking_dataset(small["records"], 5, shuffle=False, cycle_length=1))
    for (labels, features), (all_labels, all_features) in zip(lists_of(ds), full, strict=True):
        np.testing.assert_array_equal(labels, all_labels[:9])
        np.testing.assert_array_equal(features, all_features[:9])


def test_truncation_in_training_is_a_uniform_random_subset(tmp_path):
    # One list of 40 documents (10 relevant) read many times, truncated to 8.
    features = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    labels = (np.arange(40) % 4 == 0).astype(np.float32)
    with tf.io.TFRecordWriter(str(tmp_path / "one.tfrecord")) as writer:
        writer.write(records.encode_elwc(features, labels))
    ds = dataset.ranking_dataset(tmp_path / "one.tfrecord", 1, list_size=8, seed=11, repeat=True)
    kept_relevant, chosen = [], set()
    for inputs, y in ds.take(400):
        rows = inputs["features"].numpy()[0]
        assert inputs["mask"].numpy().all()
        docs = (rows[:, 0] / 3).astype(int)
        assert (np.diff(docs) > 0).all(), "a subset, without repeats, in the original order"
        np.testing.assert_array_equal(y.numpy()[0], labels[docs])
        kept_relevant.append(y.numpy().sum())
        chosen.update(docs.tolist())
    assert chosen == set(range(40))
    # Expected 8 * 10 / 40 = 2 relevant documents kept per draw: none preferred, none dropped.
    assert abs(np.mean(kept_relevant) - 2.0) < 0.2


def test_seed_makes_order_and_subsets_repeatable(small):
    def run(seed):
        ds = dataset.ranking_dataset(small["records"], 6, list_size=10, seed=seed, repeat=True)
        return [b.numpy().tobytes() for (inputs, _) in ds.take(25) for b in [inputs["features"]]]

    first = run(3)
    assert first == run(3)
    assert first != run(4)
    epochs = [first[:10], first[10:20]]  # 60 lists / 6 = 10 batches an epoch: reshuffled each epoch
    assert epochs[0] != epochs[1]


def test_a_seeded_dataset_gives_the_same_batches_on_every_iteration(small):
    """Keras may read an epoch's first batches and then iterate the dataset again from the start
    (on JAX, a process's first fit does): a seed must fix the order of every iteration, or a
    resumed run trains on another order than an uninterrupted one."""
    for source in (small["records"], small["paths"]["train"]):
        ds = dataset.ranking_dataset(source, 6, list_size=10, seed=3)
        first, second = ([inputs["features"].numpy().tobytes() for inputs, _ in ds]
                         for _ in range(2))
        assert first == second and len(first) == 10


def test_every_list_once_per_epoch_when_shuffled(small):
    got = lists_of(dataset.ranking_dataset(small["records"], 7, seed=1))
    assert sorted(signature(*x) for x in got) == sorted(signature(q.labels, q.features) for q in small["queries"])


def test_shard_by_file_for_workers(small):
    parts = [lists_of(dataset.ranking_dataset(small["records"], 4, num_shards=2, shard_index=i, seed=0))
             for i in range(2)]
    assert (len(parts[0]), len(parts[1])) == (40, 20)  # files 0 and 2, then file 1
    together = sorted(signature(*x) for part in parts for x in part)
    assert together == sorted(signature(q.labels, q.features) for q in small["queries"])
    with pytest.raises(ValueError, match="cannot shard 3 files over num_shards=4 workers"):
        dataset.ranking_dataset(small["records"], 4, num_shards=4, shard_index=0)
    text = [lists_of(dataset.ranking_dataset(small["paths"]["train"], 4, num_shards=3, shard_index=i,
                                             shuffle=False)) for i in range(3)]
    assert [len(t) for t in text] == [20, 20, 20]


def test_bucket_sizes_minimise_padding():
    rng = np.random.default_rng(0)

    def padding(lengths, sizes):
        sizes = np.asarray(sizes)
        return int((sizes[np.searchsorted(sizes, lengths)] - lengths).sum())

    for _ in range(100):
        lengths = rng.integers(1, 30, rng.integers(1, 40))
        most = int(rng.integers(1, 5))
        sizes = dataset.bucket_sizes(lengths, most)
        distinct = np.unique(lengths)
        fewest = min(padding(lengths, [*chosen, distinct[-1]]) for count in range(most)
                     for chosen in itertools.combinations(distinct[:-1], count))
        assert len(sizes) <= most and sizes[-1] == distinct[-1]
        assert padding(lengths, sizes) == fewest, (lengths.tolist(), most, sizes)
    many = dataset.bucket_sizes(np.arange(1, 5001), 4)  # more distinct lengths than candidates
    assert len(many) == 4 and many[-1] == 5000
    assert dataset.bucket_sizes([], 3) == []


def test_buckets_pad_whole_lists_to_a_few_sizes(small):
    sizes = [9, 13, 18]
    bucketed = dataset.ranking_dataset(small["records"], 7, seed=2, list_buckets=sizes)
    batches = [(inputs["mask"].numpy(), labels.numpy()) for inputs, labels in bucketed]
    assert [len(mask) for mask, _ in batches] == [7] * 8 + [4]  # the batches of no buckets
    for mask, _ in batches[:-1]:
        longest = mask.sum(axis=1).max()
        assert mask.shape[1] == min(s for s in sizes if s >= longest)
    assert batches[-1][0].shape[1] == 18  # the short last batch takes the largest size
    got = lists_of(bucketed)  # a seeded dataset: each iteration gives the same batches
    assert sorted(signature(*x) for x in got) == sorted(signature(q.labels, q.features)
                                                         for q in small["queries"])
    again = lists_of(dataset.ranking_dataset(small["records"], 7, seed=2, list_buckets=sizes))
    other = lists_of(dataset.ranking_dataset(small["records"], 7, seed=3, list_buckets=sizes))
    order = [signature(*x) for x in got]
    assert order == [signature(*x) for x in again] != [signature(*x) for x in other]


def test_buckets_chosen_from_the_lists_lengths(small, tmp_path):
    expected = [len(q.labels) for q in small["queries"]]
    assert sorted(dataset.list_lengths(small["records"])) == sorted(expected)
    assert dataset.list_lengths(small["paths"]["train"]).tolist() == expected
    converter.convert(small["paths"]["train"], tmp_path / "seq", record_format="sequence_example")
    assert dataset.list_lengths(tmp_path / "seq").tolist() == expected
    sizes = dataset.bucket_sizes(expected, 3)
    for source in (small["records"], tmp_path / "seq"):
        widths = {labels.shape[1] for _, labels in
                  dataset.ranking_dataset(source, 8, seed=0, list_buckets=3)}
        assert widths <= set(sizes)


def test_bucket_groups_of_a_global_batch_split_into_replica_batches(small):
    def lists(batch_size, **kwargs):
        return [signature(*x) for x in lists_of(dataset.ranking_dataset(
            small["records"], batch_size, seed=0, list_buckets=[9, 13, 18], **kwargs))]

    # replica batches 2k and 2k + 1 hold global batch k's lists
    assert lists(4, bucket_batch_size=8) == lists(8)
    with pytest.raises(ValueError, match="bucket_batch_size must be a positive multiple of batch_size=4"):
        dataset.ranking_dataset(small["records"], 4, list_buckets=[9, 18], bucket_batch_size=6)
    with pytest.raises(ValueError, match="list_buckets pads whole lists"):
        dataset.ranking_dataset(small["records"], 4, list_size=10, list_buckets=[9, 18])
    with pytest.raises(ValueError, match="list_buckets must be increasing positive sizes"):
        dataset.ranking_dataset(small["records"], 4, list_buckets=[18, 9])


def test_tfranking_per_feature_records_are_detected(tmp_path, rng):
    features = [rng.random((n, 4), dtype=np.float32) for n in (3, 5)]
    with tf.io.TFRecordWriter(str(tmp_path / "tfr.tfrecord")) as writer:
        for f in features:
            examples = []
            for row in f:
                feature = {str(j + 1): tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
                           for j, v in enumerate(row)}
                feature["relevance"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[2]))
                examples.append(tf.train.Example(features=tf.train.Features(feature=feature)))
            writer.write(b"".join(records._field(1, e.SerializeToString()) for e in examples))
    info = dataset.describe(tmp_path / "tfr.tfrecord")
    assert (info.record_format, info.layout, info.num_features, info.label_dtype) == ("elwc", "per_feature", 4,
                                                                                      tf.int64)
    got = lists_of(dataset.ranking_dataset(tmp_path / "tfr.tfrecord", 2, shuffle=False))
    for (labels, f_got), f in zip(got, features):
        np.testing.assert_array_equal(f_got, f)
        np.testing.assert_array_equal(labels, 2.0)


# --------------------------------------------------------------------------------------------------
# Real data (../shared/data)
# --------------------------------------------------------------------------------------------------
@pytest.mark.data
@requires_data
@pytest.mark.parametrize("name,num_features,num_queries,num_docs",
                         [("MQ2008", 46, 784, 15211), ("OHSUMED", 45, 106, 16140)])
def test_real_data_round_trip(tmp_path, letor_folds, name, num_features, num_queries, num_docs):
    specs = converter.convert_tree(letor_folds / name / "Fold1", tmp_path / "out")
    assert sorted(specs) == ["test", "train", "vali"]
    assert sum(s["num_lists"] for s in specs.values()) == num_queries
    assert sum(s["num_docs"] for s in specs.values()) == num_docs
    read = {}
    for split, spec in specs.items():
        queries = list(letor.read_queries(letor_folds / name / "Fold1" / f"{split}.txt"))
        assert spec["num_features"] == num_features
        read[split] = lists_of(dataset.ranking_dataset(tmp_path / "out" / split, 32, shuffle=False))
        assert_lists_equal(read[split], queries)  # every label and feature, list by list, in order
    sharded = converter.convert(letor_folds / name / "Fold1" / "train.txt", tmp_path / "sharded", num_shards=4)
    assert sharded["num_docs"] == specs["train"]["num_docs"]
    got = lists_of(dataset.ranking_dataset(tmp_path / "sharded", 16, seed=2))
    assert sorted(signature(*x) for x in got) == sorted(signature(*x) for x in read["train"])


@pytest.mark.data
@requires_data
def test_real_fold_tree_conversion_counts(tmp_path, letor_folds):
    specs = converter.convert_tree(letor_folds / "MQ2008", tmp_path / "out")
    assert len(specs) == 15
    for fold in range(1, 6):
        split_specs = [specs[f"Fold{fold}/{split}"] for split in ("train", "vali", "test")]
        assert sum(s["num_lists"] for s in split_specs) == 784
        assert sum(s["num_docs"] for s in split_specs) == 15211
        assert sum(s["label_counts"]["2"] for s in split_specs) == 931


# --------------------------------------------------------------------------------------------------
# Generated data
# --------------------------------------------------------------------------------------------------
def _ndcg(labels, scores):
    order = np.argsort(-scores, kind="stable")
    discounts = 1.0 / np.log2(np.arange(2, len(labels) + 2))
    ideal = np.sum((2.0 ** np.sort(labels)[::-1] - 1) * discounts)
    return np.sum((2.0 ** labels[order] - 1) * discounts) / ideal if ideal > 0 else None


def test_generated_data_is_learnable_and_repeatable(tmp_path):
    hidden = synthetic._HiddenRelevance(40, 5, 0.5, seed=0)
    queries = list(synthetic.generate(300, 40, 40, seed=0))
    assert [q.qid for q in queries] == [str(i) for i in range(1, 301)]
    sizes = [len(q.labels) for q in queries]
    assert min(sizes) >= 20 and max(sizes) <= 60 and 35 < np.mean(sizes) < 45
    labels = np.concatenate([q.labels for q in queries])
    assert set(np.unique(labels)) == {0, 1, 2, 3, 4}
    assert 0.4 < np.mean(labels == 0) < 0.75 and np.mean(labels == 4) < 0.06
    # Ordering by the hidden function beats a random order by a wide margin (the labels are learnable).
    rng = np.random.default_rng(0)
    oracle = [_ndcg(q.labels, hidden.raw_score(q.features.astype(np.float64))) for q in queries]
    chance = [_ndcg(q.labels, rng.random(len(q.labels))) for q in queries]
    oracle, chance = np.mean([v for v in oracle if v is not None]), np.mean([v for v in chance if v is not None])
    assert oracle > chance + 0.25, (oracle, chance)
    again = list(synthetic.generate(300, 40, 40, seed=0))
    assert all(np.array_equal(a.features, b.features) and np.array_equal(a.labels, b.labels)
               for a, b in zip(queries, again))
    assert not np.array_equal(next(synthetic.generate(3, 40, 40, seed=1)).features, queries[0].features)


def test_generated_text_reads_back_exactly(tmp_path):
    paths = synthetic.write_splits(tmp_path, 50, 10, 7, label_levels=3, seed=9)
    queries = list(synthetic.generate(50, 10, 7, label_levels=3, seed=9))
    read = [q for split in ("train", "vali", "test") for q in letor.read_queries(paths[split], 7)]
    assert [q.qid for q in read] == [q.qid for q in queries]
    assert [len(list(letor.read_queries(paths[s]))) for s in ("train", "vali", "test")] == [30, 10, 10]
    for a, b in zip(read, queries):
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.labels, b.labels)
    assert set(np.concatenate([q.labels for q in queries])) <= {0, 1, 2}
    summary = synthetic.write_letor(tmp_path / "one.txt", 5, 4, 3)
    assert (summary["num_queries"], summary["num_features"]) == (5, 3)
    with pytest.raises(ValueError, match="label_levels must be one of"):
        synthetic.write_letor(tmp_path / "x.txt", label_levels=4)


def test_generated_data_goes_to_new_files_only(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "train.txt.tmp").symlink_to(victim)  # the temporary name an older version wrote through
    paths = synthetic.write_splits(gen, 9, 4, 3)
    assert victim.read_text() == "mine" and (gen / "train.txt.tmp").is_symlink()
    assert sorted(p.name for p in gen.iterdir()) == ["test.txt", "train.txt", "train.txt.tmp", "vali.txt"]
    before = paths["train"].read_bytes()
    with pytest.raises(FileExistsError, match=r"train\.txt exists; generated data goes to new files only"):
        synthetic.write_splits(gen, 9, 4, 3, seed=1)
    assert paths["train"].read_bytes() == before
    (tmp_path / "link.txt").symlink_to(victim)
    with pytest.raises(FileExistsError, match=r"link\.txt exists"):
        synthetic.write_letor(tmp_path / "link.txt", 3, 2, 2)
    assert victim.read_text() == "mine" and (tmp_path / "link.txt").is_symlink()


def test_feature_index_beyond_the_first_lines_widens_f(tmp_path):
    rows = [f"0 qid:{i // 4} 1:0.5 2:0.25" for i in range(30000)] + ["1 qid:x 1:1 7:2"]
    (tmp_path / "in.txt").write_text("\n".join(rows) + "\n")
    spec = converter.convert(tmp_path / "in.txt", tmp_path / "out")
    assert (spec["num_features"], spec["num_lists"], spec["num_docs"]) == (7, 7501, 30001)
    last = lists_of(dataset.ranking_dataset(tmp_path / "out", 10000, shuffle=False))[-1]
    np.testing.assert_array_equal(last[1], [[1, 0, 0, 0, 0, 0, 2]])
    with pytest.raises(letor.LetorFormatError, match=r"in\.txt:30001: feature index 7 is above num_features=2"):
        converter.convert(tmp_path / "in.txt", tmp_path / "out2", num_features=2)
    assert not list((tmp_path / "out2").glob("*.tfrecord*")), "no partial shards left behind"
