"""Missing feature values end to end: NULL / nan in LETOR text read as NaN (fast and token paths
alike), counted by convert, carried by the records and ranking_dataset, and handled by the scorer
(learned fill + indicator; list statistics over the values present) through fit under XLA / jit."""

import json

import keras
import numpy as np
import pytest

from conftest import COMPILE_MODES, to_numpy
from tfapprox import losses, models
from tfapprox.data import letor, letor_fast, letor_tokens

NUM_FEATURES = 4
XLA_MODES = [mode for mode in COMPILE_MODES if mode in ("xla", "jit")]

TEXT = """\
2 qid:1 1:NULL 2:0.5 3:nan 4:1 # docid = a
0 qid:1 1:3 2:NaN 3:-NAN 4:null
1 qid:2 1:0.25 2:1 3:2 4:+nan
0 qid:2 1:NULL 2:NULL 3:NULL 4:NULL
"""


def expected_features():
    nan = np.nan
    return [np.array([[nan, 0.5, nan, 1], [3, nan, nan, nan]], np.float32),
            np.array([[0.25, 1, 2, nan], [nan, nan, nan, nan]], np.float32)]


@pytest.mark.backend_neutral
def test_reader_takes_null_and_nan_in_any_case_as_missing(tmp_path):
    """Every marker spelling reads as NaN, on the line-by-line path and in a dense-looking read."""
    path = tmp_path / "agg.txt"
    path.write_text(TEXT)
    for num_features in (None, NUM_FEATURES):
        queries = list(letor.read_queries(path, num_features))
        for query, want in zip(queries, expected_features(), strict=True):
            np.testing.assert_array_equal(query.features, want)  # NaN == NaN here


@pytest.mark.backend_neutral
def test_fast_tokeniser_reads_markers_as_the_token_parser_does():
    """The numpy tokeniser and the specification agree on markers, numbers and absent indices."""
    rng = np.random.default_rng(0)
    tokens = ["NULL", "null", "nan", "NaN", "-nan", "+NaN", "0.5", "-1e-3", "7", ".25"]
    bodies = [" ".join(f"{i}:{tokens[rng.integers(len(tokens))]}" for i in range(1, 9)
                       if rng.random() < 0.8).encode() for _ in range(300)]
    fast = letor_fast.parse_sparse(bodies)
    spec = letor_tokens.parse_tokens("x.txt", range(1, 301), bodies)
    assert fast is not None and np.isnan(fast[2]).any()
    for got, want in zip(fast, spec):
        np.testing.assert_array_equal(got, want)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("token", ["NA", "nul", "nanx", "NULLNULL", "N/A", "-null", "inf"])
def test_a_token_neither_number_nor_marker_names_file_and_line(tmp_path, token):
    path = tmp_path / "bad.txt"
    path.write_text(f"1 qid:1 1:NULL 2:0.5\n0 qid:1 1:2 2:{token}\n")
    message = "infinite" if token == "inf" else "non-numeric"
    with pytest.raises(letor.LetorFormatError,
                       match=rf"bad\.txt:2: {message} feature value in token '2:{token}'"):
        list(letor.read_queries(path, 2))
    assert letor_fast.parse_sparse([f"1:2 2:{token}".encode()]) is None  # left to the tokens


@pytest.mark.backend_neutral
def test_a_missing_label_is_an_error(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("NULL qid:1 1:0.5\n")
    with pytest.raises(letor.LetorFormatError, match=r"bad\.txt:1: non-numeric label 'NULL'"):
        list(letor.read_queries(path, 1))


@pytest.mark.backend_neutral
def test_convert_counts_missing_values_and_the_records_carry_them(tmp_path, capsys):
    """convert prints and writes the missing values per feature; ranking_dataset gives NaN at
    them and 0 at padding (the vector layout's absent-key check is not set off by a NaN)."""
    from tfapprox.data import ranking_dataset
    from tfapprox.data.__main__ import main

    path = tmp_path / "agg.txt"
    path.write_text(TEXT)
    assert main(["convert", str(path), "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "missing values (NULL or nan, read as NaN): 10 (62.5%); per feature (index:count) " \
           "1:2, 2:2, 3:3, 4:3" in printed
    spec = json.loads((tmp_path / "out" / "spec.json").read_text())
    assert spec["missing_values"] == [2, 2, 3, 3]
    inputs, labels = next(iter(ranking_dataset(str(tmp_path / "out"), 2, 3, shuffle=False)))
    features, mask = inputs["features"].numpy(), inputs["mask"].numpy()
    assert mask[:, :2].all() and not mask[:, 2].any()
    np.testing.assert_array_equal(features[:, :2], np.stack(expected_features()))
    np.testing.assert_array_equal(features[:, 2], 0.0)


def batches_with_missing(seed=0, batch=3):
    """Batches whose list size changes, 40 % of real values NaN, NaN at padded slots too."""
    rng = np.random.default_rng(seed)
    for list_size in (4, 9):
        features = rng.normal(size=(batch, list_size, NUM_FEATURES)).astype(np.float32)
        labels = np.digitize(features[..., 0], [0.0, 1.0]).astype(np.float32)
        labels[:, -1] = -1.0
        features[rng.random(features.shape) < 0.4] = np.nan
        features[:, -1] = np.nan
        yield {"features": features, "mask": labels >= 0}, labels


def missing_dataset():
    import tensorflow as tf

    spec = ({"features": tf.TensorSpec((None, None, NUM_FEATURES), tf.float32),
             "mask": tf.TensorSpec((None, None), tf.bool)},
            tf.TensorSpec((None, None), tf.float32))
    return tf.data.Dataset.from_generator(batches_with_missing, output_signature=spec)


@pytest.mark.slow
@pytest.mark.parametrize("mode", XLA_MODES)
def test_scorer_with_missing_values_trains_on_variable_length_lists(mode):
    """A scorer that handles missing values, with log1p inputs and list standardisation,
    through fit, compiled, on NaN-holding lists whose size changes: finite loss, fill values
    learned, batch statistics finite."""
    keras.utils.set_random_seed(1)
    model = models.build_scorer("LINEAR", input_transform="log1p", list_standardize=True,
                                handles_missing=True)
    model.build({"features": (None, None, NUM_FEATURES), "mask": (None, None)})
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses.ApproxNDCGLoss(),
                  jit_compile=True)
    history = model.fit(missing_dataset(), epochs=1, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    assert np.all(np.isfinite(to_numpy(model.input_norm.moving_mean)))
    assert np.all(np.isfinite(to_numpy(model.input_norm.moving_variance)))
    fill = to_numpy(model.missing_fill.fill)
    assert np.all(np.isfinite(fill)) and not np.allclose(fill, 0.0)


def test_missing_value_is_neither_zero_nor_nan_and_padding_changes_nothing():
    """A missing value scores as its fill value with the indicator on: not as 0, never NaN;
    changing padded slots (NaN, huge) changes no real document's score."""
    keras.utils.set_random_seed(2)
    model = models.build_scorer("B64", handles_missing=True, input_batch_norm=False)
    features = np.array([[[1.0, np.nan], [0.5, 2.0], [np.nan, np.nan]]], np.float32)
    mask = np.array([[True, True, False]])
    model({"features": features, "mask": mask})
    model.missing_fill.fill.assign([0.0, 3.0])
    scores = to_numpy(model({"features": features, "mask": mask}))
    assert np.all(np.isfinite(scores)) and scores[0, 2] == 0.0
    as_fill = to_numpy(model({"features": np.array([[[1.0, 3.0]]], np.float32)}))[0, 0]
    as_zero = to_numpy(model({"features": np.array([[[1.0, 0.0]]], np.float32)}))[0, 0]
    assert scores[0, 0] != pytest.approx(as_zero) and scores[0, 0] != pytest.approx(as_fill)
    features[0, 2] = [1e30, -7.0]
    np.testing.assert_array_equal(to_numpy(model({"features": features, "mask": mask})), scores)
    config = model.get_config()
    assert config["handles_missing"] is True
    assert models.DNNScorer.from_config(config).handles_missing is True
    assert models.build_scorer("B64").handles_missing is False


def test_list_standardize_ignores_missing_values():
    """The standardised value of a present feature is that over the documents where it is
    present; a missing one's is 0."""
    x = np.array([[[1.0], [3.0], [np.nan], [100.0]]], np.float32)
    present = np.array([[[True], [True], [False], [False]]])  # the last document is padding
    got = to_numpy(models.standardize_within_lists(np.nan_to_num(x), present))
    want = np.array([-1.0, 1.0]) / np.sqrt(1.0 + 1e-3)
    np.testing.assert_allclose(got[0, :2, 0], want, rtol=1e-6)
    assert got[0, 2, 0] == 0.0 and got[0, 3, 0] == 0.0


def test_quantiles_are_fitted_to_the_values_present():
    layer = models.QuantileTransform(num_quantiles=3)
    features = np.array([[0.0, np.nan], [np.nan, np.nan], [2.0, np.nan], [4.0, np.nan]])
    with pytest.raises(ValueError, match="non-finite feature values"):
        layer.adapt(features)
    before = to_numpy(layer.quantiles)[:, 1]
    layer.adapt(features, ignore_missing=True)
    np.testing.assert_array_equal(to_numpy(layer.quantiles)[:, 0], [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(to_numpy(layer.quantiles)[:, 1], before)  # none present


@pytest.mark.backend_neutral
def test_has_missing_values_reads_the_spec_or_else_the_records(tmp_path):
    import shutil

    from tfapprox.data import converter
    from tfapprox.data.dataset import has_missing_values

    for name, text in (("agg", TEXT), ("full", TEXT.replace("NULL", "1").replace("nan", "2")
                                             .replace("NaN", "3").replace("NAN", "4")
                                             .replace("null", "5"))):
        (tmp_path / f"{name}.txt").write_text(text)
        converter.convert(tmp_path / f"{name}.txt", tmp_path / name)
        shard = next((tmp_path / name).glob("*.tfrecord"))
        bare = tmp_path / f"{name}-bare"  # the records without their spec.json: read them
        bare.mkdir()
        shutil.copy(shard, bare / shard.name)
        for files in ([shard], [bare / shard.name]):
            assert has_missing_values(files, NUM_FEATURES) is (name == "agg"), (name, files)


@pytest.mark.backend_neutral
def test_the_trainer_turns_missing_handling_on_for_data_with_missing_values(tmp_path):
    """trainer: training data with NULL -> Splits.missing_values -> model.handles_missing in the
    run's config (unless the config chose) -> a scorer built with it; data without any -> off."""
    from trainer import build, config as trainer_config, data, distribute

    (tmp_path / "agg.txt").write_text(TEXT * 3)
    (tmp_path / "full.txt").write_text(TEXT.replace("NULL", "1").replace("nan", "2")
                                       .replace("NaN", "3").replace("NAN", "4").replace("null", "5"))
    for train, chosen, want in (("agg", None, True), ("agg", True, True), ("full", None, None)):
        config = trainer_config.load("demo", {
            "data.train": [str(tmp_path / f"{train}.txt")], "data.vali": [str(tmp_path / "agg.txt")],
            "data.cache_dir": str(tmp_path / "cache"), "model.preset": "linear",
            "model.handles_missing": chosen})
        splits = data.resolve(config.data, print_fn=lambda _: None)
        assert splits.missing_values is (train == "agg")
        config = build.with_missing_values(config, splits, lambda _: None)
        assert config.model.handles_missing is want
        built = build.build(config, splits.num_features, distribute.make("default"),
                            with_training_model=False)
        assert built.eval_model.handles_missing is bool(want)


@pytest.mark.parametrize("setting, refusal", [
    ({"model.handles_missing": False}, "model.handles_missing to false"),
    ({"model.kind": "adarank"}, "AdaRank's weak rankers"),
])
@pytest.mark.backend_neutral
def test_the_trainer_refuses_missing_values_a_model_cannot_take(tmp_path, setting, refusal):
    """A config that turns missing handling off, or AdaRank (single-feature weak rankers), on
    training data with missing values: one ValueError naming why, before anything is built."""
    from trainer import build, config as trainer_config, data

    (tmp_path / "agg.txt").write_text(TEXT * 3)
    config = trainer_config.load("demo", {
        "data.train": [str(tmp_path / "agg.txt")], "data.vali": [str(tmp_path / "agg.txt")],
        "data.cache_dir": str(tmp_path / "cache"), "model.preset": "linear", **setting})
    splits = data.resolve(config.data, print_fn=lambda _: None)
    with pytest.raises(ValueError, match=refusal):
        build.with_missing_values(config, splits, lambda _: None)


@pytest.mark.backend_neutral  # the members' flags
def test_an_ensemble_handles_missing_values_when_every_member_does():
    """ScoreEnsemble.handles_missing (read by the export's NaN check): all members' flags."""
    from tfapprox.ensemble import ScoreEnsemble

    def member(handles):
        return models.build_scorer("linear", handles_missing=handles)

    assert ScoreEnsemble([member(True), member(True)]).handles_missing
    assert not ScoreEnsemble([member(True), member(False)]).handles_missing
