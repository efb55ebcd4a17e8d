"""Ctrl-C or SIGTERM while training stops the run between two steps, never inside a TensorFlow call.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives; raised
inside a running step or a tf.data iterator's clean-up it can leave TensorFlow's runtime in a state
that crashes the process on its way out (seen in CI: SIGSEGV instead of the trainer's exit line).
Within `deferred()` the first SIGINT only sets a flag, which `StopWhenRequested` reads after each
training step; the training loop then leaves through KeyboardInterrupt itself. A second SIGINT
raises at once, for a user who will not wait for the step to end.

SIGTERM is what a preempted cloud VM (spot, preemptible) sends its processes before it stops them.
Within `terminate_as_interrupt()` it raises `Terminated`, a KeyboardInterrupt, so it is treated as
Ctrl-C everywhere, `deferred()` included: the step ends, the last whole epoch is kept, and the
trainer says how to resume.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import keras


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C's KeyboardInterrupt is."""


def _raise_terminated(signum, frame):
    raise Terminated


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM raises `Terminated` in the main thread; left as it is off the main
    thread and where its handler is not the default (ignored, or the embedding program's own)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# The handlers `deferred` takes over: each raises a KeyboardInterrupt.
_INTERRUPTING = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _raise_terminated}


class StopRequest(threading.Event):
    """Set by the first SIGINT or SIGTERM within `deferred`; `signum` says which."""

    def __init__(self):
        super().__init__()
        self.signum: int | None = None


@contextlib.contextmanager
def deferred(enabled: bool = True) -> Iterator[StopRequest]:
    """Yields the request the first SIGINT or SIGTERM sets, handled as the module says.

    A signal is left as it is when `enabled` is False, off the main thread, and where its handler
    is not the one that raises (SIGINT: Python's default; SIGTERM: `terminate_as_interrupt`'s), as
    when a shell that started us in the background ignores SIGINT: it then never sets the request.
    """
    requested = StopRequest()
    taken = {}
    if enabled and threading.current_thread() is threading.main_thread():
        taken = {s: h for s, h in _INTERRUPTING.items() if signal.getsignal(s) is h}

    def on_signal(signum, frame):
        if requested.is_set():
            taken[signum](signum, frame)
        requested.signum = signum
        requested.set()

    for signum in taken:
        signal.signal(signum, on_signal)
    try:
        yield requested
    finally:
        for signum, handler in taken.items():
            signal.signal(signum, handler)


class StopWhenRequested(keras.callbacks.Callback):
    """Ends `fit` after the current training step once `requested` is set."""

    def __init__(self, requested: threading.Event):
        super().__init__()
        self._requested = requested

    def on_train_batch_end(self, batch, logs=None):
        if self._requested.is_set():
            self.model.stop_training = True
