"""`--reader auto`: ClickHouse reads a local table itself on the embedded engine (no JVM starts), and Spark
reads what ClickHouse would read differently or cannot reach; either way FINAL equals Delta."""

from __future__ import annotations

import threading

import pytest

from cdc2ch.base.errors import SourceError
from cdc2ch.clickhouse.writers.pushdown import LakeFunctionReader
from cdc2ch.fleet.runner import Runner
from cdc2ch.model.config import TargetName
from cdc2ch.replication import readers
from cdc2ch.replication.metrics import Metrics
from cdc2ch.replication.pipeline import Replicator
from cdc2ch.replication.target import clickhouse_snapshotter
from cdc2ch.source import open_source
from cdc2ch.source.spark.lazysession import LazySpark
from tests.support.helpers import assert_replicated, committed_version, create_table, job_config, orders


def recording(spark, started: list[str]) -> LazySpark:
    """A lazy session that hands out the test's session and records why it was asked for."""

    def start(settings, what, stop):
        started.append(what)
        return spark

    return LazySpark(start)


def test_auto_reads_a_local_table_through_clickhouse_without_a_jvm(spark, sink, database, tmp_path, chdb_dsn):
    path = str(tmp_path / "orders")
    orders(spark, path)
    changes, copy = TargetName(database, "orders"), TargetName(database, "orders_copy")
    started: list[str] = []

    cfg = job_config(path, changes, chdb_dsn, reader="auto")
    Runner([cfg], recording(spark, started), sink, threading.Event(), Metrics()).run()
    snapshot = job_config(path, copy, chdb_dsn, reader="auto")
    clickhouse_snapshotter(snapshot, open_source(recording(spark, started), path), sink).run()

    assert started == []  # ClickHouse read every row: no Spark session was asked for
    assert committed_version(sink, database, str(changes)) == 3
    assert_replicated(spark, sink, path, changes)
    assert_replicated(spark, sink, path, copy)

    # A running pipeline meets a TIMESTAMP column, which ClickHouse would read differently: it stops before
    # that range, its offset where it was; the next attempt chooses Spark and goes on.
    job = Replicator(cfg, open_source(recording(spark, started), path), sink)
    job.start()
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (at TIMESTAMP)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (4, 'd', TIMESTAMP'2299-12-31 23:59:59')")
    try:
        with pytest.raises(
            SourceError, match="changed since --reader auto chose ClickHouse's reader"
        ) as stop:
            job.step()
    finally:
        job.close()
    assert "TIMESTAMP columns (at)" in str(stop.value) and "with version 3 committed" in str(stop.value)
    assert committed_version(sink, database, str(changes)) == 3 and started == []
    Runner([cfg], recording(spark, started), sink, threading.Event(), Metrics()).run()
    assert started and committed_version(sink, database, str(changes)) == 5
    assert_replicated(spark, sink, path, changes)


def test_auto_leaves_timestamps_and_server_targets_to_spark(
    spark, sink, http_sink, database, tmp_path, chdb_dsn
):
    path = str(tmp_path / "events")
    create_table(spark, path, "id BIGINT, at TIMESTAMP")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, TIMESTAMP'2026-01-01 10:00:00'), (2, NULL)")
    spark.sql(f"UPDATE delta.`{path}` SET at = TIMESTAMP'2299-12-31 23:59:59' WHERE id = 2")
    target = TargetName(database, "events")
    started: list[str] = []

    cfg = job_config(path, target, chdb_dsn, reader="auto")
    Runner([cfg], recording(spark, started), sink, threading.Event(), Metrics()).run()
    assert started and all("through Spark" in why for why in started)
    assert_replicated(spark, sink, path, target)  # 2299 arrives as written, which ClickHouse's reader wraps

    plain = str(tmp_path / "plain")
    create_table(spark, plain, "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{plain}` VALUES (1, 'a')")
    source = open_source(spark, plain)
    remote = http_sink.task_client is not None
    on_server = readers.resolved(
        replace_reader(cfg), source, remote, LakeFunctionReader(http_sink.has_setting)
    )
    lake = LakeFunctionReader(sink.has_setting)
    embedded = readers.resolved(replace_reader(cfg), source, sink.task_client is not None, lake)
    assert (on_server.reader, embedded.reader) == ("spark", "clickhouse")


def replace_reader(cfg):
    from dataclasses import replace

    return replace(cfg, reader="auto")


def test_a_local_pattern_read_by_clickhouse_needs_no_java(tmp_path):
    """Listing a local pattern, choosing the reader and replicating each table: no JVM anywhere."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from tests.e2e.commands.test_no_java import cdc2ch, no_java_env, rows_of

    env, lake, dsn = no_java_env(tmp_path), tmp_path / "lake", f"chdb://{tmp_path / 'clickhouse'}"
    cdf = {"delta.enableChangeDataFeed": "true"}
    for name, ids in (("orders", [1, 2, 3]), ("customers", [7, 8])):
        rows = pa.table({"id": pa.array(ids, pa.int64()), "name": [f"{name}{i}" for i in ids]})
        write_deltalake(str(lake / name), rows, configuration=cdf)
        write_deltalake(str(lake / name), rows.slice(0, 1), mode="overwrite", configuration=cdf)
    (lake / "notes").mkdir()  # not a Delta table: reported and skipped
    ran = cdc2ch(env, "run", "--once", "--reader", "auto", "--table", f"{lake}/*", "--primary-key", "id",
                 "--target", "shop.{table}", "--clickhouse", dsn, "--log-format", "json")  # fmt: skip
    assert '"table_skipped"' in ran.stderr and ran.stderr.count('"reason": "ClickHouse reads this local') == 2
    assert rows_of(env, dsn, "shop.orders") == [(1, "orders1")]
    assert rows_of(env, dsn, "shop.customers") == [(7, "customers7")]
