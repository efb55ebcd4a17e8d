"""Generated LETOR-format ranking data with learnable graded labels.

Used as the trainer's default data on a machine without the LETOR sets, and by the benchmarks (an
MSLR-WEB30K-shaped file: 136 features, ~120 documents per query). Documents have features in [0, 1]
written with six decimals, like LETOR's QueryLevelNorm files. A document's relevance is a hidden
nonlinear function of its features -- a fixed random one-hidden-layer tanh network plus a sparse
linear term -- shifted by a per-query offset (so some queries have no relevant document, as in MQ2008)
and Gaussian noise, then cut at fixed quantiles into grades ``0 .. label_levels - 1`` with few high
grades. A scorer can learn it; with ``noise=0`` the labels are a deterministic function of the query.

List lengths are uniform around ``docs_per_query`` by default; ``lengths="mslr"`` draws them like
MSLR-WEB30K's instead (see :func:`mslr_lengths`).
"""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path
from typing import Iterator

import numpy as np

from tfapprox.data.letor import Query
from tfapprox.data.named_records import write_named_records
from tfapprox.files import create_file, fresh_name

LENGTHS = ("uniform", "mslr")
MSLR_MAX_LIST = 1251  # MSLR-WEB30K's longest list

_GRADE_SHARES = {
    2: (0.75,),
    3: (0.75, 0.92),
    5: (0.55, 0.80, 0.92, 0.98),
}


def mslr_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    """Returns ``n`` list lengths shaped like MSLR-WEB30K's: ``round(exp(N(ln 100, 0.6^2)))`` clipped to
    ``1 .. 1251``. Mean ``100 * exp(0.6^2 / 2)`` ~ 120, median 100, a heavy right tail (~0.4% of
    lists longer than 500)."""
    return np.clip(np.rint(rng.lognormal(np.log(100.0), 0.6, n)), 1, MSLR_MAX_LIST).astype(np.int64)


class _HiddenRelevance:
    """The fixed random function behind the labels; all randomness comes from ``seed``."""

    def __init__(self, num_features: int, label_levels: int, noise: float, seed: int, hidden: int = 16):
        if label_levels not in _GRADE_SHARES:
            raise ValueError(
                f"label_levels must be one of {sorted(_GRADE_SHARES)}; got {label_levels!r}"
            )
        if num_features < 1:
            raise ValueError(f"num_features must be a positive integer; got {num_features!r}")
        rng = np.random.default_rng([seed, 0])
        self.num_features = num_features
        self.noise = noise
        self.w1 = rng.normal(0.0, 3.0 / np.sqrt(num_features), (num_features, hidden))
        self.b1 = rng.normal(0.0, 0.5, hidden)
        self.w2 = rng.normal(0.0, 1.0, hidden)
        informative = rng.random(num_features) < 0.25
        weights = rng.normal(0.0, 2.0 / np.sqrt(num_features), num_features)
        self.linear = np.where(informative, weights, 0.0)
        sample = self.features(rng, 20_000)
        raw = self.raw_score(sample)
        self.mean, self.std = raw.mean(), raw.std() + 1e-12
        spread = np.sqrt(1.0 + noise**2 + 0.5**2)
        z = rng.normal(0.0, spread, raw.size) + (raw - self.mean) / self.std
        self.thresholds = np.quantile(z, _GRADE_SHARES[label_levels])

    def features(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Features in [0, 1], skewed towards 0 like normalised LETOR features, rounded to 6 decimals."""
        x = rng.random((n, self.num_features)) ** 2
        return np.rint(x * 1e6) / 1e6

    def raw_score(self, x: np.ndarray) -> np.ndarray:
        centred = x - 0.5
        return np.tanh(centred @ self.w1 + self.b1) @ self.w2 + centred @ self.linear * 3.0

    def labels(self, rng: np.random.Generator, x: np.ndarray, query_offset: float) -> np.ndarray:
        z = (self.raw_score(x) - self.mean) / self.std + query_offset
        z = z + rng.normal(0.0, self.noise, z.shape) if self.noise > 0 else z
        return np.searchsorted(self.thresholds, z).astype(np.float32)


def generate(
    num_queries: int = 300,
    docs_per_query: int = 40,
    num_features: int = 40,
    *,
    label_levels: int = 5,
    noise: float = 0.5,
    seed: int = 0,
    lengths: str = "uniform",
) -> Iterator[Query]:
    """Yields ``num_queries`` generated queries (qids ``"1"``, ``"2"``, ...).

    With ``lengths="uniform"`` a query has between ``docs_per_query // 2`` and
    ``docs_per_query * 3 // 2`` documents; with ``lengths="mslr"`` its length comes from
    :func:`mslr_lengths` and ``docs_per_query`` is not used. Features are exactly what a LETOR
    reader gets back from the written text (float32 of 6-decimal values).
    """
    if num_queries < 1 or docs_per_query < 1:
        raise ValueError(
            f"num_queries and docs_per_query must be positive; got {num_queries}, {docs_per_query}"
        )
    if lengths not in LENGTHS:
        raise ValueError(f"lengths must be one of {', '.join(LENGTHS)}; got {lengths!r}")
    hidden = _HiddenRelevance(num_features, label_levels, noise, seed)
    rng = np.random.default_rng([seed, 1])
    if lengths == "mslr":
        sizes = mslr_lengths(np.random.default_rng([seed, 2]), num_queries)
    else:
        low, high = max(1, docs_per_query // 2), max(1, docs_per_query * 3 // 2)
        sizes = (int(rng.integers(low, high + 1)) for _ in range(num_queries))  # drawn lazily, per query
    for qid, n in enumerate(sizes, 1):
        x = hidden.features(rng, int(n))
        labels = hidden.labels(rng, x, rng.normal(0.0, 0.5))
        yield Query(str(qid), labels, x.astype(np.float32))


class _LineFormatter:
    """Formats documents as LETOR lines ``L qid:Q 1:d.dddddd ... F:d.dddddd`` with numpy byte ops."""

    def __init__(self, num_features: int):
        parts, slots, pos = [], [], 0
        for j in range(1, num_features + 1):
            head = f"{j}:".encode()
            parts.append(head + b"0.000000" + (b" " if j < num_features else b"\n"))
            slots.append(pos + len(head))
            pos += len(parts[-1])
        self.template = np.frombuffer(b"".join(parts), dtype=np.uint8)
        self.slots = np.asarray(slots)

    def format(self, qid: str, labels: np.ndarray, features: np.ndarray) -> bytes:
        n = len(labels)
        body = np.tile(self.template, (n, 1))
        micro = np.rint(features.astype(np.float64) * 1e6).astype(np.int64)
        if micro.min() < 0 or micro.max() >= 10_000_000:
            raise ValueError("generated features must lie in [0, 10)")
        body[:, self.slots] = 48 + micro // 1_000_000
        micro %= 1_000_000
        for digit in range(6, 0, -1):
            body[:, self.slots + 1 + digit] = 48 + micro % 10
            micro //= 10
        grades = labels.astype(np.int64)
        if grades.min() < 0 or grades.max() > 9 or not np.array_equal(grades, labels):
            raise ValueError("generated labels must be integers 0..9")
        head = np.tile(np.frombuffer(f"0 qid:{qid} ".encode(), dtype=np.uint8), (n, 1))
        head[:, 0] = 48 + grades
        return np.concatenate([head, body], axis=1).tobytes()


def _write(path: Path, queries) -> dict:
    """Writes ``queries`` to the new file ``path`` (an existing file or link there is refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path):
        raise FileExistsError(f"{path} exists; generated data goes to new files only")
    formatter = None
    num_queries = num_docs = 0
    tmp = fresh_name(path.parent, f".{path.name}.")
    handle = os.fdopen(create_file(tmp), "wb")
    try:
        with handle:
            for query in queries:
                if formatter is None:
                    formatter = _LineFormatter(query.features.shape[1])
                handle.write(formatter.format(query.qid, query.labels, query.features))
                num_queries += 1
                num_docs += len(query.labels)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # ours, created above
        raise
    return {"path": str(path), "num_queries": num_queries, "num_docs": num_docs}


def write_letor(
    path: str | os.PathLike,
    num_queries: int = 300,
    docs_per_query: int = 40,
    num_features: int = 40,
    *,
    label_levels: int = 5,
    noise: float = 0.5,
    seed: int = 0,
    lengths: str = "uniform",
) -> dict:
    """Writes generated queries (see :func:`generate`) to one LETOR text file.

    Returns ``{"path", "num_queries", "num_docs", "num_features"}``.
    """
    summary = _write(
        Path(path),
        generate(
            num_queries, docs_per_query, num_features, label_levels=label_levels, noise=noise, seed=seed,
            lengths=lengths,
        ),
    )
    return {**summary, "num_features": num_features}


def write_splits(
    directory: str | os.PathLike,
    num_queries: int = 300,
    docs_per_query: int = 40,
    num_features: int = 40,
    *,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    label_levels: int = 5,
    noise: float = 0.5,
    seed: int = 0,
    lengths: str = "uniform",
) -> dict[str, Path]:
    """Writes ``directory/{train,vali,test}.txt`` from one generated set (one hidden function).

    Queries are split in order by ``fractions`` (each split gets at least one query) and streamed to
    the files: one query at a time is in memory. Returns
    ``{"train": path, "vali": path, "test": path}``, a layout :func:`folds.find_split_files` reads.
    """
    if len(fractions) != 3 or min(fractions) <= 0:
        raise ValueError(f"fractions must be three positive numbers; got {fractions!r}")
    if num_queries < 3:
        raise ValueError(f"num_queries must be at least 3 to fill three splits; got {num_queries}")
    total = float(sum(fractions))
    n_train = min(max(1, round(num_queries * fractions[0] / total)), num_queries - 2)
    n_vali = min(max(1, round(num_queries * fractions[1] / total)), num_queries - n_train - 1)
    queries = generate(
        num_queries, docs_per_query, num_features, label_levels=label_levels, noise=noise, seed=seed,
        lengths=lengths,
    )
    directory = Path(directory)
    sizes = {"train": n_train, "vali": n_vali, "test": num_queries - n_train - n_vali}
    return {split: Path(_write(directory / f"{split}.txt", islice(queries, size))["path"])
            for split, size in sizes.items()}


# --------------------------------------------------------------------------------------------------
# Named-feature records shaped like TF-Ranking's example data
# --------------------------------------------------------------------------------------------------
NUMERIC_FEATURES = 136  # custom_features_1 .. custom_features_136, as in TF-Ranking's numerical ELWC


def named_numeric_lists(num_lists: int = 100, docs_per_list: int = 20, *, presence: float = 0.7,
                        seed: int = 0) -> Iterator[tuple[dict, list[dict]]]:
    """Yields ``(context, documents)`` lists like TF-Ranking's ``train_numerical_elwc.tfrecord``:
    each document holds a random ``presence`` share of the float features ``custom_features_1`` ..
    ``custom_features_136`` (one value each) and its label under ``utility`` (a float grade 0..4).
    The grade is :func:`generate`'s hidden function of the features a document holds (absent: 0).
    The context is empty; list lengths are uniform in ``docs_per_list // 2 .. docs_per_list * 3 //
    2``."""
    hidden = _HiddenRelevance(NUMERIC_FEATURES, 5, 0.5, seed)
    rng = np.random.default_rng([seed, 3])
    names = [f"custom_features_{j}" for j in range(1, NUMERIC_FEATURES + 1)]
    for _ in range(num_lists):
        n = int(rng.integers(max(1, docs_per_list // 2), max(1, docs_per_list * 3 // 2) + 1))
        held = rng.random((n, NUMERIC_FEATURES)) < presence
        x = np.where(held, hidden.features(rng, n), 0.0).astype(np.float32)
        grades = hidden.labels(rng, x, rng.normal(0.0, 0.5))
        documents = [{**{names[j]: x[i, j] for j in np.flatnonzero(held[i])},
                      "utility": np.float32(grades[i])} for i in range(n)]
        yield {}, documents


def named_token_lists(num_lists: int = 100, docs_per_list: int = 10, *,
                      vocabulary_size: int = 500, seed: int = 0
                      ) -> tuple[list[str], Iterator[tuple[dict, list[dict]]]]:
    """Returns ``(vocabulary, lists)``, lists like TF-Ranking's ``train_elwc.tfrecord``: a context
    feature ``query_tokens`` (2-5 strings), per document ``document_tokens`` (3-30 strings, about
    one in twenty outside the vocabulary) and the int64 label ``relevance`` 0..4: how many of the
    query's tokens the document holds, give or take one."""
    rng = np.random.default_rng([seed, 4])
    vocabulary = [f"tok{i}" for i in range(vocabulary_size)]

    def tokens(size):
        words = rng.choice(vocabulary, size).astype(object)
        unknown = rng.random(size) < 0.05
        words[unknown] = [f"unseen{k}" for k in rng.integers(0, 10**6, int(unknown.sum()))]
        return list(words)

    def lists():
        for _ in range(num_lists):
            query = tokens(int(rng.integers(2, 6)))
            n = int(rng.integers(max(1, docs_per_list // 2), max(1, docs_per_list * 3 // 2) + 1))
            documents = []
            for _ in range(n):
                document = tokens(int(rng.integers(3, 31)))
                shared = rng.choice(query, int(rng.integers(0, len(query) + 1)), replace=False)
                document[:len(shared)] = list(shared)
                grade = len(set(query) & set(document)) + int(rng.integers(-1, 2))
                documents.append({"document_tokens": document,
                                  "relevance": np.int64(min(max(grade, 0), 4))})
            yield {"query_tokens": query}, documents

    return vocabulary, lists()


def write_named(directory: str | os.PathLike, kind: str = "numeric", num_lists: int = 100,
                docs_per_list: int | None = None, *, record_format: str = "elwc",
                seed: int = 0) -> dict[str, Path]:
    """Writes ``directory/{train,vali,test}.tfrecord`` of :func:`named_numeric_lists` (``kind=
    "numeric"``) or :func:`named_token_lists` (``"tokens"``, plus ``directory/vocab.txt``), 60/20/20
    of ``num_lists`` lists, and returns their paths by split (and ``"vocabulary"``)."""
    if num_lists < 3:
        raise ValueError(f"num_lists must be at least 3 to fill three splits; got {num_lists}")
    directory = Path(directory)
    if kind == "numeric":
        lists = named_numeric_lists(num_lists, docs_per_list or 20, seed=seed)
        paths = {}
    elif kind == "tokens":
        vocabulary, lists = named_token_lists(num_lists, docs_per_list or 10, seed=seed)
        paths = {"vocabulary": directory / "vocab.txt"}
        directory.mkdir(parents=True, exist_ok=True)
        with os.fdopen(create_file(paths["vocabulary"]), "w") as handle:
            handle.write("".join(word + "\n" for word in vocabulary))
    else:
        raise ValueError(f"kind must be 'numeric' or 'tokens'; got {kind!r}")
    n_train = max(1, round(num_lists * 0.6))
    n_vali = max(1, round(num_lists * 0.2))
    sizes = {"train": n_train, "vali": n_vali, "test": num_lists - n_train - n_vali}
    for split, size in sizes.items():
        paths[split] = directory / f"{split}.tfrecord"
        write_named_records(paths[split], islice(lists, size), record_format)
    return paths
