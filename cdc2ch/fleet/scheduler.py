"""Which pipeline runs next on a bounded pool of workers, and when: each at its poll or retry time, the one
waiting longest first, and long loads never on every worker at once, so that a small table's change waits
for a free worker, never for another table's load."""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# A turn that has run this long gives way between two ranges to a pipeline waiting for a worker; a pipeline
# whose turn ran this long is heavy (a load or a backlog) until a turn of it ends sooner.
QUANTUM = 2.0
NEVER = float("inf")


@dataclass
class Turn:
    due: float  # when the pipeline should run next (monotonic seconds); NEVER: not again
    order: int  # among equal due times, first come first served
    heavy: bool = False
    running: bool = False
    started: float = 0.0


class Schedule:
    """The pipelines' turns. Thread-safe: the dispatcher takes turns, workers end them, and a running turn
    asks whether it should give way. `cond` is notified whenever a turn ends."""

    def __init__(self, workers: int, clock: Callable[[], float] = time.monotonic):
        self.workers = max(1, workers)
        # heavy turns may hold every worker but one (one worker alone serves everything)
        self.heavy_cap = max(1, self.workers - 1)
        self.clock = clock
        self.cond = threading.Condition()
        self._turns: dict[str, Turn] = {}
        self._order = itertools.count()

    def add(self, name: str, due: float | None = None) -> None:
        with self.cond:
            self._turns[name] = Turn(self.clock() if due is None else due, next(self._order))
            self.cond.notify_all()

    def remove(self, name: str) -> None:
        """Forget a pipeline (a running turn of it still ends with end(), which then does nothing)."""
        with self.cond:
            self._turns.pop(name, None)
            self.cond.notify_all()

    def take(self) -> str | None:
        """The pipeline to run now on a free worker, marked running; None when no worker is free or no
        pipeline is due (or only heavy ones are, and they already hold their share of the workers)."""
        with self.cond:
            now = self.clock()
            running = [t for t in self._turns.values() if t.running]
            if len(running) >= self.workers:
                return None
            heavy_running = sum(t.heavy for t in running)
            for name, turn in self._waiting(now):
                if turn.heavy and heavy_running >= self.heavy_cap:
                    continue
                turn.running, turn.started = True, now
                return name
            return None

    def end(self, name: str, due: float, heavy: bool | None = None) -> None:
        """A turn ended: the pipeline runs next at `due`; `heavy` None decides from how long the turn ran."""
        with self.cond:
            turn = self._turns.get(name)
            if turn is not None:
                now = self.clock()
                turn.heavy = (now - turn.started >= QUANTUM) if heavy is None else heavy
                turn.running, turn.due, turn.order = False, due, next(self._order)
            self.cond.notify_all()

    def should_give_way(self, name: str) -> bool:
        """Whether the running turn of `name` should end after the range in hand: it has run for QUANTUM,
        and a due pipeline waits that only this turn's worker can take: another heavy one (loads take turns
        on their share of the workers), or any one when there is a single worker. Light pipelines waiting
        for the worker heavy turns leave free are no reason: a load would only starve behind them."""
        with self.cond:
            now = self.clock()
            turn = self._turns.get(name)
            if turn is None or not turn.running or now - turn.started < QUANTUM:
                return False
            heavy_running = sum(t.heavy for t in self._turns.values() if t.running)
            for _, waiting in self._waiting(now):
                if self.workers == 1 or (waiting.heavy and heavy_running >= self.heavy_cap):
                    return True
            return False

    def running(self) -> int:
        with self.cond:
            return sum(t.running for t in self._turns.values())

    def is_running(self, name: str) -> bool:
        with self.cond:
            turn = self._turns.get(name)
            return turn is not None and turn.running

    def next_due(self) -> float:
        """Seconds until the next pipeline not running is due (NEVER: none will be)."""
        with self.cond:
            dues = [t.due for t in self._turns.values() if not t.running]
            return max(min(dues) - self.clock(), 0.0) if dues else NEVER

    def _waiting(self, now: float) -> list[tuple[str, Turn]]:
        due = [(n, t) for n, t in self._turns.items() if not t.running and t.due <= now]
        return sorted(due, key=lambda item: (item[1].due, item[1].order))


# Pipelines that ClickHouse reads itself (--reader clickhouse, or auto) spend their turns waiting for its
# statements and the offsets' inserts, not computing: four per core keep 200 small tables of a fleet within
# two seconds of their commits beside a 20M-row load on two cores, where one per core let them fall 10 s
# behind (bench/fleet.py, docs/benchmarks.md).
CLICKHOUSE_TURNS_PER_CORE = 4


def spark_cores(master: str | None) -> int:
    """The cores Spark runs on locally (`local[N]`: N; `local[*]`, or a master elsewhere: this machine's),
    at least 2."""
    match = re.match(r"local\[(\d+)", master or "")
    return max(2, int(match.group(1)) if match else os.cpu_count() or 2)


def pool_size(
    wanted: int | None, master: str | None, pipelines: int, growing: bool, spark_reads: bool = True
) -> int:
    """How many pipelines run at once: `wanted`, else the cores Spark runs on locally (spark_cores), or
    CLICKHOUSE_TURNS_PER_CORE times as many when no pipeline reads through Spark by choice (`spark_reads`
    False: --reader clickhouse or auto); never more than the pipelines there are, unless discovery may add
    more (`growing`)."""
    if wanted is None:
        wanted = spark_cores(master) * (1 if spark_reads else CLICKHOUSE_TURNS_PER_CORE)
    return max(1, wanted if growing else min(wanted, pipelines))
