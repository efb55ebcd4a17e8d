"""The generator's list lengths: uniform around docs_per_query by default, or like MSLR-WEB30K's."""

import numpy as np

from tfapprox.data import __main__ as data_cli
from tfapprox.data.synthetic import generate


def mslr_lengths_of(num_queries, seed):
    return np.array([len(q.labels) for q in generate(num_queries, num_features=2, seed=seed,
                                                      lengths="mslr")])


def test_mslr_lengths_are_heavy_tailed_in_1_to_1251_with_mean_near_120():
    lengths = mslr_lengths_of(4000, seed=3)
    assert lengths.min() >= 1 and lengths.max() <= 1251
    assert 110 <= lengths.mean() <= 130, lengths.mean()
    assert (lengths > 500).sum() >= 3, np.sort(lengths)[-10:]  # a tail far beyond the mean
    assert (lengths < 40).sum() >= 40  # and short lists too
    np.testing.assert_array_equal(lengths[:50], mslr_lengths_of(50, seed=3))  # seeded
    assert not np.array_equal(lengths[:50], mslr_lengths_of(50, seed=4))


def test_default_lengths_stay_uniform_around_docs_per_query():
    lengths = [len(q.labels) for q in generate(300, docs_per_query=40, num_features=2)]
    assert min(lengths) >= 20 and max(lengths) <= 60


def test_synthetic_cli_writes_mslr_lengths_and_refuses_docs_with_them(tmp_path, capsys):
    assert data_cli.main(["synthetic", str(tmp_path / "a"), "--queries", "20", "--features", "3",
                          "--lengths", "mslr"]) == 0
    qids = [line.split()[1] for split in ("train", "vali", "test")
            for line in (tmp_path / "a" / f"{split}.txt").read_text().splitlines()]
    counts = [qids.count(f"qid:{i}") for i in range(1, 21)]
    assert counts == mslr_lengths_of(20, seed=0).tolist()
    assert data_cli.main(["synthetic", str(tmp_path / "b"), "--docs", "30",
                          "--lengths", "mslr"]) == 2
    assert "--docs sets uniform list lengths" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
