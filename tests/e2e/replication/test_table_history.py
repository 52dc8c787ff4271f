"""Delta log and history features, on tables written by Spark, replicated by both readers: in-commit
timestamps, commits older than the deleted-file retention, vacuumed change files, v2 checkpoints with
sidecars, classic multi-part checkpoints, log compaction files, and early commits removed after a
checkpoint. Every replication is compared with the Delta table read by Spark."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cdc2ch.model.config import TargetName
from cdc2ch.source.deltalog.logfiles import python_log
from cdc2ch.source.sparkread.deltasource import DeltaSource
from tests.support.helpers import assert_replicated, committed_version, vacuum_everything

SHORT_RETENTION = "'interval 1 seconds'"


def _create(spark, path: str, **props: str) -> None:
    tblprops = ", ".join(f"{k} = {v}" for k, v in {"delta.enableChangeDataFeed": "true", **props}.items())
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, name STRING) USING delta TBLPROPERTIES ({tblprops})")


def _insert(spark, path: str, lo: int, hi: int) -> None:
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, concat('n', id) FROM range({lo}, {hi})")


def _commit_files(path: str) -> dict[int, Path]:
    log = Path(path) / "_delta_log"
    return {
        int(p.name[:20]): p for p in log.glob("*.json") if p.name[:20].isdigit() and p.name[20:] == ".json"
    }


def _in_commit_timestamps(path: str) -> dict[int, int]:
    out = {}
    for version, file in _commit_files(path).items():
        info = next(
            json.loads(ln)["commitInfo"] for ln in file.read_text().splitlines() if '"commitInfo"' in ln
        )
        out[version] = info["inCommitTimestamp"]
    return out


def _written_timestamps(sink, target: TargetName) -> dict[int, int]:
    table = f"{target.database}.{target.table}"
    return dict(
        sink.query_rows(
            f"SELECT DISTINCT _commit_version, toUnixTimestamp64Milli(_commit_timestamp) FROM {table}"
        )
    )


def _change_types(sink, target: TargetName) -> set[str]:
    return {
        r[0] for r in sink.query_rows(f"SELECT DISTINCT _change_type FROM {target.database}.{target.table}")
    }


def _has_table(sink, target: TargetName) -> bool:
    return bool(
        sink.query_rows(
            "SELECT count() FROM system.tables WHERE database = {d:String} AND name = {t:String}",
            {"d": target.database, "t": target.table},
        )[0][0]
    )


def _no_state(sink, database: str) -> bool:
    exists = sink.query_rows(
        "SELECT count() FROM system.tables WHERE database = {d:String} AND name = 'cdc2ch_state'",
        {"d": database},
    )[0][0]
    return not exists or not sink.query_rows(f"SELECT count() FROM {database}.cdc2ch_state")[0][0]


def _compact_log(spark, path: str, start: int, end: int) -> None:
    """Write the log compaction file of versions start..end with Delta Kernel's own writer (what Kernel-based
    writers do every N commits; Delta for Spark reads these files but does not write them)."""
    jvm = spark._jvm
    engine = jvm.io.delta.kernel.defaults.engine.DefaultEngine.create(
        spark._jsparkSession.sessionState().newHadoopConf()
    )
    kpath = jvm.io.delta.kernel.internal.fs.Path
    jvm.io.delta.kernel.internal.compaction.LogCompactionWriter(
        kpath(f"file:{path}"), kpath(f"file:{path}/_delta_log"), start, end, 0
    ).writeLogCompactionFile(engine)


def test_in_commit_timestamps_on_commits_older_than_the_retention(spark, sink, cli, database, tmp_path):
    """Every commit is older than delta.deletedFileRetentionDuration, whose check Delta applies to CDF reads
    (DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION): the change files are all there,
    so both readers replicate it; _commit_timestamp is the in-commit timestamp, not the file's mtime."""
    path = str(tmp_path / "ict")
    _create(
        spark,
        path,
        **{"delta.enableInCommitTimestamps": "true", "delta.deletedFileRetentionDuration": SHORT_RETENTION},
    )
    _insert(spark, path, 0, 12)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 4 = 1")
    ict = _in_commit_timestamps(path)
    for file in _commit_files(path).values():  # as a copy or a restore leaves them: mtimes tell nothing
        os.utime(file, (978307200, 978307200))  # 2001-01-01
    time.sleep(1.2)  # the last commit is older than the retention too

    spark_target, ch_target = TargetName(database, "by_spark"), TargetName(database, "by_clickhouse")
    cli.replicate("run", path, spark_target, "--once")
    assert_replicated(spark, sink, path, spark_target)
    assert _written_timestamps(sink, spark_target) == {1: ict[1], 2: ict[2]}
    # The ClickHouse reader, after a snapshot of an old version (a time travel past the retention as well).
    cli.replicate("snapshot", path, ch_target, "--version", "1", "--reader", "clickhouse")
    cli.replicate("run", path, ch_target, "--once", "--reader", "clickhouse")
    assert_replicated(spark, sink, path, ch_target)
    assert _written_timestamps(sink, ch_target) == {1: ict[1], 2: ict[2]}
    assert {"snapshot", "delete"} <= _change_types(sink, ch_target)
    # The Python log reader (status, lag; no JVM) reads the same timestamps.
    log = python_log(path)
    assert {v: int(log.commit(v).timestamp.timestamp() * 1000) for v in ict} == ict
    assert log.lag(0, log.latest()) == (2, (ict[2] - ict[0]) / 1000)


def test_vacuumed_change_files_ask_for_a_snapshot(spark, sink, cli, database, tmp_path):
    """Where VACUUM removed the change files of versions not replicated yet, `run` stops with the resync
    advice and leaves the offset where it was (the advised snapshot then `run`: the last test)."""
    path = str(tmp_path / "vacuumed")
    _create(spark, path, **{"delta.deletedFileRetentionDuration": SHORT_RETENTION})
    _insert(spark, path, 0, 10)
    target = TargetName(database, "t")
    cli.replicate("run", path, target, "--once")
    assert committed_version(sink, database, str(target)) == 1
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 2 = 0")  # v2: its changes are in _change_data
    time.sleep(1.2)
    vacuum_everything(spark, path)
    assert not [p for p in (Path(path) / "_change_data").rglob("*.parquet")]

    failed = cli.replicate("run", path, target, "--once", expect=1)
    assert "can no longer be replayed: resync with `cdc2ch snapshot`" in failed.stderr
    assert "versions 2.." in failed.stderr and "TIME_TRAVEL" not in failed.stderr
    assert committed_version(sink, database, str(target)) == 1


def test_v2_checkpoints_sidecars_and_log_compaction(spark, sink, cli, database, tmp_path):
    """A log with a v2 checkpoint (sidecar files) and a log compaction file: neither is a commit to the
    Python log reader, both readers replicate the table, and `status` finds the latest version."""
    path = str(tmp_path / "v2")
    _create(spark, path, **{"delta.checkpointPolicy": "'v2'", "delta.checkpointInterval": "2"})
    spark.conf.set("spark.databricks.delta.checkpoint.partSize", "1")  # one sidecar per action
    try:
        _insert(spark, path, 0, 8)
        _insert(spark, path, 8, 16)  # v2: checkpoint
    finally:
        spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 3 = 0")
    _compact_log(spark, path, 1, 3)
    names = os.listdir(Path(path) / "_delta_log")
    assert [n for n in names if n.startswith("00000000000000000002.checkpoint.") and n.count(".") == 3]
    assert [n for n in os.listdir(Path(path) / "_delta_log" / "_sidecars") if n.endswith(".parquet")]
    assert "00000000000000000001.00000000000000000003.compacted.json" in names

    log = python_log(path)
    assert log.versions() == [0, 1, 2, 3] and log.latest().version == 3
    assert DeltaSource(spark, path).protocol()["readerFeatures"] == ["v2Checkpoint"]  # read by ClickHouse too
    for reader in ("spark", "clickhouse"):
        target = TargetName(database, reader)
        cli.replicate("run", path, target, "--once", "--reader", reader)
        assert_replicated(spark, sink, path, target)
        assert "delete" in _change_types(sink, target)  # read as a change feed
    status = cli("status", "--target", str(TargetName(database, "spark")), "--json")
    (row,) = json.loads(status.stdout)
    assert (row["latest_version"], row["versions_behind"]) == (3, 0)
    assert not cli.events(status, "status_reads_log_with_spark")


def test_early_commits_removed_after_a_multi_part_checkpoint(spark, sink, cli, database, tmp_path):
    """Log cleanup removed the commits before a (classic, multi-part) checkpoint: a new pipeline is refused
    naming `cdc2ch snapshot` and writes nothing; snapshot then `run` replicate the table, on both readers."""
    path = str(tmp_path / "cleaned")
    _create(spark, path, **{"delta.checkpointInterval": "2"})
    spark.conf.set("spark.databricks.delta.checkpoint.partSize", "1")
    try:
        _insert(spark, path, 0, 8)
        _insert(spark, path, 8, 16)  # v2: a checkpoint in parts
    finally:
        spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
    log_dir = Path(path) / "_delta_log"
    assert len(list(log_dir.glob("00000000000000000002.checkpoint.*.*.parquet"))) > 1
    for version in (0, 1):
        for name in (f"{version:020d}.json", f".{version:020d}.json.crc"):
            (log_dir / name).unlink(missing_ok=True)
    assert python_log(path).latest_version() == 2

    target = TargetName(database, "spark")  # refused from the log, before either reader reads anything
    failed = cli.replicate("run", path, target, "--once", "--initial-load", "changes", expect=1)
    assert "Versions 0..1 of" in failed.stderr and "no longer in the Delta log" in failed.stderr
    assert f"Resync with `cdc2ch snapshot --table {path} --primary-key id --target {target}" in failed.stderr
    assert not _has_table(sink, target) and _no_state(sink, database)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 5 = 0")  # v3
    auto = TargetName(database, "auto")  # by default, a new pipeline begins with a snapshot instead
    (chosen,) = cli.events(cli.replicate("run", path, auto, "--once"), "initial_load")
    assert (chosen["choice"], chosen["version"]) == (
        "snapshot",
        3,
    ) and "versions 0..1 are no longer" in chosen["reason"]
    assert_replicated(spark, sink, path, auto)
    for reader in ("spark", "clickhouse"):
        target = TargetName(database, reader)
        cli.replicate("snapshot", path, target, "--version", "2", "--reader", reader)
        cli.replicate("run", path, target, "--once", "--reader", reader)
        assert committed_version(sink, database, str(target)) == 3
        assert_replicated(spark, sink, path, target)


def test_an_appended_file_gone_fails_its_read_rather_than_leave_its_rows_out(tmp_path):
    """A range of appends is read from its files, each named alone: a file that is gone (VACUUM after a later
    rewrite; here removed by hand) fails the range with the resync advice, and the offset stays. Read through
    a glob, the missing file would have been skipped and its rows left out for ever."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from tests.e2e.commands.test_no_java import ROOT, cdc2ch

    def rows(first: int, last: int) -> pa.Table:
        ids = range(first, last)
        return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})

    path = tmp_path / "appended"
    write_deltalake(str(path), rows(0, 10), configuration={"delta.enableChangeDataFeed": "true"})
    env, dsn = dict(os.environ, PYTHONPATH=str(ROOT)), f"chdb://{tmp_path / 'ch'}"
    run = ["run", "--table", str(path), "--primary-key", "id", "--target", "h.appended", "--once",
           "--reader", "clickhouse", "--clickhouse", dsn]  # fmt: skip
    cdc2ch(env, *run)
    before = set(os.listdir(path))
    write_deltalake(str(path), rows(10, 12), mode="append")
    write_deltalake(str(path), rows(12, 15), mode="append")
    (gone, _) = sorted(name for name in set(os.listdir(path)) - before if name.endswith(".parquet"))
    (path / gone).unlink()
    failed = cdc2ch(env, *run, expect=1)
    assert "can no longer be replayed: resync with `cdc2ch snapshot`" in failed.stderr, failed.stderr[-2000:]
    (row,) = json.loads(cdc2ch(env, "status", "--clickhouse", dsn, "--json").stdout)
    assert row["committed_version"] == 0
