"""Spark only when Spark reads: the commands that read no rows through Spark run with no Java reachable, a
read that needs Spark says so in one paragraph, and a service starts Spark at its first read, not before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cdc2ch.model.config import TargetName
from tests.support.helpers import assert_replicated, committed_version, job_config, orders

ROOT = Path(__file__).resolve().parents[3]


def no_java_env(tmp_path: Path) -> dict:
    """The environment with no `java` reachable: PATH holds only this interpreter, JAVA_HOME is unset."""
    bin_dir = tmp_path / "bin-without-java"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env.update(PATH=str(bin_dir), PYTHONPATH=str(ROOT))
    assert shutil.which("java", path=env["PATH"]) is None
    return env


def cdc2ch(env: dict, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "cdc2ch", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == expect, (
        f"cdc2ch {' '.join(args)} exited {proc.returncode}, expected {expect}\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    )
    return proc


def rows_of(env: dict, dsn: str, target: str) -> list[tuple]:
    """FINAL's live rows of `target` (id, name), read by `cdc2ch query` in its own process (the embedded
    directory belongs to one process at a time)."""
    sql = f"SELECT id, name FROM {target} FINAL WHERE _is_deleted = 0 ORDER BY id"
    out = cdc2ch(env, "query", sql, "--format", "JSONEachRow", "--clickhouse", dsn).stdout
    return [(r["id"], r["name"]) for r in map(json.loads, out.splitlines())]


def test_commands_that_read_no_rows_through_spark_need_no_java(spark, tmp_path):
    env = no_java_env(tmp_path)
    path, dsn = str(tmp_path / "orders"), f"chdb://{tmp_path / 'clickhouse'}"
    orders(spark, path)
    expected = sorted((r.id, r.name) for r in spark.read.format("delta").load(path).collect())
    table = ["--table", path, "--primary-key", "id", "--clickhouse", dsn, "--log-format", "json"]

    # ClickHouse reads a local table's change feed itself: a first run, no JVM
    cdc2ch(env, "run", "--once", "--reader", "clickhouse", "--target", "shop.orders", *table)
    assert rows_of(env, dsn, "shop.orders") == expected
    # nothing new: the default (Spark) reader starts nothing
    polled = cdc2ch(env, "run", "--once", "--target", "shop.orders", *table)
    assert "committed" not in [json.loads(line).get("event") for line in polled.stderr.splitlines()]
    status = json.loads(cdc2ch(env, "status", "--format", "json", "--clickhouse", dsn).stdout)
    assert [(s["pipeline"], s["committed_version"], s["versions_behind"]) for s in status] == [
        ("shop.orders", 3, 0)
    ]
    checked = cdc2ch(env, "validate", "--target", "shop.orders", *table).stdout
    assert "resumes at version 4" in checked and "FAIL" not in checked
    assert "duplicate keys not checked" in checked and "needs Java" in checked  # the one Spark check
    # a snapshot ClickHouse reads: its files and schema come from the log
    cdc2ch(env, "snapshot", "--reader", "clickhouse", "--target", "shop.copy", *table)
    assert rows_of(env, dsn, "shop.copy") == expected


def test_a_read_that_needs_spark_without_java_says_so_and_writes_nothing(spark, tmp_path):
    env = no_java_env(tmp_path)
    path, dsn = str(tmp_path / "orders"), f"chdb://{tmp_path / 'clickhouse'}"
    orders(spark, path)
    table = ["--table", path, "--primary-key", "id", "--clickhouse", dsn, "--log-format", "json"]
    cdc2ch(env, "run", "--once", "--target", "shop.orders", *table)  # the default reader: no Java needed here
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (4, 'd')")

    for target in ("shop.orders", "shop.fresh"):  # a pipeline with an offset, and a new one
        failed = cdc2ch(env, "run", "--once", "--reader", "spark", "--target", target, *table, expect=1)
        last = failed.stderr.strip().splitlines()[-1]
        assert "Traceback" not in failed.stderr and "JAVA_GATEWAY_EXITED" not in failed.stderr
        final = json.loads(last)  # the command's last word: one paragraph, its exit code
        message = final["message"]
        assert final["exit_code"] == 1 and "\n" not in message
        assert f"Reading the changes of {path} through Spark needs Java" in message
        assert "Install Java 17" in message and "JAVA_HOME" in message and "--reader clickhouse" in message
    # verify reads the Delta side through Spark, whatever the reader
    failed = cdc2ch(env, "verify", "--reader", "clickhouse", "--target", "shop.orders", *table, expect=1)
    assert f"Reading version 3 of {path} through Spark needs Java" in failed.stderr
    assert "Traceback" not in failed.stderr
    sql = (
        "SELECT pipeline, committed_version FROM shop.cdc2ch_state FINAL "
        "UNION ALL SELECT name, 0 FROM system.tables WHERE database = 'shop' AND name = 'fresh'"
    )
    out = cdc2ch(env, "query", sql, "--format", "JSONEachRow", "--clickhouse", dsn).stdout
    assert [json.loads(r) for r in out.splitlines()] == [{"pipeline": "shop.orders", "committed_version": 3}]


def test_a_service_polls_without_spark_then_starts_it_for_a_new_commit(
    spark, sink, database, tmp_path, chdb_dsn
):
    from cdc2ch.fleet.runner import Runner
    from cdc2ch.replication.metrics import Metrics
    from cdc2ch.source.spark.lazysession import LazySpark

    path = str(tmp_path / "orders")
    orders(spark, path)
    target = TargetName(database, "orders")
    started: list[str] = []

    def start(settings, what, stop):  # the test's session stands for the one `run` would start
        started.append(what)
        return spark

    first = job_config(path, target, chdb_dsn, reader="clickhouse")
    Runner([first], LazySpark(start), sink, threading.Event(), Metrics()).run()
    assert started == [] and committed_version(sink, database, str(target)) == 3

    cfg = replace(job_config(path, target, chdb_dsn, poll_interval=0.1), once=False)
    metrics, stop, failed = Metrics(), threading.Event(), []
    lazy = LazySpark(start, on_start=lambda s: setattr(metrics, "jvm_pid", -1))

    def serve() -> None:
        try:
            Runner([cfg], lazy, sink, stop, metrics).run()
        except BaseException as exc:
            failed.append(exc)

    service = threading.Thread(target=serve)
    service.start()
    try:
        time.sleep(2)  # a score of polls, each finding nothing new
        assert not failed and started == [] and lazy.started is None and metrics.jvm_pid is None
        spark.sql(f"UPDATE delta.`{path}` SET name = 'y' WHERE id = 1")
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (5, 'e')")
        deadline = time.monotonic() + 120
        while (
            committed_version(sink, database, str(target)) < 5 and time.monotonic() < deadline and not failed
        ):
            time.sleep(0.2)
    finally:
        stop.set()
        service.join(60)
    assert not failed, failed
    assert started == [f"reading the changes of {path} through Spark"] and metrics.jvm_pid == -1
    assert committed_version(sink, database, str(target)) == 5
    assert_replicated(spark, sink, path, target)


def bare(node):
    """A schema without field metadata: names, types and nullability, at every depth (what cdc2ch uses)."""
    if isinstance(node, dict):
        return {k: bare(v) for k, v in node.items() if k != "metadata"}
    return [bare(i) for i in node] if isinstance(node, list) else node


def test_the_log_read_by_python_answers_as_spark_does(spark, tmp_path):
    """Schema (table and change feed), properties, protocol, table id and a version's files, read from the log
    by Python, equal what Spark and Delta's JVM answer: column mapping, renames, added columns, type
    widening, deletion vectors, NOT NULL and nested types, across checkpoints."""
    from cdc2ch.source.spark.lazysession import LazySpark
    from cdc2ch.source.sparkread.deltasource import DeltaSource
    from cdc2ch.source.sparkread.snapshotframe import file_path
    from cdc2ch.source.sparkread.tablemeta import JvmMetadata

    path = str(tmp_path / "zoo")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT NOT NULL, s STRING, n SMALLINT, m MAP<STRING, INT>, "
        "a ARRAY<STRUCT<x: INT, y: DECIMAL(10, 2)>>, t TIMESTAMP, d DATE) USING delta TBLPROPERTIES "
        "(delta.enableChangeDataFeed = true, delta.columnMapping.mode = 'name', delta.checkpointInterval = 3, "
        "delta.enableDeletionVectors = true, delta.enableTypeWidening = true)"
    )
    row = (
        "map('k', 1), array(named_struct('x', 1, 'y', 2.5)), timestamp'2024-01-01 10:00:00', date'2024-01-01'"
    )
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, CAST(id AS STRING), 1, {row} FROM range(20)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 3 = 0")  # deletion vectors
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (extra STRING)")
    spark.sql(f"ALTER TABLE delta.`{path}` RENAME COLUMN s TO name")
    spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN n TYPE INT")
    spark.sql(f"UPDATE delta.`{path}` SET extra = 'x', n = 100000 WHERE id = 1")
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, 'late', 2, {row}, 'y' FROM range(20, 25)")
    python = DeltaSource(
        LazySpark(lambda settings, what, stop: pytest.fail(f"Spark started for {what}")), path
    )
    jvm = DeltaSource(spark, path)
    latest = python.latest_version()
    assert latest == 7 and any(".checkpoint." in f for f in os.listdir(f"{path}/_delta_log"))
    for version in range(latest + 1):
        table = spark.read.format("delta").option("versionAsOf", version).load(path)
        assert bare(python.schema_at(version)) == bare(table.schema.jsonValue()), version
    for start, end in ((1, 1), (2, 6), (7, 7)):
        assert bare(python.changes(start, end).schema) == bare(
            jvm.changes(start, end).frame.schema.jsonValue()
        )
    # Delta's own log object in the JVM, as a table on storage only Spark reaches is read
    by_jvm = JvmMetadata(lambda: spark, path, lambda: None, jvm.snapshot)
    assert python.properties() == by_jvm.properties() and python.protocol() == by_jvm.protocol()
    assert python.table_id() == by_jvm.table_id()
    assert python.mapped_schema(latest) == by_jvm.mapped_schema(latest)
    for version in (1, 2, latest):
        files = python.snapshot_files(version)
        table = spark.read.format("delta").option("versionAsOf", version).load(path)
        assert [f for f, _ in files] == sorted(file_path(f) for f in table.inputFiles())
        assert sum(n for _, n in files) == table.count()
    # Each version above was answered from Spark's checksum files: the checkpoint and the commits, read
    # without them, give the same states.
    summed = {v: python.table_state(v) for v in range(latest + 1)}
    for crc in (f for f in os.listdir(f"{path}/_delta_log") if f.endswith(".crc")):
        os.remove(f"{path}/_delta_log/{crc}")
    unsummed = DeltaSource(
        LazySpark(lambda settings, what, stop: pytest.fail(f"Spark started for {what}")), path
    )
    assert {v: unsummed.table_state(v) for v in range(latest + 1)} == summed
