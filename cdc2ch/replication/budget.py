"""How many rows the pipelines of one process hold in memory at once: one budget (--max-rows-in-memory),
leased per range or snapshot chunk read into this process and given back once it is written.

A loop waits for its current range's lease only while it holds nothing else, and reads ahead only when the
budget has room now (never waiting for it), so no two loops can wait on each other. Leases are granted in
the order they were asked for: a load's large range is not starved by a stream of small ones. A range
larger than the whole budget takes the whole budget (it waits until the others have given theirs back).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable

WAIT_STEP = 0.1  # seconds between looks at a stop while waiting for a lease


class RowBudget:
    """Rows that may be held at once across a process's pipelines (None: no limit)."""

    def __init__(self, total: int | None):
        self.total = total
        self._free = total or 0
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()  # the tickets of leases waited for, oldest first

    def take(self, rows: int, stop: threading.Event | None = None) -> int | None:
        """Lease `rows` (at most the whole budget), waiting for them in turn; None when `stop` is set first."""
        if self.total is None or rows <= 0:
            return 0
        rows = min(rows, self.total)
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                while self._queue[0] is not ticket or self._free < rows:
                    if stop is not None and stop.is_set():
                        return None
                    self._cond.wait(WAIT_STEP)
                self._free -= rows
                return rows
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()

    def try_take(self, rows: int) -> int | None:
        """Lease `rows` if they are free now and nobody waits before; None otherwise."""
        if self.total is None or rows <= 0:
            return 0
        rows = min(rows, self.total)
        with self._cond:
            if self._queue or self._free < rows:
                return None
            self._free -= rows
            return rows

    def give(self, rows: int) -> None:
        if self.total is None or rows <= 0:
            return
        with self._cond:
            self._free += rows
            self._cond.notify_all()

    @property
    def held(self) -> int:
        return 0 if self.total is None else self.total - self._free


UNLIMITED = RowBudget(None)


class Leases:
    """What one loop holds of the budget, by item (range or chunk): the one being written and the one read
    ahead. A context manager: leaving it gives back everything still held (a stop, a failure)."""

    def __init__(self, budget: RowBudget, stop: threading.Event):
        self.budget, self.stop = budget, stop
        self._held: dict[Hashable, int] = {}

    def __enter__(self) -> "Leases":
        return self

    def __exit__(self, *exc: object) -> None:
        for key in list(self._held):
            self.done(key)

    def need(self, key: Hashable, rows: int) -> bool:
        """The item's rows leased (already, or waited for now); False when stopped while waiting."""
        if key in self._held:
            return True
        got = self.budget.take(rows, self.stop)
        if got is None:
            return False
        self._held[key] = got
        return True

    def ahead(self, key: Hashable, rows: int) -> bool:
        """The item's rows leased if the budget has room now: True means it may be read ahead."""
        got = self.budget.try_take(rows)
        if got is None:
            return False
        self._held[key] = got
        return True

    def done(self, key: Hashable) -> None:
        self.budget.give(self._held.pop(key, 0))
