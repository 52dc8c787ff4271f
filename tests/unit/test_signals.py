"""SIGTERM and SIGINT ask for a stop after the current batch; a second one means now. In this process, no
JVM: the real processes are in tests/test_interrupt.py."""

from __future__ import annotations

import os
import signal

import pytest

from cdc2ch.commands import app


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_stops_second_interrupts(sig):
    before = signal.getsignal(sig)
    with app.stop_on_signals() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), sig)  # the handler runs here, in the main thread, and raises nothing
        assert stop.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
            stop.wait(5)  # any bytecode after the signal runs the handler
    assert signal.getsignal(sig) is before  # restored


def test_no_signal_no_stop():
    with app.stop_on_signals() as stop:
        pass
    assert not stop.is_set()
