"""The loop's answers to what goes wrong, on in-memory ports (issue 17): what `stopped` reports after a
failure (item 2), a target owned by another pipeline (item 6), and refused input writing nothing (item 7)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from cdc2ch.base.errors import ConfigError, SourceError, StateError
from cdc2ch.replication import readers
from tests.support.fakes import Crash, FakeTable, Harness

pytestmark = pytest.mark.unit


def history() -> FakeTable:
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 6)])  # v1: 5 rows
    t.commit(("update", 2, {"name": "two"}), ("delete", 3))  # v2: 3 rows
    return t


def test_stopped_reports_what_was_committed_when_a_later_range_fails():
    h = Harness(history(), max_rows_per_read=2, batch_size=2)  # ranges 0..0, 1..1 (3 batches), 2..2
    h.writer.crash_after = 3  # version 1 lands and commits; the first batch of version 2 fails
    with capture_logs() as logs, pytest.raises(Crash):
        h.run()
    committed = [e for e in logs if e["event"] == "committed"]
    (stopped,) = [e for e in logs if e["event"] == "stopped"]
    assert committed[-1]["version"] == 1 and committed[-1]["total_rows"] == 5
    # Today's complaint: "committed version=1 total_rows=400000" then "stopped committed=-1 rows_written=0".
    assert (stopped["committed"], stopped["rows_written"]) == (1, 5)
    assert h.store.load("p").committed_version == 1


def test_a_target_belongs_to_one_pipeline():
    t = history()
    h = Harness(t)
    h.run(pipeline="db.t")  # a flag run names its pipeline after the target
    t.commit(("insert", {"id": 9, "name": "x"}))
    # A config entry naming the pipeline `orders` for the same target is refused, naming the owner.
    with pytest.raises(StateError) as err:
        h.run(pipeline="orders")
    message = str(err.value)
    assert "db.t is already replicated by pipeline 'db.t'" in message
    assert 'name = "db.t"' in message and "--pipeline db.t" in message and "resumes at version 3" in message
    assert h.store.load("orders") is None and h.source.reads[-1] == (2, 2)
    # Adopted under the owner's name, it resumes where the owner stopped.
    assert h.run(pipeline="db.t").committed_version == t.latest and h.final() == h.expected()


def test_null_keys_in_a_new_pipeline_leave_no_table_and_no_offset():
    t = FakeTable()
    t.commit(("insert", {"id": 1, "name": "a"}), ("insert", {"id": None, "name": "b"}))
    h = Harness(t, max_rows_per_read=100)
    with pytest.raises(
        SourceError, match="1 row\\(s\\) in versions 0..1 have a null in primary-key column 'id'"
    ):
        h.run()
    # Today: an empty target table and an offset at -1 were left behind.
    assert h.db.tables == {} and h.store.states == {} and not h.store.ensured and h.lock.acquired == 0
    assert h.writer.checked == [(0, 1)]


def test_a_new_pipeline_checks_only_its_first_range_and_writes_it_once():
    h = Harness(history(), max_rows_per_read=2)
    assert h.run().committed_version == 2 and h.final() == h.expected()
    assert h.writer.checked == [(0, 0)] and h.lock.acquired == 1
    rows = len(h.db.tables["db.t"]["rows"])
    assert rows == sum(len(v["changes"]) for v in h.table.versions)  # nothing written twice


def test_clickhouse_reader_refuses_a_table_feature_it_cannot_read_before_writing():
    t = history()
    # A reader feature ClickHouse's Delta reader does not know (a catalog-managed table).
    t.protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["catalogManaged", "v2Checkpoint"],
    }
    h = Harness(t)
    with pytest.raises(ConfigError) as err:
        h.run(reader="clickhouse")
    message = str(err.value)
    assert "feature catalogManaged" in message and "v2Checkpoint" not in message
    assert "--reader spark" in message and "/lake/t" in message
    assert h.db.tables == {} and h.store.states == {} and h.lock.acquired == 0 and h.source.reads == []
    # The features ClickHouse's reader does read pass; --reader spark replicates any.
    assert readers.unsupported_by_clickhouse_reader({"readerFeatures": ["v2Checkpoint"]}, {}) == []
    assert readers.unsupported_by_clickhouse_reader({"minReaderVersion": 1}, {}) == []
    assert h.run().committed_version == t.latest and h.final() == h.expected()
