"""Parsing workers (`tfapprox.data.worker_pool`): fresh processes, never forks of the caller; a
dead or stuck worker is a one-line error naming the file, never a hang; none outlives its reader."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import REPO
from tfapprox.data import letor, letor_blocks, worker_pool

pytestmark = [
    pytest.mark.slow,  # each test parses a file over the 64 MB from which workers start
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

NUM_FEATURES = 136
DOCS_PER_QUERY = 120


def write_dense_file(path, min_bytes):
    """Writes a dense LETOR file of queries of DOCS_PER_QUERY documents, just over `min_bytes`."""
    rng = np.random.default_rng(7)
    bodies = [" ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(row))
              for row in rng.random((DOCS_PER_QUERY, NUM_FEATURES))]
    labels = rng.integers(0, 5, DOCS_PER_QUERY)
    size, qid = 0, 0
    with open(path, "w") as out:
        while size <= min_bytes:
            qid += 1
            block = "".join(f"{y} qid:{qid} {body}\n" for y, body in zip(labels, bodies))
            size += out.write(block)
    return path


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """A dense LETOR file just over the size from which the reader parses with workers (for the
    command lines, fresh processes that read the package's own threshold)."""
    path = write_dense_file(tmp_path_factory.mktemp("big") / "train.txt",
                            letor_blocks.PARALLEL_BYTES + (2 << 20))
    assert letor.default_workers([path]) > 1 or os.cpu_count() == 1
    return path


SMALL_PARALLEL_BYTES = 4 << 20  # this process's threshold for `parallel_file`


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    """A dense LETOR file of six 1 MB chunks, for tests in this process, which lower the threshold
    to SMALL_PARALLEL_BYTES (`parallel_file`): the same workers, a tenth of the parsing."""
    return write_dense_file(tmp_path_factory.mktemp("small") / "train.txt",
                            SMALL_PARALLEL_BYTES + (2 << 20))


@pytest.fixture
def parallel_file(small_file, monkeypatch):
    """`small_file`, parsed with workers in this process."""
    monkeypatch.setattr(letor_blocks, "PARALLEL_BYTES", SMALL_PARALLEL_BYTES)
    assert letor.default_workers([small_file]) > 1 or os.cpu_count() == 1
    return small_file


def user_environment():
    """This environment as in a user's shell: without the TF_CPP_MIN_LOG_LEVEL importing
    TensorFlow leaves here, so the command line keeps its start-up quiet."""
    return {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}


def parsing_workers(pid):
    """Returns the pids of process `pid`'s parsing workers, once they run as such."""
    found = []
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                if b"pool._serve(" in cmdline.read():
                    found.append(child)
        except OSError:  # ended meanwhile
            pass
    return found


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(child) for child in listing.read().split()]
    except OSError:
        return []


def wait_for_workers(process, seconds=300):
    """Returns the pids of `process`' parsing workers once it has some; fails if it ends first."""
    deadline = time.monotonic() + seconds
    while not (workers := parsing_workers(process.pid)):
        assert process.poll() is None, f"it ended without workers: {process.communicate()}"
        assert time.monotonic() < deadline, f"no parsing workers within {seconds} s"
        time.sleep(0.01)
    return workers


def caught_signals(pid):
    """Returns the signal numbers process `pid` has a handler for (/proc's SigCgt mask)."""
    with open(f"/proc/{pid}/status") as status:
        mask = int(next(line.split()[1] for line in status if line.startswith("SigCgt:")), 16)
    return {signum for signum in range(1, 65) if mask >> (signum - 1) & 1}


def ended(process, seconds):
    try:
        return process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"still running {seconds} s later (a hang): {err[-2000:]}")


def test_a_killed_worker_is_a_one_line_error_naming_the_file(big_file, tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "tfapprox.data", "convert", str(big_file), "--output",
         str(tmp_path / "out")], cwd=tmp_path, env=user_environment(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    os.kill(wait_for_workers(process)[0], signal.SIGKILL)
    out, err = ended(process, 120)
    assert process.returncode == 2, (out, err)
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: {big_file}: parsing stopped: worker process "), err
    assert "was killed by SIGKILL" in err, err
    assert not (tmp_path / "out").exists()


def test_a_stuck_worker_is_an_error_after_the_bound_and_is_killed(parallel_file, monkeypatch):
    monkeypatch.setattr(worker_pool, "DEFAULT_TIMEOUT_S", 2.0)
    reader = letor.read_queries(parallel_file, NUM_FEATURES, assume_contiguous=True)
    next(reader)
    workers = parsing_workers(os.getpid())
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(worker_pool.WorkerError,
                       match=rf"^{parallel_file}: parsing stopped: worker process \d+ gave no "
                             r"answer for 2 s, and was killed$"):
        list(reader)
    assert time.monotonic() - started < 30
    assert not set(workers) & set(_children(os.getpid()))


def test_the_trainers_workers_are_not_forks_and_end_with_it_on_sigterm(big_file, tmp_path):
    """The trainer raises on SIGTERM; its parsing workers keep the default action, are fresh
    interpreters (not copies of the trainer and its TensorFlow threads), and end with it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").symlink_to(big_file)
    small = "".join(f"{q % 3} qid:{q // 4} 1:0.5 2:{q}\n" for q in range(40))
    (data / "vali.txt").write_text(small)
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--data-dir", str(data), "--run-dir",
         str(tmp_path / "run"), "--epochs", "1"], cwd=tmp_path, env=user_environment(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = wait_for_workers(process)
    for pid in workers:
        assert signal.SIGTERM not in caught_signals(pid)
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            assert b"trainer" not in cmdline.read()
    process.send_signal(signal.SIGTERM)
    _, err = ended(process, 120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("python -m trainer train: stopped by SIGTERM")
    deadline = time.monotonic() + 10
    while left := [pid for pid in workers if _running(pid)]:
        assert time.monotonic() < deadline, f"workers {left} outlived the trainer by 10 s"
        time.sleep(0.05)


def test_the_trainers_conversion_with_tensorflow_running_never_forks(parallel_file, tmp_path):
    """Converts the file as the trainer does, three times, while TensorFlow's threads compute: no
    fork of this process (a child of a fork can deadlock on a lock one of those threads held),
    the same records each time, and no worker left."""
    import tensorflow as tf

    from trainer import data
    from trainer.config import DataConfig

    forks = []
    os.register_at_fork(before=lambda: forks.append(threading.current_thread().name))
    stop = threading.Event()

    def compute():
        x = tf.random.normal([256, 256])
        while not stop.is_set():
            x = tf.linalg.normalize(tf.matmul(x, x))[0]

    busy = threading.Thread(target=compute, daemon=True)
    busy.start()
    try:
        counts = set()
        for attempt in range(3):
            config = DataConfig(train=[str(parallel_file)], vali=[str(parallel_file)],
                                cache_dir=str(tmp_path / f"cache{attempt}"), buckets=0)
            splits = data.resolve(config, print_fn=lambda _: None)
            counts.add(splits.num_train_lists)
            assert not parsing_workers(os.getpid())
    finally:
        stop.set()
        busy.join()
    assert forks == []
    assert counts == {sum(1 for _ in letor.scan(parallel_file).docs_per_query)}


def test_workers_end_at_once_when_their_caller_dies_mid_call(tmp_path):
    """A caller that exits without leaving the pool (os._exit here; in the trainer, SIGTERM raised
    while the parser's generator is open) leaves no worker finishing queued calls."""
    (tmp_path / "napping.py").write_text("import time\ndef nap(s):\n    time.sleep(s)\n    return s\n")
    # The pool's module is loaded from its file, as its workers load it: the caller starts at once,
    # without the TensorFlow that tfapprox/__init__.py imports.
    caller = (
        "import importlib.util\n"
        "def load(name, path):\n"
        "    spec = importlib.util.spec_from_file_location(name, path)\n"
        "    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "    return module\n"
        f"pool_module = load('worker_pool', {str(REPO / 'tfapprox' / 'data' / 'worker_pool.py')!r})\n"
        f"module = load('napping', {str(tmp_path / 'napping.py')!r})\n"
        "pool = pool_module.WorkerPool(module, 'nap', 1, what='naps')\n"
        "calls = pool.map([(30.0,)] * 2)\n"
        "print(pool._workers[0].pid, flush=True)\n"
        "next(calls)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True)
    pid = int(process.stdout.readline())
    time.sleep(1.0)  # the worker is inside its first 30 s call
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while _running(pid):
        assert time.monotonic() < deadline, "the worker outlived its caller by 10 s"
        time.sleep(0.05)


def _running(pid):
    """False once `pid` has exited (gone, or a zombie no one has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
