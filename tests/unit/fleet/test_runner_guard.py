"""A pipeline's turn on the worker pool: whatever escapes it ends the service instead of vanishing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from cdc2ch.fleet.runner import Runner
from cdc2ch.fleet.scheduler import Schedule

pytestmark = pytest.mark.unit


class _Cfg:
    pipeline = "orders"


class _Slot:
    cfg = _Cfg()


def _runner(turn) -> Runner:
    runner = Runner.__new__(Runner)  # only what _guarded touches: the rest needs a sink and Spark
    runner.fatal, runner.stop, runner.schedule = None, threading.Event(), Schedule(2)
    runner._turn = turn
    return runner


def test_an_exception_escaping_a_turn_on_the_pool_stops_the_service_and_is_raised_by_run():
    def turn(slot):
        raise RuntimeError("escaped the attempt")

    runner = _runner(turn)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(runner._guarded, _Slot()).result()  # nothing left for the future to swallow
    assert runner.stop.is_set()
    assert isinstance(runner.fatal, RuntimeError) and str(runner.fatal) == "escaped the attempt"


def test_a_turn_that_ends_normally_changes_nothing():
    ran = []
    runner = _runner(ran.append)
    runner._guarded(_Slot())
    assert len(ran) == 1 and not runner.stop.is_set() and runner.fatal is None


def test_the_first_fatal_error_is_kept():
    first = ValueError("first")
    runner = _runner(lambda slot: (_ for _ in ()).throw(KeyError("second")))
    runner.fatal = first
    runner._guarded(_Slot())
    assert runner.fatal is first and runner.stop.is_set()
