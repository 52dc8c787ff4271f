"""One row budget for a process's pipelines: leases granted in turn, read-ahead only when there is room, and
everything given back however a loop ends."""

from __future__ import annotations

import threading
import time

import pytest

from cdc2ch.replication.budget import Leases, RowBudget
from tests.support.fakes import FakeChanges, Harness
from tests.unit.replication.test_loop import history

pytestmark = pytest.mark.unit


def test_a_lease_larger_than_the_budget_takes_all_of_it():
    budget = RowBudget(10)
    assert budget.take(25) == 10 and budget.held == 10
    assert budget.try_take(1) is None
    budget.give(10)
    assert budget.held == 0 and budget.try_take(4) == 4


def test_leases_are_granted_in_the_order_asked_and_a_stop_ends_a_wait():
    budget, order = RowBudget(10), []
    budget.take(8)

    def ask(name: str, rows: int, stop=None):
        got = budget.take(rows, stop)
        order.append((name, got))

    big = threading.Thread(target=ask, args=("big", 10))
    big.start()
    time.sleep(0.2)
    assert budget.try_take(2) is None  # room for 2, but the big lease waits first
    stopped = threading.Event()
    small = threading.Thread(target=ask, args=("small", 1, stopped))
    small.start()
    time.sleep(0.2)
    budget.give(8)
    big.join(5)
    stopped.set()
    small.join(5)
    assert order == [("big", 10), ("small", None)] and budget.held == 10


def test_a_loop_gives_back_what_it_holds_when_it_ends_early():
    budget, stop = RowBudget(10), threading.Event()
    with pytest.raises(RuntimeError), Leases(budget, stop) as leases:
        assert leases.need("a", 4) and leases.ahead("b", 5) and not leases.ahead("c", 5)
        assert budget.held == 9
        raise RuntimeError("a failed write")
    assert budget.held == 0


def test_a_range_is_read_ahead_only_when_the_budget_has_room_for_it(monkeypatch):
    """history() has ranges of 0, 5, 3, 3 and 2 rows with a bound of 3: without a budget, 3 and 4 are read
    ahead (test_readahead); with room for only one range at a time, none is, and every row still lands."""
    ahead: list[int] = []
    read = FakeChanges.arrow_rows

    def rows(self, immutable_keys):
        if threading.current_thread().name.startswith("cdc2ch-read-ahead"):
            ahead.append(self.start)
        return read(self, immutable_keys)

    monkeypatch.setattr(FakeChanges, "arrow_rows", rows)
    h = Harness(history(), max_rows_per_read=3)
    budget = RowBudget(4)
    assert h.run(budget=budget).committed_version == 4 and h.final() == h.expected()
    assert ahead == [] and budget.held == 0
    h2 = Harness(history(), max_rows_per_read=3)
    assert h2.run(budget=RowBudget(6)).committed_version == 4 and ahead == [3, 4]
