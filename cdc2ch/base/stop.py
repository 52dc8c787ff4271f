"""When a stop signal (SIGTERM, SIGINT) means "stop after the current batch": caught from the command's
first line, so that one arriving while the command line is still being imported is a clean stop too."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from cdc2ch.base import log as logsetup

log = logsetup.get_logger("cdc2ch")

# SIGINT first: a process that catches SIGTERM (visible in /proc/PID/status) catches both.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_Handler = Callable[[int, FrameType | None], Any] | int | None  # what signal.signal returns

_early: list[int] = []  # signals caught before a command took them over
_before: dict[signal.Signals, _Handler] = {}  # the handlers catch_early replaced


class _StopEvent(threading.Event):
    """Set by the watcher thread, but set already for `is_set` from the moment the handler ran: a batch
    that ends before that thread gets its turn (a busy machine) sees the stop and begins no other."""

    def __init__(self, received: list[int]) -> None:
        super().__init__()
        self._received = received

    def is_set(self) -> bool:
        return bool(self._received) or super().is_set()


class Stopped(BaseException):
    """A stop came while the work waited for something to begin (Spark's start): it ends there, having begun
    nothing more. A BaseException, as KeyboardInterrupt is, so that no `except Exception` on its way takes it
    for a failure; the runner and the commands end cleanly on it (exit 0)."""


def catch_early() -> None:
    """Record stop signals until a command takes them over (`stop_on_signals`) or hands them back
    (`release`). Called before the heavy imports of the command line; a no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread() or _before:
        return
    for s in STOP_SIGNALS:
        _before[s] = signal.signal(s, lambda signum, frame: _early.append(signum))


def release() -> None:
    """For a command that does not stop cleanly: the usual handlers again, and a signal that came in the
    meantime delivered to them now (Ctrl-C interrupts, SIGTERM ends the process)."""
    if not _before:
        return
    for s, handler in _before.items():
        signal.signal(s, handler)
    _before.clear()
    if _early:
        signal.raise_signal(_early.pop(0))


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Yields an event that SIGTERM or SIGINT (Ctrl-C: sent to the whole process group, where the Spark JVM
    ignores it and PySpark's workers are in a group of their own) set: the work stops after the current
    batch, exit 0. A second signal means now (KeyboardInterrupt). A signal `catch_early` recorded counts
    as the first.

    The handler may run between any two bytecodes of the main thread, inside a py4j call or a write to
    stderr, or while that thread holds the event's lock: it takes no lock and writes nothing but one byte
    to a pipe. A thread reads it, sets the event (for waiters) and logs the signal; `is_set` is true from the
    handler on."""
    received: list[int] = []
    stop = _StopEvent(received)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    read_end, write_end = os.pipe()

    def handler(signum: int, frame: FrameType | None) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        os.write(write_end, bytes([signum]))

    def announce() -> None:
        signum = os.read(read_end, 1)[0]
        if signum:
            stop.set()
            name = signal.Signals(signum).name
            logsetup.when_configured(
                lambda: log.warning("signal_received", signal=name, action="stopping after the current batch")
            )

    watcher = threading.Thread(target=announce, name="cdc2ch-signals", daemon=True)
    watcher.start()
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    previous.update(_before)  # taken over for good: afterwards the usual handlers, not catch_early's
    _before.clear()
    if _early:
        handler(_early[0], None)
    _early.clear()
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if not received:
            os.write(write_end, b"\0")  # no signal came: let the watcher end
        watcher.join(5)
        os.close(read_end)
        os.close(write_end)
