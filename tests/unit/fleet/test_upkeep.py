"""When a service compacts (fleet/upkeep.py): due at once without a record, `every` after the last one
recorded, one table at a time, a failure tried again sooner. The compaction itself is tested on chdb
(tests/e2e/commands/test_compact.py, tests/e2e/commands/test_compact_service.py); here it is replaced by a recorder."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from cdc2ch.base.errors import SinkError
from cdc2ch.fleet.upkeep import RETRY_AFTER, Upkeep
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import Compacted
from cdc2ch.replication.metrics import Metrics
from tests.support.fakes import Clock

pytestmark = pytest.mark.unit


@pytest.fixture
def world():
    recorded: dict[str, Compacted] = {}
    calls, failures = [], []

    class Store:  # the CompactionRecords of one database
        def __init__(self, database):
            pass

        def load_all(self, exists=None):
            return dict(recorded)

    def compact(target, older_than):
        calls.append((str(target), older_than))
        if failures:
            raise failures.pop()
        return type("Result", (), {"dropped": 3, "seconds": 0.5})()

    return recorded, calls, failures, lambda clock=time.monotonic: Upkeep(Store, compact, clock)


def _cfg(name: str, every: timedelta | None = timedelta(hours=1)) -> RunConfig:
    return RunConfig("/t", ("id",), TargetName("db", name), "chdb:///x", name, compact_every=every,
                     compact_older_than=timedelta(days=7) if every else None)  # fmt: skip


def test_due_at_once_without_a_record_then_every_interval(world):
    _, calls, _, make = world
    clock, metrics = Clock(1000.0), Metrics()
    keeper, cfg = make(clock), _cfg("a")
    assert keeper.after_turn(cfg, metrics.pipeline("a"))
    assert calls == [("db.a", timedelta(days=7))]
    assert not keeper.after_turn(cfg, metrics.pipeline("a"))  # not due again before an hour
    clock.now += 3599
    assert not keeper.after_turn(cfg, metrics.pipeline("a"))
    clock.now += 1
    assert keeper.after_turn(cfg, metrics.pipeline("a")) and len(calls) == 2
    labels = {"pipeline": "a"}
    assert metrics.registry.get_sample_value("cdc2ch_compactions_total", labels) == 2
    assert metrics.registry.get_sample_value("cdc2ch_tombstones_removed_total", labels) == 6
    assert metrics.registry.get_sample_value("cdc2ch_compaction_seconds_sum", labels) == 1.0
    assert not keeper.after_turn(_cfg("b", None), metrics.pipeline("b"))  # off: never


def test_the_schedule_goes_on_from_the_last_compaction_recorded(world):
    recorded, calls, _, make = world
    ago = datetime.now(timezone.utc) - timedelta(minutes=40)
    recorded["db.a"] = Compacted("db.a", ago, 1, 0, 0.1, 1)
    clock = Clock(1000.0)
    keeper = make(clock)
    assert not keeper.after_turn(_cfg("a"), Metrics().pipeline("a"))
    assert keeper.after_turn(_cfg("b"), Metrics().pipeline("b"))  # no record of b's target
    clock.now += 20 * 60 + 1
    assert keeper.after_turn(_cfg("a"), Metrics().pipeline("a"))
    assert [c[0] for c in calls] == ["db.b", "db.a"]


def test_one_compaction_at_a_time_and_a_failure_tried_again_sooner(world):
    _, calls, failures, make = world
    clock, metrics = Clock(1000.0), Metrics()
    keeper = make(clock)
    with keeper.busy:  # another pipeline's compaction runs: this one waits for a later turn
        assert not keeper.after_turn(_cfg("a"), metrics.pipeline("a")) and calls == []
    failures.append(SinkError("ClickHouse went away"))
    assert not keeper.after_turn(_cfg("a"), metrics.pipeline("a")) and len(calls) == 1
    assert metrics.registry.get_sample_value("cdc2ch_compaction_failures_total", {"pipeline": "a"}) == 1
    clock.now += RETRY_AFTER
    assert keeper.after_turn(_cfg("a"), metrics.pipeline("a")) and len(calls) == 2
    failures.append(ValueError("a bug"))  # any failure: logged, replication goes on
    clock.now += 3600
    assert not keeper.after_turn(_cfg("a"), metrics.pipeline("a")) and len(calls) == 3
    often = replace(_cfg("b"), compact_every=timedelta(seconds=30))  # retried after min(every, RETRY_AFTER)
    failures.append(SinkError("again"))
    assert not keeper.after_turn(often, metrics.pipeline("b"))
    clock.now += 30
    assert keeper.after_turn(often, metrics.pipeline("b")) and len(calls) == 5


def test_concurrent_turns_never_compact_two_tables_at_once():
    running, most, lock = [0], [0], threading.Lock()
    gate = threading.Barrier(4)

    def compact(target, older_than):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.05)
        with lock:
            running[0] -= 1
        return type("Result", (), {"dropped": 0, "seconds": 0.05})()

    keeper, metrics = (
        Upkeep(lambda database: type("Store", (), {"load_all": lambda self: {}})(), compact),
        Metrics(),
    )

    def turn(name):
        gate.wait()
        keeper.after_turn(_cfg(name), metrics.pipeline(name))

    threads = [threading.Thread(target=turn, args=(n,)) for n in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
