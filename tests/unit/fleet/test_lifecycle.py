"""Which pipelines a service holds paused or rebuilds (fleet/lifecycle.py), from the requests recorded: read
once per poll interval, a pause said once, a resync done once and recorded. The requests table is replaced by
an in-memory one; the service itself is tested end to end in tests/e2e/fleet/test_lifecycle.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import cast

import pytest

from cdc2ch.base.errors import SinkError
from cdc2ch.fleet.lifecycle import Lifecycle
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import PAUSE, RESUME, RESYNC, RESYNCED, Request
from cdc2ch.replication.metrics import Metrics
from cdc2ch.replication.standing import Stage, Standing
from cdc2ch.replication.startup.inputs import Inputs
from tests.support.fakes import Clock

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def table():
    """{database: {pipeline: Request}}, and the number of reads."""
    rows: dict[str, dict[str, Request]] = {}
    reads, broken = [0], []

    class Store:  # the RequestRecords of one database
        def __init__(self, database):
            self.database = database

        def load_all(self, exists=None):
            reads[0] += 1
            if broken:
                raise SinkError("ClickHouse is away")
            return dict(rows.get(self.database, {}))

        def resynced(self, asked, by):
            if rows[self.database].get(asked.pipeline) != asked:
                return False
            rows[self.database][asked.pipeline] = Request(asked.pipeline, RESYNCED, "", by, asked.at)
            return True

    def ask(database, pipeline, action, minutes=0, reason=""):
        at = T0 + timedelta(minutes=minutes)
        rows.setdefault(database, {})[pipeline] = Request(pipeline, action, reason, "ann@laptop", at)

    return rows, reads, broken, ask, Store


def _cfg(name: str, database: str = "db") -> RunConfig:
    return RunConfig("/t", ("id",), TargetName(database, name), "chdb:///x", name)


class Job:
    def __init__(self, swapped: bool = True, claimed: bool = True, held: bool = False):
        self.swapped, self.rebuilt = swapped, []
        self.standing = Standing(Stage.CLAIMED) if claimed else Standing()
        if held:  # a --once poll's offset, held unclaimed
            self.standing = self.standing.held(cast(Inputs, object()))

    def claim(self) -> None:
        if self.standing.inputs is not None:
            self.standing = self.standing.claim()

    def rebuild(self, reason: str) -> bool:
        self.rebuilt.append(reason)
        return self.swapped


def test_pause_and_resume_are_read_once_per_poll_interval(table):
    _, reads, broken, ask, records = table
    clock, metrics = Clock(), Metrics()
    life = Lifecycle(records, 5.0, clock)
    a, b, c = _cfg("a"), _cfg("b"), _cfg("c", database="other")
    ask("db", "a", PAUSE, reason="reload")
    life.refresh([a, b, c])
    assert reads[0] == 2  # one query per target database
    assert life.holds(a, metrics.pipeline("a")) and life.wants(a)
    assert not life.holds(b, metrics.pipeline("b")) and not life.wants(b)
    assert metrics.registry.get_sample_value("cdc2ch_paused", {"pipeline": "a"}) == 1
    assert metrics.registry.get_sample_value("cdc2ch_consecutive_failures", {"pipeline": "a"}) == 0

    ask("db", "a", RESUME, minutes=1)
    clock.now = 4.9
    life.refresh([a, b, c])  # not a poll interval yet: the pause still holds
    assert reads[0] == 2 and life.holds(a, metrics.pipeline("a"))
    clock.now = 5.0
    life.refresh([a, b, c])
    assert reads[0] == 4 and not life.holds(a, metrics.pipeline("a"))
    assert metrics.registry.get_sample_value("cdc2ch_paused", {"pipeline": "a"}) == 0

    ask("db", "a", PAUSE, minutes=2)  # a read that fails keeps the requests as they were
    broken.append(True)
    clock.now = 10.0
    life.refresh([a, b, c])
    assert not life.holds(a, metrics.pipeline("a"))
    broken.clear()
    clock.now = 15.0
    life.refresh([a])
    assert life.holds(a, metrics.pipeline("a"))


def _resync_read(table) -> tuple[dict, Callable, Clock, Lifecycle, RunConfig]:
    """A service that has read one request, a resync of pipeline `a` for "suspect rows": the requests, `ask`,
    its clock, its Lifecycle and `a`."""
    rows, _, _, ask, records = table
    clock = Clock()
    life = Lifecycle(records, 1.0, clock)
    a = _cfg("a")
    ask("db", "a", RESYNC, reason="suspect rows")
    life.refresh([a])
    return rows, ask, clock, life, a


def test_a_resync_runs_once_and_is_recorded_done_unless_a_newer_request_came(table):
    rows, ask, clock, life, a = _resync_read(table)
    assert life.wants(a)  # a running catch-up ends after its range
    unclaimed = Job(claimed=False)
    life.resync(a, unclaimed)
    assert unclaimed.rebuilt == []  # a new pipeline is rebuilt once it has an offset
    # a --once poll that found nothing new holds its offset unclaimed: it claims it for the rebuild
    idle = Job(swapped=False, claimed=False, held=True)
    life.resync(a, idle)
    assert idle.standing.claimed and idle.rebuilt == ["requested by ann@laptop: suspect rows"]
    stopped = Job(swapped=False)
    life.resync(a, stopped)  # stopped midway: still owed
    assert rows["db"]["a"].action == RESYNC and life.wants(a)
    job = Job()
    life.resync(a, job)
    assert job.rebuilt == ["requested by ann@laptop: suspect rows"]
    assert rows["db"]["a"].action == RESYNCED and not life.wants(a)
    life.resync(a, job)  # done: not again, even before the next read
    assert len(job.rebuilt) == 1

    ask("db", "a", RESYNC, minutes=1)
    clock.now = 2.0
    life.refresh([a])
    ask("db", "a", PAUSE, minutes=2)  # asked while the rebuild ran: the pause is kept
    life.resync(a, Job())
    assert rows["db"]["a"].action == PAUSE and not life.wants(a)  # (until the next read sees the pause)


def test_a_read_that_began_before_a_resync_was_recorded_done_does_not_run_it_again(table):
    """The dispatcher reads the requests while a turn rebuilds: the read, older than the record of the
    resync done, brings the request back as pending."""
    rows, ask, clock, life, a = _resync_read(table)
    stale = dict(rows["db"])  # what a read that began now returns, whenever it ends
    job = Job()
    life.resync(a, job)
    assert rows["db"]["a"].action == RESYNCED
    rows["db"] = stale  # the stale read lands after the rebuild
    clock.now = 1.0
    life.refresh([a])
    assert not life.wants(a)
    life.resync(a, job)
    assert len(job.rebuilt) == 1
    ask("db", "a", RESYNC, minutes=1, reason="again")  # a new request is carried out
    clock.now = 2.0
    life.refresh([a])
    assert life.wants(a)
    life.resync(a, job)
    assert job.rebuilt[-1] == "requested by ann@laptop: again" and len(job.rebuilt) == 2


def test_a_pause_asked_while_a_new_pipeline_starts_holds_it_before_it_writes(table):
    """Spark's start takes seconds (minutes on a loaded machine): a pause recorded meanwhile, before the
    pipeline ever committed, keeps it from writing anything until it is resumed; resumed, it begins."""
    import dataclasses
    import threading

    from cdc2ch.fleet.runner import Fleet, Runner
    from tests.support.fakes import FakeTable, Harness
    from tests.support.service import service_ports

    _, _, _, ask, records = table
    lake = FakeTable()
    lake.commit(("insert", {"id": 1, "name": "a"}), ("insert", {"id": 2, "name": "b"}))
    harness = Harness(lake, once=False, poll_interval=0.01, target=TargetName("db", "p"))
    stop, turns = threading.Event(), []

    class Starting:  # the pipeline: its start is when the pause comes
        def __init__(self, cfg):
            self.job = harness.replicator()

        def start(self):
            turns.append("start")
            if len(turns) == 1:
                ask("db", "p", PAUSE, reason="walk")
            return self.job.start()

        def __getattr__(self, name):
            return getattr(self.job, name)

        def __setattr__(self, name, value):
            if name == "job":
                object.__setattr__(self, name, value)
            else:
                setattr(self.job, name, value)

    ports = dataclasses.replace(service_ports(Starting), requests=records)
    runner = Runner([harness.cfg], None, None, stop, Metrics(), fleet=Fleet(isolate=True), ports=ports)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(turns) < 1 or runner.lifecycle._paused != {"p"}:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        time.sleep(0.2)  # many polls: still nothing written
        assert harness.store.load("p") is None and not harness.db.tables  # before: its first range written
        ask("db", "p", RESUME, minutes=1)
        while getattr(harness.store.load("p"), "committed_version", None) != lake.latest:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        assert harness.final() == lake.rows_at(lake.latest)
    finally:
        stop.set()
        thread.join(10)
