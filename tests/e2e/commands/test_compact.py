"""`compact`: old tombstones physically gone, young ones kept, FINAL unchanged, interrupted runs finished."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse.state.compactlog import CompactStore
from cdc2ch.clickhouse.tables import ddl
from cdc2ch.clickhouse.tables.compaction import SIDE_SUFFIX, VIEW_SUFFIX, compact
from cdc2ch.fleet.assembly import service_ports
from cdc2ch.fleet.upkeep import Upkeep
from cdc2ch.model import schema
from cdc2ch.model.config import RunConfig, TargetName, parse_duration
from cdc2ch.model.design import TableDesign
from cdc2ch.replication.metrics import Metrics
from tests.support.helpers import SinkTap, assert_replicated, create_table

COLS = "id BIGINT, name STRING"


def final_rows(sink, target: TargetName, order: str = "id") -> list[tuple]:
    return sink.query_rows(f"SELECT * FROM {schema.qualified(target)} FINAL ORDER BY {order}")


def tombstone_ids(sink, target: TargetName, key: str = "id") -> list:
    rows = sink.query_rows(
        f"SELECT {key} FROM {schema.qualified(target)} WHERE _is_deleted = 1 ORDER BY {key}"
    )
    return [r[0] for r in rows]


def count(sink, target: TargetName, where: str = "1") -> int:
    return sink.query_rows(f"SELECT count() FROM {schema.qualified(target)} WHERE {where}")[0][0]


def cleanup_enabled(sink, target: TargetName) -> bool:
    ddl = sink.query_rows(
        "SELECT create_table_query FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        {"db": target.database, "t": target.table},
    )[0][0]
    return "allow_experimental_replacing_merge_with_cleanup = 1" in ddl


def leftovers(sink, target: TargetName) -> list[str]:
    names = (target.table + SIDE_SUFFIX, target.table + VIEW_SUFFIX)
    rows = sink.query_rows(
        "SELECT name FROM system.tables WHERE database = {db:String} AND name IN {n:Array(String)}",
        {"db": target.database, "n": list(names)},
    )
    return [r[0] for r in rows]


def commit_times(sink, target: TargetName) -> dict[int, datetime]:
    rows = sink.query_rows(
        f"SELECT _commit_version, min(_commit_timestamp) FROM {schema.qualified(target)} GROUP BY 1"
    )
    return {v: ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts for v, ts in rows}


# -- a replicated Delta table, commit times from Delta ------------------------------------------------------


def test_compact_replicated_table(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "events")
    create_table(spark, path, COLS)  # v0
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, concat('n', id) FROM range(30)")  # v1
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 5")  # v2: old tombstones 0..4
    spark.sql(f"UPDATE delta.`{path}` SET name = 'u' WHERE id BETWEEN 10 AND 14")  # v3: pre-images, live keys
    spark.sql(f"UPDATE delta.`{path}` SET id = id + 100 WHERE id IN (20, 21)")  # v4: keys 20, 21 gone
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id BETWEEN 5 AND 7")  # v5: young tombstones 5..7
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (0, 'back')")  # v6: key 0 alive again
    target = TargetName(database, "events")
    cli.replicate("run", path, target, "--once")
    assert_replicated(spark, sink, path, target)

    # Tombstones of v5 and later are young: a cutoff exactly at v5's commit time, seen from far ahead.
    times = commit_times(sink, target)
    assert times[2] < times[4] < times[5]
    now = times[5] + timedelta(days=1000)
    before = final_rows(sink, target)
    young_before = sink.query_rows(
        f"SELECT * FROM {schema.qualified(target)} WHERE _is_deleted = 1 AND _commit_version = 5 ORDER BY id"
    )
    rows_before = count(sink, target)

    result = compact(sink, target, timedelta(days=1000), now=now)

    assert (result.tombstones_before, result.dropped, result.kept) == (9, 6, 3)
    assert result.optimized and result.recovered == 0
    assert result.cutoff == times[5]
    assert result.rows_before == rows_before and result.rows_after == count(sink, target)
    assert final_rows(sink, target) == before
    assert_replicated(spark, sink, path, target)
    # Old tombstones gone with every older version of their keys; young ones kept as they were.
    assert tombstone_ids(sink, target) == [5, 6, 7]
    assert count(sink, target, "id IN (1, 2, 3, 4, 20, 21)") == 0
    assert count(sink, target, "id = 0") == 1  # re-inserted key: its live row only
    assert (
        sink.query_rows(f"SELECT * FROM {schema.qualified(target)} WHERE _is_deleted = 1 ORDER BY id")
        == young_before
    )
    live = count(sink, target, "_is_deleted = 0")
    assert live == len(before) and result.rows_after == live + 3
    assert cleanup_enabled(sink, target)
    assert leftovers(sink, target) == []
    assert result.as_dict()["cutoff"] == times[5].isoformat(timespec="milliseconds")

    # Again: nothing old is left, so the table is not rewritten.
    again = compact(sink, target, timedelta(days=1000), now=now)
    assert (again.tombstones_before, again.dropped, again.kept, again.optimized) == (3, 0, 3, False)
    assert tombstone_ids(sink, target) == [5, 6, 7]

    # Replication goes on: a compacted key comes back, another is deleted.
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'one again')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 8")
    cli.replicate("run", path, target, "--once")
    assert_replicated(spark, sink, path, target)

    # No --older-than: every tombstone goes.
    before = final_rows(sink, target)
    everything = compact(sink, target, None)
    assert everything.cutoff is None and everything.kept == 0 and everything.dropped == 4
    assert tombstone_ids(sink, target) == []
    assert final_rows(sink, target) == before
    assert_replicated(spark, sink, path, target)
    assert everything.rows_after == count(sink, target) == len(before)


# -- hand-made rows: chosen commit times, a two-column key ----------------------------------------------------

TYPES = {"tenant": "String", "id": "Int64", "name": "Nullable(String)"}
KEY = ("tenant", "id")
INSERT_COLUMNS = "tenant, id, name, _commit_version, _commit_timestamp, _change_type, _is_deleted, _version"


def hand_table(sink, database: str, name: str = "hand") -> TargetName:
    target = TargetName(database, name)
    ddl.create_target(sink, target, TYPES, TableDesign(KEY))
    return target


def insert(sink, target: TargetName, rows: list[tuple]) -> None:
    """rows: (tenant, id, name, commit version, commit time, change type); tombstone and _version follow."""
    values = []
    for tenant, id_, name, version, ts, change in rows:
        deleted = int(change in ("delete", "update_preimage"))
        rank = {"insert": 3, "update_postimage": 3, "delete": 2, "update_preimage": 1}[change]
        stamp = ts.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        name_sql = "NULL" if name is None else schema.literal(name)
        values.append(
            f"({schema.literal(tenant)}, {id_}, {name_sql}, {version}, {schema.literal(stamp)}, "
            f"{schema.literal(change)}, {deleted}, {version * 4 + rank})"
        )
    sink.command(
        f"INSERT INTO {schema.qualified(target)} ({INSERT_COLUMNS}) VALUES {', '.join(values)}",
        settings={"insert_deduplicate": 0},
    )


def history(sink, target: TargetName) -> datetime:
    """Three tenants' keys over five commits; returns the real time the young commits are relative to."""
    now = datetime.now(timezone.utc)
    old, young = now - timedelta(days=30), now - timedelta(days=1)
    insert(sink, target, [("a", i, f"a{i}", 1, old - timedelta(days=1), "insert") for i in range(6)])
    insert(sink, target, [("b", i, f"b{i}", 1, old - timedelta(days=1), "insert") for i in range(6)])
    insert(sink, target, [("a", 1, "a1", 2, old, "delete"), ("a", 2, "a2", 2, old, "delete")])  # old
    insert(sink, target, [("b", 1, "b1", 3, young, "delete")])  # young; ("a", 1) stays gone
    insert(
        sink,
        target,
        [("a", 3, "a3", 4, young, "update_preimage"), ("a", 3, "A3", 4, young, "update_postimage")],
    )
    insert(sink, target, [("b", 2, "b2", 5, old, "delete"), ("b", 2, "again", 5, old, "insert")])  # alive
    return now


def test_compact_hand_made_tombstones(sink, cli, database):
    """Through the command users run: `cdc2ch compact --target ... --older-than 7d`."""
    target = hand_table(sink, database)
    history(sink, target)
    before = final_rows(sink, target, "tenant, id")

    result = json.loads(cli("compact", "--target", str(target), "--older-than", "7d", "--json").stdout)

    assert (result["tombstones_before"], result["dropped"], result["kept"]) == (3, 2, 1)
    assert final_rows(sink, target, "tenant, id") == before
    assert sink.query_rows(f"SELECT tenant, id FROM {target} WHERE _is_deleted = 1") == [("b", 1)]
    assert count(sink, target, "tenant = 'a' AND id IN (1, 2)") == 0
    assert result["rows_after"] == count(sink, target) == len(before) + 1
    assert cleanup_enabled(sink, target) and leftovers(sink, target) == []
    text = cli("compact", "--target", str(target), "--older-than", "7d").stdout
    assert "dropped 0 of 1 tombstones" in text
    assert (
        "is not a duration" in cli("compact", "--target", str(target), "--older-than", "7x", expect=2).stderr
    )
    assert "does not exist" in cli("compact", "--target", f"{database}.nope", expect=2).stderr


def test_young_tombstone_written_during_compaction_is_kept(sink, database):
    """A replicator may insert while compact runs: a tombstone arriving after the young ones were copied
    aside, before the cleanup merge, is still there afterwards (caught by the side table's view)."""
    target = hand_table(sink, database)
    now = history(sink, target)
    written = []

    def replicator(what):
        if what == "copy the young tombstones aside" and not written:
            insert(sink, target, [("a", 5, "a5", 6, now, "delete")])
            written.append(1)

    before = final_rows(sink, target, "tenant, id")
    result = compact(SinkTap(sink, after_command=replicator), target, timedelta(days=7))
    assert written and result.dropped == 2
    assert sink.query_rows(f"SELECT tenant, id FROM {target} WHERE _is_deleted = 1 ORDER BY tenant, id") == [
        ("a", 5),
        ("b", 1),
    ]
    assert final_rows(sink, target, "tenant, id") == [r for r in before if r[:2] != ("a", 5)]
    assert leftovers(sink, target) == []


def test_interrupted_after_cleanup_is_finished_by_next_run(sink, database):
    target = hand_table(sink, database)
    history(sink, target)
    before = final_rows(sink, target, "tenant, id")

    def crash(what):
        if what == "merge the table with CLEANUP":
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        compact(SinkTap(sink, after_command=crash), target, timedelta(days=7))
    # The young tombstone is only in the side table now; FINAL shows the same either way.
    assert tombstone_ids(sink, target) == []
    assert final_rows(sink, target, "tenant, id") == before
    assert sorted(leftovers(sink, target)) == [target.table + SIDE_SUFFIX, target.table + VIEW_SUFFIX]

    result = compact(sink, target, timedelta(days=7))
    assert result.recovered == 1 and result.dropped == 0 and result.kept == 1
    assert sink.query_rows(f"SELECT tenant, id FROM {target} WHERE _is_deleted = 1") == [("b", 1)]
    assert final_rows(sink, target, "tenant, id") == before
    assert leftovers(sink, target) == []


def side_table(sink, target: TargetName) -> TargetName:
    """The side table of a compaction that set tombstones aside, as if its process died then."""
    side = TargetName(target.database, target.table + SIDE_SUFFIX)
    sink.command(
        f"CREATE TABLE {schema.qualified(side)} AS {schema.qualified(target)} ENGINE = MergeTree ORDER BY tuple()"
    )
    return side


def test_side_table_left_behind_is_put_back(sink, database):
    target = hand_table(sink, database)
    history(sink, target)
    side = side_table(sink, target)
    lost = datetime.now(timezone.utc) - timedelta(hours=1)
    insert(sink, side, [("c", 9, "c9", 7, lost, "delete")])  # set aside, then the process died
    insert(sink, side, [("b", 1, "b1", 3, lost, "delete")])  # also still in the table: not doubled
    before = final_rows(sink, target, "tenant, id")

    result = compact(sink, target, timedelta(days=7))

    assert result.recovered == 1
    assert leftovers(sink, target) == []
    assert final_rows(sink, target, "tenant, id") == before
    assert sink.query_rows(f"SELECT tenant, id FROM {target} WHERE _is_deleted = 1 ORDER BY tenant, id") == [
        ("b", 1),
        ("c", 9),
    ]


def test_a_service_compaction_finishes_an_interrupted_one_and_is_recorded(sink, database):
    """The service's path (fleet/upkeep.py) on the real engine: due at once without a record, it puts back
    what an interrupted compaction had set aside, records itself, and is not due again before its interval;
    a compaction that fails is counted and leaves replication alone."""
    target = hand_table(sink, database)
    history(sink, target)
    side = side_table(sink, target)
    lost = datetime.now(timezone.utc) - timedelta(hours=1)
    insert(sink, side, [("c", 9, "c9", 7, lost, "delete")])  # set aside, then the service was killed
    before = final_rows(sink, target, "tenant, id")
    cfg = RunConfig("/t", ("tenant", "id"), target, "chdb:///x", "p", compact_every=timedelta(hours=1),
                    compact_older_than=timedelta(days=7))  # fmt: skip
    metrics = Metrics()
    ports = service_ports(None, sink)
    keeper = Upkeep(ports.compactions, ports.compact)

    assert keeper.after_turn(cfg, metrics.pipeline("p"))
    assert leftovers(sink, target) == [] and final_rows(sink, target, "tenant, id") == before
    assert ("c", 9) in sink.query_rows(f"SELECT tenant, id FROM {target} WHERE _is_deleted = 1")
    recorded = CompactStore(sink, database).load_all()[str(target)]
    assert recorded.finished_at > lost and recorded.removed_total == recorded.removed
    assert not keeper.after_turn(cfg, metrics.pipeline("p"))  # due again in an hour
    assert not Upkeep(ports.compactions, ports.compact).after_turn(
        cfg, metrics.pipeline("p")
    )  # a restarted service reads the record

    gone = replace(cfg, pipeline="q", target=TargetName(database, "gone"))
    assert not keeper.after_turn(gone, metrics.pipeline("q"))
    assert metrics.registry.get_sample_value("cdc2ch_compaction_failures_total", {"pipeline": "q"}) == 1


# -- errors -------------------------------------------------------------------------------------------------


def test_missing_target(sink, database):
    with pytest.raises(ConfigError, match=rf"{database}\.nope does not exist.*cdc2ch status"):
        compact(sink, TargetName(database, "nope"), None)


def test_not_a_cdc2ch_table(sink, database):
    sink.ensure_database(database)
    plain = TargetName(database, "plain")
    sink.command(
        f"CREATE TABLE {schema.qualified(plain)} (id Int64, v String) ENGINE = MergeTree ORDER BY id"
    )
    with pytest.raises(ConfigError, match=r"not a table cdc2ch replicates into.*_is_deleted.*MergeTree"):
        compact(sink, plain, None)
    replacing = TargetName(database, "replacing")
    sink.command(
        f"CREATE TABLE {schema.qualified(replacing)} (id Int64, _commit_timestamp DateTime64(3), "
        f"_is_deleted UInt8, _version UInt64) ENGINE = ReplacingMergeTree(_version) ORDER BY id"
    )
    with pytest.raises(ConfigError, match=r"engine is ReplacingMergeTree, not ReplacingMergeTree\(_version"):
        compact(sink, replacing, None)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        ("0", timedelta(0)),
        ("1d12h", timedelta(days=1, hours=12)),
        (" 7D ", timedelta(days=7)),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text, "--older-than") == expected


@pytest.mark.parametrize("text", ["", "7", "7x", "d", "-1d", "1.5h", "7 days", "99999999999999d"])
def test_parse_duration_rejects(text):
    with pytest.raises(ConfigError, match=r"--older-than .* is not a duration.*e\.g\. 7d"):
        parse_duration(text, "--older-than")
