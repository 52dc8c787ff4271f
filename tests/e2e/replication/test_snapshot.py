"""`cdc2ch snapshot`: backfill at version N, hand-over to `run`, resumability, late CDF, both readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from cdc2ch.model.config import TargetName
from cdc2ch.replication.target import clickhouse_snapshotter
from cdc2ch.source.sparkread.deltasource import DeltaSource
from tests.support.helpers import (
    SinkTap,
    assert_replicated,
    committed_version,
    create_table,
    delta_rows,
    job_config,
    latest_version,
    out_of_memory_paragraph,
)
from tests.support.processes import kill_9

COLS = "id BIGINT, part STRING, name STRING, amount DECIMAL(18,4), at TIMESTAMP, day DATE"


def _history(spark, path, partitioned: bool):
    create_table(spark, path, COLS, partitioned_by="part" if partitioned else None)
    for i in range(4):
        spark.sql(
            f"INSERT INTO delta.`{path}` SELECT id, IF(id % 3 = 0, 'a', 'b'), concat('n', id), id / 7, "
            f"timestamp_micros(id * 1000003), date_add(DATE'1950-01-01', cast(id AS INT)) "
            f"FROM range({i * 500}, {(i + 1) * 500})"
        )
    spark.sql(f"UPDATE delta.`{path}` SET name = 'upd' WHERE id % 10 = 1")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 2")


def _after(spark, path):
    spark.sql(f"UPDATE delta.`{path}` SET amount = -1 WHERE id % 10 = 3")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 4")
    spark.sql(f"UPDATE delta.`{path}` SET id = id + 100000 WHERE id % 10 = 5")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (999999, 'a', 'late', 1.5, NULL, NULL)")


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
def test_snapshot_then_run(partitioned, spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "t")
    _history(spark, path, partitioned)
    n = latest_version(spark, path)
    _after(spark, path)
    target = TargetName(database, "t")
    snap = cli.replicate("snapshot", path, target, "--version", str(n))
    assert cli.events(snap, "snapshot_done")[0]["version"] == n
    assert committed_version(sink, database, str(target)) == n
    assert_replicated(spark, sink, path, target, n)  # the snapshot alone is the table at N
    assert sink.query_rows(f"SELECT DISTINCT _change_type, _commit_version FROM {database}.t") == [
        ("snapshot", n)
    ]

    run = cli.replicate("run", path, target, "--once")
    assert cli.events(run, "range_read")[0]["start"] == n + 1
    assert_replicated(spark, sink, path, target)


def test_late_cdf_needs_a_snapshot(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "late")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, v STRING) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE delta.`{path}` SET v = 'bb' WHERE id = 2")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    enabled_at = latest_version(spark, path)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'c')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    target = TargetName(database, "late")
    # read from the feed only (by default the versions before it are read from the log)
    args = ("--table", path, "--primary-key", "id", "--target", str(target), "--changes-from", "cdf")

    failed = cli("run", *args, "--from-version", "0", "--once", expect=1)
    err = " ".join(failed.stderr.split())
    assert f"was enabled at version {enabled_at}" in err and f"--version {enabled_at}" in err
    assert sink.query_rows(f"SELECT count() FROM system.tables WHERE database = '{database}'")[0][0] == 0

    cli("snapshot", *args[:-2], "--version", str(enabled_at))
    cli("run", *args, "--once")
    assert_replicated(spark, sink, path, target)


def test_clickhouse_reader_matches_spark_reader(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "readers")
    _history(spark, path, partitioned=True)
    cols = "id, part, name, amount, at, day, _commit_version, _commit_timestamp, _change_type, _is_deleted, _version"
    tables = {}
    for reader in ("spark", "clickhouse"):
        target = TargetName(database, f"by_{reader}")
        cli.replicate(
            "snapshot",
            path,
            target,
            "--reader",
            reader,
            "--max-rows-per-read",
            "700",
        )
        assert_replicated(spark, sink, path, target)
        tables[reader] = sink.query_rows(f"SELECT {cols} FROM {database}.by_{reader} FINAL ORDER BY id")
    assert tables["spark"] == tables["clickhouse"] and len(tables["spark"]) > 1000


def test_snapshot_interleaved_with_run_converges(spark, sink, cli, database, tmp_path):
    """A snapshot at N interrupted, `run` from N + 1 meanwhile, more writes, then the snapshot finishes."""
    path = str(tmp_path / "both")
    spark.conf.set("spark.sql.files.maxRecordsPerFile", "200")  # many files, so several chunks
    try:
        _history(spark, path, partitioned=False)
    finally:
        spark.conf.unset("spark.sql.files.maxRecordsPerFile")
    n = latest_version(spark, path)
    _after(spark, path)
    target = TargetName(database, "both")
    cfg = job_config(path, target, cli.dsn, snapshot_version=n)
    stop = threading.Event()
    chunks = []

    def after_insert(table_sql):
        if "cdc2ch_snapshot_chunks" in table_sql:  # a chunk was recorded as done
            chunks.append(1)
            if len(chunks) == 2:
                stop.set()

    # One Delta file per Spark partition: several chunks, so the snapshot can be stopped midway.
    spark.conf.set("spark.sql.files.maxPartitionBytes", "65536")
    spark.conf.set("spark.sql.files.openCostInBytes", "65536")
    try:
        assert (
            clickhouse_snapshotter(cfg, DeltaSource(spark, path), SinkTap(sink, after_insert), stop).run()
            is None
        )
        cli.replicate(
            "run",
            path,
            target,
            "--once",
            "--from-version",
            str(n + 1),
        )
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 6")
        finish = cli.replicate("snapshot", path, target, "--version", str(n))
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")
    finished = cli.events(finish, "chunk")
    assert finished and len(finished) == finished[0]["of"] - 2  # the two chunks done before were skipped
    assert cli.events(finish, "offset_kept")  # run was already past N
    cli.replicate("run", path, target, "--once")
    assert_replicated(spark, sink, path, target)


def _cdc2ch(*args, env=None):
    return [sys.executable, "-m", "cdc2ch", *args]


def test_killed_snapshot_resumes(spark, tmp_path):
    """SIGKILL a snapshot twice mid-way; the third run finishes with the chunks it had not done."""
    path = str(tmp_path / "kill")
    create_table(spark, path, "id BIGINT, v STRING")
    (
        spark.range(0, 60_000, 1, 30)
        .selectExpr("id", "cast(id * 3 as string) as v")
        .write.format("delta")
        .mode("append")
        .save(path)
    )
    dsn = f"chdb://{tmp_path / 'ch'}"
    args = _cdc2ch(
        "snapshot",
        "--table",
        path,
        "--primary-key",
        "id",
        "--target",
        "k.kill",
        "--clickhouse",
        dsn,
        "--log-format",
        "json",
        "--batch-size",
        "500",
        # One Delta file per Spark partition, so one chunk per file: 30 chunks.
        "--spark-conf",
        "spark.sql.files.maxPartitionBytes=65536",
        "--spark-conf",
        "spark.sql.files.openCostInBytes=65536",
        "--spark-master",
        "local[1]",
        "--reader",
        "spark",
    )
    done_chunks = 0
    for kill_after in (3, 3):
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        seen = 0
        for line in proc.stderr:
            if line.startswith("{") and json.loads(line).get("event") == "chunk":
                seen += 1
                if seen == kill_after:
                    kill_9(proc.pid)
                    break
        proc.wait(timeout=120)
        assert proc.returncode == -signal.SIGKILL
        done_chunks += seen
    final = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    events = [json.loads(ln) for ln in final.stderr.splitlines() if ln.startswith("{")]
    chunk_events = [e for e in events if e["event"] == "chunk"]
    total = chunk_events[0]["of"]
    assert total >= 10 and len(chunk_events) <= total - done_chunks  # finished chunks were skipped

    query = subprocess.run(
        _cdc2ch(
            "query",
            "SELECT id, v FROM k.kill FINAL ORDER BY id",
            "--clickhouse",
            dsn,
            "--format",
            "JSONCompactEachRow",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert query.returncode == 0, query.stderr
    got = [tuple(json.loads(ln)) for ln in query.stdout.splitlines()]
    expected = [(r[0], r[1].decode()) for r in delta_rows(spark, path, columns=["id", "v"])]
    assert sorted(got) == sorted(expected) and len(got) == 60_000  # no duplicates after FINAL


def _one_file(spark, path: str, rows: int, column: str, row_group_bytes: int, mode: str = "error") -> None:
    """`rows` rows (`id` and `column`) in one Parquet file whose row groups hold about `row_group_bytes`."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("parquet.block.size", str(row_group_bytes))
    try:
        spark.range(0, rows, 1, 1).selectExpr("id", column).write.format("delta").mode(mode).save(path)
    finally:
        hadoop.unset("parquet.block.size")


def test_a_read_too_large_for_spark_says_what_to_change(spark, tmp_path):
    """One version of one file of one large row group of wide rows: a snapshot spreads it over chunks of
    --max-rows-per-read rows, each still too large here, and `run` reads the version whole. When that does
    not fit in the JVM (which then exits), each stops with a paragraph naming the cause and the fixes, and
    records no offset; a new pipeline (its first range this one) leaves nothing behind."""
    path = str(tmp_path / "big_version")
    create_table(spark, path, "id BIGINT, pad STRING")
    _one_file(spark, path, 500_000, "repeat('x', 1000) AS pad", row_group_bytes=1 << 30, mode="append")
    dsn = f"chdb://{tmp_path / 'ch'}"
    last = out_of_memory_paragraph(
        "snapshot", "--table", path, "--primary-key", "id", "--target", "k.big", "--reader", "spark", dsn=dsn
    )  # fmt: skip
    assert last.startswith("cdc2ch: error: Spark ran out of memory reading chunk"), last
    assert "500,000 rows each" in last and "spark.driver.memory" in last and "--reader clickhouse" in last
    assert "a lower --max-rows-per-read" in last
    last = out_of_memory_paragraph(
        "run", "--table", path, "--primary-key", "id", "--target", "k.big", "--once", "--from-version", "1",
        "--reader", "spark", dsn=dsn,
    )  # fmt: skip
    assert last.startswith("cdc2ch: error: Spark ran out of memory reading the change data feed for"), last
    assert "--max-rows-per-read" in last and "spark.driver.memory" in last and "--reader clickhouse" in last


OUT_OF_MEMORY_IN_THE_DRIVER = """
import time
from cdc2ch.model.config import SparkSettings
from cdc2ch.source.spark import session as sparksession

jvm = sparksession.session(SparkSettings(conf={"spark.driver.memory": "512m"}))._jvm
try:
    jvm.java.lang.reflect.Array.newInstance(jvm.java.lang.Long.TYPE, 100_000_000)
except Exception as exc:
    print("failed:", type(exc).__name__)
time.sleep(1)
print("exited:", sparksession._launched.poll() is not None)
"""


def test_running_out_of_memory_in_a_driver_thread_ends_the_jvm():
    """Where a driver thread rather than a task runs out of memory, a local JVM exits as it does for a task.
    Before, the thread only died: when it was the one taking a chunk's task results (a 20M-row table whose
    row groups held 6.8M rows each), the snapshot's job waited for them for ever, the JVM idle. Here the
    driver's gateway thread allocates more than the heap."""
    proc = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY_IN_THE_DRIVER], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed, exited = proc.stdout.splitlines()
    # the gateway's connection broke or was refused: not a Py4JJavaError, the answer of a JVM that lived on
    assert failed in ("failed: Py4JNetworkError", "failed: ConnectionRefusedError"), proc.stdout
    assert exited == "exited: True", proc.stdout


def test_chunks_hold_at_most_max_rows_as_far_as_row_groups_allow(spark, tmp_path):
    """What the driver holds of a snapshot is bounded by --max-rows-per-read: Spark's file splits are sized
    from the table's bytes per row. Parquet splits only between row groups: where they are smaller than a
    partition, a chunk may exceed the bound by at most a row group, and no shuffle is needed."""
    import pyarrow.parquet as pq

    from cdc2ch.source.sparkread.chunked import ChunkedFrame

    path = str(tmp_path / "row_groups")
    _one_file(spark, path, 200_000, "sha2(cast(id AS STRING), 256) AS h", row_group_bytes=1 << 20)
    (data_file,) = [p for p in os.listdir(path) if p.endswith(".parquet")]
    meta = pq.ParquetFile(os.path.join(path, data_file)).metadata
    largest_group = max(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    assert meta.num_row_groups > 4
    frame = ChunkedFrame(DeltaSource(spark, path).snapshot(0), 200_000, 30_000)
    sizes = [t.num_rows if t else 0 for t in (frame.read(i) for i in range(frame.count))]
    assert sum(sizes) == 200_000 and sum(1 for n in sizes if n) >= 6
    assert max(sizes) <= 30_000 + largest_group and not frame.shuffled


def test_a_row_group_larger_than_a_chunk_is_spread_over_chunks(spark, tmp_path):
    """A narrow table's row group can hold millions of rows, and Spark cannot split it: read as one
    partition it was a chunk many times --max-rows-per-read (a 20M-row table of two files ran a 1 GiB driver
    out of memory). Such a table's rows are spread by a shuffle: every chunk holds at most the bound, and
    together they hold every row once."""
    import pyarrow.parquet as pq

    from cdc2ch.source.sparkread.chunked import ChunkedFrame, largest_row_group

    path = str(tmp_path / "one_row_group")
    _one_file(spark, path, 200_000, "sha2(cast(id AS STRING), 256) AS h", row_group_bytes=1 << 30)
    (data_file,) = [p for p in os.listdir(path) if p.endswith(".parquet")]
    assert pq.ParquetFile(os.path.join(path, data_file)).metadata.num_row_groups == 1
    snapshot = DeltaSource(spark, path).snapshot(0)
    assert largest_row_group(spark, snapshot.inputFiles()) == 200_000
    frame = ChunkedFrame(snapshot, 200_000, 30_000)
    chunks = [frame.read(i) for i in range(frame.count)]
    sizes = [t.num_rows if t else 0 for t in chunks]
    assert max(sizes) <= 30_000, sizes
    assert frame.shuffled
    ids = sorted(i for t in chunks if t for i in t.column("id").to_pylist())
    assert ids == list(range(200_000))
    again = ChunkedFrame(DeltaSource(spark, path).snapshot(0), 200_000, 30_000)
    assert again.fingerprint() == frame.fingerprint()  # a resumed snapshot finds its chunks
    assert again.read(3).column("id").to_pylist() == chunks[3].column("id").to_pylist()
