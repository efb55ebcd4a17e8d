"""`python -m trainer ensemble`: trained runs combined into one model (`tfapprox.ensemble.
ScoreEnsemble`), its standardisation fitted on validation, evaluated, saved and exported.

The ensemble's own run directory holds `ensemble.keras` (the Keras model: members, their weights
and the fitted offsets and scales), `results.json` (the members, each one's validation metrics
and the ensemble's) and nothing the members wrote; the members' run directories are only read.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

# standard library and YAML only: no TensorFlow before the command line quiets its start-up
# (tfapprox/_startup.py)
from trainer.config import Config, DataConfig

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
    """Raises ValueError naming a run directory that `members` names twice (it would count twice),
    or if the ensemble's `run_dir` is a member's or inside one (the members are only read) or
    holds a training run (its results.json would be replaced)."""
    from trainer import checkpoint

    named: dict[Path, str] = {}
    for member in members:
        real = Path(member).resolve()
        if real in named:
            raise ValueError(f"--members names {named[real]} twice (also as {member}); an "
                             "ensemble takes each run once")
        named[real] = member
    target = Path(run_dir).resolve()
    for real, member in named.items():
        if target == real:
            raise ValueError(f"--run-dir {run_dir} is a member's run directory; the ensemble's "
                             "results.json would replace the member's: choose another")
        if target.is_relative_to(real):
            raise ValueError(f"--run-dir {run_dir} is inside member {member}'s run directory, "
                             "which the ensemble only reads: choose one outside the members'")
    if checkpoint.path_in(run_dir).exists():
        raise ValueError(f"--run-dir {run_dir} holds a training run's checkpoint; the ensemble's "
                         "results.json would replace the run's: choose another")


def check_same_inputs(configs: list[Config]) -> None:
    """Raises ValueError if some members were trained on vector features and others over a
    feature spec (`data.feature_spec`), or over specs naming other features: one model scores
    them all from the same request."""
    from trainer import named_data

    def inputs(config):
        spec = config.data.feature_spec
        return None if spec is None else named_data.load_spec(spec).model_inputs()

    first = inputs(configs[0])
    for config in configs[1:]:
        if inputs(config) != first:
            raise ValueError(
                f"member {config.train.run_dir} was trained on other inputs than member "
                f"{configs[0].train.run_dir} ({_inputs_named(config)} vs "
                f"{_inputs_named(configs[0])}): an ensemble's members score the same requests")


def _inputs_named(config: Config) -> str:
    spec = config.data.feature_spec
    return "vector features" if spec is None else f"the features of {spec}"


def check_finished(configs: list[Config]) -> None:
    """Raises ValueError naming a member that a live trainer still holds or whose run did not
    finish (its checkpoint has fewer epochs than planned and it did not stop early): its best
    weights so far are not the run's choice."""
    from trainer import checkpoint, run_lock

    for config in configs:
        run_dir = config.train.run_dir
        holder = run_lock.holder(run_dir)
        if holder is not None:
            raise ValueError(f"member {run_dir} is still being trained ({holder}): wait for its "
                             "run to finish")
        state = checkpoint.load_state(run_dir) or checkpoint.RunState()
        adarank = config.model.kind == "adarank"
        planned = config.model.adarank_rounds if adarank else config.train.epochs
        if not state.finished(planned):
            raise ValueError(
                f"member {run_dir} did not finish training: {state.epoch} of its {planned} "
                f"{'rounds' if adarank else 'epochs'} done; rerun its `python -m trainer train` "
                "command to finish it")


def check_unseen(configs: list[Config], data_config: DataConfig) -> None:
    """Raises ValueError if a file the ensemble is fitted or scored on (its validation and test
    files, `data_config`) holds the data a member was trained on: its standardisation and metrics
    would then rest on data that member learned.

    Files are compared by content: size, then SHA-256. A member's training files are read where
    its config names them, if they still have the name and size its checkpoint recorded; where
    they are gone, a file of the same name and size counts as the same."""
    from trainer import data

    used = data.source_files(data_config)
    digests: dict[Path, str] = {}
    for config in configs:
        for name, size, found in _training_files(config):
            for split, role in (("vali", "validation"), ("test", "test")):
                for path in used.get(split, []):
                    if path.stat().st_size != size:
                        continue
                    if found:
                        digest = _digest(path, digests)
                        if all(_digest(f, digests) != digest for f in found):
                            continue
                    elif path.name != name:
                        continue
                    same = name if path.name == name else f"{name} (the same data as {path})"
                    raise ValueError(
                        f"member {config.train.run_dir} was trained on {same}, which the ensemble "
                        f"would use as {role} data: give --vali/--test files no member trained on")


def _training_files(config: Config) -> list[tuple[str, int, list[Path]]]:
    """Returns the name and size of each file the run of `config` was trained on (as its
    checkpoint recorded them), each with the files of that name and size where its config names
    its training files now (none where they are gone)."""
    from trainer import checkpoint, data

    state = checkpoint.load_state(config.train.run_dir)
    try:
        now = data.source_files(config.data).get("train", [])
    except FileNotFoundError:
        now = []
    recorded = (state.data.get("train") if state is not None else None) or []
    return [(name, size, [f for f in now if (f.name, f.stat().st_size) == (name, size)])
            for name, size, *_ in recorded]


def _digest(path: Path, digests: dict[Path, str]) -> str:
    """Returns the SHA-256 of `path`'s bytes, read once per path (`digests` holds those read)."""
    if path not in digests:
        sha = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
        digests[path] = sha.hexdigest()
    return digests[path]


def run(config: Config, members: list[str], print_fn: Printer = print) -> dict[str, Any]:
    """Builds the ensemble of the runs in `members` (each with its best weights), fits its
    standardisation on `config`'s validation data, scores validation and test, writes
    `ensemble.keras` and `results.json` into `config.train.run_dir` and exports it if
    `config.export.enabled`. Returns the results. Every refusal (`check_finished`,
    `check_unseen`, a member's scores that are not finite on validation) comes before any write."""
    import keras

    from tfapprox import losses
    from tfapprox.ensemble import NonFiniteScores, ScoreEnsemble
    from trainer import data, run_files
    from trainer.build import Built, bound_evaluation, evaluate_on, restore_best
    from trainer.export import export
    from trainer.metric_names import metrics_named
    from trainer.report import describe_method

    started = time.perf_counter()
    configs = [member_config(member) for member in members]
    check_finished(configs)
    splits = data.resolve(config.data, print_fn=print_fn)
    check_unseen(configs, config.data)
    built = [restore_best(member, data_width=splits.num_features) for member in configs]
    ensemble = ScoreEnsemble([b.eval_model for b in built], name="score_ensemble")
    splits = bound_evaluation(config, ensemble, splits)
    vali = data.eval_dataset(splits.vali, splits)
    try:
        ensemble.adapt(vali.map(lambda inputs, labels: inputs))
    except NonFiniteScores as err:  # the ensemble would score every document NaN
        files = ", ".join(entry[0] for entry in splits.fingerprints["vali"])
        raise ValueError(f"member {members[err.member]} {err.reason} on validation ({files}); "
                         "an ensemble of it would score every document NaN: check its weights "
                         "and the validation features") from None
    results = {
        "run_dir": config.train.run_dir,
        "members": [{"run_dir": member.train.run_dir, "method": describe_method(member),
                     "validation": evaluate_on(b, vali)}
                    for member, b in zip(configs, built)],
        "offsets": [float(v) for v in keras.ops.convert_to_numpy(ensemble.offsets)],
        "scales": [float(v) for v in keras.ops.convert_to_numpy(ensemble.scales)],
    }
    run_dir = run_files.claim(config.train.run_dir)
    run_files.replace_by_saving(run_dir / MODEL_FILE, ensemble.save)  # before compile: a model
    if config.export.enabled:                                          # to score with, not train
        results["export_path"] = str(export(ensemble, config, splits.num_features))
    # the members' metrics, less the monitors of a loss the ensemble was not trained on
    names = [name for name in built[0].eval_metrics if not name.startswith("approx_")]
    ensemble.compile(loss=losses.get(config.loss.name, **config.loss.params),  # Keras's evaluate
                     metrics=metrics_named(names, config))         # needs one; unreported
    scored = Built(model=None, eval_model=ensemble, eval_metrics=names,
                         num_features=splits.num_features, reports_loss=False)
    results["validation"] = evaluate_on(scored, vali)
    results["test"] = (evaluate_on(scored, data.eval_dataset(splits.test, splits))
                       if splits.test else None)
    results["wall_seconds"] = time.perf_counter() - started
    run_files.write_json(run_dir / "results.json", results)
    print_fn(summary(results))
    return results


def summary(results: dict[str, Any]) -> str:
    """Returns the members' validation metrics beside the ensemble's, and where it went."""
    from trainer.report import metrics_table

    lines = [f"Ensemble {results['run_dir']} of {len(results['members'])} runs:"]
    for member in results["members"]:
        metric, value = next(iter(member["validation"].items()))  # the selection metric
        lines.append(f"  {member['run_dir']}: {member['method']} | validation {metric} {value:.4f}")
    lines.append(metrics_table(results))
    if "export_path" in results:
        lines.append(f"Exported {results['export_path']}")
    return "\n".join(lines)
