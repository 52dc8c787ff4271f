"""Pure pieces: range planning, row estimates, names, type mapping, quoting (no Spark, no ClickHouse)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.clickhouse.connection.dsn import redact
from cdc2ch.clickhouse.writers import changerows as changes
from cdc2ch.model.changeset import Commit
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign
from cdc2ch.model.schema import clickhouse_type, column_types, quote
from cdc2ch.replication.plan import plan_ranges
from cdc2ch.source.deltalog.commitlog import estimate_rows, file_rows, parse_commit

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def commits(*rows):
    return [Commit(v, T0, "WRITE", n) for v, n in enumerate(rows, start=3)]


def test_plan_ranges_groups_by_estimated_rows_and_never_splits_a_version():
    assert plan_ranges(commits(10, 10, 10), max_rows=100) == [(3, 5)]
    assert plan_ranges(commits(60, 60, 10, 500, 1), max_rows=100) == [(3, 3), (4, 5), (6, 6), (7, 7)]
    assert plan_ranges(commits(*[0] * 10), max_rows=100, max_versions=4) == [(3, 6), (7, 10), (11, 12)]
    assert plan_ranges([], max_rows=100) == []


def _file(path, rows, size, **extra):
    return {"path": path, "size": size, "stats": json.dumps({"numRecords": rows}), **extra}


def test_estimates_come_from_file_statistics():
    # Appends: the rows of the added files; an OPTIMIZE-style rewrite (dataChange false) yields nothing.
    assert estimate_rows([_file("a", 100, 1000), _file("b", 50, 500)], [], []) == 150
    assert (
        estimate_rows(
            [_file("c", 150, 1500, dataChange=False)], [_file("a", 100, 1000, dataChange=False)], []
        )
        == 0
    )
    # Removed files without change files: every row of theirs is a delete.
    assert estimate_rows([_file("n", 70, 700)], [_file("a", 100, 1000)], []) == 170
    # Change files: their bytes at twice the density of this commit's data files.
    assert estimate_rows([_file("n", 100, 1000)], [], [{"path": "cdc", "size": 500}]) == 101
    # ... or exactly, from the counts the operation recorded (Spark's names, delta-rs's), never above the size.
    cdc = [{"path": "cdc", "size": 5000}]
    merge = {"numTargetRowsUpdated": "40", "numTargetRowsInserted": "7", "numTargetRowsDeleted": "3"}
    assert estimate_rows([_file("n", 100, 1000)], [], cdc, merge) == 2 * 40 + 7 + 3
    assert estimate_rows([], [], cdc, {"num_updated_rows": 12, "num_copied_rows": 900}) == 24
    assert estimate_rows([], [], cdc, {"numDeletedRows": "5"}) == 5
    assert estimate_rows([_file("n", 100, 1000)], [], cdc, {"numTargetRowsUpdated": "9000"}) == 1001
    assert estimate_rows([_file("n", 100, 1000)], [], cdc, {"numOutputRows": "3"}) == 1001
    # A removed file without statistics is sized by the bytes per row of the others.
    assert estimate_rows([_file("n", 100, 1000)], [{"path": "x", "size": 300}], []) == 100 + 31
    # A deletion vector on a kept file: only the rows it newly deletes.
    dv = lambda n: {"deletionVector": {"cardinality": n}}  # noqa: E731
    assert estimate_rows([_file("a", 100, 1000, **dv(7))], [_file("a", 100, 1000, **dv(3))], []) == 4


def test_the_file_rows_a_derivation_reads_count_a_re_added_file_once_and_whole():
    dv = {"deletionVector": {"cardinality": 7}}
    adds = [_file("a", 100, 1000, **dv), _file("n", 20, 200), _file("o", 50, 500, dataChange=False)]
    removes = [_file("a", 100, 1000), _file("b", 30, 300), {"path": "x", "size": 400}]
    # a: 100 once; n: 20; b: 30; x by the bytes per row of the others (400 / 10 + 1); o changes no data
    assert file_rows(adds, removes) == 100 + 20 + 30 + 41
    actions = (
        [{"commitInfo": {"operation": "DELETE"}}]
        + [{"add": a} for a in adds]
        + [{"remove": r} for r in removes]
    )
    assert parse_commit(3, "\n".join(json.dumps(a) for a in actions), 0).file_rows == 191


def test_only_row_level_operations_are_sized_from_their_metrics():
    def commit(operation):
        actions = (
            {"commitInfo": {"operation": operation, "operationMetrics": {"numDeletedRows": "5"}}},
            {"add": _file("n", 100, 1000)},
            {"cdc": {"path": "c", "size": 500}},
        )
        return parse_commit(3, "\n".join(json.dumps(a) for a in actions), 0).estimated_rows

    assert commit("DELETE") == 5
    assert commit("WRITE") == 101  # replaceWhere: its metrics need not count every change row


def test_commit_file_parsing():
    text = "\n".join(
        json.dumps(a)
        for a in (
            {"commitInfo": {"timestamp": 5, "operation": "WRITE", "operationParameters": {"mode": "Append"}}},
            {"metaData": {"configuration": {"delta.enableChangeDataFeed": "true"}}},
            {"add": _file("a", 10, 100)},
        )
    )
    commit = parse_commit(4, text, modified_ms=1_700_000_000_000)
    assert (commit.version, commit.operation, commit.estimated_rows, commit.metadata) == (
        4,
        "WRITE",
        10,
        True,
    )
    assert commit.properties == {"delta.enableChangeDataFeed": "true"}
    assert commit.timestamp.timestamp() == 1_700_000_000  # the file's time, as DESCRIBE HISTORY shows
    ict = text.replace('"timestamp": 5', '"timestamp": 5, "inCommitTimestamp": 1800000000000')
    assert parse_commit(4, ict, 0).timestamp.timestamp() == 1_800_000_000


def test_duplicate_keys_are_found_next_to_each_other_in_replay_order():
    rows = pa.table(
        {
            "id": [1, 1, 1, 2, 2, 3, 3],
            "_commit_version": [5, 5, 5, 5, 5, 6, 6],
            "_is_deleted": [0, 0, 0, 1, 0, 0, 0],
            "_version": [23, 23, 23, 22, 23, 27, 27],
        }
    )
    shuffled = rows.take([6, 3, 0, 4, 1, 5, 2])
    found = changes.duplicate_keys(shuffled, ("id",), changes.replay_order(shuffled, ("id",)))
    assert [(d["version"], d["duplicate_keys"], d["extra_rows"]) for d in found] == [(5, 1, 2), (6, 1, 1)]
    # A delete and a re-insert of a key in one commit are not duplicates.
    pair = rows.slice(3, 2)
    assert changes.duplicate_keys(pair, ("id",), changes.replay_order(pair, ("id",))) == []
    # Batches come out in replay order, whatever order the rows arrived in.
    ordered = pa.concat_tables(changes.batches(shuffled, 3, changes.replay_order(shuffled, ("id",))))
    assert ordered.column("_version").to_pylist() == [22, 23, 23, 23, 23, 27, 27]


def test_target_names():
    assert TargetName.parse("db.t") == TargetName("db", "t")
    assert TargetName.parse("t") == TargetName("cdc2ch", "t")
    assert TargetName.parse("`my.db`.`we``ird`") == TargetName("my.db", "we`ird")
    assert TargetName.for_source("s3a://bucket/lake/orders/") == TargetName("cdc2ch", "orders")
    for bad in ("a.b.c", "a..b", "`x"):
        with pytest.raises(ConfigError):
            TargetName.parse(bad)


def test_type_mapping():
    assert clickhouse_type("decimal(38,10)", True) == "Nullable(Decimal(38, 10))"
    assert clickhouse_type("varchar(20)", False) == "String"
    nested = {
        "type": "map",
        "keyType": "string",
        "valueContainsNull": True,
        "valueType": {"type": "array", "elementType": "timestamp", "containsNull": False},
    }
    assert clickhouse_type(nested, True) == "Map(String, Array(DateTime64(6, 'UTC')))"
    assert (
        clickhouse_type("variant", True, "v") == "Nullable(String)"
    )  # its JSON text (docs/reference/table-features.md)
    with pytest.raises(SourceError, match="interval day to second"):
        clickhouse_type("interval day to second", True, "v")
    schema = {
        "fields": [
            {"name": "id", "type": "long", "nullable": True},
            {"name": "_change_type", "type": "string", "nullable": True},
        ]
    }
    assert column_types(schema, TableDesign(("id",))) == {
        "id": "Int64"
    }  # keys are never Nullable; CDF columns dropped
    with pytest.raises(SourceError, match="reserves"):
        column_types(
            {"fields": [{"name": "_version", "type": "long"}, {"name": "id", "type": "long"}]},
            TableDesign(("id",)),
        )


def test_quoting_and_redaction():
    assert quote("select") == "`select`"
    assert quote("a`b c.d") == "`a\\`b c.d`"
    assert redact("http://u:secret@h:8123/db") == "http://u:***@h:8123/db"


def test_unreachable_server_is_not_taken_for_bad_credentials():
    """Authentication failures are told by their error code (516), not by those digits anywhere in the
    text: the port here contains them, as query ids sometimes do."""
    import socket

    from cdc2ch.base.errors import SinkError
    from cdc2ch.clickhouse.connection.dsn import connect

    for port in (5160, 15160, 25160, 35160, 45160, 51600, 51601, 51602):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        break
    with pytest.raises(SinkError) as err:
        connect(f"http://default@127.0.0.1:{port}/", retries=1)
    assert "Cannot connect to ClickHouse" in str(err.value), str(err.value)
