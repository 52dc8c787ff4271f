"""The loop's decisions as pure functions: start version, writer choice, ranges."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from cdc2ch.base.errors import ConfigError, SourceError, StateError
from cdc2ch.model.changeset import Commit, Files
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import PipelineState
from cdc2ch.replication import plan, readers

TS = datetime(2026, 1, 1, tzinfo=timezone.utc)


def commits(*rows: int, first: int = 3, metadata=()) -> list[Commit]:
    return [Commit(first + i, TS, "WRITE", n, {}, first + i in metadata) for i, n in enumerate(rows)]


def stored(
    committed: int, pending: int | None = None, uri: str = "/t", target: str = "db.t"
) -> PipelineState:
    p = committed if pending is None else pending
    return PipelineState("p", uri, target, committed, p, 10, PipelineState.epoch())


def start(state, requested=None, latest=9, reset=False) -> int:
    return plan.start_version("/t", "db.t", state, requested, latest, reset)


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


def _cfg(key: tuple[str, ...], changes_from: str = "cdf") -> RunConfig:
    target = TargetName("db", "t")
    return RunConfig("/t", key, target, "chdb:///m", "p", changes_from=changes_from)


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
    plan.check_commits(3, history, "/t", _cfg(("id",)))
    plan.check_commits(6, off_on[3:], "/t", _cfg(("id",)))  # switched on where replication starts
    with pytest.raises(SourceError, match="enabled at version 6; .* cannot start at 3"):
        plan.check_commits(3, off_on, "/t", _cfg(("id",)))
    plan.check_commits(3, off_on, "/t", _cfg(("id",), "auto"))  # read from the log before it
    with pytest.raises(SourceError, match="Versions 4..4 of /t are no longer"):
        plan.check_commits(3, [history[0], history[2]], "/t", _cfg(("id",), "auto"))


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
    fresh = plan.state_pointed_at(base, "p", "/t", "db.t", 9, rows=3)
    assert (fresh.committed_version, fresh.pending_version, fresh.rows_written) == (9, 9, 13)
    assert fresh.updated_at > base.updated_at and fresh.interrupted_range is None
    assert plan.state_pointed_at(None, "p", "/t", "db.t", -1).rows_written == 0


def test_clickhouse_reader_refuses_variant_at_any_depth():
    from cdc2ch.replication.readers import clickhouse_reader_error, unsupported_by_clickhouse_reader

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


def test_requesting_the_latest_version_itself_is_allowed():
    assert start(None, requested=9, latest=9) == 9
    assert start(None, requested=0, latest=0) == 0


def test_an_offset_with_a_recorded_table_id_resumes_when_none_was_read():
    recorded = PipelineState("p", "/t", "db.t", 5, 5, 10, PipelineState.epoch(), "/t", "id-1")
    assert plan.start_version("/t", "db.t", recorded, None, 9, False) == 6
    assert plan.start_version("/t", "db.t", recorded, None, 9, False, "/t", "id-1") == 6


def test_a_target_belongs_to_one_pipeline():
    other = PipelineState("q", "/u", "db.u", 7, 7, 0, PipelineState.epoch())
    own = PipelineState("p", "/t", "db.t", 7, 7, 0, PipelineState.epoch())
    plan.check_owner("p", "db.t", [other, own])  # another pipeline's other target, and its own offset
    with pytest.raises(
        StateError, match="db.u is already replicated by pipeline 'q' .* resumes at version 8"
    ):
        plan.check_owner("p", "db.u", [own, other])


def test_versions_spark_scans_through_deletion_vectors_are_cut_by_the_rows_of_their_files():
    history = [replace(c, file_rows=25) for c in commits(10, 10, 10, 10, 10, 10)]  # versions 3..8
    assert plan.catch_up_ranges(history, 40, None) == [(3, 6), (7, 8)]
    assert plan.catch_up_ranges(history, 40, None, reads=scanned(3, 4, 5)) == [(3, 3), (4, 4), (5, 6), (7, 8)]
    assert plan.catch_up_ranges(history, 40, (3, 5), reads=scanned(6, 7)) == [(3, 5), (6, 6), (7, 8)]
    fewer = [replace(c, file_rows=5) for c in history]  # the estimate where it is more
    assert plan.catch_up_ranges(fewer, 40, None, reads=scanned(3, 4, 5, 6, 7, 8)) == [(3, 6), (7, 8)]
    scheduled = plan.schedule(history, None, 20, 2, True, True, False, scanned(3))
    assert (scheduled.ranges, scheduled.estimates) == ([(3, 4), (5, 8)], [20, 40])  # estimates: change rows


def scanned(*versions: int) -> plan.LogReads:
    return plan.LogReads(scanned=frozenset(versions))


def test_the_versions_the_feed_does_not_record_are_read_from_the_log_and_how():
    vectors = Files((), (), (), vectors=True)
    history = [replace(c, files=vectors) for c in commits(1, 1, 1, 1)]  # versions 3..6, the feed records 5, 6
    assert plan.log_reads("auto", {5, 6}, history, "driver") == scanned(3, 4)
    assert plan.log_reads("log", {5, 6}, history, "executors") == scanned(3, 4, 5, 6)
    assert plan.log_reads("cdf", set(), history, "driver") == plan.LogReads()
    assert plan.log_reads("auto", {5, 6}, history, "clickhouse") == plan.LogReads(netted=frozenset({3, 4}))
    # copy-on-write, or file actions not known: may be derived at once
    mixed = [history[0], replace(history[1], files=Files((), (), ())), replace(history[2], files=None)]
    assert plan.log_reads("log", set(), mixed, "driver") == plan.LogReads(frozenset({3}), frozenset({4, 5}))
    # ClickHouse reads each file as it was at a version: any may be derived at once
    assert plan.log_reads("log", set(), mixed, "clickhouse") == plan.LogReads(netted=frozenset({3, 4, 5}))


def rewrite(version: int, gone: tuple[str, ...], new: tuple[str, ...], rows: int = 250_000) -> Commit:
    """A copy-on-write commit that removes the files `gone` and adds `new`, `rows` each, every row counted
    in its estimate (none left out as a copy)."""
    files = Files(tuple((p, rows, True) for p in new), tuple((p, rows, True) for p in gone))
    return Commit(version, TS, "MERGE", rows * (len(gone) + len(new)), {}, files=files)


def test_rewrites_of_the_same_files_are_cut_by_the_rows_spark_reads_deriving_them_at_once():
    """Each MERGE rewrites the whole table (four files of 250,000 rows): counted whole, each is its own range;
    derived at once, a range reads the files it found and those it leaves, so it spans every MERGE until
    deriving it pays (FileSpan.pays), and as many more as keep those within the bound."""
    names = [(f"a{v}", f"b{v}", f"c{v}", f"d{v}") for v in range(3, 11)]
    history = [
        rewrite(v, names[v - 4] if v > 3 else ("a", "b", "c", "d"), names[v - 3]) for v in range(3, 11)
    ]
    netted = plan.LogReads(netted=frozenset(range(3, 11)))
    assert plan.catch_up_ranges(history, 2_000_000, None) == [(v, v) for v in range(3, 11)]
    assert plan.catch_up_ranges(history, 2_000_000, None, reads=netted) == [(3, 10)]
    # (a range must reach 3 MERGEs to pay: between >= 2,000,000 rows, before and after 1,000,000 each)
    assert plan.catch_up_ranges(history[:2], 2_000_000, None, reads=netted) == [(3, 3), (4, 4)]
    assert plan.catch_up_ranges(history, 1_999_999, None, reads=netted) == [(v, v) for v in range(3, 11)]
    # a version not netted (vectors, the feed) ends it, and so does a schema change
    assert plan.catch_up_ranges(
        history, 2_000_000, None, reads=plan.LogReads(netted=frozenset({3, 4, 5, 7, 8, 9}))
    ) == [(3, 5), (6, 6), (7, 9), (10, 10)]
    history[5] = replace(history[5], metadata=True)  # version 8
    assert plan.catch_up_ranges(history, 2_000_000, None, reads=netted) == [(3, 7), (8, 10)]
    scheduled = plan.schedule(history[:5], None, 500_000, 4, True, True, True, netted)  # the first checked
    assert (scheduled.ranges, scheduled.estimates) == ([(3, 3), (4, 7)], [2_000_000, 2_000_000])
    # the same files re-added with larger deletion vectors: ClickHouse derives them at once, Spark not
    same = ("a", "b", "c", "d")
    dv = [replace(c, files=replace(rewrite(c.version, same, same).files, vectors=True)) for c in history]
    for writer, expected in (("clickhouse", [(3, 7), (8, 10)]), ("driver", [(v, v) for v in range(3, 11)])):
        reads = plan.log_reads("log", set(), dv, writer)
        assert plan.catch_up_ranges(dv, 2_000_000, None, reads=reads) == expected


def test_interrupted_and_first_ranges_are_followed_by_ranges_that_respect_schema_changes():
    history = commits(1, 1, 1, 1, 1, 1, metadata={7})  # versions 3..8
    assert plan.catch_up_ranges(history, 100, (3, 4)) == [(3, 4), (5, 6), (7, 8)]
    breaks = commits(1, 1, 1, 1, 1, 1, metadata={4, 7})
    assert plan.catch_up_ranges(breaks, 100, None, first_rows=50) == [(3, 3), (4, 6), (7, 8)]


def test_a_ranges_estimate_counts_nothing_for_versions_the_log_lacks():
    history = [c for c in commits(10, 20, 30) if c.version != 4]  # versions 3 and 5
    assert plan.range_estimates(history, [(3, 5), (4, 4), (5, 5)]) == [40, 0, 30]


def test_only_a_streaming_source_streams_and_only_ranges_above_the_bound():
    assert plan.streamed(11, 10, True) and not plan.streamed(10, 10, True)
    assert not plan.streamed(11, 10, False) and not plan.streamed(10, 10, False)


def test_the_rows_held_for_a_range():
    assert plan.held_rows(50, 10, collects=False, streams=True, whole=False) == 0
    assert plan.held_rows(50, 10, collects=True, streams=True, whole=False) == 10
    assert plan.held_rows(50, 10, collects=True, streams=True, whole=True) == 50
    assert plan.held_rows(50, 10, collects=True, streams=False, whole=False) == 50
    assert plan.held_rows(5, 10, collects=True, streams=True, whole=False) == 5


def test_a_schedule_bounds_ranges_by_the_writers_factor_and_a_new_pipelines_first_by_the_plain_bound():
    history = commits(10, 10, 10, 10, 10, 10)  # versions 3..8
    checked = plan.schedule(history, None, 20, 2, collects=True, streams=True, checks_first=True)
    assert (checked.ranges, checked.estimates, checked.held) == ([(3, 4), (5, 8)], [20, 40], [20, 20])
    resumed = plan.schedule(history, None, 20, 2, collects=True, streams=True, checks_first=False)
    assert (resumed.ranges, resumed.estimates, resumed.held) == ([(3, 6), (7, 8)], [40, 20], [20, 20])
    pushed = plan.schedule(history, None, 20, 2, collects=False, streams=True, checks_first=False)
    assert pushed.held == [0, 0]
    # a single version above the bound is a first range of its own, held whole for its check
    large = plan.schedule(commits(30, 10, 10, metadata={5}), None, 20, 2, True, True, checks_first=True)
    assert (large.ranges, large.held, large.breaks) == ([(3, 3), (4, 4), (5, 5)], [30, 10, 10], {5})


def test_properties_that_are_not_a_json_object_do_not_switch_the_feed():
    def props(version: int, properties) -> Commit:
        return Commit(version, TS, "SET TBLPROPERTIES", 0, {"properties": properties})

    enabled = props(5, '{"delta.enableChangeDataFeed": "TRUE"}')
    assert plan.cdf_enabled_at([props(3, "not json"), props(4, "[1, 2]"), enabled]) == 5
    assert plan.cdf_enabled_at([enabled, props(6, '"true"'), props(7, "{}")]) == 5


def test_gap_errors_give_the_snapshot_command_that_resyncs():
    history = commits(1, 1, 1, 1, 1)  # versions 3..7
    switched = Commit(6, TS, "SET TBLPROPERTIES", 0, {"properties": '{"delta.enableChangeDataFeed":"true"}'})
    with pytest.raises(SourceError) as cdf_gap:
        plan.check_commits(3, [*history[:3], switched], "/lake/t", _cfg(("id", "region")))
    assert "`cdc2ch snapshot --table /lake/t --primary-key id,region --target db.t --version 6`" in str(
        cdf_gap.value
    )
    with pytest.raises(SourceError) as log_gap:
        plan.check_commits(3, [history[0], history[2]], "/lake/t", _cfg(("id", "region")))
    assert "`cdc2ch snapshot --table /lake/t --primary-key id,region --target db.t --reset`" in str(
        log_gap.value
    )


def test_the_clickhouse_reader_refusal_names_every_feature_and_the_outcome():
    features = ["table feature rowTracking", "VARIANT columns (j)"]
    message = str(readers.clickhouse_reader_error("/lake/t", features))
    assert message.startswith("/lake/t uses table feature rowTracking and VARIANT columns (j), which ")
    assert ", so nothing was written. Replicate" in message
    later = str(readers.clickhouse_reader_error("/lake/t", features[:1], "the run stops here"))
    assert "cannot read, so the run stops here. Replicate" in later


@pytest.mark.parametrize(
    "operation, parameters, described",
    [
        ("RENAME COLUMN", {"oldColumnPath": "a", "newColumnPath": "b"}, "RENAME COLUMN a TO b"),
        ("ADD COLUMNS", {"columns": '[{"column":{"name":"c"}}]'}, 'ADD COLUMNS [{"column":{"name":"c"}}]'),
        (
            "CHANGE COLUMN",
            {"column": '{"name":"c","type":"long"}'},
            'CHANGE COLUMN {"name":"c","type":"long"}',
        ),
        ("DROP COLUMNS", {"columns": ["c", "d"]}, "DROP COLUMNS ['c', 'd']"),
        ("WRITE", {"mode": "Append"}, "WRITE"),
        ("ADD COLUMNS", {"columns": ""}, "ADD COLUMNS"),
    ],
)
def test_a_commit_is_described_by_its_operation_and_columns(operation, parameters, described):
    assert plan.describe(Commit(3, TS, operation, 0, parameters)) == described


def test_a_long_column_list_is_shortened_to_200_characters():
    described = plan.describe(Commit(3, TS, "ADD COLUMNS", 0, {"columns": "c" * 300}))
    assert described.startswith("ADD COLUMNS ccc") and described.endswith("…")
    assert len(described) == len("ADD COLUMNS ") + 200


def test_repointing_a_new_pipeline_records_nothing_it_was_not_told():
    fresh = plan.state_pointed_at(None, "p", "/t", "db.t", 4)
    assert (fresh.location, fresh.table_id, fresh.initial_load, fresh.initial_reason) == ("", "", "", "")
    assert (fresh.committed_version, fresh.pending_version, fresh.rows_written) == (4, 4, 0)
    told = plan.state_pointed_at(None, "p", "/t", "db.t", 4, location="file:/t", table_id="id-1")
    assert (told.location, told.table_id) == ("file:/t", "id-1")


def test_repointing_keeps_how_the_pipeline_began_and_stamps_after_a_stamp_ahead_of_the_clock():
    ahead = datetime.now(timezone.utc) + timedelta(hours=1)
    base = PipelineState("p", "/t", "db.t", 5, 5, 10, ahead, "", "", "snapshot at version 2", "new table")
    fresh = plan.state_pointed_at(base, "p", "/t", "db.t", 9, rows=3)
    assert fresh.updated_at > ahead
    assert (fresh.initial_load, fresh.initial_reason, fresh.rows_written) == (
        "snapshot at version 2",
        "new table",
        13,
    )
