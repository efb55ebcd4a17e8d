"""LETOR/SVMlight reader: formats, grouping, fold layouts, every bad-input message, real data."""

import gzip
import pathlib
import re
import warnings

import numpy as np
import pytest

from tfapprox.data import letor, letor_blocks, letor_fast, letor_files, synthetic
from tfapprox.data.folds import find_folds, find_split_files
from tfapprox.data.letor import LetorFormatError

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
requires_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"LETOR data not found at {SHARED_DATA}")


def naive_read(paths, num_features):
    """Independent reference: {qid: (labels, features)} in first-appearance order, token by token."""
    found = {}
    for path in paths:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as handle:
            for line in handle:
                tokens = line.split("#")[0].split()
                if not tokens:
                    continue
                features = np.zeros(num_features, np.float32)
                for token in tokens[2:]:
                    index, value = token.split(":")
                    features[int(index) - 1] = np.float32(float(value))
                labels, rows = found.setdefault(tokens[1][4:], ([], []))
                labels.append(np.float32(float(tokens[0])))
                rows.append(features)
    return {q: (np.array(l, np.float32), np.stack(r)) for q, (l, r) in found.items()}


def assert_same_queries(queries, reference):
    assert [q.qid for q in queries] == list(reference)
    for query in queries:
        labels, features = reference[query.qid]
        np.testing.assert_array_equal(query.labels, labels, err_msg=query.qid)
        np.testing.assert_array_equal(query.features, features, err_msg=query.qid)
        assert query.features.dtype == np.float32 and query.labels.dtype == np.float32


def write(path, text, mode="w"):
    path = pathlib.Path(path)
    if mode == "gz":
        with gzip.open(path, "wb") as handle:
            handle.write(text.encode())
    else:
        path.write_bytes(text.encode())
    return path


SPARSE = """\
# a header comment line
2 qid:7 1:0.5 3:1.25 # docid = a
0 qid:7 2:-3e-2
1 qid:7\t4:7   5:0.125

0 qid:8 1:1 2:2 3:3 4:4 5:5 #docid = b inc = 1
"""


def test_sparse_tabs_comments_and_blank_lines(tmp_path):
    path = write(tmp_path / "a.txt", SPARSE)
    queries = list(letor.read_queries(path, 5))
    assert [q.qid for q in queries] == ["7", "8"]
    np.testing.assert_array_equal(queries[0].labels, [2, 0, 1])
    expected = np.zeros((3, 5), np.float32)
    expected[0, [0, 2]] = [0.5, 1.25]
    expected[1, 1] = np.float32(-0.03)
    expected[2, [3, 4]] = [7, 0.125]
    np.testing.assert_array_equal(queries[0].features, expected)
    np.testing.assert_array_equal(queries[1].features, [[1, 2, 3, 4, 5]])


def test_num_features_inferred_and_padded(tmp_path):
    path = write(tmp_path / "a.txt", SPARSE)
    assert list(letor.read_queries(path))[0].features.shape == (3, 5)
    assert list(letor.read_queries(path, 9))[1].features.shape == (1, 9)


def test_crlf_cr_bom_and_gzip_read_the_same(tmp_path):
    crlf, cr = SPARSE.replace("\n", "\r\n"), SPARSE.replace("\n", "\r")
    plain = list(letor.read_queries(write(tmp_path / "a.txt", SPARSE), 5))
    paths = [write(tmp_path / "crlf.txt", crlf), write(tmp_path / "b.txt.gz", crlf, "gz"),
             write(tmp_path / "cr.txt", cr), write(tmp_path / "bom.txt", "\ufeff" + SPARSE),
             write(tmp_path / "bom_cr.txt.gz", "\ufeff" + cr, "gz")]
    for path in paths:
        for got, want in zip(letor.read_queries(path, 5), plain, strict=True):
            assert got.qid == want.qid
            np.testing.assert_array_equal(got.features, want.features)
            np.testing.assert_array_equal(got.labels, want.labels)
        with pytest.raises(LetorFormatError, match=rf"{path.name}:4: feature index 5 is above num_features=4"):
            list(letor.read_queries(path, 4))  # line numbers count CR, CRLF and LF line ends alike


@pytest.mark.parametrize("chunk_bytes", [5, 7, 64])
def test_line_ends_split_across_reads(tmp_path, monkeypatch, chunk_bytes):
    """A CRLF cut between two reads is one line end: the documents and line numbers stay right."""
    monkeypatch.setattr(letor_files, "CHUNK_BYTES", chunk_bytes)
    lines = [f"{i % 3} qid:{i // 4} 1:{i}.5 2:0.25" for i in range(40)]
    lines[29] = lines[29].replace("2:0.25", "2:x")
    for end in ("\r\n", "\r"):
        path = write(tmp_path / "a.txt", end.join(lines) + end)
        with pytest.raises(LetorFormatError, match=r"a\.txt:30: non-numeric feature value in token '2:x'"):
            list(letor.read_queries(path, 2))
    good = lines[:29] + lines[30:]
    path = write(tmp_path / "b.txt", "\r\n".join(good) + "\r\n")
    queries = list(letor.read_queries(path, 2))
    assert sum(len(q.labels) for q in queries) == 39
    np.testing.assert_array_equal(queries[-1].features[:, 0], [36.5, 37.5, 38.5, 39.5])
    assert letor.read_group_sizes(write(tmp_path / "s.query", "\ufeff2\r\r3\r")).tolist() == [2, 3]


def test_dense_and_sparse_paths_agree(tmp_path):
    """A dense block (numpy.loadtxt path) and the same data with one sparse line read identically."""
    rng = np.random.default_rng(3)
    values = np.round(rng.random((700, 6)), 6)
    lines = [f"{i % 3} qid:{i // 10} " + " ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(row))
             for i, row in enumerate(values)]
    dense = write(tmp_path / "dense.txt", "\n".join(lines) + "\n")
    lines[5] = lines[5].replace(" 6:", "  6:")  # double space: not the dense path any more
    mixed = write(tmp_path / "mixed.txt", "\n".join(lines) + "\n")
    for path in (dense, mixed):
        assert_same_queries(list(letor.read_queries(path, 6)), naive_read([path], 6))


NUMBER_FORMS = [  # every LETOR number form: fractions, exponents, signs, '-0', '.5', '5.', '05'
    lambda v: f"{v:.6f}", lambda v: f"{v:.3e}", lambda v: f"{v:+.2f}", lambda v: f"{abs(v):.0f}.",
    lambda v: f".{abs(v):.0f}", lambda v: "-0", lambda v: f"{v:g}", lambda v: f"0{abs(v):.4f}",
]


def tricky_dense_lines(rng, num_features=105):
    """Dense lines (every index 1..F) of numbers in all forms, with lists longer than a block."""
    lines = []
    for qid, size in zip(["007", "-3", "1.5", "1e3", "42", "+8"], [1, 700, 3, 1251, 40, 2]):
        for _ in range(size):
            label = rng.choice(["0", "1", "2.5", "0.25", "1e0", "+3", "-0", "4."])
            values = rng.normal(scale=10.0 ** rng.integers(-9, 9), size=num_features)
            tokens = [NUMBER_FORMS[rng.integers(len(NUMBER_FORMS))](v) for v in values]
            lines.append(f"{label} qid:{qid} " + " ".join(f"{j}:{t}" for j, t in enumerate(tokens, 1)))
    return lines


@pytest.mark.parametrize("layout", ["qid", "grouped"])
def test_whole_read_dense_path_writes_the_records_of_the_token_path(tmp_path, monkeypatch, layout):
    """Reads whose every line is dense (one numpy.loadtxt call) give byte-identical records to the
    same lines tab-separated (the token-by-token path), also mixed with reads holding a missing
    feature, indices out of order or written '01', with lists longer than a read, and with a width
    below num_features."""
    from tfapprox.data import converter

    monkeypatch.setattr(letor_files, "CHUNK_BYTES", 1 << 16)
    lines = tricky_dense_lines(np.random.default_rng(7))
    lines[1500] = " ".join(t for t in lines[1500].split() if not t.startswith("4:"))  # sparse read
    lines[300] = re.sub(r" 12:(\S+) 13:(\S+)", r" 13:\2 12:\1", lines[300])  # indices out of order
    lines[1900] = re.sub(r" 1:", " 01:", lines[1900])
    if layout == "grouped":
        lines = [re.sub(r" qid:\S+", "", line) for line in lines]
    taken = []
    dense_lines = letor_fast.parse_dense_lines

    def spy(*args):
        blocks = dense_lines(*args)
        taken.append(blocks is not None)
        return blocks

    monkeypatch.setattr(letor_fast, "parse_dense_lines", spy)
    specs = {}
    for name, separator in (("dense", " "), ("tabs", "\t")):
        path = write(tmp_path / f"{name}.txt", "\n".join(line.replace(" ", separator) for line in lines))
        if layout == "grouped":
            write(tmp_path / f"{name}.txt.query", "1\n700\n3\n1251\n40\n2\n")
        for num_features in (None, 110):
            output = tmp_path / f"{name}-{num_features}"
            specs[name, num_features] = converter.convert(path, output, num_features=num_features,
                                                          workers=1)
            if name == "tabs":
                dense = (tmp_path / f"dense-{num_features}" / "part-00000-of-00001.tfrecord").read_bytes()
                assert (output / "part-00000-of-00001.tfrecord").read_bytes() == dense
    assert specs["dense", None]["num_docs"] == len(lines) and specs["dense", 110]["num_features"] == 110
    assert any(taken) and not all(taken)  # both paths ran: dense reads, and the sparse and tab ones


def test_non_contiguous_queries_grouped_in_first_appearance_order(tmp_path):
    text = "1 qid:b 1:1\n0 qid:a 1:2\n2 qid:b 1:3\n0 qid:c 1:4\n1 qid:a 1:5\n"
    path = write(tmp_path / "a.txt", text)
    queries = list(letor.read_queries(path, 1))
    assert [q.qid for q in queries] == ["b", "a", "c"]
    np.testing.assert_array_equal(queries[0].features[:, 0], [1, 3])
    np.testing.assert_array_equal(queries[1].labels, [0, 1])
    with pytest.raises(LetorFormatError, match=r"a\.txt:3: query id 'b' appears again"):
        list(letor.read_queries(path, 1, assume_contiguous=True))


def test_query_split_across_files_is_one_query(tmp_path):
    first = write(tmp_path / "1.txt", "1 qid:q 1:1\n")
    second = write(tmp_path / "2.txt", "0 qid:r 1:3\n2 qid:q 1:2\n")
    queries = list(letor.read_queries([first, second], 1))
    assert [(q.qid, q.labels.tolist()) for q in queries] == [("q", [1, 2]), ("r", [0])]


def test_contiguous_stream_is_bounded(tmp_path):
    """With contiguous queries each one is handed out before the file has been read to its end."""
    path = tmp_path / "big.txt"
    synthetic.write_letor(path, num_queries=60, docs_per_query=30, num_features=5)
    reader = letor.read_queries(path, 5)
    first = next(reader)
    assert first.qid == "1"
    assert len(list(reader)) == 59


def test_parallel_workers_read_the_same(tmp_path):
    path = tmp_path / "syn.txt"
    synthetic.write_letor(path, num_queries=200, docs_per_query=40, num_features=12, seed=4)
    one = list(letor.read_queries(path, 12, workers=1))
    two = list(letor.read_queries(path, workers=2))
    assert [q.qid for q in one] == [q.qid for q in two]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.labels, b.labels)


def test_workers_reread_their_stretch_of_a_plain_file(tmp_path, monkeypatch):
    """Parsing workers read a chunk of a plain file at its position instead of receiving its bytes:
    positions stay right after a byte order mark and are not used from a CR on, nor for gzip."""
    monkeypatch.setattr(letor_files, "CHUNK_BYTES", 64)
    lines = [f"{i % 3} qid:{i // 4} 1:{i}.5 2:0.25" for i in range(60)]
    text = "\n".join(lines[:30]) + "\r\n" + "\r\n".join(lines[30:45]) + "\r" + "\r".join(lines[45:])
    want = list(letor.read_queries(write(tmp_path / "lf.txt", "\n".join(lines)), 2, workers=1))
    for path in (write(tmp_path / "mixed.txt", text), write(tmp_path / "bom.txt", "\ufeff" + text),
                 write(tmp_path / "bom.txt.gz", "\ufeff" + text, "gz")):
        raw = path.read_bytes()
        starts = []
        for _, data, start in letor_files.iter_chunks(path, with_offsets=True):
            starts.append(start)
            assert start is None or raw[start:start + len(data)] == data
        if path.suffix == ".gz":
            assert set(starts) == {None}
        else:
            assert starts[0] == (3 if "bom" in path.name else 0) and starts[-1] is None
        got = list(letor.read_queries(path, 2, workers=2))
        assert [q.qid for q in got] == [q.qid for q in want]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.features, b.features)
            np.testing.assert_array_equal(a.labels, b.labels)
    path = write(tmp_path / "changed.txt", "\n".join(lines))
    stretch = letor_blocks.Stretch(100, 200, path.read_bytes()[280:300])
    assert stretch.read(path) == path.read_bytes()[100:300]
    write(path, "\n".join(lines[1:]))
    with pytest.raises(LetorFormatError, match=r"changed\.txt: the file changed while being read"):
        stretch.read(path)


def test_parallel_workers_name_the_bad_line(tmp_path):
    path = tmp_path / "syn.txt"
    synthetic.write_letor(path, num_queries=300, docs_per_query=40, num_features=12, seed=4)
    lines = path.read_bytes().split(b"\n")
    lines[9000] = lines[9000].replace(b" 5:", b" 5:x")
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(LetorFormatError, match=r"syn\.txt:9001: non-numeric feature value in token '5:x"):
        list(letor.read_queries(path, 12, workers=2))


BAD_INPUTS = [
    ("1 qid:1 1:0.5\nx qid:1 1:0.5\n", None, r"bad\.txt:2: non-numeric label 'x'"),
    ("1 qid:1 1:0.5\n-1 qid:1 1:0.5\n", None, r"bad\.txt:2: label '-1' is not a finite number >= 0"),
    ("nan qid:1 1:0.5\n", None, r"bad\.txt:1: label 'nan'"),
    ("1 1:0.5 2:0.1\n", None, r"bad\.txt:1: no 'qid:ID' after the label, and no group file beside the file"),
    ("1 qid:1 1:0.5\n0 1:0.5\n", None,
     r"bad\.txt:2: expected 'qid:ID' as second token, got '1:0\.5' \(the file's first line has one"),
    ("1 foo 1:0.5\n", None, r"bad\.txt:1: expected 'qid:ID' as second token, got 'foo'"),
    ("1 qid: 1:0.5\n", None, r"bad\.txt:1: expected 'qid:ID' as second token, got 'qid:'"),
    ("1\n", None, r"bad\.txt:1: expected 'LABEL qid:ID INDEX:VALUE \.\.\.', got only '1'"),
    ("1 qid:1 1:0.5 2:abc 3:1\n", None, r"bad\.txt:1: non-numeric feature value in token '2:abc'"),
    ("1 qid:1 1:0.5 2:inf\n", None, r"bad\.txt:1: infinite feature value in token '2:inf'"),
    ("1 qid:1 1:0.5 3:1e40\n", None, r"bad\.txt:1: feature value overflows float32 in token '3:1e40'"),
    ("1 qid:1 1:0.5 2:-1e39\n", None, r"bad\.txt:1: feature value overflows float32 in token '2:-1e39'"),
    ("1e40 qid:1 1:0.5\n", None, r"bad\.txt:1: label '1e40' overflows float32"),
    ("1 qid:1 1:0.5\n200 qid:1 1:0.5\n", None, r"bad\.txt:2: label 200 is above max_label=31 \(NDCG's gain"),
    ("31.5 qid:1 1:0.5\n", None, r"bad\.txt:1: label 31\.5 is above max_label=31"),
    ("1 qid:1 1:0.5 x:2\n", None, r"bad\.txt:1: feature index must be a positive integer, got token 'x:2'"),
    ("1 qid:1 0:0.5\n", None, r"bad\.txt:1: feature index must be a positive integer, got token '0:0\.5'"),
    ("1 qid:1 1:0.5 7\n", None, r"bad\.txt:1: expected INDEX:VALUE, got token '7'"),
    ("1 qid:1 1:2:3 4\n", None, r"bad\.txt:1: expected INDEX:VALUE, got token '1:2:3'"),
    ("1 qid:1 1:0.5 2:\n", None, r"bad\.txt:1: expected INDEX:VALUE, got token '2:'"),
    ("1 qid:1 2:0.5 2:0.7\n", None, r"bad\.txt:1: feature index 2 repeated in token '2:0\.7'"),
    ("1 qid:1 1:1 2:2\n0 qid:1 1:1 9:2\n", 5,
     r"bad\.txt:2: feature index 9 is above num_features=5 in token '9:2'"),
    ("1 qid:1 1:1 2:2 3:3\n0 qid:1 1:1 2:2 3:3\n", 2,
     r"bad\.txt:1: feature index 3 is above num_features=2 in token '3:3'"),
    ("1 qid:1 1:1 2:2 3:3\n0 qid:1 1:1 2:2\n", 2,
     r"bad\.txt:1: feature index 3 is above num_features=2 in token '3:3'"),
    # Python's int() and float() take more than LETOR syntax: underscores, '1.0' as an index.
    ("1 qid:1 1:1_0\n", None, r"bad\.txt:1: non-numeric feature value in token '1:1_0' \(LETOR numbers are plain"),
    ("1 qid:1 1:0.5 2:1_0.5\n", None, r"bad\.txt:1: non-numeric feature value in token '2:1_0\.5'"),
    ("1_0 qid:1 1:0.5\n", None, r"bad\.txt:1: non-numeric label '1_0'"),
    ("1 qid:1 1.0:0.5\n", None, r"bad\.txt:1: feature index must be a positive integer, got token '1\.0:0\.5'"),
    ("1 qid:1 1:0.5 2e0:0.5\n", None, r"bad\.txt:1: feature index must be a positive integer, got token '2e0:0\.5'"),
    ("1 qid:1 +1:0.5\n", None, r"bad\.txt:1: feature index must be a positive integer, got token '\+1:0\.5'"),
    ("1 qid:1\u00a01:0.5\n0 qid:1 1:0.2\n", None, r"bad\.txt:1: non-ASCII whitespace U\+00A0 in the line"),
    ("1 qid:1 1:0.5\n0 qid:1 1:0.2\u3000\n", None, r"bad\.txt:2: non-ASCII whitespace U\+3000 in the line"),
    ("1 qid:1 1:0.1 1000000000:0.2\n", 5, r"bad\.txt:1: feature index 1000000000 is above num_features=5"),
    ("", None, r"bad\.txt: no documents \(the file is empty or has only comments\)"),
    ("# only a comment\n\n", 3, r"bad\.txt: no documents"),
]


@pytest.mark.parametrize("text,num_features,message", BAD_INPUTS,
                         ids=[re.sub(r"\W+", "_", m.split(": ", 1)[-1])[:40] for _, _, m in BAD_INPUTS])
@pytest.mark.parametrize("assume_contiguous", [False, True])
def test_bad_input_names_file_line_and_token(tmp_path, text, num_features, message, assume_contiguous):
    path = write(tmp_path / "bad.txt", text)
    with pytest.raises(LetorFormatError, match=message):
        list(letor.read_queries(path, num_features or 9 if assume_contiguous else num_features,
                                assume_contiguous=assume_contiguous))


def test_inferred_width_is_limited_to_the_indices_in_use(tmp_path):
    """F from the data: up to max(1000, 10 x distinct indices in use), never above 100,000."""
    def rows(indices_per_line):
        return "".join(f"0 qid:1 {' '.join(f'{i}:1' for i in line)}\n" for line in indices_per_line)

    accepted = [[[1, 1000]], [list(range(1, 201)), [2000]]]  # 2 in use: 1000; 201 in use: 2010
    for lines in accepted:
        path = write(tmp_path / "ok.txt", rows(lines))
        assert letor.scan(path, with_features=True).num_features == lines[-1][-1]
    refused = [([[1, 1_000_000_000]], 2, 1000, 1), ([[1, 1001]], 2, 1000, 1), ([list(range(1, 47))] * 50 + [[1, 4600]] + [[2, 3]], 47, 1000, 51),
               ([list(range(k, k + 1000)) for k in range(1, 11001, 1000)] + [[100_001]], 11_001, 100_000, 12)]
    for lines, used, limit, lineno in refused:
        path = write(tmp_path / "far.txt", rows(lines))
        message = (rf"far\.txt:{lineno}: feature index {lines[lineno - 1][-1]} is far beyond the others; .* "
                   rf"up to {limit} here \(10 x the {used} distinct indices in use")
        for read in (lambda: letor.scan(path, with_features=True), lambda: list(letor.read_queries(path)),
                     lambda: list(letor.read_queries(path, assume_contiguous=True))):
            with pytest.raises(LetorFormatError, match=message):
                read()
        assert letor.peek_num_features(path) is None, "no width guessed from an outlier"
    path = write(tmp_path / "wide.txt", rows([[1, 4600]]))
    assert next(letor.read_queries(path, 4600)).features.shape == (1, 4600), "asked for: read"


def test_large_labels_need_an_explicit_max_label(tmp_path):
    path = write(tmp_path / "a.txt", "0.5 qid:1 1:1\n200 qid:1 1:2\n3 qid:2 1:3\n")
    for max_label in (200, None):
        queries = list(letor.read_queries(path, max_label=max_label))
        np.testing.assert_array_equal(queries[0].labels, [0.5, 200])
    with pytest.raises(LetorFormatError, match=r"a\.txt:2: label 200 is above max_label=199\.5 .*--max-label"):
        list(letor.read_queries(path, max_label=199.5))
    with pytest.raises(ValueError, match="max_label must be a number >= 0 or None; got -1"):
        list(letor.read_queries(path, max_label=-1))


def test_float32_overflow_is_an_error_not_a_warning(tmp_path):
    rows = [f"0 qid:{i // 5} 1:0.5 2:0.25 3:1" for i in range(40)]
    rows[33] = rows[33].replace("3:1", "3:1e40")  # a dense block: the numpy fast path sees it first
    path = write(tmp_path / "big.txt", "\n".join(rows) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(LetorFormatError, match=r"big\.txt:34: feature value overflows float32 in token '3:1e40'"):
            list(letor.read_queries(path))


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_gzip_names_the_file_and_line(tmp_path, monkeypatch, damage):
    monkeypatch.setattr(letor_files, "CHUNK_BYTES", 4096)  # several chunks from a small file
    source = tmp_path / "full.txt"
    synthetic.write_letor(source, num_queries=20, docs_per_query=10, num_features=8)
    data = bytearray(gzip.compress(source.read_bytes()))
    if damage == "truncated":
        data = data[: len(data) * 2 // 3]
    else:
        data[len(data) // 2: len(data) // 2 + 16] = bytes(16)
    path = tmp_path / "t.txt.gz"
    path.write_bytes(bytes(data))
    message = r"t\.txt\.gz: truncated or corrupt gzip data after line (\d+)"
    with pytest.raises(LetorFormatError, match=message) as caught:
        list(letor.read_queries(path, 8))
    lines_before = int(re.search(message, str(caught.value)).group(1))
    assert 0 < lines_before <= len(source.read_text().splitlines())
    with pytest.raises(LetorFormatError, match=message):
        letor.scan(path)


def test_a_small_truncated_gzip_is_named_by_the_command_lines(tmp_path, capsys):
    """Cut before its first bytes decompress: the byte-order-mark probe reads them."""
    from tfapprox.data.__main__ import main as data_main
    from trainer.__main__ import main as trainer_main

    path = tmp_path / "small.txt.gz"
    path.write_bytes(gzip.compress(b"2 qid:1 1:0.5\n0 qid:1 1:0.25\n")[:20])
    message = f"{path}: truncated or corrupt gzip data within its first lines"
    assert data_main(["convert", str(path), "--output", str(tmp_path / "records")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert trainer_main(["train", "--train", str(path), "--vali", str(path),
                         "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_find_split_files_names_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'MQ2008'}: no such fold directory"):
        find_split_files(tmp_path / "MQ2008")


def test_convert_counts_queries_whose_lines_are_not_contiguous(tmp_path, capsys):
    from tfapprox.data.__main__ import main as data_main

    path = write(tmp_path / "t.txt", "1 qid:1 1:1\n0 qid:2 1:2\n0 qid:1 1:3\n1 qid:3 1:4\n"
                                     "0 qid:2 1:5\n")
    assert data_main(["convert", str(path), "--output", str(tmp_path / "records")]) == 0
    out = capsys.readouterr().out
    assert "2 queries whose lines are not contiguous" in out and "--assume-contiguous" in out, out
    assert data_main(["convert", str(path), "--output", str(tmp_path / "again"),
                      "--assume-contiguous"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: query id '1' appears again" in err and err.count("\n") == 1, err
    write(path, "1 qid:1 1:1\n0 qid:1 1:3\n1 qid:3 1:4\n")
    assert data_main(["convert", str(path), "--output", str(tmp_path / "contiguous")]) == 0
    assert "not contiguous" not in capsys.readouterr().out


def test_bad_line_deep_in_a_dense_file_is_located(tmp_path):
    rows = [f"0 qid:{i // 7} " + " ".join(f"{j}:0.5" for j in range(1, 5)) for i in range(2000)]
    rows[1733] = rows[1733].replace("3:0.5", "3:0.5x")
    path = write(tmp_path / "bad.txt", "\n".join(rows) + "\n")
    with pytest.raises(LetorFormatError, match=r"bad\.txt:1734: non-numeric feature value in token '3:0\.5x'"):
        list(letor.read_queries(path, 4))


def test_missing_file_and_bad_num_features(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        list(letor.read_queries(tmp_path / "nope.txt"))
    path = write(tmp_path / "a.txt", "1 qid:1 1:1\n")
    with pytest.raises(ValueError, match="num_features must be a positive integer"):
        list(letor.read_queries(path, 0))


def lightgbm_copy(path, directory, suffix=".query"):
    """Writes ``path`` without its qid: tokens plus its group sizes (LightGBM layout); returns the copy."""
    lines, sizes, previous = [], [], None
    for line in pathlib.Path(path).read_text().splitlines():
        tokens = line.split("#")[0].split()
        if not tokens:
            continue
        if tokens[1] != previous:
            sizes.append(0)
            previous = tokens[1]
        sizes[-1] += 1
        lines.append(" ".join([tokens[0]] + tokens[2:]))
    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    copy = write(pathlib.Path(directory) / pathlib.Path(path).name, "\n".join(lines) + "\n")
    write(copy.with_name(copy.name + suffix), "".join(f"{n}\n" for n in sizes))
    return copy


def test_lightgbm_layout_reads_like_the_qid_layout(tmp_path):
    first = tmp_path / "a.txt"
    synthetic.write_letor(first, num_queries=30, docs_per_query=6, num_features=5, seed=1)
    second = write(tmp_path / "b.txt", SPARSE.replace("qid:", "qid:b"))  # not 7 and 8 again
    copies = [lightgbm_copy(first, tmp_path / "lgb"), lightgbm_copy(second, tmp_path / "lgb", ".group")]
    want = list(letor.read_queries([first, second], 5))
    for contiguous in (False, True):
        got = list(letor.read_queries(copies, 5, assume_contiguous=contiguous))
        assert [q.qid for q in got] == [str(k) for k in range(1, 33)], "groups numbered across files"
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.labels, b.labels)
            np.testing.assert_array_equal(a.features, b.features)
    assert letor.scan(copies).docs_per_query == {str(k).encode(): len(q.labels) for k, q in enumerate(want, 1)}
    data = copies[0].rename(tmp_path / "data.txt")  # an explicit group file, of any name
    sizes = (tmp_path / "lgb" / "a.txt.query").rename(tmp_path / "sizes")
    got = list(letor.read_queries(data, query_files=sizes))
    assert [len(q.labels) for q in got] == [len(q.labels) for q in want[:30]]


GROUP_ERRORS = [
    ("1 1:1\n0 1:2\n1 1:3\n", "2\n", r"x\.txt: 3 documents, but the group sizes in .*x\.txt\.query sum to 2 \(1 groups\)"),
    ("1 1:1\n0 1:2\n", "2\n1\n", r"x\.txt: 2 documents, but the group sizes in .*x\.txt\.query sum to 3 \(2 groups\)"),
    ("1 1:1\n0 qid:4 1:2\n", "2\n", r"x\.txt:2: 'qid:' on this line, but the file's first line has none"),
    ("1 1:1\n", "1\n0\n", r"x\.txt\.query:2: expected a group size \(a positive integer.*got '0'"),
    ("1 1:1\n", "1.5\n", r"x\.txt\.query:1: expected a group size .*got '1\.5'"),
    ("1 1:1\n", "\n", r"x\.txt\.query: no group sizes"),
]


@pytest.mark.parametrize("text,sizes,message", GROUP_ERRORS)
def test_group_file_errors_name_both_files(tmp_path, text, sizes, message):
    path = write(tmp_path / "x.txt", text)
    write(tmp_path / "x.txt.query", sizes)
    for contiguous in (False, True):
        with pytest.raises(LetorFormatError, match=message):
            list(letor.read_queries(path, 3, assume_contiguous=contiguous))
    with pytest.raises(LetorFormatError, match=message):
        letor.scan(path, with_features=True)


def test_qid_files_and_group_files_do_not_mix(tmp_path):
    with_qid = write(tmp_path / "q.txt", "1 qid:1 1:1\n")
    grouped = write(tmp_path / "g.txt", "1 1:1\n")
    write(tmp_path / "g.txt.query", "1\n")
    with pytest.raises(LetorFormatError, match=r"inputs mix files with qid: \(.*q\.txt\) and files grouped by a "
                                               r"query file \(.*g\.txt, .*g\.txt\.query\)"):
        list(letor.read_queries([with_qid, grouped]))
    write(tmp_path / "g.txt.group", "1\n")
    with pytest.raises(LetorFormatError, match=r"g\.txt: both g\.txt\.query and g\.txt\.group lie beside it"):
        list(letor.read_queries(grouped))
    with pytest.raises(ValueError, match="got 1 query files for 2 inputs"):
        list(letor.read_queries([grouped, grouped], query_files=[tmp_path / "g.txt.query"]))
    with pytest.raises(FileNotFoundError, match="no such query file: .*nope"):
        list(letor.read_queries(grouped, query_files=tmp_path / "nope"))


def test_a_group_file_for_a_qid_file_must_group_it_as_its_query_ids(tmp_path, capsys, monkeypatch):
    """Beside the file or given with --query-file, through convert and the trainer: refused in one
    line when its groups are not the runs of equal query ids, read by qid: when they are."""
    from tfapprox.data.__main__ import main as data_main
    from trainer.__main__ import main as trainer_main

    monkeypatch.chdir(tmp_path)
    path = write(tmp_path / "q.txt", "".join(f"{i % 3} qid:{i // 3} 1:{i}\n" for i in range(30)))
    sizes = write(tmp_path / "sizes.txt", "10\n10\n10\n")
    message = (f"error: {path}: the lines carry qid: (10 runs of query ids), and the group file "
               f"{{}} groups them differently (3 groups of 30 documents); give one grouping")
    assert data_main(["convert", str(path), "--output", "a", "--query-file", str(sizes)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(sizes)) and err.count("\n") == 1, err
    beside = write(tmp_path / "q.txt.query", sizes.read_text())
    assert data_main(["convert", str(path), "--output", "b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(beside)) and err.count("\n") == 1, err
    assert trainer_main(["train", "--train", str(path), "--vali", str(path),
                         "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m trainer train: " + message.format(beside)), err
    assert err.count("\n") == 1, err
    assert not any(tmp_path.glob("[ab]"))
    write(beside, "3\n" * 10)  # the same groups: read by its qid: tokens
    assert data_main(["convert", str(path), "--output", "c"]) == 0
    assert "c: 10 lists, 30 docs" in capsys.readouterr().out


@pytest.mark.parametrize("names", [("train.txt", "vali.txt", "test.txt"),
                                   ("trainingset.txt", "validationset.txt", "testset.txt")])
def test_fold_layouts(tmp_path, names):
    for fold in (2, 1, 10):
        (tmp_path / f"Fold{fold}").mkdir()
        for name in names:
            write(tmp_path / f"Fold{fold}" / name, "0 qid:1 1:1\n")
    folds = find_folds(tmp_path)
    assert list(folds) == ["Fold1", "Fold2", "Fold10"]
    assert {split: path.name for split, path in folds["Fold1"].items()} == dict(zip(("train", "vali", "test"), names))
    assert find_split_files(tmp_path / "Fold2")["vali"].name == names[1]


def test_split_names_match_in_any_case(tmp_path):
    """LETOR 2.0 ships Fold3/trainingset.TXT; some mirrors upper-case everything."""
    names = ("trainingset.TXT", "ValidationSet.txt", "TESTSET.TXT.GZ")
    for fold in ("Fold3", "FOLD4"):
        (tmp_path / fold).mkdir()
        for name in names:
            write(tmp_path / fold / name, "0 qid:1 1:1\n", "gz" if name.endswith("GZ") else "w")
    folds = find_folds(tmp_path)
    assert list(folds) == ["Fold3", "FOLD4"]
    assert {split: path.name for split, path in folds["Fold3"].items()} == dict(zip(("train", "vali", "test"), names))
    write(tmp_path / "Fold3" / "TrainingSet.txt", "0 qid:1 1:1\n")
    with pytest.raises(ValueError, match=r"Fold3: TrainingSet\.txt and trainingset\.TXT differ only in case"):
        find_split_files(tmp_path / "Fold3")


def test_fold_layout_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Fold<N>/ directories"):
        find_folds(tmp_path)
    (tmp_path / "Fold1").mkdir()
    write(tmp_path / "Fold1" / "train.txt", "0 qid:1 1:1\n")
    with pytest.raises(FileNotFoundError, match=r"Fold1: no test/vali file"):
        find_folds(tmp_path)


@pytest.mark.data
@requires_data
@pytest.mark.parametrize("name,num_features,num_queries,num_docs",
                         [("MQ2008", 46, 784, 15211), ("OHSUMED", 45, 106, 16140)])
def test_real_data_read_exactly(letor_folds, name, num_features, num_queries, num_docs):
    fold = find_folds(letor_folds / name)["Fold1"]
    paths = [fold["train"], fold["vali"], fold["test"]]  # Fold1's three splits hold all five parts
    queries = list(letor.read_queries(paths))
    assert len(queries) == num_queries
    assert sum(len(q.labels) for q in queries) == num_docs
    assert queries[0].features.shape[1] == num_features
    assert_same_queries(queries, naive_read(paths, num_features))
