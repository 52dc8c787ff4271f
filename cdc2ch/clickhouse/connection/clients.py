"""How calls from several threads share one target's clients: each call leases a client of its own, and more
are opened, up to a bound, while all are busy; beyond the bound a call waits for a free one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Clients:
    """The clients of one target. `opener` opens another (None: the first client is the only one, and calls
    take turns on it). A client is used by one call at a time, so no client needs to be thread-safe."""

    def __init__(self, first: Any, opener: Callable[[], Any] | None = None, size: int = 1):
        self.first = first
        self._opener = opener
        self._size = max(1, size)
        self._free = [first]
        self._open = [first]
        self._opening = 0  # clients being opened (outside the condition's lock)
        self._cond = threading.Condition()

    def widen(self, size: int) -> None:
        """Allow up to `size` clients at once (never fewer than now allowed)."""
        with self._cond:
            self._size = max(self._size, size)
            self._cond.notify_all()

    @contextmanager
    def lease(self) -> Iterator[Any]:
        client = self._take()
        try:
            yield client
        finally:
            with self._cond:
                self._free.append(client)
                self._cond.notify()

    def _take(self) -> Any:
        with self._cond:
            while not self._free and not self._may_open():
                self._cond.wait()
            if self._free:
                return self._free.pop()
            self._opening += 1
        try:
            assert self._opener is not None  # (_may_open)
            client = self._opener()
        except BaseException:
            with self._cond:
                self._opening -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._opening -= 1
            self._open.append(client)
        return client

    def _may_open(self) -> bool:
        return self._opener is not None and len(self._open) + self._opening < self._size

    @property
    def count(self) -> int:
        return len(self._open)

    def close(self) -> None:
        with self._cond:
            opened, self._open, self._free = self._open, [], []
        for client in opened:
            client.close()
