"""The schedule of pipelines on a bounded pool (fleet/scheduler.py) and the clients calls lease
(clickhouse/connection/clients.py): pure decisions, a fake clock."""

from __future__ import annotations

import threading

import pytest

from cdc2ch.clickhouse.connection.clients import Clients
from cdc2ch.fleet.scheduler import NEVER, QUANTUM, Schedule, pool_size
from tests.support.fakes import Clock

pytestmark = pytest.mark.unit


def schedule(workers: int, *names: str) -> tuple[Schedule, Clock]:
    clock = Clock(100.0)
    s = Schedule(workers, clock)
    for name in names:
        s.add(name)
    return s, clock


def test_due_pipelines_run_in_arrival_order_on_free_workers_only():
    s, clock = schedule(2, "a", "b", "c")
    assert [s.take(), s.take(), s.take()] == ["a", "b", None]  # two workers
    s.end("a", clock.now + 1)
    assert s.take() == "c"
    assert s.take() is None and s.next_due() == 1.0
    clock.now += 1
    s.end("b", clock.now)
    assert s.take() == "a"  # due first (at 101, ended before b)


def test_a_pipeline_that_ended_goes_behind_those_already_waiting():
    s, clock = schedule(1, "a", "b")
    assert s.take() == "a"
    s.end("a", clock.now)  # more to do: due at once, but b has waited longer
    assert s.take() == "b"


def test_heavy_turns_never_hold_every_worker():
    s, clock = schedule(3, "big1", "big2", "big3", "small")
    for name in ("big1", "big2", "big3"):
        s.end(name, clock.now, heavy=True)
    s.end("small", clock.now + 5, heavy=False)
    assert [s.take(), s.take(), s.take()] == ["big1", "big2", None]  # one worker kept free
    clock.now += 5
    assert s.take() == "small"  # the small table's change runs at once


def test_one_worker_serves_heavy_turns_too():
    s, clock = schedule(1, "big")
    s.end("big", clock.now, heavy=True)
    assert s.take() == "big"


def test_a_turn_is_heavy_when_it_ran_a_quantum():
    s, clock = schedule(2, "a", "b")
    s.take(), s.take()
    clock.now += QUANTUM
    s.end("a", clock.now)
    s.end("b", clock.now, heavy=False)
    assert (s._turns["a"].heavy, s._turns["b"].heavy) == (True, False)


def test_a_long_turn_gives_way_to_another_load_not_to_light_pipelines():
    s, clock = schedule(2, "big", "big2", "small1", "small2")
    s.end("big", clock.now, heavy=True)
    s.end("small1", clock.now, heavy=False)
    s.end("small2", clock.now + 1, heavy=False)
    s.end("big2", clock.now + 5, heavy=True)
    assert [s.take(), s.take()] == ["big", "small1"]
    clock.now += QUANTUM
    assert not s.should_give_way("big")  # small2 waits for the light worker, not for the load's
    s.end("small1", clock.now + 10)
    assert s.take() == "small2"
    clock.now += 3
    assert s.take() is None  # big2 is due, but heavy turns already hold their share
    assert s.should_give_way("big")
    s.end("big", clock.now, heavy=True)
    assert s.take() == "big2"  # the loads take turns


def test_on_one_worker_a_long_turn_gives_way_to_anyone():
    s, clock = schedule(1, "big", "small")
    assert s.take() == "big"
    assert not s.should_give_way("big")  # ran no quantum yet
    clock.now += QUANTUM
    assert s.should_give_way("big")
    s.end("big", clock.now)
    assert s.take() == "small"


def test_once_each_pipeline_runs_one_turn():
    s, clock = schedule(2, "a", "b")
    s.take(), s.take()
    s.end("a", NEVER), s.end("b", NEVER)
    assert s.take() is None and s.running() == 0 and s.next_due() == NEVER


def test_a_removed_pipeline_is_not_taken_and_its_end_is_ignored():
    s, clock = schedule(2, "a", "b")
    assert s.take() == "a"
    s.remove("a"), s.remove("b")
    s.end("a", clock.now)
    assert s.take() is None and s.next_due() == NEVER


def test_pool_size():
    assert pool_size(None, "local[4]", 10, growing=False) == 4
    assert pool_size(None, "local[1]", 10, growing=False) == 2
    assert pool_size(None, "local[8]", 3, growing=False) == 3  # no more than the pipelines
    assert pool_size(None, "local[8]", 3, growing=True) == 8  # discovery may add pipelines
    assert pool_size(5, None, 1, growing=True) == 5
    assert pool_size(1, "local[4]", 9, growing=False) == 1
    # turns ClickHouse reads wait on its statements: more of them at once
    assert pool_size(None, "local[2]", 300, growing=True, spark_reads=False) == 8
    assert pool_size(None, "local[2]", 5, growing=False, spark_reads=False) == 5
    assert pool_size(3, "local[2]", 300, growing=True, spark_reads=False) == 3


class Client:
    opened = 0

    def __init__(self):
        Client.opened += 1
        self.closed = False

    def close(self):
        self.closed = True


def test_calls_lease_clients_opening_more_up_to_the_bound():
    first = Client()
    clients = Clients(first, Client, size=1)
    with clients.lease() as a:
        assert a is first
    clients.widen(2)
    with clients.lease() as a, clients.lease() as b:  # two calls at once: a second client
        assert a is first and b is not first
    assert clients.count == 2
    taken = threading.Event()
    third = []

    def wait_for_one():
        with clients.lease() as c:
            third.append(c)

    with clients.lease(), clients.lease():  # both busy, bound reached: a third call waits
        t = threading.Thread(target=wait_for_one)
        t.start()
        t.join(0.2)
        assert t.is_alive() and not third
        taken.set()
    t.join(5)
    assert len(third) == 1 and clients.count == 2
    opened = [first, *[c for c in third if c is not first]]
    clients.close()
    assert all(c.closed for c in opened)


def test_without_an_opener_calls_take_turns_on_the_one_client():
    first = Client()
    clients = Clients(first, None, size=4)
    with clients.lease() as a:
        assert a is first
        t = threading.Thread(target=lambda: clients.lease().__enter__())
        t.start()
        t.join(0.2)
        assert t.is_alive()  # waits for the one client
    t.join(5)
    assert clients.count == 1
