"""The report's tables as declared: every study has its place on the page (a declared table of
`experiment_studies.TABLES` or a section of `experiment_report.SECTIONS`), and the declared
renderer draws a table of each of a declaration's studies, its paired tests against the reference
row and its note."""

import dataclasses
import json

from benchmarks import experiment_report
from benchmarks.experiment_studies import TABLES, Setting, Table, runs_of, studies
from benchmarks.experiment_runs import METRICS, DataSet


def test_every_study_is_drawn_by_a_declared_table_or_a_section_of_its_own():
    declared = {study: name for name, table in TABLES.items() for study in table.studies or (name,)}
    sections = {study for names, _ in experiment_report.SECTIONS for study in names}
    assert set(declared) | sections == set(studies()), "a study the page never shows, or no study"
    assert set(experiment_report.NOTES) <= set(TABLES), "a note to no declared table"
    losses = {s.loss for settings in studies().values() for s in settings}
    for name, table in TABLES.items():
        assert table.reference == "" or table.tests, f"{name}: a reference tested in no metric"
        for published in table.published.values():  # figures of losses run, in metrics shown
            assert published and all(
                loss in losses and set(figures) <= set(METRICS) and figures
                for loss, figures in published.items()), f"{name}: {published}"


def _cache(cache, setting, values):
    """Caches one run of `setting` (MQ2008 Fold1, seed 0) whose test queries have these values in
    every metric the table shows; returns its `Selected` row."""
    (run,) = runs_of(setting, "MQ2008", [1], [0], 40)
    path = run.cache_path(cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "validation": {"ndcg@10": 0.5}, "qids": [f"q{i}" for i in range(len(values))],
        "test": {"values": {m: values for m in ("ndcg@5", "map")},
                 "relevant": [True] * len(values)},
        "wall_seconds": 1.0, "run": dataclasses.asdict(run)}))
    return experiment_report.Selected(setting, "MQ2008", cache, [1], [0], 40, print)


def test_a_declaration_of_two_studies_draws_a_table_of_each_its_tests_and_its_note(
        tmp_path, monkeypatch):
    first, second, other = (Setting("B64", loss) for loss in ("ranknet", "listmle", "softrank"))
    rows = {"one": [_cache(tmp_path, first, [0.2, 0.4, 0.6])],
            "two": [_cache(tmp_path, second, [0.3, 0.5, 0.6])],
            "elsewhere": [_cache(tmp_path, other, [0.1, 0.1, 0.1])]}
    monkeypatch.setitem(TABLES, "both", Table("Both", ("ndcg@5", "map"), first.label(), ("map",),
                                              studies=("one", "two")))
    monkeypatch.setitem(experiment_report.NOTES, "both", lambda view: "A note.\n")
    view = experiment_report.SetView(DataSet("MQ2008", tmp_path, shared=True), rows,
                                     {"one": rows["one"]}, [1], tmp_path)
    parts = experiment_report.declared("both", view)
    assert parts[1] == "A note.\n" and len(parts) == 2
    text = parts[0]
    assert text.startswith("### Both\n\n`python -m benchmarks.experiments run --study one two "
                           "--dataset MQ2008`\n\n| setting | seeds | ndcg@5 | map |\n")
    assert text.count("| setting | seeds |") == 2  # a table of each study
    assert "| elsewhere" not in text and other.label() not in text
    # the rows against the reference (of the first study), not the reference against itself
    assert text.endswith(f"| setting | map − {first.label()} |\n|---|---|\n"
                         f"| {second.label()} | +0.0667 (p = 0.184) |\n")
    monkeypatch.delitem(experiment_report.NOTES, "both")
    assert len(experiment_report.declared("both", view)) == 1  # no note: the table alone
    view.shown = {"elsewhere": rows["elsewhere"]}
    assert experiment_report.declared("both", view) == []  # none of its studies shown: nothing
