"""trainer/data.py: finding, converting and caching the trainer's LETOR input."""

import pathlib

import pytest

from tfapprox.data import synthetic
from trainer import data
from trainer.config import DataConfig

from test_data_letor import lightgbm_copy


def test_letor_2_upper_case_split_names(tmp_path):
    paths = synthetic.write_splits(tmp_path / "gen", 12, 5, 4, seed=1)
    fold = tmp_path / "Fold3"
    fold.mkdir()
    for split, name in (("train", "trainingset.TXT"), ("vali", "validationset.TXT"), ("test", "testset.TXT")):
        (fold / name).write_bytes(paths[split].read_bytes())
    splits = data.resolve(DataConfig(dir=str(fold), cache_dir=str(tmp_path / "cache")), print_fn=lambda _: None)
    assert (splits.num_features, splits.num_train_lists) == (4, 7)
    assert splits.test is not None
    assert data.letor_folds(tmp_path)[3][0] == [str(fold / "trainingset.TXT")]
    (fold / "validationset.TXT").unlink()
    with pytest.raises(FileNotFoundError, match=r"Fold3: expected train and vali files"):
        data.resolve(DataConfig(dir=str(fold), cache_dir=str(tmp_path / "cache")))


def test_lightgbm_files_with_query_files_beside_them(tmp_path):
    paths = synthetic.write_splits(tmp_path / "gen", 20, 6, 4, seed=2)
    copies = {split: lightgbm_copy(paths[split], tmp_path / "lgb") for split in ("train", "vali")}
    config = DataConfig(train=[str(copies["train"])], vali=[str(copies["vali"])], cache_dir=str(tmp_path / "cache"))
    assert data.resolve(config, print_fn=lambda _: None).num_train_lists == 12
    # A changed group file (the first query split in two) is a different data set, not a cache hit.
    group_file = pathlib.Path(str(copies["train"]) + ".query")
    sizes = [int(n) for n in group_file.read_text().split()]
    group_file.write_text("\n".join(map(str, [1, sizes[0] - 1] + sizes[1:])) + "\n")
    assert data.resolve(config, print_fn=lambda _: None).num_train_lists == 13
