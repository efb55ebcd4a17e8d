"""The user docs describe the package as it is: no issue numbers, round names, session history or
commit hashes in README.md, docs/ or the sources of tfapprox/, trainer/ and benchmarks/; README and
docs/benchmarks.md within their sizes; every link to a heading of a doc lands on one. Text scans only."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_BYTES = 12_000
BENCHMARKS_MAX_BYTES = 40_000

HISTORY = re.compile(
    r"\bissues? \d+"                                              # issue 32, Issue 30's
    r"|\b(?:first|second|third|fourth|fifth|sixth)[- ]round\b"    # third-round recipe
    r"|round\d"                                                   # quantile_round3
    r"|\bsession \d+"                                             # session 31
    r"|(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w.])",  # commit 9d9c17f
    re.IGNORECASE)

def _scanned():
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for package in ("tfapprox", "trainer", "benchmarks"):
        files += sorted((REPO / package).rglob("*.py"))
    return files


def history_hits(text):
    """(line number, match) of each issue number, round name, session or commit hash in `text`."""
    return [(number, match.group(0)) for number, line in enumerate(text.splitlines(), 1)
            for match in HISTORY.finditer(line)]


def test_the_pattern_finds_history_and_spares_numbers():
    found = [hit for _, hit in history_hits(
        "Issue 32's table (fourth round)\nthe third-round recipe, MIXED_ENSEMBLES['list_round4']\n"
        "from commit 9d9c17f; session 31\nsee issue 18 and round2")]
    assert found == ["Issue 32", "fourth round", "third-round", "round4", "9d9c17f", "session 31",
                     "issue 18", "round2"]
    assert history_hits("LOWEST = -3.4028234663852886e38; 0x7fffffff; 2^15 = 32768 pairs; "
                        "1e-30; deadbeef; 2,271,481 documents; the round with the best score") == []


def test_no_history_in_docs_and_sources():
    hits = [f"{path.relative_to(REPO)}:{number}: {hit}" for path in _scanned()
            for number, hit in history_hits(path.read_text(encoding="utf-8"))]
    assert not hits, "history in user docs or sources:\n" + "\n".join(hits)


@pytest.mark.parametrize("name, limit", [("README.md", README_MAX_BYTES),
                                         ("docs/benchmarks.md", BENCHMARKS_MAX_BYTES)])
def test_doc_sizes(name, limit):
    size = len((REPO / name).read_bytes())
    assert size <= limit, f"{name} is {size:,} bytes, over {limit:,}"


def _slug(heading):
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
    anchors, seen, in_code = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        in_code ^= line.startswith("```")
        heading = None if in_code else re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = _slug(heading.group(1))
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_links_to_doc_headings_resolve():
    broken = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", line):
                linked = (doc.parent / target).resolve() if target else doc
                if linked.suffix == ".md" and linked.is_file() and anchor not in _anchors(linked):
                    broken.append(f"{doc.relative_to(REPO)}:{number}: {target}#{anchor}")
    assert not broken, "links to missing headings:\n" + "\n".join(broken)
