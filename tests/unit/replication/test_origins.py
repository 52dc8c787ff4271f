"""Where each range's changes come from (plan.origin, --changes-from): the change data feed where the table
records one, derived from the log's file actions where it does not, over the in-memory ports (the fake source
derives what a rewrite of every touched row's file would yield)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.model.changeset import FEED, LOG, Commit, Files
from cdc2ch.replication import plan
from tests.support.fakes import T0, FakeTable, Harness, late_feed_table

CDF_ON = {"delta.enableChangeDataFeed": "true"}
CDF_OFF = {"delta.enableChangeDataFeed": "false"}


def commit(version: int, properties: dict | None = None) -> Commit:
    return Commit(version, T0, "WRITE", 1, {}, properties is not None, properties)


def no_feed() -> FakeTable:
    """A table that never recorded a feed: inserts, an update, a key change, a delete and a re-insert."""
    t = FakeTable(cdf=False)
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 6)])
    t.commit(("update", 2, {"name": "two"}), ("delete", 3))
    t.commit(("update", 4, {"id": 40}))  # a key change: 4 must go
    t.commit(("delete", 5), ("insert", {"id": 5, "name": "again"}))
    return t


late_feed = late_feed_table


# -- the decision ------------------------------------------------------------------------------------------
def test_the_feed_covers_the_versions_from_a_metadata_that_enables_it_to_one_that_does_not():
    history = [commit(3), commit(4, CDF_ON), commit(5), commit(6, CDF_OFF), commit(7), commit(8, {})]
    assert plan.feed_versions(False, history) == {4, 5}
    assert plan.feed_versions(True, history) == {3, 4, 5}
    assert plan.feed_versions(True, []) == frozenset()


def test_auto_reads_the_feed_only_for_a_range_it_wholly_records_and_the_option_forces_either():
    fed = {4, 5, 6}
    assert plan.origin("auto", fed, 4, 6) == FEED
    assert plan.origin("auto", fed, 3, 4) == LOG  # (never planned: a metaData commit starts a range)
    assert plan.origin("auto", fed, 7, 7) == LOG
    assert plan.origin("cdf", set(), 1, 2) == FEED
    assert plan.origin("log", fed, 4, 6) == LOG


def test_validate_says_where_the_changes_come_from_and_why():
    assert plan.origins_text("auto", {0, 1, 2}, 0, 2, True) == (
        "changes from the change data feed (the table records one)"
    )
    assert plan.origins_text("auto", set(), 0, 2, False) == (
        "changes derived from the Delta log's file actions (the table records no change data feed)"
    )
    assert plan.origins_text("auto", {3, 4}, 0, 4, True) == (
        "changes derived from the Delta log's file actions up to version 2 and from the change data feed "
        "from version 3 on (when it was enabled)"
    )
    assert plan.origins_text("auto", set(), 5, 4, True).startswith("changes from the change data feed")
    assert plan.origins_text("auto", set(), 5, 4, False).startswith("changes derived from the Delta log")
    assert plan.origins_text("log", {0}, 0, 0, True) == (
        "changes derived from the Delta log's file actions (--changes-from log)"
    )
    assert (
        plan.origins_text("cdf", set(), 0, 0, False)
        == "changes from the change data feed (--changes-from cdf)"
    )


# -- the loop acting on it ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rows_per_read", [1, 100])
def test_a_table_without_a_feed_is_replicated_from_its_log_exactly(rows_per_read):
    h = Harness(no_feed(), max_rows_per_read=rows_per_read, batch_size=1)
    state = h.run()
    assert state.committed_version == 4 and h.final() == h.expected()
    assert {origin for _, _, origin in h.source.origins} == {LOG} and h.snapshots == []
    assert state.initial_load == "changes from version 0"
    h.table.commit(("update", 1, {"name": "one"}), ("delete", 2))
    assert h.run().committed_version == 5 and h.final() == h.expected()


def test_ranges_derived_through_deletion_vectors_are_bounded_by_the_rows_of_their_files_fed_ones_not():
    def large_files(t: FakeTable) -> FakeTable:
        for v in t.versions:
            v["commit"] = replace(v["commit"], file_rows=1000, files=Files((), (), (), vectors=True))
        return t

    h = Harness(large_files(no_feed()), max_rows_per_read=100)
    assert h.run().committed_version == 4 and h.final() == h.expected()
    assert h.source.origins == [(v, v, LOG) for v in range(5)]
    h = Harness(large_files(late_feed()), max_rows_per_read=100)
    assert h.run().committed_version == 3 and h.final() == h.expected()
    assert h.source.origins == [(0, 0, LOG), (1, 1, LOG), (2, 3, FEED)]


def test_a_late_feed_is_read_from_the_log_before_it_and_from_the_feed_after_it():
    h = Harness(late_feed(), max_rows_per_read=100)
    state = h.run()
    assert h.snapshots == [] and state.committed_version == 3 and h.final() == h.expected()
    assert h.source.origins == [(0, 1, LOG), (2, 3, FEED)]
    h.table.commit(("insert", {"id": 9, "name": "nine"}), ("delete", 1))
    assert h.run().committed_version == 4 and h.source.origins[-1] == (4, 4, FEED)
    assert h.final() == h.expected()


def test_a_feed_switched_off_is_followed_from_the_log_from_that_version():
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 4)])
    h = Harness(t, max_rows_per_read=100)
    h.run()
    t.commit(properties=CDF_OFF, operation="SET TBLPROPERTIES")
    t.commit(("update", 1, {"name": "one"}), ("delete", 2))
    assert h.run().committed_version == 3 and h.final() == h.expected()
    assert h.source.origins[-1] == (2, 3, LOG)


def test_the_option_forces_the_log_on_a_table_with_a_feed_and_the_feed_refuses_one_without():
    h = Harness(late_feed(), changes_from="log", max_rows_per_read=100)
    assert h.run().committed_version == 3 and h.final() == h.expected()
    assert {origin for _, _, origin in h.source.origins} == {LOG}
    h = Harness(FakeTable(cdf=False), changes_from="cdf")
    with pytest.raises(SourceError, match="The Change Data Feed is not enabled"):
        h.run()
    assert h.db.tables == {} and h.store.states == {}


def test_a_source_that_cannot_derive_changes_keeps_its_feed_refusals():
    h = Harness(FakeTable(cdf=False))
    h.source.derives = False  # (a share)
    with pytest.raises(SourceError, match="The Change Data Feed is not enabled"):
        h.run()
    h = Harness(FakeTable(), changes_from="log")
    h.source.derives = False
    with pytest.raises(ConfigError, match="--changes-from log derives changes"):
        h.run()
    assert h.db.tables == {} and h.store.states == {}
