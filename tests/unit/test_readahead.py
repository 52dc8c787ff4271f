"""Reading the next range while one is written: when it happens, and that offsets move exactly as without it."""

from __future__ import annotations

import threading
import time

import pytest

from cdc2ch.errors import SourceError
from tests.unit.fakes import FakeChanges, Harness
from tests.unit.test_loop import history

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

    def changes(s, e):
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
    # planned on the loop's thread, in order; the two ranges read ahead are read on the helper thread
    assert [e[:2] for e in events if e[0] != "read"] == [
        ("open", 0), ("write", 0),
        ("open", 1), ("write", 1),  # 5 rows: read alone
        ("open", 2), ("open", 3), ("write", 2),  # 3 is planned, and read, while 2 is written
        ("open", 4), ("write", 3),
        ("write", 4),
    ]  # fmt: skip
    assert not [e for e in events if e[0] == "open" and e[2]]
    assert sorted(e[1] for e in events if e[0] == "read" and e[2]) == [3, 4]
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

    def changes(s, e):
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
    h.writer.stop_after = 4  # batches of 2 rows: stops in range 2, while range 3 is read ahead
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
