"""Where a pipeline's time goes: seconds per phase (JVM start, log, plan, scan, transfer, arrow, rank,
insert, offsets), summed over the threads that work for it, for its `stopped` log event and the benchmark.

The pipeline sets its accumulator for the duration of its work (`recording`); any layer then times a phase
with `timed(name)` or `add(name, seconds)`, which do nothing when no pipeline records. Threads started for a
pipeline carry it along when they run in a copy of the caller's context (source/threads.on_other_threads).
Phases overlap where work does (a range is read while the one before is inserted), so they need not add up
to the wall time.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

ORDER = ("jvm", "log", "plan", "scan", "transfer", "arrow", "rank", "insert", "offsets")


class Phases:
    """Seconds per phase, added to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + max(seconds, 0.0)

    def seconds(self) -> dict[str, float]:
        """The phases seen so far, in ORDER (then any other), rounded to milliseconds."""
        with self._lock:
            known = dict(self._seconds)
        names = [n for n in ORDER if n in known] + sorted(set(known) - set(ORDER))
        return {n: round(known[n], 3) for n in names}


_current: ContextVar[Phases | None] = ContextVar("cdc2ch_phases", default=None)


@contextmanager
def recording(phases: Phases) -> Iterator[Phases]:
    """Time the phases of the work done inside (on this thread, and threads run in a copy of its context)."""
    token = _current.set(phases)
    try:
        yield phases
    finally:
        _current.reset(token)


# The seconds of the phases timed inside the innermost phase open on this thread: a phase counts its own
# time only (a JVM started while a read is planned is "jvm", not "plan").
_inside: ContextVar[list[float] | None] = ContextVar("cdc2ch_phase_inside", default=None)


def add(name: str, seconds: float) -> None:
    phases = _current.get()
    if phases is None:
        return
    phases.add(name, seconds)
    outer = _inside.get()
    if outer is not None:
        outer[0] += seconds


@contextmanager
def timed(name: str) -> Iterator[None]:
    phases = _current.get()
    if phases is None:
        yield
        return
    t0, inner = time.monotonic(), [0.0]
    token = _inside.set(inner)
    try:
        yield
    finally:
        _inside.reset(token)
        total = time.monotonic() - t0
        phases.add(name, total - inner[0])
        outer = _inside.get()
        if outer is not None:
            outer[0] += total


def carried(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn`, to be run on another thread in a copy of this thread's context: what the caller records its
    phases in goes on being recorded there."""
    context = copy_context()
    return lambda *args, **kwargs: context.run(fn, *args, **kwargs)


def recording_now() -> bool:
    return _current.get() is not None


class _Recorder(Protocol):
    phases: Phases


_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S", bound=_Recorder)


def recorded(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """A method of an object with a `phases` (Phases) attribute, recording its work there."""

    @functools.wraps(method)
    def run(self: _S, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with recording(self.phases):
            return method(self, *args, **kwargs)

    return run


class Timed:
    """`target` with each of its method calls timed as phase `name` (the Delta log's files, read on a poll)."""

    def __init__(self, target: Any, name: str = "log") -> None:
        self._target, self._name = target, name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with timed(self._name):
                return value(*args, **kwargs)

        return call
