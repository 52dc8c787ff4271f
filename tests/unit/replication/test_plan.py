"""The loop's decisions as pure functions: start version, writer choice, ranges."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from cdc2ch.base.errors import ConfigError, SourceError, StateError
from cdc2ch.model.offset import PipelineState
from cdc2ch.replication import plan
from cdc2ch.source.log import Commit

TS = datetime(2026, 1, 1, tzinfo=timezone.utc)


def commits(*rows: int, first: int = 3, metadata=()) -> list[Commit]:
    return [Commit(first + i, TS, "WRITE", n, {}, first + i in metadata) for i, n in enumerate(rows)]


def stored(
    committed: int, pending: int | None = None, uri: str = "/t", target: str = "db.t"
) -> PipelineState:
    p = committed if pending is None else pending
    return PipelineState("p", uri, target, committed, p, 10, PipelineState.epoch())


def start(state, requested=None, latest=9, reset=False) -> int:
    return plan.start_version("p", "/t", "db.t", state, requested, latest, reset)


def test_start_version_for_new_resumed_and_reset_pipelines():
    assert start(None) == 0
    assert start(None, requested=4) == 4
    assert start(stored(5)) == 6
    assert start(stored(5), requested=6) == 6  # what it would do anyway
    assert start(stored(5), requested=2, reset=True) == 2


@pytest.mark.parametrize(
    "state, requested, latest, message",
    [
        (None, 12, 9, "--from-version 12 is beyond the latest version of /t, which is 9"),
        (stored(5), 2, 9, "has already replicated up to version 5 and would continue at 6, but 2 was asked"),
        (stored(12), None, 9, "but the latest version of /t is 9: the table was recreated"),
        (stored(5, uri="/other"), None, 9, "replicates /other into db.t, not /t into db.t"),
    ],
)
def test_start_version_refusals(state, requested, latest, message):
    with pytest.raises(StateError, match=message.replace("(", r"\(")):
        start(state, requested, latest)


@pytest.mark.parametrize(
    "reader, wanted, remote, local, chosen",
    [
        ("spark", "auto", False, True, "driver"),
        ("spark", "auto", True, True, "driver"),
        ("spark", "auto", True, False, "executors"),
        ("spark", "auto", False, False, "driver"),
        ("spark", "executors", True, True, "executors"),
        ("spark", "driver", True, False, "driver"),
        ("clickhouse", "auto", True, False, "clickhouse"),
        ("clickhouse", "driver", False, True, "clickhouse"),
    ],
)
def test_writer_choice(reader, wanted, remote, local, chosen):
    assert plan.choose_writer(reader, wanted, remote, local) == chosen


def test_writer_choice_refusals():
    with pytest.raises(ConfigError, match="needs a ClickHouse server target"):
        plan.choose_writer("spark", "executors", False, True)
    with pytest.raises(ConfigError, match="Spark tasks have nothing to write"):
        plan.choose_writer("clickhouse", "executors", True, False)


def test_catch_up_replays_the_interrupted_range_first_as_it_was():
    history = commits(10, 10, 10, 10, 10)  # versions 3..7
    assert plan.catch_up_ranges(history, 20, None) == [(3, 4), (5, 6), (7, 7)]
    # an attempt with another bound had started 3..5: replay exactly that, then plan the rest
    assert plan.catch_up_ranges(history, 20, (3, 5)) == [(3, 5), (6, 7)]


def test_schema_changes_start_a_range():
    history = commits(1, 1, 1, 1, metadata={5})
    assert plan.schema_breaks(history) == {5}
    assert plan.catch_up_ranges(history, 100, None) == [(3, 4), (5, 6)]


def test_a_feed_switched_on_after_the_start_is_a_gap():
    def cdf(version: int, value: str, props=None) -> Commit:
        props = props if props is not None else f'{{"delta.enableChangeDataFeed":"{value}"}}'
        return Commit(version, TS, "SET TBLPROPERTIES", 0, {"properties": props})

    history = commits(1, 1, 1, 1, 1)  # versions 3..7
    off_on = [history[0], cdf(4, "false"), history[2], cdf(6, "true"), history[4]]
    assert plan.cdf_enabled_at(history) is None and plan.cdf_enabled_at(off_on) == 6
    assert plan.cdf_enabled_at([cdf(3, "true"), cdf(4, "false")]) is None  # switched off last
    assert plan.cdf_enabled_at([cdf(3, "", {"delta.enableChangeDataFeed": True})]) == 3  # a writer's own form
    assert plan.cdf_enabled_at([cdf(3, "", "not json"), cdf(4, "", '{"other":"x"}')]) is None
    plan.check_commits(3, history, "/t", ("id",), "db.t")
    plan.check_commits(6, off_on[3:], "/t", ("id",), "db.t")  # switched on where replication starts
    with pytest.raises(SourceError, match="enabled at version 6; .* cannot start at 3"):
        plan.check_commits(3, off_on, "/t", ("id",), "db.t")
    with pytest.raises(SourceError, match="Versions 4..4 of /t are no longer"):
        plan.check_commits(3, [history[0], history[2]], "/t", ("id",), "db.t")


def test_missing_versions_are_named():
    history = [c for c in commits(1, 1, 1, 1, 1) if c.version not in (4, 5)]
    assert plan.missing_versions(3, history) == [4, 5]
    assert plan.missing_versions(3, commits(1, 1)) == []
    assert plan.missing_versions(1, commits(1, 1)) == [1, 2]  # the log starts after the offset
    assert "Versions 1..2 of /t are no longer in the Delta log" in str(
        plan.log_gap_error([1, 2], "/t", ("id",), "db.t")
    )


def test_repointed_keeps_rows_and_a_newer_stamp():
    base = stored(5)
    fresh = plan.repointed(base, "p", "/t", "db.t", 9, rows=3)
    assert (fresh.committed_version, fresh.pending_version, fresh.rows_written) == (9, 9, 13)
    assert fresh.updated_at > base.updated_at and fresh.interrupted_range is None
    assert plan.repointed(None, "p", "/t", "db.t", -1).rows_written == 0


def test_clickhouse_reader_refuses_variant_at_any_depth():
    from cdc2ch.replication.plan import clickhouse_reader_error, unsupported_by_clickhouse_reader

    def fields(**types):
        return {
            "type": "struct",
            "fields": [{"name": n, "type": t, "nullable": True} for n, t in types.items()],
        }

    proto = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors", "columnMapping"],
    }
    plain = fields(id="integer", t="timestamp_ntz", _change_type="string")
    assert unsupported_by_clickhouse_reader(proto, {"delta.enableDeletionVectors": "true"}, plain) == []
    nested = fields(
        id="integer",
        j="variant",
        arr={"type": "array", "elementType": "variant", "containsNull": True},
        st={"type": "struct", "fields": [{"name": "x", "type": "variant", "nullable": True}]},
        m={"type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": True},
    )
    found = unsupported_by_clickhouse_reader(proto, {}, nested)
    assert found == ["VARIANT columns (j, arr, st)"]
    message = str(clickhouse_reader_error("/lake/t", found))
    assert "/lake/t uses VARIANT columns (j, arr, st)" in message and "--reader spark" in message
    assert "nothing was written" in message


def test_a_new_pipelines_first_range_keeps_the_plain_bound():
    history = commits(10, 10, 10, 10, 10, 10)  # versions 3..8
    assert plan.catch_up_ranges(history, 40, None) == [(3, 6), (7, 8)]
    assert plan.catch_up_ranges(history, 40, None, first_rows=20) == [(3, 4), (5, 8)]
    assert plan.catch_up_ranges(history, 40, (3, 3), first_rows=20) == [(3, 3), (4, 7), (8, 8)]
    assert plan.catch_up_ranges([], 40, None, first_rows=20) == []
