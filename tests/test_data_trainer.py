"""trainer/data.py: finding, converting and caching the trainer's LETOR input."""

import pytest

from tfapprox.data import synthetic
from trainer import data
from trainer.config import DataConfig


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
