"""`python -m trainer` as separate processes: killed and resumed, and two workers on 127.0.0.1."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO, START_UP_NOTICES
from trainer import checkpoint, run_lock
from trainer.__main__ import main

pytestmark = pytest.mark.slow  # trains, compiles or runs processes: `-m "not slow"` skips it

# Two workers take the same global steps as one process (120 training lists, 24 per step); against
# one replica they differ through batch-norm statistics, computed per replica over half a batch.
MULTI_WORKER_TOLERANCE = 0.05  # absolute, on validation and test NDCG@5 and MAP (40 queries each)


def write_config(tmp_path, num_queries=40, batch_size=8, metrics=(), **train):
    values = {
        "data": {"synthetic": {"num_queries": num_queries, "docs_per_query": 10, "num_features": 8},
                 "cache_dir": str(tmp_path / "cache")},
        "model": {"preset": "linear"},  # batch-normalised features: replicas' statistics differ
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "train": {"batch_size": batch_size, "patience": 0, "metrics": list(metrics), **train},
        "export": {"enabled": False},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def trainer_command(*args):
    return [sys.executable, "-m", "trainer", "train", *args]


def run_env(**extra):
    """This environment without TF_CONFIG, with `extra`, and with Python's fault handler on: a
    crashed trainer prints its threads' stacks, so a failure here says where it crashed."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    return {**env, "PYTHONFAULTHANDLER": "1", **extra}


def wait_for_checkpoint(process, run_dir, epoch):
    """Returns once `process` has checkpointed `epoch` epochs in `run_dir` (at most 300 s)."""
    deadline = time.monotonic() + 300
    while True:
        state = checkpoint.load_state(run_dir)  # the state alone: no arrays read 20 times a second
        if state is not None and state.epoch >= epoch:
            return
        assert process.poll() is None, f"the run ended before epoch {epoch}:\n{process.stderr.read()}"
        assert time.monotonic() < deadline, f"no checkpoint of epoch {epoch} within 300 s"
        time.sleep(0.05)


def _default_sigint():
    """Gives the child Ctrl-C's default action, as in a terminal: a shell starting background jobs
    (and so a test run from one) hands them SIGINT ignored, and Python keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SIGNALLED_EPOCHS = 50  # more than a signalled run ever reaches


def signalled_run(tmp_path, signum, after_epoch, env=None):
    """Starts (or resumes) a trainer on the tiny config in tmp_path/run and sends it `signum` once
    `after_epoch` epochs are checkpointed; returns `(exit status, stdout, stderr)` once it has
    ended."""
    config = write_config(tmp_path, epochs=SIGNALLED_EPOCHS)
    run_dir = tmp_path / "run"
    command = trainer_command("--config", str(config), "--run-dir", str(run_dir))
    with open(tmp_path / "stdout.txt", "w") as out:
        process = subprocess.Popen(command, cwd=tmp_path, env=env or run_env(), stdout=out,
                                   stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        wait_for_checkpoint(process, run_dir, epoch=after_epoch)
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, (tmp_path / "stdout.txt").read_text(), err


def stop_line(signal_name, epochs_done):
    return (f"python -m trainer train: {signal_name} after epoch {epochs_done}; rerun the same "
            "command to resume")


def test_killed_terminated_and_interrupted_runs_resume_from_their_last_whole_epoch(tmp_path):
    """A crash (SIGKILL), a preempted cloud VM (SIGTERM) and Ctrl-C (SIGINT), each stopping the
    rerun of the run before: every rerun resumes after the last epoch checkpointed, doing none
    twice; SIGTERM and Ctrl-C end the step, keep the last whole epoch and say how to resume."""
    run_dir = tmp_path / "run"
    status, _, _ = signalled_run(tmp_path, signal.SIGKILL, after_epoch=1)
    assert status == -signal.SIGKILL
    at_kill = checkpoint.load(run_dir).state

    # This rerun is also the check that the command line keeps TensorFlow's start-up quiet.
    quiet = {key: value for key, value in run_env().items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    status, out, err = signalled_run(tmp_path, signal.SIGTERM, at_kill.epoch + 1, env=quiet)
    assert status == 128 + signal.SIGTERM, err[-3000:]
    assert not [notice for notice in START_UP_NOTICES if notice in err], err[-3000:]
    assert f"Resuming {run_dir} after epoch {at_kill.epoch}" in out
    assert f"Epoch {at_kill.epoch + 1}/{SIGNALLED_EPOCHS}" in out
    assert f"Epoch {at_kill.epoch}/{SIGNALLED_EPOCHS}" not in out  # nothing done twice
    at_term = checkpoint.load(run_dir).state
    assert at_term.history[: at_kill.epoch] == at_kill.history
    assert "Traceback" not in err and "Terminated" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == stop_line("stopped by SIGTERM", at_term.epoch)

    status, out, err = signalled_run(tmp_path, signal.SIGINT, at_term.epoch + 1)
    assert f"Resuming {run_dir} after epoch {at_term.epoch}" in out
    assert status == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    at_int = checkpoint.load(run_dir).state
    assert at_int.history[: at_term.epoch] == at_term.history
    assert err.strip().splitlines()[-1] == stop_line("interrupted", at_int.epoch)


# Holds a run directory's lock, as a trainer training in it does, until killed. It loads the lock's
# modules without tfapprox/__init__.py, which starts TensorFlow: the holder is ready at once.
HOLD_RUN_DIR = f"""
import sys, time, types
sys.modules["tfapprox"] = types.ModuleType("tfapprox")
sys.modules["tfapprox"].__path__ = [{str(REPO / "tfapprox")!r}]
from trainer import run_files, run_lock
run_files.claim(sys.argv[1])
with run_lock.hold(sys.argv[1]):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_a_second_trainer_on_a_run_dir_in_use_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_RUN_DIR, str(run_dir)], cwd=tmp_path,
                              env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n", holder.stderr.read()
        status = main(["train", "--config", str(write_config(tmp_path, epochs=1)),
                       "--run-dir", str(run_dir)])
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    err = capsys.readouterr().err
    assert status == 1
    message = err.strip().splitlines()[-1]
    assert message.startswith("python -m trainer train: error: "), err[-3000:]
    assert "Traceback" not in err
    assert str(run_dir) in message and "in use by another trainer" in message
    assert f"pid {holder.pid} on host {socket.gethostname()}" in message
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", ".tfapprox-run"]  # nothing trained

    # The kernel released the killed holder's lock: the directory is free again.
    with run_lock.hold(run_dir):
        assert f'"pid": {os.getpid()}' in (run_dir / ".lock").read_text()


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


# One training step of two replicas on a batch whose halves are identical (so both replicas see
# the statistics of the whole batch) must equal one step of one replica: the loss must be scaled by
# 1/replicas before gradients are summed across replicas, as keras.losses.Loss does.
SAME_STEP_LOSSES = ("approx_ndcg", "ranknet")

# One process over two logical CPU devices (set before TensorFlow starts, so not in pytest's): the
# step of one and of two replicas for each of SAME_STEP_LOSSES (the largest weight gap, a JSON line
# each), then the run of two replicas (MirroredStrategy) in RUN_DIR/two_replicas and the run of one
# in RUN_DIR/one_replica: `-c SCRIPT RUN_DIR train FLAGS`.
ONE_AND_TWO_LOCAL_REPLICAS = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfapprox import losses
from trainer import build, config as config_lib, distribute, train
from trainer.__main__ import _resolve, parse_args
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

rng = np.random.default_rng(0)
labels = rng.integers(0, 3, (4, 6)).astype("float32")
labels[:, -1] = -1.0
features = rng.random((4, 6, 5)).astype("float32")
# replica 0 takes lists 0-3, replica 1 lists 4-7: the same four lists
inputs = {"features": np.concatenate([features, features]), "mask": np.concatenate([labels, labels]) >= 0}
labels = np.concatenate([labels, labels])
weights, after = None, {}
for name in """ + repr(SAME_STEP_LOSSES) + """:
    values = config_lib.load_dict("demo")
    config_lib.apply_overrides(values, {"loss.name": name, "loss.params": {}, "model.preset": "linear",
                                        "optimizer.name": "adagrad", "optimizer.learning_rate": 0.1})
    config = config_lib.Config.from_dict(values)
    for label, strategy in (("one", tf.distribute.get_strategy()), ("two", mirrored)):
        dist = distribute.Distribution(strategy, "default" if label == "one" else "mirrored", True, 0, 1)
        keras.utils.set_random_seed(0)
        model = build.build(config, 5, dist).model
        if weights is None:
            weights = model.get_weights()
        model.set_weights(weights)
        dataset = tf.data.Dataset.from_tensors((inputs, labels))
        if label == "two":
            dataset = strategy.experimental_distribute_dataset(dataset)
        model.fit(dataset, epochs=1, verbose=0)
        after[(name, label)] = model.get_weights()
    gaps = [float(np.max(np.abs(a - b))) for a, b in zip(after[(name, "one")], after[(name, "two")])]
    print(json.dumps({"loss": name, "max_weight_gap": max(gaps)}), flush=True)

for name, dist in (("two_replicas", distribute.Distribution(mirrored, "mirrored", True, 0, 1)),
                   ("one_replica", distribute.make("default"))):
    keras.backend.clear_session()
    train.train(_resolve(parse_args([*sys.argv[2:], "--run-dir", f"{sys.argv[1]}/{name}"])), dist=dist)
"""


def run_together(commands, cwd):
    """Runs {name: (command, env)} at once; returns {name: output}, failing with every failed
    command's exit status and error lines (a worker fails when its peer dies)."""
    processes = {name: subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
                 for name, (command, env) in commands.items()}
    outputs = {}
    try:
        for name, process in processes.items():
            outputs[name] = process.communicate(timeout=600)[0]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = {name: (process.returncode,
                     [line for line in outputs[name].splitlines()
                      if "Error" in line or "error:" in line][:5],
                     outputs[name][-2000:])
              for name, process in processes.items() if process.returncode != 0}
    assert not failed, failed  # each failure: its exit status, first error lines, output's end
    return outputs


def test_two_workers_match_one_worker_and_two_replicas_take_the_step_of_one(tmp_path):
    """Two worker processes on 127.0.0.1 against one process, on 200 generated queries.

    The workers split each global batch of 24 lists; together they take exactly the steps of one
    process with two replicas (checked to 1e-4). Against one replica they differ only through
    batch-norm statistics, computed per replica over half a batch: equal within
    MULTI_WORKER_TOLERANCE. The process of one and two replicas first checks, for each of
    SAME_STEP_LOSSES, that a step of two replicas is a step of one (to 1e-6).
    """
    config = write_config(tmp_path, num_queries=200, epochs=2, batch_size=24, metrics=["map"])
    common = ["--config", str(config)]
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    commands = {}
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        commands[f"worker{index}"] = (
            trainer_command(*common, "--run-dir", str(tmp_path / "two_workers"),
                            "--strategy", "multi_worker"),
            run_env(TF_CONFIG=json.dumps(tf_config)))
    commands["replicas"] = (
        [sys.executable, "-c", ONE_AND_TWO_LOCAL_REPLICAS, str(tmp_path), "train", *common],
        run_env())
    # The two workers run first and alone: on a loaded 2-core machine a worker starved of CPU can
    # miss the strategy's health checks, which then abort the collectives.
    outputs = run_together({name: commands.pop(name) for name in ("worker0", "worker1")}, tmp_path)
    outputs.update(run_together(commands, tmp_path))
    gaps = [json.loads(line) for line in outputs["replicas"].splitlines() if line.startswith("{")]
    assert [gap["loss"] for gap in gaps] == list(SAME_STEP_LOSSES), outputs["replicas"][-3000:]
    for gap in gaps:  # two replicas take the step of one
        assert gap["max_weight_gap"] < 1e-6, gap

    assert "| ndcg@5 |" in outputs["worker0"] and "| ndcg@5 |" not in outputs["worker1"]

    results = {name: json.loads((tmp_path / name / "results.json").read_text())
               for name in ("two_workers", "one_replica", "two_replicas")}
    two = results["two_workers"]
    assert (two["strategy"], two["num_replicas"]) == ("multi_worker", 2)
    for split in ("validation", "test"):
        assert two[split] == pytest.approx(results["two_replicas"][split], abs=1e-4)
        for metric in ("ndcg@5", "map"):
            assert two[split][metric] == pytest.approx(
                results["one_replica"][split][metric], abs=MULTI_WORKER_TOLERANCE), (split, metric)
