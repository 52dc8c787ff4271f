"""Reading the next range while one is written: when it happens, and that offsets move exactly as without it."""

from __future__ import annotations

import threading
import time

import pytest

from cdc2ch.base.errors import LockedError, SourceError
from tests.support.fakes import FakeChanges, Harness
from tests.unit.replication.test_loop import history

# history() holds versions of 0, 5, 3, 3 and 2 change rows: with a bound of 3 rows each is a range, and
# only the pairs (2, 3) and (3, 4) are both within the bound.
BOUND = 3


def on_helper() -> bool:
    return threading.current_thread().name.startswith("cdc2ch-read-ahead")


def test_the_next_range_is_read_during_a_write_only_when_both_are_within_the_bound(monkeypatch):
    h = Harness(history(), max_rows_per_read=BOUND)
    events: list[tuple] = []
    reading = {v: threading.Event() for v in range(5)}
    opened, write, read = h.source.changes, h.writer.write, FakeChanges.arrow_rows

    def changes(s, e, key=(), origin="cdf"):
        events.append(("open", s, on_helper()))
        return opened(s, e)

    def rows(self, immutable_keys):
        events.append(("read", self.start, on_helper()))
        reading[self.start].set()
        return read(self, immutable_keys)

    def written(rng, state, estimate):
        # range 2 is written while range 3 is read: wait for that read to begin (False if it never does)
        events.append(("write", rng.start, rng.start != 2 or reading[3].wait(timeout=5)))
        return write(rng, state, estimate)

    monkeypatch.setattr(h.source, "changes", changes)
    monkeypatch.setattr(h.writer, "write", written)
    monkeypatch.setattr(FakeChanges, "arrow_rows", rows)
    assert h.run().committed_version == 4 and h.final() == h.expected()
    assert [e for e in events if e[0] == "write"] == [("write", v, True) for v in range(5)]
    # the loop plans and reads the ranges not read ahead; the helper plans, then reads, the two that are
    loop = [e[:2] for e in events if e[0] == "write" or not e[2]]
    assert loop == [
        ("open", 0), ("read", 0), ("write", 0), ("read", 0),  # a new pipeline's first range is checked
        ("open", 1), ("write", 1), ("read", 1),  # 5 rows: read alone
        ("open", 2), ("write", 2), ("read", 2),  # 3 is planned and read while 2 is written
        ("write", 3), ("write", 4),
    ]  # fmt: skip
    helper = [e[:2] for e in events if e[2] and e[0] != "write"]
    assert helper == [("open", 3), ("read", 3), ("open", 4), ("read", 4)]
    assert not [t for t in threading.enumerate() if t.name.startswith("cdc2ch-read-ahead")]


@pytest.mark.parametrize("ahead", [True, False])
def test_a_range_that_fails_to_read_ahead_fails_when_the_loop_reaches_it(monkeypatch, ahead):
    h = Harness(history(), max_rows_per_read=BOUND)
    h.writer.collects = ahead  # the same offsets either way
    read = FakeChanges.arrow_rows

    def rows(self, immutable_keys):
        if self.start == 3:
            raise SourceError("version 3 cannot be read")
        return read(self, immutable_keys)

    monkeypatch.setattr(FakeChanges, "arrow_rows", rows)
    with pytest.raises(SourceError, match="version 3 cannot be read"):
        h.run()
    state = h.store.load("p")  # range 2, written while 3 was read, is committed; 3 is where it failed
    assert (state.committed_version, state.interrupted_range, state.rows_written) == (2, (3, 3), 8)
    monkeypatch.setattr(FakeChanges, "arrow_rows", read)
    assert h.run().committed_version == 4 and h.final() == h.expected()


@pytest.mark.parametrize("ahead", [True, False])
def test_a_range_that_fails_to_plan_ahead_fails_when_the_loop_reaches_it(monkeypatch, ahead):
    h = Harness(history(), max_rows_per_read=BOUND)
    h.writer.collects = ahead
    opened = h.source.changes

    def changes(s, e, key=(), origin="cdf"):
        if s == 4:
            raise SourceError("version 4 is gone")
        return opened(s, e)

    monkeypatch.setattr(h.source, "changes", changes)
    with pytest.raises(SourceError, match="version 4 is gone"):
        h.run()
    state = h.store.load("p")
    assert (state.committed_version, state.interrupted_range) == (3, None)


def test_a_stop_during_a_write_leaves_no_read_running_and_the_rerun_completes():
    h = Harness(history(), max_rows_per_read=BOUND)
    h.writer.stop_after = 3  # batches of about 2 rows: stops in range 2, while range 3 is read ahead
    state = h.run()
    assert state.committed_version == 1 and state.interrupted_range == (2, 2)
    assert not [t for t in threading.enumerate() if t.name.startswith("cdc2ch-read-ahead")]
    h.writer.stop_after = None
    assert h.run().committed_version == 4 and h.final() == h.expected()


def test_a_schema_break_read_ahead_resyncs_only_once_that_read_ended(monkeypatch):
    t = history()
    t.commit(drop="name", operation="DROP COLUMNS")  # version 5, a range of its own after range 4
    h = Harness(t, max_rows_per_read=BOUND, on_schema_change="resync")
    read, load = FakeChanges.arrow_rows, h._load_snapshot
    reading = threading.Event()

    def slow(self, immutable_keys):
        if self.start == 5:
            reading.set()
            time.sleep(0.3)
            reading.clear()
        return read(self, immutable_keys)

    def snapshot(side, version, comment):
        assert not reading.is_set()  # the read of version 5 ended before the snapshot began
        return load(side, version, comment)

    monkeypatch.setattr(FakeChanges, "arrow_rows", slow)
    monkeypatch.setattr(h, "_load_snapshot", snapshot)
    state = h.run()
    assert h.snapshots == [5] and state.committed_version == 5 and h.final() == h.expected()


def test_a_new_pipeline_claims_itself_while_its_next_range_is_read(monkeypatch):
    h = Harness(history(), max_rows_per_read=BOUND, from_version=2)  # ranges 2, 3, 4: 3 and 4 read ahead
    read, acquire = FakeChanges.arrow_rows, h.lock.acquire
    reading, during = threading.Event(), []

    def rows(self, immutable_keys):
        if self.start == 3:
            reading.set()
        return read(self, immutable_keys)

    def claim():  # the claim waits for the read of range 3 to begin (False if it never does)
        during.append(reading.wait(timeout=5))
        acquire()

    monkeypatch.setattr(FakeChanges, "arrow_rows", rows)
    monkeypatch.setattr(h.lock, "acquire", claim)
    assert h.run().committed_version == 4
    assert during == [True] and len(h.db.tables["db.t"]["rows"]) == 3 + 3 + 2


def test_a_refused_claim_writes_nothing_and_leaves_no_read_running(monkeypatch):
    h = Harness(history(), max_rows_per_read=BOUND, from_version=2)
    read = FakeChanges.arrow_rows
    ended = []

    def slow(self, immutable_keys):
        time.sleep(0.2 if self.start == 3 else 0)
        ended.append(self.start)
        return read(self, immutable_keys)

    def refused():
        raise LockedError("Pipeline 'p' is already being run by another process.")

    monkeypatch.setattr(FakeChanges, "arrow_rows", slow)
    monkeypatch.setattr(h.lock, "acquire", refused)
    monkeypatch.setattr(h.lock, "check", refused)  # held by another runner: checked before the DDL too
    with pytest.raises(LockedError, match="already being run"):
        h.run()
    assert h.db.tables == {} and h.store.states == {} and not h.store.ensured
    assert 3 in ended  # the range read ahead ended before the refusal was raised
    assert not [t for t in threading.enumerate() if t.name.startswith("cdc2ch-read-ahead")]
