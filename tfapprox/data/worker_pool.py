"""Worker processes that run one function of a numpy-only module, in fresh Python interpreters.

The text parser's workers are not forked from the calling process: a fork copies a process in which
TensorFlow's threads may hold locks that are then never released in the child, and it copies the
caller's signal handlers (the trainer raises on SIGTERM), so a forked worker can hang, and then
ignore the signal meant to end it. Each worker here is a new interpreter (``sys.executable -c``,
started by fork-and-exec, in its own session so a terminal's Ctrl-C goes to the caller only) with
the default signal handlers. It loads the module that holds the function from its file under the
module's own name, without its package (whose ``__init__`` imports TensorFlow); sibling modules it
imports load the same way. Start-up costs the import of numpy only, and objects of those modules
(their exceptions too) pickle across as they are.

Calls go round-robin over the workers and come back in order. The caller waits at most ``timeout``
seconds (default 300) for any one reply or request: a worker that died (killed, out of memory), answers nothing
or fails outside the function raises :class:`WorkerError` naming ``what`` (the file being parsed),
never a hang. Exceptions the function raises are re-raised in the caller as they are. Leaving the
pool (``with``, or closing the iterator of :meth:`WorkerPool.map`) kills the workers; a caller that
ends without leaving it (killed, or stopped with the pool's generator still open) closes their stdin,
and each exits at once, in the middle of a call too.

Standard library only, besides the loaded module: a worker loads this file as it loads the module.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import pickle
import queue
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from typing import Any, Iterable, Iterator

DEFAULT_TIMEOUT_S = 300.0
_HEADER_BYTES = 8  # a message: its length as 8 little-endian bytes, then a pickle
# A worker's start: load this file under its own name, then serve calls (see `_serve`).
_BOOT = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2])\n"
    "pool = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(pool)\n"
    "pool._serve(*sys.argv[3:])\n"
)


class WorkerError(OSError):
    """A worker process died, stopped answering, or failed outside the function it runs."""


def available() -> bool:
    """True where workers can run: POSIX (pipes that can be waited on), a known interpreter."""
    return os.name == "posix" and bool(sys.executable)


class WorkerPool:
    """``workers`` processes running ``function`` of ``module`` (a module object, numpy-only)."""

    def __init__(self, module, function: str, workers: int, *, what: str,
                 timeout: float | None = None):
        self._what = what
        self._timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
        self._selector = selectors.DefaultSelector()
        self._workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self._workers.append(_Worker(module, function))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Kills the workers (ours: started by this pool) and collects their exit status."""
        for worker in self._workers:
            worker.kill()
        self._workers = []
        self._selector.close()

    def map(self, calls: Iterable[tuple], ahead: int = 2) -> Iterator[Any]:
        """Yields ``function(*args)`` for each ``args`` of ``calls``, in order; at most ``ahead``
        calls per worker are waiting at any time (bounded memory)."""
        waiting: collections.deque[_Worker] = collections.deque()
        for number, args in enumerate(calls):
            worker = self._workers[number % len(self._workers)]
            self._send(worker, pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL))
            waiting.append(worker)
            if len(waiting) >= ahead * len(self._workers):
                yield self._reply(waiting.popleft())
        while waiting:
            yield self._reply(waiting.popleft())

    def _send(self, worker: "_Worker", message: bytes) -> None:
        data = memoryview(len(message).to_bytes(_HEADER_BYTES, "little") + message)
        deadline = time.monotonic() + self._timeout
        while data:
            try:
                data = data[os.write(worker.requests, data):]
            except BlockingIOError:
                self._wait(worker, worker.requests, selectors.EVENT_WRITE, deadline)
            except BrokenPipeError:
                raise self._failure(worker) from None

    def _reply(self, worker: "_Worker") -> Any:
        deadline = time.monotonic() + self._timeout
        size = int.from_bytes(self._receive(worker, _HEADER_BYTES, deadline), "little")
        status, value = pickle.loads(self._receive(worker, size, deadline))
        if status == "error":
            raise value
        if status == "failed":
            raise WorkerError(f"{self._what}: parsing stopped: worker process {worker.pid} failed: "
                              f"{value}")
        return value

    def _receive(self, worker: "_Worker", size: int, deadline: float) -> bytes:
        parts, missing = [], size
        while missing:
            try:
                part = os.read(worker.replies, min(missing, 1 << 24))
            except BlockingIOError:
                self._wait(worker, worker.replies, selectors.EVENT_READ, deadline)
                continue
            if not part:
                raise self._failure(worker)
            parts.append(part)
            missing -= len(part)
        return b"".join(parts)

    def _wait(self, worker: "_Worker", fd: int, event: int, deadline: float) -> None:
        self._selector.register(fd, event)
        try:
            ready = self._selector.select(max(0.0, deadline - time.monotonic()))
        finally:
            self._selector.unregister(fd)
        if not ready:
            raise WorkerError(f"{self._what}: parsing stopped: worker process {worker.pid} gave no "
                              f"answer for {self._timeout:g} s, and was killed")

    def _failure(self, worker: "_Worker") -> WorkerError:
        return WorkerError(f"{self._what}: parsing stopped: worker process {worker.pid} "
                           f"{worker.ended()}")


class _Worker:
    """One worker process: its request and reply pipes (non-blocking), and its stderr in a file."""

    def __init__(self, module, function: str):
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, __name__, __file__, module.__name__, module.__file__,
             function],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            start_new_session=True,
        )
        self.pid = self._process.pid
        self.requests, self.replies = self._process.stdin.fileno(), self._process.stdout.fileno()
        os.set_blocking(self.requests, False)
        os.set_blocking(self.replies, False)

    def ended(self) -> str:
        """Says how the worker ended (it closed its pipe), with the last line it wrote to stderr."""
        try:
            status = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "closed its pipe and did not exit"
        if status < 0:
            name = signal.Signals(-status).name
            how = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            how = f"exited with status {status}"
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return how + (f" ({lines[-1]})" if lines else "")

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout):
            try:
                pipe.close()
            except OSError:  # a request half-written into a full pipe
                pass
        self._stderr.close()


# --------------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------------
def _serve(module_name: str, module_path: str, function_name: str) -> None:
    """Runs in a worker: answers each request on stdin with the function's result on stdout, until
    stdin closes (the caller ended, or left the pool), which ends the worker at once."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    # The module's parent packages stand in as empty modules: pickle looks objects up by their
    # module's full name, which would otherwise import the package.
    # The innermost one looks in the module's directory, so that sibling modules it imports load
    # (without the package's __init__).
    parts = module_name.split(".")
    for name in (".".join(parts[:end]) for end in range(1, len(parts))):
        sys.modules.setdefault(name, types.ModuleType(name)).__path__ = []
    if len(parts) > 1:
        sys.modules[".".join(parts[:-1])].__path__ = [os.path.dirname(module_path)]
    function = getattr(_load(module_name, module_path), function_name)
    # Requests are read ahead by a thread, so that the caller's writes never wait for our replies.
    requests: queue.Queue = queue.Queue()
    threading.Thread(target=_read_requests, args=(sys.stdin.buffer, requests), daemon=True).start()
    replies = sys.stdout.buffer
    while True:
        args = requests.get()
        try:
            reply = ("ok", function(*args))
        except Exception as err:  # noqa: BLE001 - handed to the caller, which raises it
            reply = ("error", err)
        try:
            message = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001 - an exception that does not pickle
            message = pickle.dumps(("failed", f"{type(reply[1]).__name__}: {reply[1]} ({err})"))
        replies.write(len(message).to_bytes(_HEADER_BYTES, "little") + message)
        replies.flush()


def _load(name: str, path: str):
    """Returns the module in the file ``path``, run and registered under ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_requests(stream, requests: queue.Queue) -> None:
    """Queues each request; at the end of stdin the worker exits at once, whatever it is doing:
    the caller has ended (or left the pool) and reads no more replies, so none is worth finishing."""
    while len(header := stream.read(_HEADER_BYTES)) == _HEADER_BYTES:
        requests.put(pickle.loads(stream.read(int.from_bytes(header, "little"))))
    os._exit(0)
