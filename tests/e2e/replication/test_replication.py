"""End to end: Delta writes by Spark -> `cdc2ch run --once` -> ClickHouse FINAL equals the Delta table."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake

from cdc2ch.model.config import TargetName
from tests.support.helpers import (
    SinkTap,
    assert_replicated,
    committed_version,
    create_table,
    job_config,
    latest_version,
)

COLS = "id BIGINT, part STRING, name STRING, amount DOUBLE"


def _rows(spark, rows):
    return spark.createDataFrame(rows, "id BIGINT, part STRING, name STRING, amount DOUBLE")


def _append(spark, path, rows):
    _rows(spark, rows).write.format("delta").mode("append").save(path)


def scenario_append(spark, path):
    create_table(spark, path, COLS)
    for i in range(3):
        _append(spark, path, [(i * 10 + j, "a", f"n{j}", float(j)) for j in range(10)])


def scenario_overwrite(spark, path):
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", f"old{i}", 1.0) for i in range(20)])
    # Keeps keys 10..19 (with new values), drops 0..9, adds 20..29.
    _rows(spark, [(i, "b", f"new{i}", 2.0) for i in range(10, 30)]).write.format("delta").mode(
        "overwrite"
    ).save(path)


def scenario_replace_where(spark, path):
    create_table(spark, path, COLS, partitioned_by="part")
    _append(spark, path, [(i, "a" if i % 2 else "b", f"x{i}", 1.0) for i in range(40)])
    (
        _rows(spark, [(i, "a", f"y{i}", 3.0) for i in range(1, 60, 4)])
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", "part = 'a'")
        .save(path)
    )


def scenario_update(spark, path):
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", f"n{i}", float(i)) for i in range(30)])
    spark.sql(f"UPDATE delta.`{path}` SET amount = amount * 2, name = 'doubled' WHERE id % 3 = 0")
    spark.sql(f"UPDATE delta.`{path}` SET name = NULL WHERE id = 5")


def scenario_update_key(spark, path):
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", f"n{i}", float(i)) for i in range(20)])
    # Keys 0..4 become 100..104; 0..4 must not survive as stale rows.
    spark.sql(f"UPDATE delta.`{path}` SET id = id + 100 WHERE id < 5")
    # A swap inside one commit: 10 <-> 11.
    spark.sql(f"UPDATE delta.`{path}` SET id = CASE WHEN id = 10 THEN 11 ELSE 10 END WHERE id IN (10, 11)")


def scenario_delete(spark, path):
    create_table(spark, path, COLS, partitioned_by="part")
    _append(spark, path, [(i, "a" if i < 15 else "b", f"n{i}", 0.5) for i in range(30)])
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 4 = 1")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE part = 'b'")  # a whole partition


def scenario_merge(spark, path):
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", f"n{i}", float(i)) for i in range(20)])
    _rows(spark, [(i, "a", f"m{i}", -1.0) for i in range(15, 30)]).createOrReplaceTempView("merge_src")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING merge_src s ON t.id = s.id "
        f"WHEN MATCHED AND s.id % 2 = 0 THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET * "
        f"WHEN NOT MATCHED THEN INSERT *"
    )


def scenario_mix(spark, path):
    """25+ versions of every kind of write on a partitioned table, seeded."""
    rnd = random.Random(7)
    create_table(spark, path, COLS, partitioned_by="part")
    next_id = 0
    for step in range(26):
        op = rnd.choice(
            ["append", "append", "update", "update_key", "delete", "merge", "replace_where", "overwrite"]
        )
        if step < 2:
            op = "append"
        if op == "append":
            n = rnd.randint(5, 25)
            _append(
                spark, path, [(next_id + i, rnd.choice("abc"), f"s{step}", rnd.random()) for i in range(n)]
            )
            next_id += n
        elif op == "update":
            spark.sql(
                f"UPDATE delta.`{path}` SET amount = amount + 1, name = 'u{step}' WHERE id % 5 = {step % 5}"
            )
        elif op == "update_key":
            spark.sql(f"UPDATE delta.`{path}` SET id = id + 100000 WHERE id % 7 = {step % 7} AND id < 100000")
        elif op == "delete":
            spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 6 = {step % 6}")
        elif op == "merge":
            src = [
                (rnd.randint(0, next_id + 10), rnd.choice("abc"), f"m{step}", rnd.random()) for _ in range(12)
            ]
            src = list({r[0]: r for r in src}.values())
            _rows(spark, src).createOrReplaceTempView("mix_src")
            spark.sql(
                f"MERGE INTO delta.`{path}` t USING mix_src s ON t.id = s.id "
                f"WHEN MATCHED AND s.amount < 0.3 THEN DELETE "
                f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            )
            next_id += 11
        elif op == "replace_where":
            p = rnd.choice("abc")
            rows = [(next_id + i, p, f"r{step}", rnd.random()) for i in range(8)]
            next_id += 8
            _rows(spark, rows).write.format("delta").mode("overwrite").option(
                "replaceWhere", f"part = '{p}'"
            ).save(path)
        elif op == "overwrite":
            current = spark.read.format("delta").load(path).where("id % 3 != 0").collect()
            keep = [(r.id, r.part, r.name, r.amount) for r in current]
            _rows(spark, keep + [(next_id, "a", f"o{step}", 0.0)]).write.format("delta").mode(
                "overwrite"
            ).save(path)
            next_id += 1


SCENARIOS = {
    "append": scenario_append,
    "overwrite": scenario_overwrite,
    "replace_where_partitioned": scenario_replace_where,
    "update": scenario_update,
    "update_key_column": scenario_update_key,
    "delete": scenario_delete,
    "merge": scenario_merge,
    "mix_26_versions": scenario_mix,
}


@pytest.mark.parametrize("reader", ["spark", "clickhouse"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_final_equals_delta(name, reader, spark, sink, cli, database, tmp_path, built):
    """Both readers: Spark's CDF into Arrow batches, and ClickHouse reading the CDF itself (push-down)."""
    path = built.copy(SCENARIOS[name], tmp_path / name)
    target = TargetName(database, f"{name}_{reader}")
    cli.replicate("run", path, target, "--once", "--reader", reader)
    latest = latest_version(spark, path)
    assert committed_version(sink, database, str(target)) == latest
    assert_replicated(spark, sink, path, target, latest)
    if reader == "clickhouse" and name == "mix_26_versions":
        # A replay of the whole history sends the same statements with the same tokens: nothing new is stored.
        raw = sink.query_rows(f"SELECT count() FROM {target}")[0][0]
        cli.replicate("run", path, target, "--once", "--reader", reader, "--reset", "--from-version", "0")
        assert sink.query_rows(f"SELECT count() FROM {target}")[0][0] == raw
        assert_replicated(spark, sink, path, target, latest)
    if reader == "spark" and name == "mix_26_versions":
        # The other reader replays the whole history into the same table (the default reader may choose
        # another one at a later start): FINAL is the same, to its metadata columns (but when rows were synced).
        final = f"SELECT * EXCEPT (_synced_at) FROM {target} FINAL ORDER BY id"
        before = sink.query_rows(final)
        cli.replicate(
            "run", path, target, "--once", "--reader", "clickhouse", "--reset", "--from-version", "0"
        )
        assert sink.query_rows(final) == before


def test_incremental_runs_match_one_run(spark, sink, cli, database, tmp_path):
    """--once after every commit builds the same table as one run over the whole history."""
    path = str(tmp_path / "inc")
    rnd = random.Random(3)
    create_table(spark, path, COLS, partitioned_by="part")
    step_target = TargetName(database, "stepwise")
    writes = [
        lambda: _append(spark, path, [(i, rnd.choice("ab"), "a", float(i)) for i in range(30)]),
        lambda: spark.sql(f"UPDATE delta.`{path}` SET amount = -amount WHERE id % 2 = 0"),
        lambda: spark.sql(f"UPDATE delta.`{path}` SET id = id + 1000 WHERE id % 5 = 0"),
        lambda: spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 3 = 0"),
        lambda: _append(spark, path, [(i, "b", "again", 1.0) for i in range(0, 40, 3)]),
        lambda: (
            _rows(spark, [(i, "a", "rw", 9.0) for i in range(500, 505)])
            .write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", "part = 'a'")
            .save(path)
        ),
    ]
    cli.replicate("run", path, step_target, "--once")
    for write in writes:
        write()
        cli.replicate("run", path, step_target, "--once")
        assert_replicated(spark, sink, path, step_target)
    whole_target = TargetName(database, "whole")
    cli.replicate("run", path, whole_target, "--once")
    cols = "id, part, name, amount, _commit_version, _change_type, _is_deleted, _version"
    stepwise = sink.query_rows(f"SELECT {cols} FROM {database}.stepwise FINAL ORDER BY id")
    whole = sink.query_rows(f"SELECT {cols} FROM {database}.whole FINAL ORDER BY id")
    assert stepwise == whole
    assert_replicated(spark, sink, path, whole_target)


def test_resume_and_replay(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "resume")
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", "x", 1.0) for i in range(50)])
    spark.sql(f"UPDATE delta.`{path}` SET amount = 2.0 WHERE id < 10")
    target = TargetName(database, "resume")
    args = ("run", "--table", path, "--primary-key", "id", "--target", str(target), "--once",
            "--reader", "spark")  # fmt: skip
    first = cli(*args)
    committed = committed_version(sink, database, str(target))
    # 50 inserts, 10 of them updated since: each key's newest row (the outranked ones are not written)
    assert sum(b["rows"] for b in cli.events(first, "batch")) == 50
    # Background merges would change raw counts under the test's feet.
    sink.command(f"SYSTEM STOP MERGES {database}.resume")
    raw_count = sink.query_rows(f"SELECT count() FROM {database}.resume")[0][0]

    # Nothing new: nothing read, nothing inserted.
    again = cli(*args)
    assert cli.events(again, "batch") == [] and cli.events(again, "range_read") == []
    assert sink.query_rows(f"SELECT count() FROM {database}.resume")[0][0] == raw_count

    # New commit: the next run starts exactly at committed + 1.
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id >= 45")
    nxt = cli(*args)
    reads = cli.events(nxt, "range_read")
    assert reads and reads[0]["start"] == committed + 1
    assert_replicated(spark, sink, path, target)

    before = sink.query_rows(f"SELECT * EXCEPT _synced_at FROM {database}.resume FINAL ORDER BY id")
    raw_before = sink.query_rows(f"SELECT count() FROM {database}.resume")[0][0]
    # Replaying the last range: same range, same batches, same tokens, so ClickHouse drops the blocks.
    cli(*args, "--reset", "--from-version", str(committed + 1))
    assert sink.query_rows(f"SELECT count() FROM {database}.resume")[0][0] == raw_before
    # Replaying everything (state reset to 0) leaves FINAL unchanged.
    cli(*args, "--reset", "--from-version", "0")
    after = sink.query_rows(f"SELECT * EXCEPT _synced_at FROM {database}.resume FINAL ORDER BY id")
    assert before == after
    assert_replicated(spark, sink, path, target)

    # A stored offset that disagrees with --from-version is refused unless --reset.
    refused = cli(*args, "--from-version", "1", expect=1)
    assert "--reset" in refused.stderr and "already replicated up to version" in refused.stderr


def test_batches_are_bounded(spark, sink, cli, database, tmp_path):
    """500k changed rows arrive in batches of at most --batch-size rows, across several read ranges."""
    path = str(tmp_path / "big")
    create_table(spark, path, "id BIGINT, v STRING")
    for part in range(2):  # written by delta-rs: Spark takes about twenty times the CPU for these rows
        ids = pa.array(range(part * 250_000, (part + 1) * 250_000), pa.int64())
        write_deltalake(
            path, pa.table({"id": ids, "v": pc.cast(pc.multiply(ids, 7), pa.string())}), mode="append"
        )
    target = TargetName(database, "big")
    result = cli.replicate(
        "run",
        path,
        target,
        "--once",
        "--batch-size",
        "80000",
        "--max-rows-per-read",
        "300000",
        "--reader",
        "spark",
    )
    batches = cli.events(result, "batch")
    sizes = [b["rows"] for b in batches]
    assert sum(sizes) == 500_000
    assert max(sizes) <= 120_000 and len(sizes) >= 6  # about --batch-size each (changes.batches)
    assert len(cli.events(result, "range_read")) >= 2  # the backlog was not read in one piece
    assert sink.query_rows(f"SELECT count() FROM {database}.big FINAL WHERE _is_deleted = 0")[0][0] == 500_000


@pytest.mark.parametrize(
    "resume_batch, raw_rows", [(300, 1000), (1000, 1666)], ids=["same-batches", "new-size"]
)
def test_stop_mid_range_then_resume(resume_batch, raw_rows, spark, sink, cli, database, tmp_path):
    """A stop request after a batch abandons the range without committing; the next run replays exactly
    that range. Batches that had landed are dropped by their deduplication tokens when the replay cuts the
    same batches; with another --batch-size nothing is dropped wrongly (tokens carry a content digest)."""
    import threading

    from cdc2ch.replication.pipeline import Replicator
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    path = str(tmp_path / "stop")
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", "x", 1.0) for i in range(1000)])
    target = TargetName(database, "stop")
    cfg = job_config(path, target, cli.dsn, batch_size=300)
    stop = threading.Event()
    landed = []

    def after_insert(table_sql):
        if "stop" in table_sql:  # a data batch landed; after two, freeze parts and ask the job to stop
            landed.append(1)
            if len(landed) == 2:
                sink.command(f"SYSTEM STOP MERGES {database}.stop")
                stop.set()

    state = Replicator(cfg, DeltaSource(spark, path), SinkTap(sink, after_insert), stop).run()
    assert state.committed_version == -1 and state.interrupted_range == (0, 1)
    assert sink.query_rows(f"SELECT count() FROM {database}.stop")[0][0] == 666  # batches of 333, 333, 334

    result = cli.replicate(
        "run", path, target, "--once", "--batch-size", str(resume_batch), "--reader", "spark"
    )
    assert cli.events(result, "resuming_interrupted_range")[0]["end"] == 1
    assert sink.query_rows(f"SELECT count() FROM {database}.stop")[0][0] == raw_rows
    assert committed_version(sink, database, str(target)) == 1
    assert_replicated(spark, sink, path, target)


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["files", "deletion-vectors"])
def test_log_reader_agrees_with_delta(deletion_vectors, spark, tmp_path, built):
    """Commits read straight from the log match DESCRIBE HISTORY, and each commit's row estimate covers the
    change rows Delta's own CDF reader yields for it (estimates size the reads, so they must not fall short)."""
    from delta.tables import DeltaTable

    from cdc2ch.source.sparkread.deltasource import DeltaSource

    path = built.copy(scenario_mix, tmp_path / "t")
    if deletion_vectors:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableDeletionVectors = true)")
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 4 = 1")
        spark.sql(f"UPDATE delta.`{path}` SET name = 'dv' WHERE id % 4 = 2")
        _append(spark, path, [(900_000 + i, "a", "late", 1.0) for i in range(5)])
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 900000")
    history = {
        r["version"]: (r["ms"], r["operation"])
        for r in DeltaTable.forPath(spark, path)
        .history()
        .selectExpr("version", "unix_millis(timestamp) AS ms", "operation")
        .collect()
    }
    source = DeltaSource(spark, path)
    commits = source.commits(0)
    assert source.latest().version == source.latest_version() == max(history)
    assert {c.version: (int(c.timestamp.timestamp() * 1000), c.operation) for c in commits} == history
    cdf = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(path)
        .groupBy("_commit_version")
        .count()
        .collect()
    )
    actual = {r["_commit_version"]: r["count"] for r in cdf}
    short = {
        c.version: (c.estimated_rows, actual[c.version])
        for c in commits
        if c.estimated_rows < actual.get(c.version, 0)
    }
    assert not short, f"estimates below the real change rows (estimate, actual) by version: {short}"
    assert sum(c.estimated_rows for c in commits) <= 3 * sum(actual.values()) + 1000  # and not wildly above
    assert [c.version for c in commits if c.metadata] == [0] + (
        [max(history) - 4] if deletion_vectors else []
    )


def test_a_table_seen_while_it_was_being_created_is_found_once_it_exists(
    spark, sink, cli, database, tmp_path
):
    """A look at a table whose `_delta_log` exists but holds no commit yet (another writer is creating it)
    finds no table; the next run in the same process must find it, not an answer Delta kept from that look."""
    import pyarrow as pa
    from deltalake import write_deltalake

    path = tmp_path / "creating"
    (path / "_delta_log").mkdir(parents=True)
    target = TargetName(database, "creating")
    refused = cli.replicate("run", str(path), target, "--once", expect=1)
    assert "is not a Delta table" in " ".join(refused.stderr.split())
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    write_deltalake(str(path), data, configuration={"delta.enableChangeDataFeed": "true"})
    cli.replicate("run", str(path), target, "--once")
    assert_replicated(spark, sink, str(path), target)


def _recorded_queues(spark, monkeypatch, rows_per_batch: int) -> tuple[list, list, set, str]:
    """A recording RowQueue in place: its queues, the rows each held in memory after each put and the
    directories it spilled to; and Spark batches of `rows_per_batch` rows, returning the setting to restore."""
    from cdc2ch.source.sparkread import spill

    queues, in_memory, spill_dirs = [], [], set()

    class Recorded(spill.RowQueue):
        def __init__(self, limit):
            super().__init__(limit)
            queues.append(self)

        def put(self, item, rows=0):
            super().put(item, rows)
            in_memory.append(self._rows)
            if self._dir is not None:
                spill_dirs.add(self._dir)

    monkeypatch.setattr(spill, "RowQueue", Recorded)
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(rows_per_batch))
    return queues, in_memory, spill_dirs, previous


def test_a_streamed_read_keeps_its_rows_in_memory_up_to_a_bound_and_the_rest_on_disk(spark, monkeypatch):
    """Spark's batches wait for slow inserts in memory up to the rows the read may hold, and on local disk
    beyond that: Spark never waits for this process, and every row still arrives once."""
    import time

    from structlog.testing import capture_logs

    from cdc2ch.source.spark import threads

    queues, in_memory, spill_dirs, previous = _recorded_queues(spark, monkeypatch, 150)
    try:
        seen = []
        with capture_logs() as logs:
            for batch in threads.arrow_batches(spark.range(0, 3000, 1, 4), 300):
                seen.extend(batch.column(0).to_pylist())
                time.sleep(0.05)  # an insert slower than the scan
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert sorted(seen) == list(range(3000))
    # the scan ran ahead as far as memory may hold, and what passed the bound waited on disk
    assert max(in_memory) == 300 and queues[0].spilled > 0
    spilled = [e for e in logs if e["event"] == "read_spilled"]
    assert spilled == [
        {"event": "read_spilled", "batches": queues[0].spilled, "held_rows": 300, "log_level": "info"}
    ]
    assert spill_dirs and not any(os.path.exists(d) for d in spill_dirs)


def test_a_streamed_read_left_early_cancels_its_job_and_removes_what_it_spilled(spark, monkeypatch):
    """Leaving a read whose batches passed to disk ends its job and its reader thread and removes the
    spilled batches; Spark goes on."""
    import threading
    import time

    from cdc2ch.source.spark import threads

    queues, _, spill_dirs, previous = _recorded_queues(spark, monkeypatch, 100)
    try:
        read = threads.arrow_batches(spark.range(0, 5000, 1, 2), 100)
        first = next(read)
        deadline = time.monotonic() + 30
        while not queues[0].spilled and time.monotonic() < deadline:
            time.sleep(0.05)  # the job's other batches pass the bound meanwhile
        read.close()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert first.num_rows == 100 and spill_dirs and not any(os.path.exists(d) for d in spill_dirs)
    assert spark.range(10).count() == 10

    def streaming() -> bool:
        return any(t.name == "cdc2ch-arrow-stream" and t.is_alive() for t in threading.enumerate())

    deadline = time.monotonic() + 30
    while streaming() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not streaming()


def test_a_streamed_range_is_inserted_as_spark_scans_and_a_replay_drops_what_landed(
    spark, sink, cli, database, tmp_path
):
    """A range above --max-rows-per-read reaches the inserts a Spark Arrow batch at a time (here batches of
    150 rows), each ranked on its own. Stopped after two inserts, the range is replayed whole: the batches
    that landed come back with the same tokens and are dropped, and FINAL equals Delta."""
    import threading

    from cdc2ch.replication.pipeline import Replicator
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    path = str(tmp_path / "streamed")
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", "x", 1.0) for i in range(100)])
    target = TargetName(database, "streamed")
    options = (
        "--max-rows-per-read",
        "150",
        "--batch-size",
        "100",
        "--reader",
        "spark",
    )  # ranges of up to 1,200 rows
    cli.replicate("run", path, target, "--once", *options)  # claimed, at version 1
    for v in range(3):
        _append(spark, path, [(1000 * (v + 1) + i, "b", "y", 2.0) for i in range(300)])
    spark.sql(f"UPDATE delta.`{path}` SET amount = 3.0 WHERE id < 50")
    sink.command(f"SYSTEM STOP MERGES {database}.streamed")
    before = sink.query_rows(f"SELECT count() FROM {database}.streamed")[0][0]
    stop, landed = threading.Event(), []

    def after_insert(table_sql):
        if "streamed" in table_sql:
            landed.append(1)
            if len(landed) == 2:
                stop.set()

    cfg = job_config(path, target, cli.dsn, max_rows_per_read=150, batch_size=100)
    batch_rows = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "150")
    try:
        state = Replicator(cfg, DeltaSource(spark, path), SinkTap(sink, after_insert), stop).run()
        assert state.committed_version == 1 and state.interrupted_range == (2, 5)
        first = sink.query_rows(f"SELECT count() FROM {database}.streamed")[0][0] - before
        assert 0 < first <= 200
        result = cli.replicate("run", path, target, "--once", *options)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", batch_rows)
    batches = cli.events(result, "batch")
    assert cli.events(result, "resuming_interrupted_range")[0]["end"] == 5 and len(batches) > 3
    # the landed batches were dropped by their tokens: the table holds each batch once
    assert sink.query_rows(f"SELECT count() FROM {database}.streamed")[0][0] == before + sum(
        b["rows"] for b in batches
    )
    assert committed_version(sink, database, str(target)) == 5
    assert_replicated(spark, sink, path, target)


def test_a_spark_read_leaves_out_only_the_pre_images_another_row_of_their_key_outranks(spark, tmp_path):
    """Told the key, a read of a range leaves out the pre-images of ordinary updates (their post-images
    outrank them) and keeps a key-changing update's, the tombstone that removes the old key; a MERGE that
    updates, deletes and inserts is told the same way. Without the key, every pre-image is read."""
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    path = str(tmp_path / "t")
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", f"n{i}", float(i)) for i in range(20)])  # version 1
    spark.sql(f"UPDATE delta.`{path}` SET name = 'u' WHERE id < 4")  # 2: ordinary
    spark.sql(f"UPDATE delta.`{path}` SET id = id + 100 WHERE id >= 18")  # 3: keys change
    _rows(spark, [(5, "a", "m", 0.0), (6, "a", "d", 0.0), (50, "a", "new", 0.0)]).createOrReplaceTempView(
        "src"
    )
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING src s ON t.id = s.id WHEN MATCHED AND s.name = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET name = s.name WHEN NOT MATCHED THEN INSERT *"
    )  # 4

    def pre_images(key) -> dict[int, int]:
        rows = DeltaSource(spark, path).changes(2, 4, key).arrow_rows(immutable_keys=False).to_pylist()
        return {
            v: sum(r["_commit_version"] == v and r["_change_type"] == "update_preimage" for r in rows)
            for v in (2, 3, 4)
        }

    assert pre_images(("id",)) == {2: 0, 3: 2, 4: 0}
    assert pre_images(()) == {2: 4, 3: 2, 4: 1}


def test_reads_of_ranges_that_need_no_pre_image_run_the_same_compiled_code_on_every_poll(spark, tmp_path):
    """A service reads each new commit as its own range. Where no commit of a range needs its pre-images the
    read leaves them out by change type alone: a filter naming the range's versions was new generated code on
    every poll, three classes compiled again on each."""
    from cdc2ch.model.contract import PREIMAGE
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    path = str(tmp_path / "t")
    create_table(spark, path, "id BIGINT, flag BOOLEAN, day DATE")  # a schema of its own: code of its own
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, false, DATE'2026-01-01' FROM range(10)")  # version 1
    for version in (2, 3, 4):
        spark.sql(f"UPDATE delta.`{path}` SET flag = NOT flag, day = day + {version} WHERE id < 3")
    source = DeltaSource(spark, path)
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def read(version: int):
        return source.changes(version, version, ("id",)).arrow_rows(immutable_keys=False)

    first = read(2)  # compiles the read's code
    before = compiled.getCount()
    later = [read(3), read(4)]
    assert compiled.getCount() == before
    for rows in (first, *later):
        assert rows.num_rows == 3 and PREIMAGE not in rows.column("_change_type").to_pylist()
