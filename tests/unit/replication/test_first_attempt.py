"""A new pipeline's first attempt that fails leaves nothing behind (bootstrap.take_back, the Footprint port):
no offset, no claim held, no table it created; what it did not create, what another runner holds, what a
kill leaves and a pipeline that committed are kept."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from cdc2ch.base.errors import LockedError, SinkError
from cdc2ch.model import schema
from tests.support.fakes import Crash, FakeTable, Harness, MemoryTables, Refused

pytestmark = pytest.mark.unit


def history() -> FakeTable:
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 6)])  # v1: 5 rows
    t.commit(("update", 2, {"name": "two"}), ("delete", 3))  # v2
    return t


def events(logs, name):
    return [e for e in logs if e["event"] == name]


def test_a_first_range_clickhouse_refuses_part_way_leaves_no_offset_and_no_table():
    h = Harness(history(), max_rows_per_read=100, batch_size=2)
    h.writer.fail_after = 1  # the first batch lands, the second is refused
    with capture_logs() as logs, pytest.raises(Refused):
        h.run()
    assert h.store.load("p") is None and h.store.saves == 2  # recorded (claim, pending), then taken back
    assert "db.t" not in h.db.tables and not h.lock.held
    assert [e["dropped"] for e in events(logs, "first_attempt_taken_back")] == [["db.t"]]
    h.writer.fail_after = None  # fixed: the next attempt starts the pipeline anew and completes it
    assert h.run().committed_version == h.table.latest
    assert h.final() == h.expected()


def test_a_table_that_was_there_before_is_kept():
    h = Harness(history(), max_rows_per_read=100)
    types = schema.column_types(h.source.schema_at(h.table.latest), h.cfg.design)
    MemoryTables(h.db, h.cfg.target, h.cfg.identity).prepare(types)  # made by hand
    h.writer.fail_after = 0
    with pytest.raises(Refused):
        h.run()
    assert h.store.load("p") is None and "db.t" in h.db.tables and h.footprint.undone == [[]]


def test_a_pipeline_that_committed_keeps_its_offset_when_a_later_range_fails():
    h = Harness(history(), max_rows_per_read=2, batch_size=2)  # ranges 0..0, 1..1, 2..2
    h.writer.fail_after = 3  # version 1 commits; version 2 is refused
    with capture_logs() as logs, pytest.raises(Refused):
        h.run()
    assert h.store.load("p").committed_version == 1 and "db.t" in h.db.tables
    assert not events(logs, "first_attempt_taken_back") and h.footprint.undone == []


def test_a_kill_keeps_the_pending_range_to_replay():
    h = Harness(history(), max_rows_per_read=100, batch_size=2)
    h.writer.crash_after = 1  # kill -9: nothing in the process handles it
    with pytest.raises(Crash):
        h.run()
    assert h.store.load("p").interrupted_range == (0, 2) and h.footprint.undone == []


def test_what_another_runner_holds_is_left_to_it():
    h = Harness(history())

    def taken():
        raise LockedError("Pipeline 'p' is already being run by another process.")

    h.lock.acquire = taken
    with pytest.raises(LockedError):
        h.run()
    assert h.footprint.undone == []  # the table may already be the other runner's


def test_when_clickhouse_cannot_take_it_back_the_next_run_resumes_as_after_a_crash():
    h = Harness(history(), max_rows_per_read=100, batch_size=2)
    h.writer.fail_after = 1

    def unreachable():
        raise SinkError("ClickHouse could not be reached after 5 attempts")

    r = h.replicator()
    r.ports.footprint.undo = unreachable
    with capture_logs() as logs, pytest.raises(Refused):
        r.run()
    assert events(logs, "first_attempt_kept") and h.store.load("p").interrupted_range == (0, 2)
    h.writer.fail_after = None
    assert h.run().committed_version == h.table.latest and h.final() == h.expected()


@pytest.mark.parametrize("chunks_landed", [False, True])
def test_a_failed_initial_snapshot_is_taken_back_unless_chunks_landed_to_resume(chunks_landed):
    h = Harness(history(), initial_load="snapshot")
    load = h._load_snapshot

    def failing(side, version, comment):
        load(side, version, comment)  # the table is created and filled...
        if chunks_landed:
            h.store.begun["p"] = version
        raise Refused("the last chunk is refused")

    h._load_snapshot = failing
    with pytest.raises(Refused):
        h.run()
    assert h.store.load("p") is None
    assert ("db.t" in h.db.tables) is chunks_landed
