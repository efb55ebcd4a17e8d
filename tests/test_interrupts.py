"""`trainer.interrupts`: the first Ctrl-C or SIGTERM is a request, the second interrupts."""

import os
import signal

import pytest

from trainer import interrupts


@pytest.fixture
def default_sigint():
    """SIGINT as in a terminal's foreground process, whatever the test runner set."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_first_sigint_is_a_request_second_interrupts(default_sigint):
    with interrupts.deferred() as requested:
        os.kill(os.getpid(), signal.SIGINT)
        assert requested.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_disabled_or_ignored_sigint_is_left_alone(default_sigint):
    with interrupts.deferred(enabled=False) as requested:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert not requested.is_set()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with interrupts.deferred() as requested:
        os.kill(os.getpid(), signal.SIGINT)
    assert not requested.is_set() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_sigterm_is_treated_as_ctrl_c(default_sigint):
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with interrupts.terminate_as_interrupt():
            with interrupts.deferred() as requested:
                os.kill(os.getpid(), signal.SIGTERM)
                assert requested.is_set() and requested.signum == signal.SIGTERM
                with pytest.raises(interrupts.Terminated):
                    os.kill(os.getpid(), signal.SIGTERM)
            with pytest.raises(KeyboardInterrupt):  # outside `deferred`, as Ctrl-C raises
                os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
