"""What `--reader auto` leaves to Spark, and what `--reader clickhouse` refuses, decided from the table's
place and schema (no I/O)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cdc2ch.base.errors import ConfigError, SinkError, SourceError
from cdc2ch.clickhouse.writers.pushdown import LakeFunctionReader
from cdc2ch.replication.readers import check_clickhouse_reads, place_needs_spark, table_needs_spark

pytestmark = pytest.mark.unit


def schema_of(*fields: tuple[str, object]) -> dict:
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True} for n, t in fields]}


def test_only_a_local_table_on_the_embedded_engine_may_be_read_by_clickhouse():
    assert place_needs_spark("/lake/orders", remote_target=False) is None
    assert place_needs_spark("file:///lake/orders", remote_target=False) is None
    assert "server" in place_needs_spark("/lake/orders", remote_target=True)
    assert "local path" in place_needs_spark("s3a://lake/orders", remote_target=False)
    assert "local path" in place_needs_spark(
        "https://sharing.example.com/delta-sharing/", remote_target=False
    )


def test_timestamps_at_any_depth_and_unreadable_features_go_to_spark():
    assert table_needs_spark(schema_of(("id", "long"), ("at", "timestamp_ntz")), {}, {}) is None
    assert table_needs_spark(schema_of(("id", "long"), ("day", "date")), {}, {}) is None
    nested = {
        "type": "array",
        "elementType": {"type": "struct", "fields": [{"name": "t", "type": "timestamp"}]},
    }
    reason = table_needs_spark(schema_of(("id", "long"), ("events", nested)), {}, {})
    assert "TIMESTAMP columns (events)" in reason
    assert "VARIANT" in table_needs_spark(schema_of(("id", "long"), ("v", "variant")), {}, {})
    protocol = {"minReaderVersion": 3, "readerFeatures": ["someFutureFeature"]}
    assert "someFutureFeature" in table_needs_spark(schema_of(("id", "long")), protocol, {})


def test_the_clickhouse_reader_refuses_by_the_tables_location_features_and_the_engines_setting():
    current, old = LakeFunctionReader(lambda name: True), LakeFunctionReader(lambda name: False)
    named = SimpleNamespace(uri="sales.orders", location="gs://lake/orders")
    with pytest.raises(SourceError, match="cannot read gs://lake/orders"):  # the name is no path to it
        check_clickhouse_reads(named, current, schema_of(("id", "long")))
    local = SimpleNamespace(uri="/lake/orders", location="/lake/orders")
    check_clickhouse_reads(local, current, schema_of(("id", "long")), feed=True)
    check_clickhouse_reads(local, old, schema_of(("id", "long")))  # a snapshot reads no change data feed
    with pytest.raises(SinkError, match="needs ClickHouse's setting delta_lake_snapshot_start_version"):
        check_clickhouse_reads(local, old, schema_of(("id", "long")), feed=True)
    assert (current.lacks(), old.lacks()) == (None, "the setting delta_lake_snapshot_start_version")
    variant = schema_of(("id", "long"), ("v", "variant"))
    with pytest.raises(ConfigError, match="VARIANT columns \\(v\\).*, so nothing was written"):
        check_clickhouse_reads(local, current, variant)
    with pytest.raises(ConfigError, match="so replication stopped with version 3 committed"):
        check_clickhouse_reads(
            local, current, variant, outcome="replication stopped with version 3 committed"
        )
