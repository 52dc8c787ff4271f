"""Pure pieces: range planning, row estimates, names, type mapping, quoting (no Spark, no ClickHouse)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from cdc2ch.config import TargetName
from cdc2ch.errors import ConfigError, SourceError
from cdc2ch.pipeline import plan_ranges
from cdc2ch.schema import clickhouse_type, column_types, quote
from cdc2ch.sink.server import redact
from cdc2ch.source.delta import Commit, estimate_change_rows

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def commits(*rows):
    return [Commit(v, T0, "WRITE", n) for v, n in enumerate(rows, start=3)]


def test_plan_ranges_groups_by_estimated_rows_and_never_splits_a_version():
    assert plan_ranges(commits(10, 10, 10), max_rows=100) == [(3, 5)]
    assert plan_ranges(commits(60, 60, 10, 500, 1), max_rows=100) == [(3, 3), (4, 5), (6, 6), (7, 7)]
    assert plan_ranges(commits(*[0] * 10), max_rows=100, max_versions=4) == [(3, 6), (7, 10), (11, 12)]
    assert plan_ranges([], max_rows=100) == []


def test_estimates_cover_every_changed_row():
    assert estimate_change_rows("WRITE", {"mode": "Append"}, {"numOutputRows": "100"}) == 100
    assert (
        estimate_change_rows("UPDATE", {"predicate": "[]"}, {"numUpdatedRows": "5", "numCopiedRows": "95"})
        >= 10
    )
    merge = {
        "numTargetRowsInserted": "3",
        "numTargetRowsUpdated": "4",
        "numTargetRowsDeleted": "2",
        "numOutputRows": "50",
    }
    assert estimate_change_rows("MERGE", {}, merge) >= 3 + 2 * 4 + 2
    overwrite = {"numOutputRows": "100", "numOutputBytes": "1000", "numRemovedBytes": "3000"}
    assert estimate_change_rows("WRITE", {"mode": "Overwrite"}, overwrite) == 100 + 300


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
    with pytest.raises(SourceError, match="variant"):
        clickhouse_type("variant", True, "v")
    schema = {
        "fields": [
            {"name": "id", "type": "long", "nullable": True},
            {"name": "_change_type", "type": "string", "nullable": True},
        ]
    }
    assert column_types(schema, ("id",)) == {"id": "Int64"}  # keys are never Nullable; CDF columns dropped
    with pytest.raises(SourceError, match="reserves"):
        column_types(
            {"fields": [{"name": "_version", "type": "long"}, {"name": "id", "type": "long"}]}, ("id",)
        )


def test_quoting_and_redaction():
    assert quote("select") == "`select`"
    assert quote("a`b c.d") == "`a\\`b c.d`"
    assert redact("http://u:secret@h:8123/db") == "http://u:***@h:8123/db"
