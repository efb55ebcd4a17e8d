"""Ctrl-C while training stops the run between two steps, never inside a TensorFlow call.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives; raised
inside a running step or a tf.data iterator's clean-up it can leave TensorFlow's runtime in a state
that crashes the process on its way out (seen in CI: SIGSEGV instead of the trainer's exit line).
Within `deferred()` the first SIGINT only sets a flag, which `StopWhenRequested` reads after each
training step; the training loop then leaves through KeyboardInterrupt itself. A second SIGINT
raises at once, for a user who will not wait for the step to end.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import keras


@contextlib.contextmanager
def deferred(enabled: bool = True) -> Iterator[threading.Event]:
    """Yields the event the first SIGINT sets, with SIGINT handled as the module says.

    SIGINT is left as it is when `enabled` is False, off the main thread, and where its handler is
    not Python's default (ignored by a shell that started us in the background, or the embedding
    program's own): the event is then never set.
    """
    requested = threading.Event()
    if (not enabled or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield requested
        return

    def on_sigint(signum, frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class StopWhenRequested(keras.callbacks.Callback):
    """Ends `fit` after the current training step once `requested` is set."""

    def __init__(self, requested: threading.Event):
        super().__init__()
        self._requested = requested

    def on_train_batch_end(self, batch, logs=None):
        if self._requested.is_set():
            self.model.stop_training = True
