"""`python -m trainer ensemble`: trained runs combined into one model (`tfapprox.ensemble.
ScoreEnsemble`), its standardisation fitted on validation, evaluated, saved and exported.

The ensemble's own run directory holds `ensemble.keras` (the Keras model: members, their weights
and the fitted offsets and scales), `results.json` (the members, each one's validation metrics
and the ensemble's) and nothing the members wrote; the members' run directories are only read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from trainer.config import Config  # standard library and YAML only: no TensorFlow before the
# command line quiets its start-up (tfapprox/_startup.py)

Printer = Callable[[str], None]
MODEL_FILE = "ensemble.keras"


def member_config(run_dir: str) -> Config:
    """Returns the config a run was trained with (its `config.json`), its run directory `run_dir`
    (a run may have been moved since, or trained from another working directory)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: --members takes the run directories of `python -m trainer train`")
    values = json.loads(path.read_text())
    values["train"]["run_dir"] = str(run_dir)
    return Config.from_dict(values)


def check_run_dir(run_dir: str, members: list[str]) -> None:
    """Raises ValueError if the ensemble's `run_dir` is a member's or holds a training run: its
    results.json would be replaced."""
    from trainer import checkpoint

    target = Path(run_dir).resolve()
    if any(Path(member).resolve() == target for member in members):
        raise ValueError(f"--run-dir {run_dir} is a member's run directory; the ensemble's "
                         "results.json would replace the member's: choose another")
    if checkpoint.path_in(run_dir).exists():
        raise ValueError(f"--run-dir {run_dir} holds a training run's checkpoint; the ensemble's "
                         "results.json would replace the run's: choose another")


def check_unseen(configs: list[Config], fingerprints: dict[str, list]) -> None:
    """Raises ValueError if a file the ensemble is fitted or scored on (`fingerprints` of its
    "vali" and "test" splits, `trainer.data.fingerprint`) is one a member was trained on: its
    standardisation and metrics would then rest on data that member learned. Files are the same
    when their names and sizes are, whatever their times (a data set copied again gets new ones)."""
    from trainer import checkpoint

    for config in configs:
        state = checkpoint.load_state(config.train.run_dir)
        train_files = state.data.get("train") if state is not None else None
        trained_on = {tuple(entry[:2]) for entry in train_files or []}
        for split, name in (("vali", "validation"), ("test", "test")):
            seen = [entry for entry in fingerprints.get(split) or []
                    if tuple(entry[:2]) in trained_on]
            if seen:
                raise ValueError(
                    f"{config.train.run_dir} was trained on {seen[0][0]}, which the ensemble "
                    f"would use as {name} data: give --vali/--test files no member trained on")


def run(config: Config, members: list[str], print_fn: Printer = print) -> dict[str, Any]:
    """Builds the ensemble of the runs in `members` (each with its best weights), fits its
    standardisation on `config`'s validation data, scores validation and test, writes
    `ensemble.keras` and `results.json` into `config.train.run_dir` and exports it if
    `config.export.enabled`. Returns the results."""
    import keras

    from tfapprox import losses
    from tfapprox.ensemble import ScoreEnsemble
    from trainer import data, run_files, train

    started = time.perf_counter()
    configs = [member_config(member) for member in members]
    splits = data.resolve(config.data, print_fn=print_fn)
    check_unseen(configs, splits.fingerprints)
    built = [train.restore_best(member, data_width=splits.num_features) for member in configs]
    vali = data.eval_dataset(splits.vali, splits)
    ensemble = ScoreEnsemble([b.eval_model for b in built], name="score_ensemble")
    ensemble.adapt(vali.map(lambda inputs, labels: inputs))
    results = {
        "run_dir": config.train.run_dir,
        "members": [{"run_dir": member.train.run_dir, "method": train.describe_method(member),
                     "validation": train.evaluate_on(b, vali)}
                    for member, b in zip(configs, built)],
        "offsets": [float(v) for v in keras.ops.convert_to_numpy(ensemble.offsets)],
        "scales": [float(v) for v in keras.ops.convert_to_numpy(ensemble.scales)],
    }
    run_dir = run_files.claim(config.train.run_dir)
    run_files.replace_by_saving(run_dir / MODEL_FILE, ensemble.save)  # before compile: a model
    if config.export.enabled:                                          # to score with, not train
        results["export_path"] = str(train.export(ensemble, config, splits.num_features))
    # the members' metrics, less the monitors of a loss the ensemble was not trained on
    names = [name for name in built[0].eval_metrics if not name.startswith("approx_")]
    ensemble.compile(loss=losses.get(config.loss.name, **config.loss.params),  # Keras's evaluate
                     metrics=train.metrics_named(names, config))         # needs one; unreported
    scored = train.Built(model=None, eval_model=ensemble, eval_metrics=names,
                         num_features=splits.num_features, reports_loss=False)
    results["validation"] = train.evaluate_on(scored, vali)
    results["test"] = (train.evaluate_on(scored, data.eval_dataset(splits.test, splits))
                       if splits.test else None)
    results["wall_seconds"] = time.perf_counter() - started
    train.write_json(run_dir / "results.json", results)
    print_fn(summary(results))
    return results


def summary(results: dict[str, Any]) -> str:
    """Returns the members' validation metrics beside the ensemble's, and where it went."""
    from trainer import train

    lines = [f"Ensemble {results['run_dir']} of {len(results['members'])} runs:"]
    for member in results["members"]:
        metric, value = next(iter(member["validation"].items()))  # the selection metric
        lines.append(f"  {member['run_dir']}: {member['method']} | validation {metric} {value:.4f}")
    lines.append(train.metrics_table(results))
    if "export_path" in results:
        lines.append(f"Exported {results['export_path']}")
    return "\n".join(lines)
