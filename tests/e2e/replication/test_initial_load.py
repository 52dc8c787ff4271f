"""`--initial-load`: a new pipeline begins with a snapshot where the change feed cannot replay the table's
history or costs clearly more than a copy, else with the change feed; real Spark, Delta and chdb."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pyarrow as pa
from deltalake import write_deltalake

from cdc2ch.model.config import TargetName
from tests.support.helpers import (
    assert_replicated,
    create_table,
    delta_rows,
    latest_version,
    vacuum_everything,
)
from tests.support.processes import kill_9


def _tables(sink, database: str) -> int:
    return sink.query_rows(f"SELECT count() FROM system.tables WHERE database = '{database}'")[0][0]


def _status(cli, target: TargetName) -> dict:
    (row,) = json.loads(cli("status", "--target", str(target), "--json").stdout)
    return row


def test_a_late_change_feed_read_as_the_only_source_begins_with_a_snapshot_then_follows_the_changes(
    spark, sink, cli, database, tmp_path
):
    """With --changes-from cdf (the versions before the feed are not read from the log: the default reads them
    so, tests/e2e/replication/test_changes_from_log.py)."""
    path = str(tmp_path / "late")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, v STRING) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    spark.sql(f"UPDATE delta.`{path}` SET v = 'bb' WHERE id = 2")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    enabled_at = latest_version(spark, path)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (4, 'd')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    loaded_at = latest_version(spark, path)
    target = TargetName(database, "late")

    # --initial-load changes: refused as before, naming the snapshot to take; nothing written
    cdf = ("--changes-from", "cdf")
    failed = cli.replicate("run", path, target, "--once", "--initial-load", "changes", *cdf, expect=1)
    err = " ".join(failed.stderr.split())
    assert f"was enabled at version {enabled_at}" in err and f"--version {enabled_at}" in err
    assert _tables(sink, database) == 0

    checked = cli.replicate("validate", path, target, *cdf).stdout
    assert (
        f"initial load needed: a snapshot of version {loaded_at}, then the changes, because the " in checked
    )
    assert f"Change Data Feed was enabled at version {enabled_at}" in checked and "FAIL" not in checked

    run = cli.replicate("run", path, target, "--once", *cdf)  # --initial-load auto, the default
    (chosen,) = cli.events(run, "initial_load")
    assert (chosen["choice"], chosen["version"]) == ("snapshot", loaded_at)
    assert f"enabled at version {enabled_at}" in chosen["reason"]
    assert not cli.events(run, "batch")  # no range of changes was written, by either reader
    assert_replicated(spark, sink, path, target)

    spark.sql(f"UPDATE delta.`{path}` SET id = 20 WHERE id = 2")  # a key changes
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (5, 'e')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")
    run = cli.replicate("run", path, target, "--once", *cdf)
    assert not cli.events(run, "initial_load") and cli.events(run, "batch")[0]["start"] == loaded_at + 1
    assert_replicated(spark, sink, path, target)
    cli.replicate("verify", path, target)  # exits 0: FINAL equals the table at the committed version

    row = _status(cli, target)
    assert row["initial_load"] == f"snapshot at version {loaded_at}"
    assert f"enabled at version {enabled_at}" in row["initial_reason"]
    assert f"snapshot at version {loaded_at}" in cli("status", "--target", str(target), "--wide").stdout


def test_a_long_history_of_overwrites_begins_with_a_snapshot(spark, sink, cli, database, tmp_path):
    """12 overwrites of 50,000 rows (delta-rs): a replay would write about 1.15M change rows for a table of
    50,000, so auto copies the table instead."""
    path = str(tmp_path / "overwritten")
    for i in range(12):
        ids = pa.array(range(i * 1000, i * 1000 + 50_000), pa.int64())
        data = pa.table({"id": ids, "v": pa.array([f"r{i}"] * 50_000)})
        conf = {"delta.enableChangeDataFeed": "true"} if i == 0 else None
        write_deltalake(path, data, mode="overwrite", configuration=conf)
    target = TargetName(database, "overwritten")

    checked = cli.replicate("validate", path, target).stdout
    assert "initial load needed: a snapshot of version 11" in checked and "change rows" in checked

    run = cli.replicate("run", path, target, "--once")
    (chosen,) = cli.events(run, "initial_load")
    assert (chosen["choice"], chosen["version"]) == ("snapshot", 11)
    assert "the table holds 50,000: more than 2x as many and over 1,000,000 more" in chosen["reason"]
    assert_replicated(spark, sink, path, target)
    assert sink.query_rows(f"SELECT count() FROM {target}")[0][0] == 50_000  # no history was replayed


def test_a_table_with_its_whole_change_feed_replays_it(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "plain")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    spark.sql(f"UPDATE delta.`{path}` SET v = 'bb' WHERE id = 2")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    target = TargetName(database, "plain")

    assert "no initial load: the changes from version 0" in cli.replicate("validate", path, target).stdout
    run = cli.replicate("run", path, target, "--once")
    (chosen,) = cli.events(run, "initial_load")
    assert (chosen["choice"], chosen["version"]) == ("changes", 0)
    assert chosen["reason"].startswith("the changes of versions 0..3 can be replayed, and replaying them")
    assert cli.events(run, "batch")[0]["start"] == 0
    assert_replicated(spark, sink, path, target)
    # the history is there: the deleted key is kept as a tombstone
    assert sink.query_rows(f"SELECT id FROM {target} WHERE _change_type = 'delete'") == [(1,)]
    assert _status(cli, target)["initial_load"] == "changes from version 0"


def test_vacuumed_change_files_begin_with_a_snapshot(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "vacuumed")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE delta.`{path}` SET v = 'B' WHERE id = 2")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    vacuum_everything(spark, path)
    target = TargetName(database, "vacuumed")

    refused = cli.replicate("run", path, target, "--once", "--initial-load", "changes", expect=1)
    assert "are gone (removed by VACUUM or log retention)" in refused.stderr and _tables(sink, database) == 0
    run = cli.replicate("run", path, target, "--once")
    (chosen,) = cli.events(run, "initial_load")
    assert chosen["choice"] == "snapshot" and "is gone from storage (removed by VACUUM)" in chosen["reason"]
    assert_replicated(spark, sink, path, target)


def test_a_killed_initial_snapshot_resumes_at_its_version(spark, tmp_path):
    """`run` beginning with a snapshot is killed with SIGKILL midway, the table moves on, and the next `run`
    resumes the snapshot at its version (skipping the chunks that landed), then replays the change."""
    path = str(tmp_path / "kill")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.range(0, 30_000, 1, 15).selectExpr("id", "cast(id * 3 as string) as v").write.format("delta").mode(
        "append"
    ).save(path)
    dsn = f"chdb://{tmp_path / 'ch'}"
    args = [sys.executable, "-m", "cdc2ch", "run", "--table", path, "--primary-key", "id", "--target", "k.kill",
            "--once", "--initial-load", "snapshot", "--clickhouse", dsn, "--log-format", "json",
            "--batch-size", "500", "--spark-master", "local[1]", "--reader", "spark",
            # one Delta file per Spark partition, so one chunk per file: 15 chunks
            "--spark-conf", "spark.sql.files.maxPartitionBytes=65536",
            "--spark-conf", "spark.sql.files.openCostInBytes=65536"]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seen = 0
    for line in proc.stderr:
        if line.startswith("{") and json.loads(line).get("event") == "chunk":
            seen += 1
            if seen == 3:
                kill_9(proc.pid)
                break
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 10")  # version 2: the table moved on

    final = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    events = [json.loads(ln) for ln in final.stderr.splitlines() if ln.startswith("{")]
    (chosen,) = [e for e in events if e["event"] == "initial_load"]
    assert (chosen["choice"], chosen["version"]) == ("snapshot", 1) and "not finished: resumed" in chosen[
        "reason"
    ]
    chunks = [e for e in events if e["event"] == "chunk"]
    assert chunks and chunks[0]["of"] >= 10 and len(chunks) <= chunks[0]["of"] - seen  # landed ones skipped
    assert [(e["start"], e["end"]) for e in events if e["event"] == "range_read"] == [(2, 2)]

    query = subprocess.run(
        [sys.executable, "-m", "cdc2ch", "query", "SELECT id, v FROM k.kill FINAL WHERE _is_deleted = 0",
         "--clickhouse", dsn, "--format", "JSONCompactEachRow"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert query.returncode == 0, query.stderr
    got = sorted(tuple(json.loads(ln)) for ln in query.stdout.splitlines())
    expected = sorted((r[0], r[1].decode()) for r in delta_rows(spark, path, columns=["id", "v"]))
    assert got == expected and len(got) == 30_000 - 10
