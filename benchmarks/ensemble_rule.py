"""Two rules for averaging an ensemble's standardised scores, on the same trained members:

- per list (`experiment_runs.ensemble_scores`, what `benchmarks.experiments` reports): each
  member's scores standardised by their mean and deviation within each list;
- by constants (`tfapprox.ensemble.ScoreEnsemble`, what `python -m trainer ensemble` builds and
  exports): by their mean and deviation over the validation documents.

    python -m benchmarks.ensemble_rule --work DIR [--dataset MQ2008 ...] [--ensemble NAME]

`--work` is the `--work` directory of the `benchmarks.experiments` runs, which holds the members'
checkpoints; `--ensemble` names an `experiment_studies.ENSEMBLES` entry (default: mixed_quantile).
Prints, per set, test NDCG@10 under each rule (the mean over the queries with a relevant
document, over every fold and seed) and their paired difference.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks import experiment_runs as runs
from benchmarks.experiments import DATASETS, REPO, SHARED_FOLDS
from benchmarks.experiment_studies import NEURAL_EPOCHS, runs_of, studies

SEEDS = (0, 1, 2)


def member_models(run, files, num_features, work: Path):
    """Returns the trained models of the ensemble `run`'s members, restored from `work`;
    FileNotFoundError if one has no finished checkpoint there (nothing is trained here)."""
    models = []
    for member in run.member_runs():
        config = runs._run_config(member, files, num_features, work)
        if not runs.finished(member, config):
            raise FileNotFoundError(f"{config.train.run_dir}: no finished checkpoint of "
                                    f"{member.label()}; run the study with --work {work} first")
        models.append(runs._best_model(config, num_features))
    return models


def by_constants(models, vali, test) -> list[np.ndarray]:
    """Returns test scores per list from a `ScoreEnsemble` of `models` fitted on `vali`."""
    from tfapprox.ensemble import ScoreEnsemble

    ensemble = ScoreEnsemble(models)
    ensemble.adapt(_batches(vali.features))
    return runs._score(ensemble, test.features)


def _batches(features, size=64):
    for start in range(0, len(features), size):
        lists = features[start:start + size]
        yield {"features": runs.padded(lists, 0.0),
               "mask": runs.padded([np.ones(len(f)) for f in lists], 0.0).astype(bool)}


def compare(dataset: str, name: str, work: Path) -> dict[str, np.ndarray]:
    """Returns each rule's test NDCG@10 per query (over every fold and seed) on `dataset`."""
    setting, = [s for s in studies()["mixed_ensemble"] if s.loss == name]
    folds = runs.DataSet(dataset, REPO.parent / "shared" / "data" / dataset, shared=True).folds()
    found = {"per list": [], "by constants": []}
    for run in runs_of(setting, dataset, SHARED_FOLDS, SEEDS, NEURAL_EPOCHS):
        files = folds[run.fold]
        num_features = runs._num_features(files)
        vali = runs._Split(files, "vali", num_features)
        test = runs._Split(files, "test", num_features)
        models = member_models(run, files, num_features, work)
        per_list = runs.ensemble_scores([runs._score(m, test.features) for m in models])
        for rule, scores in (("per list", per_list),
                             ("by constants", by_constants(models, vali, test))):
            measured = runs.per_query_metrics(test.labels, scores)
            relevant = np.asarray(measured["relevant"], bool)
            found[rule].append(np.asarray(measured["values"]["ndcg@10"])[relevant])
    return {rule: np.concatenate(values) for rule, values in found.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ensemble_rule",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dataset", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--ensemble", default="mixed_quantile")
    args = parser.parse_args(argv)
    from scipy import stats

    print(f"ensemble {args.ensemble}, folds 1-5 x seeds 0-2: test NDCG@10")
    print("| set | per list | by constants | by constants − per list |")
    print("|---|---|---|---|")
    for dataset in args.dataset:
        found = compare(dataset, args.ensemble, args.work)
        difference = found["by constants"] - found["per list"]
        p = stats.ttest_rel(found["by constants"], found["per list"]).pvalue
        error = difference.std(ddof=1) / np.sqrt(len(difference))
        print(f"| {dataset} | {found['per list'].mean():.4f} | {found['by constants'].mean():.4f} "
              f"| {difference.mean():+.4f} ± {error:.4f} (p = {p:.2f}) |", flush=True)


if __name__ == "__main__":
    main()
