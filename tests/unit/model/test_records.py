"""What cdc2ch records per pipeline: the offset (which table and target it belongs to, the stamp each save gets,
what it resumes) and its health."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from cdc2ch.base.errors import StateError
from cdc2ch.model.records import Health, PipelineState, stamp_after


def state(committed: int = 5, pending: int | None = None, **more) -> PipelineState:
    values = {"location": "", "table_id": "", **more}
    p = committed if pending is None else pending
    return PipelineState("p", "main.sales.orders", "db.t", committed, p, 10, PipelineState.epoch(), **values)


def test_each_stamp_is_after_the_last_even_when_the_clock_is_behind_it():
    ahead = datetime.now(timezone.utc) + timedelta(hours=1)  # a clock that went back since the last save
    assert stamp_after(ahead) == ahead + timedelta(milliseconds=1)
    past = datetime(2020, 1, 1, tzinfo=timezone.utc)
    before = datetime.now(timezone.utc)
    assert before <= stamp_after(past) <= datetime.now(timezone.utc)


def test_the_first_stamp_is_the_unix_epoch():
    assert PipelineState.epoch() == datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert PipelineState.epoch().timestamp() == 0


def test_an_offset_checked_without_a_location_or_table_id_still_matches():
    """A caller that resolved no location (a path) or read no table id is not refused on their account."""
    recorded = state(location="s3://lake/orders", table_id="id-1")
    recorded.check_matches("main.sales.orders", "db.t")
    recorded.check_matches("main.sales.orders", "db.t", "s3://lake/orders/", "id-1")
    recorded.check_matches("s3://lake/orders", "db.t", "s3://lake/orders")  # the same table by its path


def test_a_table_recreated_under_the_same_name_is_refused():
    recorded = state(location="s3://lake/orders", table_id="id-1")
    with pytest.raises(
        StateError, match="from s3://lake/orders, but the catalog now places it at s3://lake/o2"
    ):
        recorded.check_matches("main.sales.orders", "db.t", "s3://lake/o2")
    with pytest.raises(
        StateError, match=r"\(Delta table id id-1\), but s3://lake/orders now holds table id-2"
    ):
        recorded.check_matches("main.sales.orders", "db.t", "s3://lake/orders", "id-2")
    with pytest.raises(
        StateError, match=r"\(Delta table id id-1\), but main.sales.orders now holds table id-2"
    ):
        recorded.check_matches("main.sales.orders", "db.t", "", "id-2")
    with pytest.raises(
        StateError, match="replicates main.sales.orders into db.t, not main.sales.orders into db.u"
    ):
        recorded.check_matches("main.sales.orders", "db.u")


def test_relabelling_keeps_the_recorded_table_id_when_none_was_read():
    recorded = state(table_id="id-1")
    assert recorded.relabelled("/lake/orders", "/lake/orders", "").table_id == "id-1"
    moved = recorded.relabelled("/lake/orders", "file:/lake/orders", "id-2")
    assert (moved.source, moved.location, moved.table_id) == ("/lake/orders", "file:/lake/orders", "id-2")
    assert moved.committed_version == recorded.committed_version and moved.updated_at == recorded.updated_at


def test_advancing_commits_the_range_being_written():
    writing = state(5).writing(9)
    assert (writing.committed_version, writing.pending_version, writing.interrupted_range) == (5, 9, (6, 9))
    landed = writing.advanced(9, 40)
    assert (landed.committed_version, landed.pending_version, landed.rows_written) == (9, 9, 50)
    assert landed.interrupted_range is None
    assert state(5).advanced(7, 0).pending_version == 7
    assert landed.updated_at > writing.updated_at > PipelineState.epoch()


def test_health_counts_failures_in_a_row_and_keeps_the_last_error_after_a_recovery():
    t0, t1, t2 = (datetime(2026, 12, 1, 12, m, tzinfo=timezone.utc) for m in (0, 1, 2))
    failed = Health("p", "/lake/t", "db.t").failed(t0, "boom", "source")
    assert (failed.failures, failed.last_error, failed.last_error_kind, failed.last_error_at) == (
        1,
        "boom",
        "source",
        t0,
    )
    assert failed.last_success_at is None
    again = failed.failed(t1, "bang", "clickhouse")
    assert (again.failures, again.last_error, again.last_error_kind, again.last_error_at) == (
        2,
        "bang",
        "clickhouse",
        t1,
    )
    ok = again.succeeded(t2)
    assert (ok.failures, ok.last_success_at) == (0, t2)
    assert (ok.last_error, ok.last_error_kind, ok.last_error_at) == (
        "bang",
        "clickhouse",
        t1,
    )  # kept for `status`
    assert (ok.pipeline, ok.source, ok.target) == ("p", "/lake/t", "db.t")


def test_a_range_being_written_records_where_its_changes_come_from_and_what_reads_them():
    writing = state(4).writing(7, "log", "spark")
    assert (writing.committed_version, writing.pending_version) == (4, 7)
    assert (writing.changes_from, writing.reader) == ("log", "spark")
    # a write told neither keeps what the last one recorded
    again = writing.writing(9)
    assert (again.pending_version, again.changes_from, again.reader) == (9, "log", "spark")
