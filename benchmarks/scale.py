"""Web scale: an MSLR-WEB30K-sized generated set end to end, with LightGBM as the reference.

    python benchmarks/scale.py                                  # the full protocol, 31,531 queries
    python benchmarks/scale.py --queries 6000 --presets B256 --epochs 2 --work runs/scale-6000

Protocol. Each stage runs as a child process (from --work as its working directory); its wall
time, peak RSS (the child's own ru_maxrss, from wait4), CPU time (user + system, its worker
processes included, from wait4) and the machine's load average as it starts and ends are
recorded.
  generate         python -m tfapprox.data synthetic WORK/text --lengths mslr: --queries queries
                   (default 31,531, as MSLR-WEB30K), 136 features, labels 0..4, list lengths
                   log-normal like MSLR-WEB30K's (1..1,251 documents, mean ~120), split 3:1:1 by
                   query into train/vali/test.txt, streamed to disk a query at a time.
  convert          python -m tfapprox.data convert WORK/text: ELWC TFRecords of each split in
                   WORK/records; docs/s as the converter reports it, and docs per CPU second of
                   the stage (start-up included), which does not depend on what else runs.
  train-P[-jit]    python -m trainer train on those records: scorer preset P (--presets, default
                   B256,B1024), ApproxNDCG, Adagrad 0.05, batch 32, whole lists (--list-size full,
                   the trainer's default list-length buckets), --epochs epochs (default 3), without
                   and with --jit (--jit both|off|on); validation NDCG@10 after each epoch selects
                   the weights (no early stop); not exported here.
  evaluate-P[-jit] python -m trainer evaluate: the selected weights on the validation and test sets.
  export-P[-jit]   python -m trainer export: the selected weights as a TF Serving SavedModel.
  lightgbm         LightGBM lambdarank on the same text files, run as the experiments run it
                   (benchmarks/experiment_runs.py: learning rate 0.05, 31 leaves, feature and
                   bagging fractions 0.8, early stop after 50 rounds without a gain in its
                   validation NDCG@10; each split read whole into memory), with 2 threads, at
                   most --lightgbm-rounds rounds (default 500).
Time to best validation NDCG@10: ours, the trainer's epoch times (training plus the epoch's
validation) summed up to the selected epoch; LightGBM's, from the start of lightgbm.train (its
binning of the data included) to the end of its best round (reading the text is in the stage's
wall time only). Test NDCG@10 of both is computed with tfapprox.metrics, queries without a
relevant document left out.

Targets on a 2-core machine: peak RSS under 4 GB at every stage (data streamed, never all in
memory), conversion >= 70k docs/s, an epoch of the B256 training (without --jit) <= 2 minutes at
the full size.

Resuming. Every finished stage's result is kept in WORK/stages/STAGE.json and a rerun skips it; a
stage killed midway runs again from its start (its logs are in WORK/logs/). WORK/protocol.json
holds the settings the work directory was made with: a rerun with other --queries, --seed,
--epochs or --lightgbm-rounds is refused. --stages runs a subset (generate, convert, train,
evaluate, export, lightgbm; later stages need the earlier ones' results). At the end the tables of
every finished stage are printed and written to WORK/table.md.

--preload (quick runs, e.g. the tests'): every stage's child is forked from one process that has
already imported TensorFlow, tfapprox, the trainer and LightGBM, not started afresh, which saves
each stage the seconds of CPU those imports take; its peak RSS then includes what it inherited.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "vali", "test")
STAGE_KINDS = ("generate", "convert", "train", "evaluate", "export", "lightgbm")
MSLR_QUERIES = 31_531
NUM_FEATURES = 136
SELECT_METRIC = "ndcg@10"
RSS_TARGET_MIB = 4096
CONVERT_TARGET_DOCS_PER_S = 70_000
EPOCH_TARGET_S = 120


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.lightgbm_child:
        return _lightgbm_child(Path(args.work), args.seed, args.lightgbm_rounds)
    if args.fork_server:
        return _fork_server()
    work = Path(args.work or f"runs/scale-{args.queries}")
    _claim(work, {"queries": args.queries, "seed": args.seed, "epochs": args.epochs,
                  "lightgbm_rounds": args.lightgbm_rounds, "batch_size": args.batch_size})
    stages = [stage for stage in _plan(args) if stage.kind in args.stages]
    to_run = [stage for stage in stages if _cached(work, stage.name) is None]
    forker = _Forker() if args.preload and to_run else None
    try:
        for stage in to_run:
            _run_stage(work, stage, forker)
    finally:
        if forker is not None:
            forker.close()
    table = _report(work, _plan(args), args)
    (work / "table.md").write_text(table)
    print(table, end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", help="work directory: new, or one this script made "
                        "(default runs/scale-QUERIES)")
    parser.add_argument("--queries", type=_positive, default=MSLR_QUERIES,
                        help=f"queries generated (default {MSLR_QUERIES:,}; at least 5)")
    parser.add_argument("--epochs", type=_positive, default=3, help="training epochs (default 3)")
    parser.add_argument("--presets", type=lambda text: text.split(","), default=["B256", "B1024"],
                        help="scorer presets, comma-separated (default B256,B1024)")
    parser.add_argument("--jit", choices=("both", "off", "on"), default="both",
                        help="train without --jit, with it, or both (default)")
    parser.add_argument("--stages", type=_stage_kinds, default=list(STAGE_KINDS),
                        help=f"stages to run, comma-separated (default {','.join(STAGE_KINDS)})")
    parser.add_argument("--batch-size", type=_positive, default=32)
    parser.add_argument("--lightgbm-rounds", type=_positive, default=500,
                        help="LightGBM's boosting rounds at most (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="data, training and LightGBM seed")
    parser.add_argument("--preload", action="store_true",
                        help="fork each stage from a process that has imported TensorFlow "
                        "(quick runs: saves each stage's start-up; see below)")
    parser.add_argument("--lightgbm-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fork-server", action="store_true", help=argparse.SUPPRESS)
    return parser


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _stage_kinds(text: str) -> list[str]:
    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(STAGE_KINDS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGE_KINDS)}")
    return kinds


class Stage:
    """One child process of the protocol: `command` (run from the work directory), then `finish`,
    which moves its outputs into place and returns what the stage's result keeps of them."""

    def __init__(self, name: str, command: list[str], finish: Callable[[Path, str], dict]):
        self.name, self.command, self.finish = name, command, finish
        self.kind = name.split("-")[0]


def _plan(args) -> list[Stage]:
    """Returns every stage of the protocol, in order."""
    python = sys.executable
    stages = [
        Stage("generate", [python, "-m", "tfapprox.data", "synthetic", "text.partial", "--lengths",
                           "mslr", "--queries", str(args.queries), "--features",
                           str(NUM_FEATURES), "--levels", "5", "--seed", str(args.seed)],
              _finish_generate),
        Stage("convert", [python, "-m", "tfapprox.data", "convert", "text", "--output",
                          "records.partial", "--num-features", str(NUM_FEATURES)],
              _finish_convert),
    ]
    modes = {"both": (False, True), "off": (False,), "on": (True,)}[args.jit]
    for preset in args.presets:
        for jit in modes:
            run = f"{preset}{'-jit' if jit else ''}"
            trainer = [python, "-m", "trainer"]
            stages.append(Stage(f"train-{run}", trainer + [
                "train", "--train", "records/train", "--vali", "records/vali", "--test",
                "records/test", "--num-features", str(NUM_FEATURES), "--list-size", "full",
                "--preset", preset, "--loss", "approx_ndcg", "--batch-size", str(args.batch_size),
                "--epochs", str(args.epochs), "--seed", str(args.seed), "--select-metric",
                SELECT_METRIC, "--patience", "0", "--run-dir", f"runs/{run}", "--fresh",
                "--no-export", *(["--jit"] if jit else [])], partial(_finish_train, run)))
            stages.append(Stage(f"evaluate-{run}", trainer + [
                "evaluate", "--run-dir", f"runs/{run}"], partial(_finish_evaluate, run)))
            stages.append(Stage(f"export-{run}", trainer + [
                "export", "--run-dir", f"runs/{run}", "--export-dir", "saved_models", "--name", run],
                partial(_finish_export, run)))
    stages.append(Stage("lightgbm", [python, "-m", "benchmarks.scale", "--lightgbm-child",
                                     "--work", ".", "--seed", str(args.seed), "--lightgbm-rounds",
                                     str(args.lightgbm_rounds)], _finish_lightgbm))
    return stages


def _claim(work: Path, protocol: dict[str, Any]) -> None:
    """Makes `work` ours (new or empty), or checks that it is ours with the same protocol."""
    marker = work / "protocol.json"
    if marker.exists():
        made_with = json.loads(marker.read_text())
        if made_with != protocol:
            raise SystemExit(f"error: {work} was made with {made_with}, not {protocol}; "
                             "give another --work")
        return
    if work.is_symlink() or (work.exists() and any(work.iterdir())):
        raise SystemExit(f"error: {work} exists and was not made by this script; "
                         "give a new or empty --work")
    work.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(protocol, indent=1) + "\n")


def _cached(work: Path, name: str) -> dict[str, Any] | None:
    path = work / "stages" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _run_stage(work: Path, stage: Stage, forker: _Forker | None = None) -> None:
    """Runs `stage` as a child process (forked by `forker` if given); on success keeps its wall
    time, peak RSS and results."""
    for unfinished in ("text.partial", "records.partial"):  # left by a killed stage of ours
        shutil.rmtree(work / unfinished, ignore_errors=True)
    (work / "logs").mkdir(exist_ok=True)
    log = work / "logs" / f"{stage.name}.log"
    print(f"[{time.strftime('%H:%M:%S')}] {stage.name}: {' '.join(stage.command[1:])}", flush=True)
    load_before, started = os.getloadavg()[0], time.perf_counter()
    with open(log, "w") as out:
        if forker is None:
            child = subprocess.Popen(stage.command, cwd=work, env=_child_env(), stdout=out,
                                     stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)
            returncode, cpu, max_rss = (os.waitstatus_to_exitcode(status),
                                        usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
        else:
            returncode, cpu, max_rss = forker.run(stage.command, work, log)
    wall = time.perf_counter() - started
    output = log.read_text()
    if returncode != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise SystemExit(f"{tail}\nerror: stage {stage.name} exited with status "
                         f"{returncode}; its log is {log}")
    # ru_maxrss is in KiB on Linux, in bytes on macOS
    peak = max_rss / (2**20 if platform.system() == "Darwin" else 2**10)
    result = {"stage": stage.name, "command": " ".join(stage.command[1:]),
              "wall_seconds": round(wall, 1), "peak_rss_mib": round(peak),
              "cpu_seconds": round(cpu, 1),
              "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              **stage.finish(work, output)}
    (work / "stages").mkdir(exist_ok=True)
    (work / "stages" / f"{stage.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"    {result['wall_seconds']} s, peak RSS {result['peak_rss_mib']} MiB", flush=True)


class _Forker:
    """--preload: a process (`--fork-server`) that has imported what the stages import, and forks
    a child per stage that runs the stage's `python -m MODULE ARGS...` there."""

    def __init__(self):
        self.server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale", "--fork-server"], env=_child_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, command: list[str], cwd: Path, log: Path) -> tuple[int, float, int]:
        """Returns the child's exit status, CPU seconds and ru_maxrss, as wait4 gives them."""
        assert command[1] == "-m", command
        self.server.stdin.write(json.dumps({"module": command[2], "args": command[3:],
                                            "cwd": str(Path(cwd).resolve()),
                                            "log": str(Path(log).resolve())}) + "\n")
        self.server.stdin.flush()
        reply = self.server.stdout.readline()
        if not reply:
            raise SystemExit(f"error: the --preload process exited with status "
                             f"{self.server.wait()}")
        done = json.loads(reply)
        return done["returncode"], done["cpu_seconds"], done["max_rss"]

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait()


def _fork_server() -> int:
    """Imports what the stages import, then for each request on stdin (JSON: module, args, cwd,
    log) forks a child that runs `python -m MODULE ARGS...` from cwd, its output to log; replies
    with its exit status and resource usage."""
    import runpy
    import traceback

    replies = os.fdopen(os.dup(1), "w")  # stdout is the replies' alone: what else prints, to stderr
    os.dup2(2, 1)
    import lightgbm  # noqa: F401
    import tfapprox.data  # noqa: F401
    import trainer.__main__  # noqa: F401
    import trainer.train  # noqa: F401
    from benchmarks import experiment_runs  # noqa: F401

    for line in iter(sys.stdin.readline, ""):
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                replies.close()
                os.chdir(request["cwd"])
                out = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.dup2(out, 1)
                os.dup2(out, 2)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                sys.argv = [request["module"], *request["args"]]
                try:
                    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
                    code = 0
                except SystemExit as exit_:
                    if isinstance(exit_.code, int) or exit_.code is None:
                        code = exit_.code or 0
                    else:  # as the interpreter does with sys.exit("message")
                        print(exit_.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status, usage = os.wait4(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                          "cpu_seconds": usage.ru_utime + usage.ru_stime,
                          "max_rss": usage.ru_maxrss}), file=replies, flush=True)
    return 0


def _finish_generate(work: Path, output: str) -> dict[str, Any]:
    (work / "text.partial").rename(work / "text")
    return {"text_mib": round(sum((work / "text" / f"{split}.txt").stat().st_size
                                  for split in SPLITS) / 2**20)}


def _finish_convert(work: Path, output: str) -> dict[str, Any]:
    (work / "records.partial").rename(work / "records")
    specs = {split: json.loads((work / "records" / split / "spec.json").read_text())
             for split in SPLITS}
    rate = re.search(r"converted \d+ docs in [\d.]+s \(([\d,]+) docs/s\)", output)
    return {"lists": {split: spec["num_lists"] for split, spec in specs.items()},
            "docs": {split: spec["num_docs"] for split, spec in specs.items()},
            "docs_per_second": int(rate.group(1).replace(",", "")) if rate else None}


def _finish_train(run: str, work: Path, output: str) -> dict[str, Any]:
    results = json.loads((work / "runs" / run / "results.json").read_text())
    history, best = results["history"], results["best_epoch"]
    return {"epoch_seconds": [round(epoch["epoch_seconds"], 1) for epoch in history],
            "best_epoch": best,
            "seconds_to_best": round(sum(epoch["epoch_seconds"] for epoch in history[:best]), 1),
            "validation": results["validation"][SELECT_METRIC],
            "test": results["test"][SELECT_METRIC]}


def _finish_evaluate(run: str, work: Path, output: str) -> dict[str, Any]:
    results = json.loads((work / "runs" / run / "evaluation.json").read_text())
    return {"validation": results["validation"][SELECT_METRIC],
            "test": results["test"][SELECT_METRIC]}


def _finish_export(run: str, work: Path, output: str) -> dict[str, Any]:
    exported = re.search(r"^Exported (.+)$", output, re.MULTILINE)
    return {"path": exported.group(1) if exported else None}


def _finish_lightgbm(work: Path, output: str) -> dict[str, Any]:
    return json.loads((work / "lightgbm.json").read_text())


def _lightgbm_child(work: Path, seed: int, rounds: int) -> int:
    """Runs LightGBM lambdarank as the experiments do; writes its summary to WORK/lightgbm.json."""
    from benchmarks.experiment_runs import Run, execute, mean_over_relevant

    run = Run(dataset="scale", fold=1, seed=seed, model="lightgbm", loss="lambdarank",
              params=(("num_threads", 2),), epochs=rounds)
    files = {split: [str(work / "text" / f"{split}.txt")] for split in SPLITS}
    result = execute(run, files, work)
    summary = {"rounds": rounds, "best_epoch": result["best_epoch"],
               "seconds_to_best": result["seconds_to_best"],
               "validation": round(result["validation"][SELECT_METRIC], 6),
               "test": round(mean_over_relevant(result["test"], SELECT_METRIC), 6)}
    (work / "lightgbm.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def _report(work: Path, stages: list[Stage], args) -> str:
    """Returns the markdown tables of every finished stage, the targets checked against them."""
    done = {stage.name: result for stage in stages
            if (result := _cached(work, stage.name)) is not None}
    docs = done.get("convert", {}).get("docs")
    size = (f"{sum(docs.values()):,} documents (train/vali/test {docs['train']:,} / "
            f"{docs['vali']:,} / {docs['test']:,})" if docs else "documents not yet counted")
    lines = [
        f"{args.queries:,} queries, {size}, {NUM_FEATURES} features; "
        f"{args.epochs} epoch(s), batch {args.batch_size}, seed {args.seed}.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores; load: the 1-minute load "
        "average as the stage started and ended.",
        "",
        "| stage | wall s | peak RSS MiB | CPU s | load | result |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, result in done.items():
        start, end = result["load_average"]
        cpu = result.get("cpu_seconds")  # absent from stages run by an older version
        lines.append(f"| {name} | {result['wall_seconds']:.1f} | {result['peak_rss_mib']:,} | "
                     f"{'?' if cpu is None else f'{cpu:.1f}'} | {start:.1f} → {end:.1f} | "
                     f"{_describe(name, result)} |")
    missing = [stage.name for stage in stages if stage.name not in done]
    if missing:
        lines += ["", f"Not run: {', '.join(missing)}."]
    models = [(name.removeprefix("train-"), result, "epoch", len(result["epoch_seconds"]))
              for name, result in done.items() if name.startswith("train-")]
    if "lightgbm" in done:
        lightgbm = done["lightgbm"]
        models.append(("LightGBM lambdarank", lightgbm, "round", lightgbm["rounds"]))
    if models:
        lines += ["", f"| model | time to best vali NDCG@10 s | best | vali NDCG@10 | "
                  "test NDCG@10 |", "|---|---:|---|---:|---:|"]
        lines += [f"| {model} | {result['seconds_to_best']:.1f} | {unit} {result['best_epoch']} "
                  f"of {total} | {result['validation']:.4f} | {result['test']:.4f} |"
                  for model, result, unit, total in models]
    lines += ["", *_targets(done, args)]
    return "\n".join(lines) + "\n"


def _describe(name: str, result: dict[str, Any]) -> str:
    kind = name.split("-")[0]
    if kind == "generate":
        return f"{result['text_mib']:,} MiB of LETOR text"
    if kind == "convert":
        rate, docs = result["docs_per_second"], sum(result["docs"].values())
        cpu = result.get("cpu_seconds")
        return (f"{docs:,} docs, {'?' if rate is None else f'{rate:,}'} docs/s, "
                f"{'?' if not cpu else f'{docs / cpu:,.0f}'} docs per CPU second")
    if kind == "train":
        return (f"epochs {', '.join(f'{s:.1f}' for s in result['epoch_seconds'])} s; best epoch "
                f"{result['best_epoch']}")
    if kind == "evaluate":
        return f"NDCG@10 vali {result['validation']:.4f}, test {result['test']:.4f}"
    if kind == "export":
        return f"{result['path']}"
    return f"best validation NDCG@10 at round {result['best_epoch']} of at most {result['rounds']}"


def _targets(done: dict[str, dict[str, Any]], args) -> list[str]:
    """Returns one line per target, saying whether the finished stages meet it."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines = []
    if done:
        peak, stage = max((r["peak_rss_mib"], name) for name, r in done.items())
        lines.append(f"- Peak RSS under {RSS_TARGET_MIB:,} MiB at every stage: "
                     f"{verdict(peak < RSS_TARGET_MIB)} (largest {peak:,} MiB, {stage}).")
    rate = done.get("convert", {}).get("docs_per_second")
    if rate is not None:
        lines.append(f"- Conversion >= {CONVERT_TARGET_DOCS_PER_S:,} docs/s: "
                     f"{verdict(rate >= CONVERT_TARGET_DOCS_PER_S)} ({rate:,} docs/s).")
    if "train-B256" in done and "convert" in done:
        slowest = max(done["train-B256"]["epoch_seconds"])
        train_docs = done["convert"]["docs"]["train"]
        if args.queries == MSLR_QUERIES:
            lines.append(f"- A B256 epoch <= {EPOCH_TARGET_S} s: "
                         f"{verdict(slowest <= EPOCH_TARGET_S)} (slowest epoch {slowest:.1f} s).")
        else:
            lines.append(f"- A B256 epoch <= {EPOCH_TARGET_S} s at {MSLR_QUERIES:,} queries: not "
                         f"judged at {args.queries:,} queries (slowest epoch {slowest:.1f} s for "
                         f"{train_docs:,} training documents, validation included).")
    return lines


if __name__ == "__main__":
    sys.exit(main())
