"""results.md and its plots, rebuilt from the cached runs of `benchmarks.experiments`: docs/ for the
shared sets, a report of its own for a set of the user's.

Selection: for each setting, fold and seed, the grid point with the best validation NDCG@10.
Figures: the mean over folds of the test metric, per seed; shown as mean ± std over seeds.
Significance: a paired t-test over the test queries of the folds both settings have, each query's
value averaged over the seeds both have (scipy.stats.ttest_rel, two-sided).
"""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

import numpy as np

from benchmarks.experiment_runs import GBDTS, METRICS, SELECT_METRIC
from benchmarks.experiment_studies import (ENSEMBLES_BY_NAME, LIST_STANDARDIZE, RECOMMENDED,
                                           LOSS_STUDY_REFERENCE, SEED_CHALLENGERS, SEED_LOSSES,
                                           SET_STUDIES, TABLES, YILMAZ_MEASURES, runs_of)
from benchmarks.results_cache import read_cached

# The studies whose rows the table of DASALC against the GBDTs shows, in its order (after the
# GBDTs; DASALC tuned on validation has a table of its own below it).
DASALC_TABLE = ("dasalc", "dasalc_search", "dasalc_quantile", "dasalc_quantile_search",
                "losses_quantile", "list_standardized", "dasalc_ensemble", "mixed_ensemble",
                "dasalc_ablation")
# The studies whose rows are also shown with LETOR's convention, where a test query has no
# relevant document.
LETOR_CONVENTION = ("chen", "lightgbm")


class Selected:
    """One setting on one dataset: per (fold, seed) the selected run's per-query test values."""

    def __init__(self, setting, dataset, cache, folds, seeds, epochs, say, data_keys=None):
        self.setting, self.dataset = setting, dataset
        self.planned = len(folds) * len(seeds)
        self.by_fold_seed = {}
        # (fold, seed) -> wall seconds of every grid point, an ensemble's members included: what
        # choosing cost (None where a member's result is missing)
        self.seconds = {}
        for fold in folds:
            for seed in seeds:
                points = runs_of(setting, dataset, [fold], [seed], epochs, data_keys)
                found = [read_cached(cache, run, say) for run in points]
                if None not in found:  # every grid point, or the choice is not made
                    self.by_fold_seed[fold, seed] = max(
                        found, key=lambda r: r["validation"][SELECT_METRIC])
                    self.seconds[fold, seed] = _seconds(points, found, cache, say)

    @property
    def seeds(self):
        return sorted({seed for _, seed in self.by_fold_seed})

    def complete_seeds(self, folds):
        return [s for s in self.seeds if all((f, s) in self.by_fold_seed for f in folds)]

    def fold_mean(self, seed, folds, metric, zero_empty=False):
        """Mean over folds of the test metric of one seed."""
        return float(np.mean([_query_mean(self.by_fold_seed[f, seed]["test"], metric, zero_empty)
                              for f in folds]))

    def cell(self, folds, metric, zero_empty=False):
        seeds = self.complete_seeds(folds)
        if not seeds:
            return None
        values = [self.fold_mean(s, folds, metric, zero_empty) for s in seeds]
        return float(np.mean(values)), float(np.std(values, ddof=1) if len(values) > 1 else 0.0)

    def seconds_per_fold(self, folds):
        """Mean wall seconds to train (every grid point of) one fold, over the complete seeds."""
        seconds = [self.seconds[f, s] for f in folds for s in self.complete_seeds(folds)]
        return float(np.mean(seconds)) if seconds and None not in seconds else None

    def validation_mean(self, folds):
        """Mean validation NDCG@10 of the selected runs of the complete seeds."""
        return float(np.mean([self.by_fold_seed[f, s]["validation"][SELECT_METRIC]
                              for f in folds for s in self.complete_seeds(folds)]))

    def per_query(self, folds, seeds, metric):
        """Returns {(fold, qid): value averaged over `seeds`} over queries with a relevant doc."""
        out = {}
        for fold in folds:
            runs = [self.by_fold_seed[fold, s] for s in seeds]
            relevant = np.asarray(runs[0]["test"]["relevant"])
            values = np.mean([r["test"]["values"][metric] for r in runs], axis=0)
            for qid, value, keep in zip(runs[0]["qids"], values, relevant):
                if keep:
                    out[fold, qid] = float(value)
        return out


def _seconds(runs, results, cache, say):
    """Returns the wall seconds of `runs` (their cached `results`), with those of each ensemble's
    members, which were trained as single runs; None where a member's result is missing."""
    members = [read_cached(cache, m, say)
               for run in runs if run.ensemble for m in run.member_runs()]
    if None in members:
        return None
    return sum(r["wall_seconds"] for r in [*results, *members])


def _query_mean(test, metric, zero_empty):
    values, relevant = np.asarray(test["values"][metric]), np.asarray(test["relevant"])
    return float(values[relevant].sum() / (len(values) if zero_empty else relevant.sum()))


def _per_query_pairs(a: Selected, b: Selected, folds, metric, every_seed):
    """Returns each query's value under `a` and under `b` (two arrays in one query order), or
    None without the runs. Each query's value is averaged over the seeds both rows have, or with
    `every_seed` over each row's own complete seeds."""
    if every_seed:
        seeds_a, seeds_b = a.complete_seeds(folds), b.complete_seeds(folds)
    else:
        seeds_a = seeds_b = sorted(set(a.complete_seeds(folds)) & set(b.complete_seeds(folds)))
    if not seeds_a or not seeds_b:
        return None
    qa, qb = a.per_query(folds, seeds_a, metric), b.per_query(folds, seeds_b, metric)
    keys = sorted(qa)
    return np.array([qa[k] for k in keys]), np.array([qb[k] for k in keys])


def paired(a: Selected, b: Selected, folds, metric, every_seed=False):
    """Returns (mean difference a − b, p-value, number of queries) of a paired t-test over the
    queries, or None without the runs (seeds as `_per_query_pairs`)."""
    pairs = _per_query_pairs(a, b, folds, metric, every_seed)
    return None if pairs is None else _paired_t_test(*pairs)


def _paired_t_test(x, y):
    """(mean difference x − y, p-value, number of queries) of a paired t-test of `x` and `y`."""
    from scipy import stats

    p = float(stats.ttest_rel(x, y).pvalue) if np.any(x != y) else 1.0
    return float(np.mean(x - y)), p, len(x)


def least_significant_difference(x, y):
    """The smallest mean difference |x − y| that `paired` would call significant, given the
    spread of these queries' differences: t_{1 − SIGNIFICANT/2, n − 1} · sd(x − y) / √n."""
    from scipy import stats

    d = x - y
    n = len(d)
    return float(stats.t.ppf(1 - SIGNIFICANT / 2, n - 1) * np.std(d, ddof=1) / np.sqrt(n))


def _fmt(cell):
    return "not run" if cell is None else f"{cell[0]:.4f} ± {cell[1]:.4f}"


def _fmt_test(result):
    if result is None:
        return "—"
    diff, p, _ = result
    return f"{diff:+.4f} (p = {p:.3f})"


def table(rows, folds, metrics=METRICS, zero_empty=False, names=None):
    header = ["setting", "seeds"] + list(metrics)
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for i, row in enumerate(rows):
        name = names[i] if names else row.setting.label()
        cells = [name, str(len(row.complete_seeds(folds)))]
        cells += [_fmt(row.cell(folds, m, zero_empty)) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclasses.dataclass
class SetView:
    """One set's part of the page: its rows by study (`rows`), those of the studies it shows
    (`shown`), the folds its tables are over, and the directory its plots go under."""

    data: object  # an `experiments.DataSet`
    rows: dict
    shown: dict
    folds: list
    out: Path

    @property
    def every_row(self):
        return [r for study in self.rows.values() for r in study]


def write(studies, selected, cache: Path, out: Path, data_sets, folds, seeds, epochs,
          say=print, data_keys=None) -> Path:
    """Writes `out/results.md` and `out/results/*.png` with the sections of the `selected` studies
    (names in `studies`, as from `experiment_studies.studies`) for each of `data_sets`; returns the
    markdown's path. `say` gets one line for each unreadable cache file; `data_keys`: {set name:
    {fold: `experiment_runs.data_key`}} of the sets whose runs are keyed by their data."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results").mkdir(exist_ok=True)
    unreadable = {}  # one line per file, though several tables read it
    parts = [_header(data_sets, cache, folds, seeds, epochs)]
    views = []
    for data in data_sets:
        parts.append(f"\n## {data.name}\n")
        keys = (data_keys or {}).get(data.name)
        rows = _rows(studies, data, cache, folds, seeds, epochs, unreadable.setdefault, keys)
        shown = {name: rows[name] for name in studies if name in selected}
        folds_here = _folds_run(shown, folds) or folds
        if folds_here != folds:  # a set still running: its tables over the folds it has run
            rows = _rows(studies, data, cache, folds_here, seeds, epochs, unreadable.setdefault,
                         keys)
            shown = {name: rows[name] for name in studies if name in selected}
            parts.append(_partial(data, shown, folds_here, folds))
        idle = [name for name, study in shown.items() if not any(r.by_fold_seed for r in study)]
        if idle and len(idle) < len(shown):  # a set that ran some studies only: the rest in a line
            ran = [name for name in shown if name not in idle]
            parts.append(f"Run on {data.name}: {', '.join(ran)} only.\n" if len(ran) < len(idle)
                         else f"Not run on {data.name}: {', '.join(idle)} (`python -m "
                         f"benchmarks.experiments run --study {' '.join(idle)} {data.flags()}`).\n")
            shown = {name: study for name, study in shown.items() if name not in idle}
        view = SetView(data, rows, shown, folds_here, out)
        views.append(view)
        for name in TABLES:
            parts += declared(name, view)
        drawn = [draw(view) for names, draw in SECTIONS if shown.keys() & set(names)]
        parts += [text for text in drawn if text is not None]
    across = _ensembles_across_sets(views, folds)
    parts += [across] if across is not None else []
    parts.insert(1, _summary(views, folds))
    for line in unreadable:
        say(line)
    path = out / "results.md"
    path.write_text("\n".join(parts) + "\n")
    return path


def _rows(studies, data, cache, folds, seeds, epochs, say, data_keys):
    """Returns {study: its `Selected` rows} on the set `data`."""
    return {name: [Selected(s, data.name, cache, folds, seeds, epochs, say, data_keys)
                   for s in settings] for name, settings in studies.items()}


def _partial(data, shown, run, folds):
    """Says that `data`'s tables are over the folds `run` only, and how to resume the rest (the
    studies `SET_STUDIES` names for the set, else those with runs)."""
    studies = " ".join(SET_STUDIES.get(data.name, [
        name for name, rows in shown.items() if any(r.by_fold_seed for r in rows)]))
    return (f"**Partial**: the runs on {data.name} so far cover fold{'s' * (len(run) > 1)} "
            f"{', '.join(map(str, run))} of {', '.join(map(str, folds))}, so its tables are "
            f"over {'those' if len(run) > 1 else 'that fold'} only; `python -m "
            f"benchmarks.experiments run --study {studies} {data.flags()}` resumes them.\n")


def _folds_run(shown, folds):
    """Returns the folds on which every row of `shown` ({study: rows}) that has runs has one."""
    ran = [r for study in shown.values() for r in study if r.by_fold_seed]
    return [f for f in folds if all(any(fold == f for fold, _ in r.by_fold_seed) for r in ran)]


def _some_query_without_relevant(rows) -> bool:
    return any(not all(run["test"]["relevant"]) for row in rows
               for run in row.by_fold_seed.values())


def _header(data_sets, cache, folds, seeds, epochs):
    import tensorflow as tf

    own = [data for data in data_sets if not data.shared]
    flags = "".join(f" {data.flags()}" for data in own)
    return (
        "# Results: the papers' comparisons on "
        + (", ".join(f"{data.name} ({data.directory})" for data in own) or "LETOR data") + "\n\n"
        f"Regenerate with `python -m benchmarks.experiments run{flags}` (resumes from the cache in "
        f"`{cache if own else 'benchmarks/results/'}`) and `python -m benchmarks.experiments "
        f"report{flags}` (this page and its plots from the cache alone); `--help` states the "
        "protocol. Folds "
        f"{', '.join(map(str, folds))}; seeds {', '.join(map(str, seeds))}; neural runs: at most "
        f"{epochs} epochs, epoch and grid point chosen on validation {SELECT_METRIC}. Each cell is "
        "the mean over folds of the test metric, as mean ± std over seeds; `not run` marks a "
        "setting whose runs are not (all) in the cache. Differences are paired t-tests over test "
        "queries (each query averaged over seeds). Queries without a relevant document are left "
        "out unless a table says otherwise.\n\n"
        f"Generated on {platform.machine()} ({platform.processor() or 'cpu'}), "
        f"Python {platform.python_version()}, TensorFlow {tf.__version__}.\n")


def _chen_note(view):
    """Each weighted loss against its plain one on the same scorer, and the published figures."""
    rows, folds = view.rows["chen"], view.folds
    lines = ["| scorer | comparison | NDCG@5: weighted − plain | NDCG@10: weighted − plain |",
             "|---|---|---|---|"]
    by_key = {(r.setting.model, r.setting.loss): r for r in rows}
    for scorer in dict.fromkeys(r.setting.model for r in rows):  # the study's scorers, in order
        for plain in ("ranknet", "listmle"):
            weighted = by_key[scorer, "weighted_" + plain]
            cells = [_fmt_test(paired(weighted, by_key[scorer, plain], folds, m))
                     for m in ("ndcg@5", "ndcg@10")]
            lines.append(f"| {scorer} | weighted_{plain} vs {plain} | {cells[0]} | {cells[1]} |")
    published = _published("chen", view.data)
    if published:
        lines.append("\nChen et al.'s linear models on the same folds (NDCG@5 / @10): " + ", ".join(
            f"{loss} {f['ndcg@5']:.4f} / {f['ndcg@10']:.4f}" for loss, f in published.items())
            + ".")
    return "\n".join(lines) + "\n"


def _qin_note(view):
    """In each measure, the loss that optimises it against the others."""
    rows, folds = view.rows["qin"], view.folds
    lines = ["Paired tests, in each measure, of the loss that optimises it against the others:\n",
             "| measure | optimiser | vs | difference |", "|---|---|---|---|"]
    own = {"map": rows[0], "ndcg@10": rows[1], "p@10": rows[2]}
    for metric, mine in own.items():
        for other in rows:
            if other is not mine:
                lines.append(f"| {metric} | {mine.setting.loss} | {other.setting.loss} | "
                             f"{_fmt_test(paired(mine, other, folds, metric))} |")
    return "\n".join(lines) + "\n"


def _yilmaz_note(view):
    """Each row trained on one measure, tested in each, against the row trained on that one."""
    measures = {"AP": "map", "P@10": "p@10", "NDCG@10": "ndcg@10"}
    rows = dict(zip(YILMAZ_MEASURES, view.rows["yilmaz"]))
    header = ["trained on \\ tested on"] + list(measures)
    lines = ["Each cell: mean ± std over seeds, then the paired difference against the row trained "
             "on the column's own measure (the diagonal).\n",
             "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for name, row in rows.items():
        cells = [f"{name} ({row.setting.label()})"]
        for column, metric in measures.items():
            text = _fmt(row.cell(view.folds, metric))
            if name != column:
                text += " " + _fmt_test(paired(row, rows[column], view.folds, metric))
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _bruch_plots(view):
    """The test metrics plotted against α and against depth, where any ran."""
    alphas, depths, data = view.rows["bruch_alpha"], view.rows["bruch_depth"], view.data
    alpha_values = [dict(r.setting.params)["alpha"] for r in alphas]
    images = []
    for name, rows, xs, xlabel in (("alpha", alphas, alpha_values, "α (log scale)"),
                                   ("depth", depths, [r.setting.model for r in depths], "scorer")):
        png = _plot(rows, xs, xlabel, view.folds,
                    view.out / "results" / f"{data.name.lower()}_{name}.png",
                    f"{data.name}: ApproxNDCG, test metric vs {name}", log=name == "alpha")
        if png:
            images.append(f"![{data.name} {name}](results/{png.name})")
    return "\n\n".join(images) + "\n" if images else None


def _plot(rows, xs, xlabel, folds, path, title, log):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    drawn = False
    for metric in ("ndcg@5", "ndcg@10"):
        points = [(i, x, row.cell(folds, metric)) for i, (x, row) in enumerate(zip(xs, rows))]
        points = [(i, x, c) for i, x, c in points if c is not None]
        if not points:
            continue
        drawn = True
        where = [x if log else i for i, x, _ in points]
        ax.errorbar(where, [c[0] for *_, c in points], yerr=[c[1] for *_, c in points],
                    marker="o", capsize=3, label=metric)
        if not log:
            ax.set_xticks(where, [x for _, x, _ in points])
    if not drawn:
        plt.close(fig)
        return None
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test metric (mean ± std over seeds)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def declared(name, view):
    """Draws the table `name` as `experiment_studies.TABLES` declares it on one set (`view`): a
    table of each of its studies' rows, each row's paired difference from the reference row
    (found among every study's rows), then its note (`NOTES`), if it has one; returns the parts of
    the page, none if the set shows none of its studies."""
    declaration = TABLES[name]
    studies = declaration.studies or (name,)
    if not view.shown.keys() & set(studies):
        return []
    rows = [r for study in studies for r in view.rows[study]]
    reference = next((r for r in view.every_row if r.setting.label() == declaration.reference),
                     None)
    lines = [f"### {declaration.title}\n",
             f"`python -m benchmarks.experiments run --study {' '.join(studies)} "
             f"{view.data.flags()}`"]
    for study in studies if declaration.metrics else ():
        lines += ["", table(view.rows[study], view.folds, declaration.metrics)]
    if reference is not None and declaration.tests:
        lines += ["", "| setting | " + " | ".join(f"{m} − {declaration.reference}"
                                                  for m in declaration.tests) + " |",
                  "|---" * (len(declaration.tests) + 1) + "|"]
        lines += [f"| {r.setting.label()} | " + " | ".join(
            _fmt_test(paired(r, reference, view.folds, m)) for m in declaration.tests) + " |"
            for r in rows if r.setting != reference.setting]
    note = NOTES[name](view) if name in NOTES else None
    return ["\n".join(lines) + "\n", *([note] if note is not None else [])]


def _published(name, data):
    """The figures `TABLES[name]` declares published on the folds of `data` (a shared set), or
    None."""
    return TABLES[name].published.get(data.name) if data.shared else None


def _direct_note(view):
    """The published figures of SVM^map and SoftRank against ours; a blank line on other sets."""
    published = _published("direct", view.data)
    if not published:
        return ""
    rows, folds = view.rows["direct"], view.folds
    svm_map = next(r for r in rows if r.setting.loss == "svm_map")
    softrank = next(r for r in rows if r.setting.loss == "softrank")

    def paper(loss, metric):
        return f"{published[loss][metric]:.4f}".removeprefix("0")

    return (f"Published SVM-MAP on the same folds (Chen et al. Table 1, NDCG@5 / @10): "
            f"{published['svm_map']['ndcg@5']:.4f} / {published['svm_map']['ndcg@10']:.4f}; "
            f"ours: {_fmt(svm_map.cell(folds, 'ndcg@5'))} / "
            f"{_fmt(svm_map.cell(folds, 'ndcg@10'))}"
            f"{_against_published(svm_map, folds, published['svm_map'])}. Theirs is a "
            "linear SVM solved by cutting planes with C chosen on validation; ours is the "
            "same structural hinge as a loss for the B64 scorer, trained by Adagrad.\n\n"
            f"Qin et al. (2010) on {view.data.name}, NDCG over the whole list: ApproxNDCG "
            f"{paper('approx_ndcg', 'ndcg')}, SoftRank {paper('softrank', 'ndcg')} (as the paper "
            f"reports); ours: SoftRank {_fmt(softrank.cell(folds, 'ndcg'))}, ApproxNDCG α = 10 in "
            "the α table.\n")


def _against_published(row, folds, published):
    """Says, per metric, whether the row's mean reaches the published figure."""
    words = []
    for metric, value in published.items():
        cell = row.cell(folds, metric)
        if cell is None:
            continue
        mean, std = cell
        words.append(f"{metric} reaches it" if mean >= value else
                     f"{metric} is {value - mean:.4f} below it (std over seeds {std:.4f})")
    return f" ({'; '.join(words)})" if words else ""


def _lightgbm_note(view):
    """The tfapprox setting best on validation among those run against LightGBM."""
    lightgbm, folds = view.rows["lightgbm"][0], view.folds
    ours = [r for study in view.shown.values() for r in study if r.setting.model not in GBDTS
            and r.cell(folds, "ndcg@10") is not None]
    if not ours or lightgbm.cell(folds, "ndcg@10") is None:
        return None
    best = max(ours, key=lambda r: r.validation_mean(folds))
    lines = [f"Best tfapprox setting by validation {SELECT_METRIC} among those run: "
             f"{best.setting.label()}.\n", "| metric | best tfapprox − LightGBM |", "|---|---|"]
    lines += [f"| {m} | {_fmt_test(paired(best, lightgbm, folds, m))} |"
              for m in ("ndcg@5", "ndcg@10", "map")]
    return "\n".join(lines) + "\n"


# What follows a declared table (`experiment_studies.TABLES`), by its name.
NOTES = {"chen": _chen_note, "qin": _qin_note, "yilmaz": _yilmaz_note, "bruch": _bruch_plots,
         "direct": _direct_note, "lightgbm": _lightgbm_note}


def _gbdt_and_dasalc(view):
    """The GBDT references, DASALC, its ensembles, its ablation and DASALC tuned on validation
    (the rows run of the studies shown), each against the reference: the GBDT with the best
    validation NDCG@10 on this set. An ensemble's members are found among every study's rows."""
    gbdts, data, folds = view.rows["gbdt"], view.data, view.folds
    dasalc = [r for name in DASALC_TABLE if name in view.shown for r in view.rows[name]
              if r.by_fold_seed]
    tuned = view.shown.get("dasalc_tuned", [])
    lines = ["### Tuned GBDTs, and DASALC against the best of them\n",
             f"`python -m benchmarks.experiments run --study gbdt {' '.join(DASALC_TABLE)} "
             f"dasalc_tuned {data.flags()}`. Seconds per fold: wall time of every grid point of a fold on one thread, training and scoring, "
             "mean over folds and seeds (as the runs measured it: on a shared machine, compare "
             "them only roughly). Paired tests use the seeds both rows have.\n",
             _costed(gbdts, folds), ""]
    reference = _gbdt_reference(gbdts, folds)
    if reference is None:
        return "\n".join(lines) + "\n"
    lines += [f"Reference (best GBDT by validation {SELECT_METRIC}): "
              f"**{reference.setting.label()}**.\n",
              "DASALC (`--preset dasalc`) with each loss, then (the `dasalc_search` study, run "
              "on YAHOO) with the pairwise soft zero-one loss and one change each: dropout, "
              "Adagrad's learning rate, or the loss, then (`dasalc_quantile`) with that loss "
              "and each feature mapped through its training quantiles to N(0, 1) instead of "
              "log1p (`input_transform=quantile`), then (`dasalc_quantile_search`, run on YAHOO "
              "and MQ2008) that with Adagrad's learning rate 0.02 or noise σ = 3.0, then "
              "(`losses_quantile`) the B64 tower with "
              "those inputs and three losses, then (`list_standardized`) the trainer's recipes' "
              "members with each feature also standardised within its list "
              "(`list_standardize=True`), then DASALC's ensemble (`ensemble of k "
              "seeds`: DASALC-ens of Qin et al., ICLR 2021; ensemble seed s averages the scores, "
              "each standardised within its list, of the single runs of seeds k·s … "
              "k·s + k − 1, so ensemble seed 0 is made of seeds 0 … k − 1 of the single row above; its "
              "seconds are its k members' training, k times a single run's, plus scoring them), "
              "then the ensemble of different settings (`ensemble of a + b + c`, the "
              "`mixed_ensemble` study: ensemble seed s averages the standardised scores of the "
              "runs of seed s of the settings it names, rows of the DASALC table and of the table "
              "of every loss; a recipe's members are fixed by a rule on validation alone (see "
              "Ensembles of different settings); its seconds are its members' training plus "
              "scoring them), "
              "then with ApproxNDCG each piece taken "
              "away (`[input_transform=none]`: no log1p; `[noise_stddev=0.0]`: no input noise; "
              "`[attention_layers=0]`: no self-attention), then the B256 tower alone, then "
              "DASALC given the GBDTs' protocol (`∈`: the options chosen per fold on validation "
              f"{SELECT_METRIC}, the seconds those of every grid point):\n",
              _costed(dasalc + tuned, folds), "",
              "| setting | validation ndcg@10 | − reference: ndcg@5 | ndcg@10 | map |",
              "|---|---|---|---|---|"]
    ran = [row for row in dasalc + tuned if row.cell(folds, "ndcg@10") is not None]
    for row in ran:
        lines.append(f"| {row.setting.label()} | {row.validation_mean(folds):.4f} | "
                     + " | ".join(_fmt_test(paired(row, reference, folds, m))
                                  for m in ("ndcg@5", "ndcg@10", "map")) + " |")
    if ran:
        lines += ["", _chosen_against(ran, reference, folds)]
    lines += [_ensemble_tests(row, view.every_row, reference, folds)
              for row in ran if row.setting.ensemble]
    lines += [_list_standardized_test(row, view.every_row, folds)
              for row in ran if LIST_STANDARDIZE in row.setting.scorer]
    lines += [_points_chosen(row, folds) for row in tuned if row in ran]
    return "\n".join(lines) + "\n"


def _list_standardized_test(row, rows, folds):
    """Says how the setting of `row`, run with `list_standardize`, fares against the same setting
    without it (among `rows`): validation and test NDCG@10, each query averaged over the seeds
    both have."""
    without = dataclasses.replace(
        row.setting, scorer=tuple(o for o in row.setting.scorer if o != LIST_STANDARDIZE))
    other = next((r for r in rows if r.setting == without), None)
    test = None if other is None else paired(row, other, folds, "ndcg@10")
    if test is None:
        return f"\n{row.setting.label()}: {without.label()} is not run, so not compared."
    diff, p, queries = test
    return (f"\n{row.setting.label()} − the same without the list standardisation: validation "
            f"{SELECT_METRIC} {row.validation_mean(folds) - other.validation_mean(folds):+.4f}, "
            f"test NDCG@10 {diff:+.4f} (p = {p:.3f}, {queries} queries).")


def _ensemble_tests(row, rows, reference, folds):
    """Says, in test NDCG@10, how the ensemble `row` fares against the single runs it is made of
    (the rows among `rows` of its member settings, or of its setting with one member) and against
    the GBDT `reference`, each query averaged over each row's every seed (the table pairs rows on
    the seeds both have: for an ensemble, which has fewer, that can leave some of the
    reference's out)."""
    members = row.setting.members
    singles = ([(f"its member {m.label()}", m) for m in members] if isinstance(members, tuple)
               else [("the single model", dataclasses.replace(row.setting, members=1))])
    others = [(name, next((r for r in rows if r.setting == setting), None))
              for name, setting in singles] + [("the reference", reference)]

    def seeds(other):
        return ", ".join(map(str, other.complete_seeds(folds)))

    tests = [f"against {name} (seeds {seeds(other)}), {diff:+.4f} (p = {p:.3f}): "
             f"{VERDICTS[_standing(diff, p)]}"
             for name, other in others if other is not None
             for diff, p, _ in filter(None, [paired(row, other, folds, "ndcg@10",
                                                    every_seed=True)])]
    size = len(members) if isinstance(members, tuple) else members
    return (f"\n{row.setting.label()} (ensemble seeds {seeds(row)}; {size} "
            "trained models each), each query's test NDCG@10 averaged over each row's every seed: "
            f"{'; '.join(tests)}."
            + (_members_apart(row, rows) if isinstance(members, tuple) else ""))


def _members_apart(row, rows):
    """Says which members of the mixed ensemble `row` are not the runs their rows (among `rows`)
    cached: trained again where their checkpoints were gone, by code that has changed since,
    they score validation differently (`members_validation`, one value per single run, in the
    order of `Run.member_runs`: a member that is an ensemble of k seeds gives k)."""
    singles = []  # (member's name, the row of its single runs, its k seeds, which) per value
    for m in row.setting.members:
        single = dataclasses.replace(m, members=1)
        singles += [(f"its member {m.label()}", next((r for r in rows if r.setting == single),
                                                     None), m.members, i)
                    for i in range(m.members)]
    apart, each = {}, {}  # member's name -> [(its validation in the ensemble, cached)], its k
    for (fold, seed), result in row.by_fold_seed.items():
        for (name, member, k, i), value in zip(singles, result.get("members_validation", ())):
            cached = member.by_fold_seed.get((fold, k * seed + i)) if member is not None else None
            if cached is not None and abs(value - cached["validation"][SELECT_METRIC]) > 1e-4:
                apart.setdefault(name, []).append((value, cached["validation"][SELECT_METRIC]))
                each[name] = k
    return "".join(
        f" Of {name}, {len(pairs)} of the {each[name] * len(row.by_fold_seed)} runs the "
        "ensemble combines "
        "are not its cached runs (trained again, their checkpoints gone, by code changed since "
        f"they were cached): validation {SELECT_METRIC} {np.mean([a for a, _ in pairs]):.4f} "
        f"against {np.mean([b for _, b in pairs]):.4f} cached, mean over those."
        for name, pairs in apart.items())


def _ensembles_across_sets(views, folds):
    """The section on the ensembles of different settings over the sets (`views`) that show them
    on every fold; None if none does."""
    by_set = {view.data.name: (view.rows, view.rows["mixed_ensemble"],
                               _gbdt_reference(view.rows["gbdt"], folds))
              for view in views if "mixed_ensemble" in view.shown and view.folds == folds}
    if not by_set:
        return None
    ensembles = [ENSEMBLES_BY_NAME[r.setting.loss] for r in next(iter(by_set.values()))[1]]
    return _mixed_ensemble(ensembles, by_set, folds)


def _mixed_ensemble(ensembles, by_set, folds):
    """The ensembles of different settings (`experiment_studies.ENSEMBLES`): what each is, each
    recipe's members checked against its rule on the cache, and, set by set, how each fares
    against the GBDT reference in test NDCG@10 and whether it clears the bar (at or above the
    best GBDT on every set, significantly above on at least two). `ensembles`: their
    `Ensemble`s; `by_set`: {set: (rows by study, the ensembles' rows, the reference)}."""
    sets = list(by_set)
    lines = ["## Ensembles of different settings\n",
             "`python -m benchmarks.experiments run --study mixed_ensemble`. Each is one for "
             "every set. A recipe's members are fixed by a rule on validation before any of its "
             f"test figures was read: the settings of the studies it names with the best "
             f"validation {SELECT_METRIC} averaged over the sets (each set's mean over its folds "
             "and seeds), among those run on every fold and seed of every set that ran those "
             "studies; a variant changes a recipe.\n",
             "| ensemble | members | what it is |", "|---|---|---|"]
    lines += [f"| {e.name} | {e.setting().label().removeprefix('ensemble of ')} | "
              f"{'recipe' if e.ranked_from else 'variant'}: {e.provenance} |" for e in ensembles]
    lines.append("")
    for i, recipe in enumerate(ensembles):
        if recipe.ranked_from:
            ranked = {name: (rows, row[i], ref) for name, (rows, row, ref) in by_set.items()
                      if all(any(r.by_fold_seed for r in rows[study])
                             for study in recipe.ranked_from)}
            lines.append(_rule_checked(recipe, ranked, folds))
    lines += ["| ensemble | set | test ndcg@10 | best GBDT | ensemble − best GBDT | "
              "significant from | standing |", "|---|---|---|---|---|---|---|"]
    verdicts = []
    for i, ensemble in enumerate(ensembles):
        standings, below, short, ran = [], [], [], []
        for name, (_, rows, reference) in by_set.items():
            row = rows[i]
            pairs = None if reference is None else _per_query_pairs(row, reference, folds,
                                                                    "ndcg@10", every_seed=True)
            if pairs is None:
                continue
            ran.append(name)
            (diff, p, _), needed = _paired_t_test(*pairs), least_significant_difference(*pairs)
            standings.append((diff, _standing(diff, p)))
            if diff < 0:
                below.append(f"{name} ({diff:+.4f}, {'not ' * (p >= SIGNIFICANT)}significantly)")
            elif p >= SIGNIFICANT:
                short.append(f"{name} ({diff:+.4f} of the +{needed:.4f} it needs)")
            gbdt = _fmt(reference.cell(folds, "ndcg@10"))
            lines.append(f"| {ensemble.name} | {name} | "
                         f"{_fmt(row.cell(folds, 'ndcg@10'))} | {gbdt} "
                         f"({reference.setting.model}) | {diff:+.4f} (p = {p:.3f}) | "
                         f"±{needed:.4f} | {VERDICTS[_standing(diff, p)]} |")
        if not ran:
            verdicts.append(f"{ensemble.name}: not run")
            continue
        met = (len(ran) == len(sets) and all(d >= 0 for d, _ in standings)
               and sum(s == "ahead" for _, s in standings) >= 2)
        verdicts.append(f"{ensemble.name}: **{'met' if met else 'not met'}**"
                        + (f" (run on {', '.join(ran)} only)" if len(ran) < len(sets) else "")
                        + (f", below the best GBDT on {', '.join(below)}" if below else "")
                        + (f"; above it but not significantly on {', '.join(short)}"
                           if short and not met else ""))
    lines += ["", "Cells: mean ± std over seeds; differences: each query's test NDCG@10 averaged "
                  "over each row's every seed, paired t-test; significant from: the smallest "
                  "difference that test would call significant (p < "
                  f"{SIGNIFICANT}) given the spread of these queries' differences, "
                  "t · sd / √queries. The bar (at or above the best GBDT on every set, "
                  "significantly above on at least two): " + "; ".join(verdicts) + "."]
    for i, recipe in enumerate(ensembles):
        if recipe.ranked_from:
            lines += ["", _against_test_best_gbdt(recipe, i, by_set, folds)]
    return "\n".join(lines) + "\n"


def _against_test_best_gbdt(recipe, i, by_set, folds):
    """Says how the recipe `recipe` (an `Ensemble`, the `i`th ensemble row) fares on each set
    against the GBDT whose test NDCG@10 is best there: a reference chosen in hindsight, on test."""
    parts = []
    for name, (rows, ensembles, _) in by_set.items():
        best = _gbdt_reference(rows.get("gbdt", []), folds, in_test=True)
        test = None if best is None else paired(ensembles[i], best, folds, "ndcg@10",
                                                every_seed=True)
        if test is not None:
            parts.append(f"{name}: {best.setting.model} {best.cell(folds, 'ndcg@10')[0]:.4f}, "
                         f"{test[0]:+.4f} (p = {test[1]:.3f})")
    return (f"Recipe {recipe.name} against the GBDT best in test NDCG@10 on each set (chosen "
            "in hindsight, on test, so not the reference above): "
            + ("; ".join(parts) or "not run") + ".")


def _rule_checked(recipe, by_set, folds):
    """Says which settings of the studies the recipe `recipe` (an `Ensemble`) was ranked from the
    rule ranks first on the cache over the sets of `by_set` ({set: (rows by study, ...)}), and
    whether they are its members."""
    sets = list(by_set)
    validation = {}  # setting -> [its validation mean on each set]
    for rows, _, _ in by_set.values():
        for row in (row for name in recipe.ranked_from for row in rows[name]):
            if len(row.by_fold_seed) == row.planned:
                validation.setdefault(row.setting, []).append(row.validation_mean(folds))
    ranked = sorted((s for s, means in validation.items() if len(means) == len(sets)),
                    key=lambda s: -np.mean(validation[s]))
    k = len(recipe.members)

    def named(setting):
        return (f"{setting.label()} {np.mean(validation[setting]):.4f} ("
                + ", ".join(f"{name} {v:.4f}" for name, v in zip(sets, validation[setting]))
                + ")")

    return (f"Recipe {recipe.name}: the rule's {k} best of the {', '.join(recipe.ranked_from)} "
            f"{'study' if len(recipe.ranked_from) == 1 else 'studies'} on "
            f"{', '.join(sets) or 'no set'}. "
            "From the cache, best first: " + ("; ".join(map(named, ranked[:k + 2])) or "none")
            + ". " + ("Its members are these.\n" if set(ranked[:k]) == set(recipe.members) else
                      "**Its members are not these**: the cache no longer picks them.\n"))


def _points_chosen(row, folds):
    """Says which grid point validation chose for each fold of `row`'s complete seeds: the
    options that differ from the recipe's and the trainer's."""
    def options(run):
        return ", ".join(f"{k}={v}" for k, v in run["scorer"] + run.get("optimizer", []))

    chosen = [f"Fold{fold} seed{seed}: "
              f"{options(row.by_fold_seed[fold, seed]['run']) or 'the recipe'}"
              for seed in row.complete_seeds(folds) for fold in folds]
    return f"\n{row.setting.label()} chose " + "; ".join(chosen) + "."


def _costed(rows, folds, names=None):
    """The table of `rows` in NDCG@1/5/10 and MAP, each named (`names`, else its label) with its
    seconds per fold."""
    names = names or [r.setting.label() for r in rows]
    return table(rows, folds, ("ndcg@1", "ndcg@5", "ndcg@10", "map"),
                 names=[f"{name}, {_fmt_seconds(r.seconds_per_fold(folds))} s/fold"
                        for name, r in zip(names, rows)])


def _gbdt_reference(gbdts, folds, in_test=False):
    """Returns the GBDT row with the best validation NDCG@10 among those run, or with `in_test`
    the best test NDCG@10 (a choice in hindsight); None if none ran."""
    run = [r for r in gbdts if r.cell(folds, "ndcg@10") is not None]
    best = ((lambda r: r.cell(folds, "ndcg@10")[0]) if in_test else
            (lambda r: r.validation_mean(folds)))
    return max(run, key=best) if run else None


SIGNIFICANT = 0.05  # the p-value under which a paired difference is called significant


def _standing(diff, p):
    """Returns "ahead", "behind" (significantly) or "level" (within noise) for a paired test."""
    return "level" if p >= SIGNIFICANT else "ahead" if diff > 0 else "behind"


VERDICTS = {"ahead": "significantly ahead of it", "behind": "significantly behind it",
            "level": "level with it within noise"}


def _chosen_against(rows, reference, folds):
    """Says which of `rows` (all run) validation NDCG@10 chooses, and how it fares against
    `reference` in test NDCG@10."""
    best = max(rows, key=lambda r: r.validation_mean(folds))
    diff, p, queries = paired(best, reference, folds, "ndcg@10")
    return (f"Chosen on validation among these: {best.setting.label()}; test NDCG@10 "
            f"{diff:+.4f} against the reference (p = {p:.3f}, {queries} queries): "
            f"**{VERDICTS[_standing(diff, p)]}**.")


def _fmt_seconds(seconds):
    return "—" if seconds is None else f"{seconds:.0f}"


def _letor_convention(view):
    """The rows of the studies shown of `LETOR_CONVENTION` with LETOR's convention, where a
    test query has no relevant document."""
    rows = [r for name in LETOR_CONVENTION for r in view.shown.get(name, [])]
    if not _some_query_without_relevant(rows):
        return None
    return "\n".join([
        f"### {view.data.name} with LETOR's convention (queries without a relevant document count "
        "as 0)\n",
        table(rows, view.folds, ("ndcg@1", "ndcg@5", "ndcg@10", "map"), zero_empty=True)]) + "\n"


def _alpha_10_tightness(view):
    """The tightness plot of the `bruch_alpha` study's ApproxNDCG run with α = 10."""
    (row,) = [r for r in view.rows["bruch_alpha"] if dict(r.setting.params)["alpha"] == 10.0]
    return _tightness(row, view.data, view.folds, view.out)


def _tightness(row, data, folds, out):
    """Plots exact and approximate NDCG@10 per epoch of one ApproxNDCG run (`row`)."""
    runs = [row.by_fold_seed[k] for k in sorted(row.by_fold_seed)]
    if not runs:
        return "### Approximation tightness during training\n\nnot run\n"
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    history = runs[0]["history"]  # one dict of logs per epoch
    epochs = np.arange(1, len(history) + 1)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for key, style in (("ndcg@10", "-"), ("approx_ndcg@10", "--"),
                       ("val_ndcg@10", "-"), ("val_approx_ndcg@10", "--")):
        ax.plot(epochs, [logs[key] for logs in history], style, marker=".", label=key)
    ax.set_xlabel("epoch")
    ax.set_ylabel("NDCG@10")
    ax.set_title(f"{data.name} Fold{runs[0]['run']['fold']}: exact vs approx (α = 10)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "results" / f"{data.name.lower()}_tightness.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    gaps = [run["history"][-1]["approx_ndcg@10"] - run["history"][-1]["ndcg@10"] for run in runs]
    return ("### Approximation tightness during training (Qin et al. Fig. 3)\n\n"
            f"Train and validation NDCG@10, exact and approximate (α = 10), per epoch, from the "
            f"trainer's history. Approx − exact at the last epoch, over {len(runs)} runs: "
            f"{np.mean(gaps):+.4f} ± {np.std(gaps):.4f}.\n\n"
            f"![{data.name} tightness](results/{path.name})\n")


def _losses(view):
    """Every loss of the `losses` study, with its cost, paired tests against the study's
    ApproxNDCG α = 10 row and the GBDT reference, and a summary of who wins where."""
    from tfapprox.losses import LOSSES, RANKING_LOSS_KEYS

    rows, data, folds = view.rows["losses"], view.data, view.folds

    aliases = {name: key for key, loss in RANKING_LOSS_KEYS.items()
               for name, ours in LOSSES.items() if ours is loss}
    by_loss = {r.setting.loss: r for r in rows}
    approx, gbdt = by_loss[LOSS_STUDY_REFERENCE], _gbdt_reference(view.rows["gbdt"], folds)
    against = {"− ApproxNDCG α = 10": approx}
    if gbdt is not None:
        against["− GBDT reference"] = gbdt
    metrics = ("ndcg@10", "map")
    names = [r.setting.label() + (f" = TF-Ranking's {aliases[r.setting.loss]}"
                                  if r.setting.loss in aliases else "") for r in rows]
    lines = ["### Every loss of `tfapprox.losses`\n",
             f"`python -m benchmarks.experiments run --study losses {data.flags()}`. Each loss "
             "with its defaults on the B64 scorer, by its `tfapprox.losses.LOSSES` key "
             "(TF-Ranking's key where the loss is TF-Ranking's), all with the same optimiser, "
             "learning rate and batch (the trainer's preset named like the set, else its defaults; "
             "their own loss is ApproxNDCG): no loss is tuned for itself. Seconds per fold: wall time of "
             "a fold's run, training and scoring, mean over folds and seeds (on a shared machine: "
             "compare them only roughly). Paired tests use the seeds both rows have; the GBDT "
             "reference is the GBDT table's"
             + (f": {gbdt.setting.label()}" if gbdt else " (not run)") + ". The LambdaLoss "
             "framework is here as lambdarank (the pairwise logistic loss with NDCGLambdaWeight); "
             "its other weights (NDCG-Loss2++, …) are not: a `lambda_weight` is a Keras config "
             "mapping, which the runner's scalar loss parameters cannot carry.\n",
             _costed(rows, folds, names), "",
             "| loss | " + " | ".join(f"{name}: {m}" for name in against for m in metrics) + " |",
             "|---" * (1 + len(against) * len(metrics)) + "|"]
    ran = [r for r in rows if r.cell(folds, "ndcg@10") is not None]
    lines += [f"| {r.setting.loss} | " + " | ".join(
        _fmt_test(paired(r, other, folds, m) if r is not other else None)
        for other in against.values() for m in metrics) + " |" for r in ran]
    if ran and gbdt is not None:
        lines += ["", _chosen_against(ran, gbdt, folds)]
    lines += ["", _losses_summary(rows, ran, approx, gbdt, data, folds)]
    return "\n".join(lines) + "\n"


def _losses_summary(rows, ran, approx, gbdt, data, folds):
    """Says, in test NDCG@10, which losses (`ran`: the `rows` with results) are significantly
    ahead of and behind ApproxNDCG and the GBDT reference, and which seed losses are behind
    softmax_loss or lambdarank."""
    if not ran:
        return f"No loss of this study has run on {data.name}."
    seeds = sorted({len(r.complete_seeds(folds)) for r in ran})
    sentences = [f"**Summary, {data.name}** (test NDCG@10; significant: p < {SIGNIFICANT} in the "
                 "paired t-test over queries; rows have "
                 + " or ".join(f"{n} seed{'s' * (n > 1)}" for n in seeds) + " each"
                 + (", so a test of a one-seed row measures the spread over queries of that "
                    "seed, not over seeds" if seeds[0] == 1 else "") + ")."]

    def standing(row_set, other):
        groups = {"ahead": [], "behind": [], "level": []}
        for row in row_set:
            test = None if row is other else paired(row, other, folds, "ndcg@10")
            if test is not None:
                groups[_standing(*test[:2])].append(f"{row.setting.loss} ({test[0]:+.4f})")
        return groups

    for name, other in (("ApproxNDCG α = 10", approx),
                        (f"the GBDT reference ({gbdt.setting.label()})" if gbdt else None, gbdt)):
        if other is None or other.cell(folds, "ndcg@10") is None:
            continue
        groups = standing(ran, other)
        sentences.append(f"Against {name}: significantly ahead: "
                         f"{', '.join(groups['ahead']) or 'none'}; significantly behind: "
                         f"{', '.join(groups['behind']) or 'none'}; "
                         f"{len(groups['level'])} level within noise.")
    by_loss = {r.setting.loss: r for r in ran}
    seed_rows = [by_loss[loss] for loss in SEED_LOSSES if loss in by_loss]
    for challenger in SEED_CHALLENGERS:
        if challenger in by_loss:
            behind = standing(seed_rows, by_loss[challenger])["behind"]
            sentences.append(f"Seed losses significantly behind {challenger}: "
                             f"{', '.join(behind) or 'none'}.")
    missing = [r.setting.loss for r in rows if r not in ran]
    if missing:
        sentences.append(f"Not run (all folds) yet: {', '.join(missing)}.")
    return " ".join(sentences)


# The model families the summary takes the best of, each chosen on validation.
FAMILIES = (("linear", lambda s: s.model == "linear"),
            ("B-net (B64 … B1024)", lambda s: s.model.startswith("B") and not s.ensemble),
            ("DASALC", lambda s: s.model == "dasalc" and not s.ensemble),
            ("AdaRank", lambda s: s.model == "adarank"),
            ("ensemble of seeds", lambda s: isinstance(s.members, int) and s.ensemble),
            ("ensemble of settings", lambda s: isinstance(s.members, tuple)))


def _summary(views, folds):
    """The summary: per set (`views`), in test NDCG@10, the best setting of each family chosen on
    validation among those run on every fold and seed, each tuned GBDT and the recommended
    recipe, each against the reference (the GBDT best on validation), over the folds of the set's
    tables (`folds` unless the set is still running)."""
    recommended = ENSEMBLES_BY_NAME[RECOMMENDED].setting()
    table = {f"best {family}": {} for family, _ in FAMILIES}  # row name -> {set: cell}
    chosen = {}  # set -> [family: label]
    partial = []
    for view in views:
        name, rows, here = view.data.name, view.rows, view.folds
        if here != folds:
            partial.append(f"{name}: fold{'s' * (len(here) > 1)} {', '.join(map(str, here))} "
                           f"only, the runs so far (partial; see its section)")
        every = list({r.setting: r for study in rows.values() for r in study}.values())
        reference = _gbdt_reference(rows.get("gbdt", []), here)
        complete = [r for r in every if r.by_fold_seed and len(r.by_fold_seed) == r.planned]
        picked = []
        for family, member in FAMILIES:
            candidates = [r for r in complete if r.setting.model not in GBDTS
                          and member(r.setting)]
            if candidates:
                best = max(candidates, key=lambda r: r.validation_mean(here))
                picked.append((f"best {family}", best))
                chosen.setdefault(name, []).append(f"{family}: {best.setting.label()}")
        picked += [(f"{r.setting.model} (tuned)", r) for r in rows.get("gbdt", [])]
        picked += [("recommended recipe", r) for r in every if r.setting == recommended]
        for row_name, row in picked:
            table.setdefault(row_name, {})[name] = _summary_cell(row, reference, here)
    sets = [view.data.name for view in views]
    lines = ["## Summary\n",
             f"Test NDCG@10 (mean over folds, mean over seeds) and, in brackets, the paired "
             "difference from the reference, the GBDT best on validation (p: paired t-test "
             "over the test queries); each family's best is chosen on validation "
             f"{SELECT_METRIC} among the settings run on every fold and seed. The recommended "
             f"recipe is `python -m trainer train --recipe recommended` ({RECOMMENDED}).\n",
             "| | " + " | ".join(sets) + " |", "|---" * (len(sets) + 1) + "|"]
    lines += [f"| {row_name} | " + " | ".join(cells.get(s, "—") for s in sets) + " |"
              for row_name, cells in table.items() if cells]
    lines += [""] + [f"- {name}: " + "; ".join(labels) + "." for name, labels in chosen.items()]
    lines += [f"- {line}." for line in partial]
    return "\n".join(lines) + "\n"


def _summary_cell(row, reference, folds):
    """`row`'s test NDCG@10 and its paired difference from `reference`, with how many of its
    runs are in the cache where not all are."""
    runs = len(row.by_fold_seed)
    count = f"{runs} of {row.planned} runs" if runs < row.planned else ""
    cell = row.cell(folds, "ndcg@10")
    if cell is None:
        return f"partial ({count})" if runs else "not run"
    text = f"{cell[0]:.4f}"
    if row is reference:
        text += " (reference)"
    elif reference is not None:
        diff, p, _ = paired(row, reference, folds, "ndcg@10")
        text += f" ({diff:+.4f}, p = {p:.3f})"
    return text + (f", {count}" if count else "")


def _recommended(view):
    """The recommended recipe (the last row of its study) and its members against each tuned
    GBDT, in test NDCG@10, saying where it loses."""
    rows, gbdts, data, folds = view.rows["recommended"], view.rows["gbdt"], view.data, view.folds
    recipe = rows[-1]
    everything = [*gbdts, *rows]
    partial = [f"{r.setting.label()} {len(r.by_fold_seed)} of {r.planned}" for r in everything
               if len(r.by_fold_seed) < r.planned]
    lines = ["### The recommended recipe against the tuned GBDTs\n",
             f"`python -m benchmarks.experiments run --study recommended gbdt {data.flags()}`. "
             f"The trainer's recommended recipe ({RECOMMENDED}: "
             f"{recipe.setting.label().removeprefix('ensemble of ')}) and its members, against "
             "LightGBM, XGBoost and CatBoost each tuned per fold on validation "
             f"{SELECT_METRIC}; seconds per fold as in the GBDT table.\n"]
    if partial:
        lines.append(f"**Partial**: not every fold and seed has run (runs in the cache: "
                     f"{'; '.join(partial)}); a cell shows the seeds run on every fold. Resume "
                     f"with `python -m benchmarks.experiments run --study recommended gbdt "
                     f"{data.flags()}`.\n")
    lines += [_costed(everything, folds), "",
              "| setting | " + " | ".join(f"− {g.setting.model}: ndcg@10" for g in gbdts) + " |",
              "|---" * (len(gbdts) + 1) + "|"]
    lines += [f"| {r.setting.label()} | "
              + " | ".join(_fmt_test(paired(r, g, folds, "ndcg@10")) for g in gbdts) + " |"
              for r in rows]
    standings = {"ahead": [], "behind": [], "level": []}
    for gbdt in gbdts:
        test = paired(recipe, gbdt, folds, "ndcg@10")
        if test is not None:
            standings[_standing(*test[:2])].append(f"{gbdt.setting.model} ({test[0]:+.4f}, "
                                                   f"p = {test[1]:.3f})")
    lines += ["", f"**On {data.name}, in test NDCG@10, the recipe** is significantly behind "
                  f"{', '.join(standings['behind']) or 'none'}; level within noise with "
                  f"{', '.join(standings['level']) or 'none'}; significantly ahead of "
                  f"{', '.join(standings['ahead']) or 'none'}."]
    return "\n".join(lines) + "\n"


# The sections drawn by functions of their own, after the declared tables, in the page's order:
# the studies whose rows each shows (drawn if any is shown on the set), and its function of the
# set's `SetView`, which returns the section or None where it has nothing to say.
SECTIONS = ((("gbdt", *DASALC_TABLE, "dasalc_tuned"), _gbdt_and_dasalc),
            (("recommended",), _recommended),
            (("losses",), _losses),
            (LETOR_CONVENTION, _letor_convention),
            (("bruch_alpha",), _alpha_10_tightness))
