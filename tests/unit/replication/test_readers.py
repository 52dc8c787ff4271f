"""What `--reader auto` leaves to Spark, and what `--reader clickhouse` refuses, decided from the table's
place, schema and, on object storage, a probe of the target's reader (faked: no I/O)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from cdc2ch.base.errors import ConfigError, SinkError, SourceError
from cdc2ch.clickhouse.writers.pushdown import LakeFunctionReader
from cdc2ch.model.config import RunConfig, SparkSettings, TargetName
from cdc2ch.replication.readers import (
    check_clickhouse_reads,
    choose,
    place_needs_spark,
    table_needs_spark,
)

pytestmark = pytest.mark.unit


def schema_of(*fields: tuple[str, object]) -> dict:
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True} for n, t in fields]}


def test_a_local_table_on_the_embedded_engine_and_s3_on_any_target_may_be_read_by_clickhouse():
    assert place_needs_spark("/lake/orders", remote_target=False) is None
    assert place_needs_spark("file:///lake/orders", remote_target=False) is None
    assert "server" in place_needs_spark("/lake/orders", remote_target=True)
    for remote in (False, True):  # a probe then decides
        assert place_needs_spark("s3a://lake/orders", remote_target=remote) is None
        assert place_needs_spark("s3://lake/orders", remote_target=remote) is None
    assert "neither on a local path nor on S3" in place_needs_spark("gs://lake/orders", remote_target=True)
    assert "neither on a local path nor on S3" in place_needs_spark(
        "https://sharing.example.com/delta-sharing/", remote_target=False
    )
    # keys only in Spark's conf: the embedded engine does not have them; a server has its own
    assert "Spark conf" in place_needs_spark("s3a://lake/orders", False, keys_in_spark_conf=True)
    assert place_needs_spark("s3a://lake/orders", True, keys_in_spark_conf=True) is None


class ProbedLake:
    """The target's reader as `auto` sees it: the rows it reads of each file, or a failure."""

    def __init__(self, read: dict[str, int] | Exception):
        self.read, self.probed = read, []

    def lacks(self) -> None:
        return None

    def probe(self, cfg, location: str, version: int) -> dict[str, int]:
        self.probed.append((cfg.lake_collection, location, version))
        if isinstance(self.read, Exception):
            raise self.read
        return self.read

    def credentials(self, cfg) -> str:
        return f"the named collection {cfg.lake_collection}"


def s3_table(files: list[tuple[str, int | None]] | None, features: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        uri="s3a://lake/orders",
        location="s3a://lake/orders",
        latest=lambda: SimpleNamespace(version=7),
        schema_at=lambda version: schema_of(("id", "long"), ("name", "string")),
        protocol=lambda: features or {},
        properties=lambda: {},
        snapshot_files=lambda version: files,
    )


def s3_config(**options) -> RunConfig:
    return RunConfig("s3a://lake/orders", ("id",), TargetName("db", "t"), "chdb:///mem", "db.t", **options)


FILES = [("lake/orders/a.parquet", 10), ("lake/orders/b.parquet", 5)]


@pytest.mark.parametrize("remote", [False, True])
def test_auto_has_clickhouse_read_s3_where_a_probe_reads_the_logs_rows_and_spark_elsewhere(remote):
    cfg = s3_config(lake_collection="lake")
    same = ProbedLake({"lake/orders/a.parquet": 10, "lake/orders/b.parquet": 5})
    chosen = choose(cfg, s3_table(FILES), remote, same)
    assert chosen.reader == "clickhouse" and "named collection lake" in chosen.reason, chosen
    assert "probe at version 7" in chosen.reason and same.probed == [("lake", "s3a://lake/orders", 7)]
    assert choose(cfg, s3_table(FILES), remote, same, version=3).reason.count("version 3") == 1

    # another table behind the same URL, rows it does not see, or a read that fails: Spark, with the reason
    other = choose(cfg, s3_table(FILES), remote, ProbedLake({"lake/orders/a.parquet": 10}))
    assert other.reader == "spark" and "read 10 rows in 1 files where the log lists 15" in other.reason
    extra = ProbedLake({**same.read, "lake/orders/c.parquet": 1})  # type: ignore[dict-item]
    assert "first difference: lake/orders/c.parquet" in choose(cfg, s3_table(FILES), remote, extra).reason
    denied = ProbedLake(SinkError("ClickHouse at http://ch:8123 failed to read: Access Denied. (S3_ERROR)"))
    failed = choose(cfg, s3_table(FILES), remote, denied)
    assert failed.reader == "spark" and "probe of ClickHouse reading it at version 7 failed" in failed.reason
    assert "Access Denied" in failed.reason
    # a file the log keeps no count for is taken with any count; files it cannot list: no probe at all
    assert (
        choose(cfg, s3_table([*FILES, ("lake/orders/c.parquet", None)]), remote, extra).reader == "clickhouse"
    )
    unlisted = choose(cfg, s3_table(None), remote, same)
    assert unlisted.reader == "spark" and "cannot be listed from its log without Spark" in unlisted.reason

    # features ClickHouse reads differently are refused before any probe
    refused = ProbedLake(same.read)
    feature = choose(cfg, s3_table(FILES, {"readerFeatures": ["someFutureFeature"]}), remote, refused)
    assert feature.reader == "spark" and "someFutureFeature" in feature.reason and refused.probed == []


def test_s3_keys_only_in_sparks_conf_keep_the_embedded_engine_off_the_table_without_a_probe():
    conf = (("spark.hadoop.fs.s3a.access.key", "AKIA"), ("spark.hadoop.fs.s3a.secret.key", "hidden"))
    cfg = s3_config(spark=SparkSettings(conf=conf))
    lake = ProbedLake({"lake/orders/a.parquet": 10, "lake/orders/b.parquet": 5})
    chosen = choose(cfg, s3_table(FILES), False, lake)
    assert chosen.reader == "spark" and "Spark conf" in chosen.reason and lake.probed == []
    assert "hidden" not in chosen.reason and "AKIA" not in chosen.reason
    assert choose(cfg, s3_table(FILES), True, lake).reader == "clickhouse"  # a server has its own


def test_executors_that_insert_what_spark_reads_keep_the_table_with_spark_without_a_probe():
    lake = ProbedLake({"lake/orders/a.parquet": 10, "lake/orders/b.parquet": 5})
    chosen = choose(s3_config(writer="executors"), s3_table(FILES), True, lake)
    assert chosen.reader == "spark" and "--writer executors" in chosen.reason and lake.probed == []
    assert choose(s3_config(writer="driver"), s3_table(FILES), True, lake).reader == "clickhouse"


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


class ProbeSink:
    """The target as a probe uses it: the statement and settings it was sent, and the rows it answers."""

    def __init__(self):
        self.sent: list[tuple[str, dict]] = []

    @contextmanager
    def reads_files(self):
        yield

    def query_rows(self, sql: str, what: str = "", settings: dict | None = None):
        self.sent.append((sql, settings or {}))
        return [("lake/orders/a.parquet", 10)]


def test_a_probe_reads_the_version_and_bounds_the_s3_clients_retries_where_the_server_has_the_settings():
    sink = ProbeSink()
    newer = LakeFunctionReader(lambda name: True, sink)  # type: ignore[arg-type]
    assert newer.probe(s3_config(), "s3a://lake/orders", 7) == {"lake/orders/a.parquet": 10}
    sql, settings = sink.sent[-1]
    assert "GROUP BY _path" in sql and settings["delta_lake_snapshot_version"] == 7
    assert settings["s3_retry_attempts"] <= 3 and settings["s3_max_single_read_retries"] <= 3
    older = LakeFunctionReader(lambda name: name == "delta_lake_snapshot_version", sink)  # type: ignore[arg-type]
    older.probe(s3_config(), "s3a://lake/orders", 7)
    assert sink.sent[-1][1] == {"delta_lake_snapshot_version": 7}  # no setting it would refuse
