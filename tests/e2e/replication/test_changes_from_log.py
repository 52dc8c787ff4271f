"""Tables without a change data feed, replicated from their log (--changes-from auto): Spark writes a history
with deletion vectors, row tracking and column mapping (a rename among it) on a table that records no feed and
on a twin that does; after every commit `run --once` replicates each, and FINAL equals the Delta table, the
twin's FINAL too. A feed enabled late is read from the log before it and from the feed after it. Row-tracked
copy-on-write rewrites (a partitioned table, and generated histories of MERGEs, key changes and moves between
partitions) write only the rows they changed, and FINAL equals the table after each run."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc2ch.model import changeset, schema
from cdc2ch.model.config import TargetName
from cdc2ch.source.deltalog.commitlog import parse_commit
from cdc2ch.source.spark.scalaseqs import python_list
from cdc2ch.source.sparkread import rowcopies
from cdc2ch.source.sparkread.cdfscan import scanned_changes
from cdc2ch.source.sparkread.rowcopies import Copies
from tests.support.helpers import assert_rows_equal, clickhouse_rows, delta_rows

FEATURES = (
    "delta.enableDeletionVectors = true, delta.enableRowTracking = true, delta.columnMapping.mode = 'name'"
)


# The no-feed table is replicated after these statements of _history (each run reads several commits, in
# ranges of --max-rows-per-read): after the deletion-vector DML, the key change and rename, the copy-on-write
# UPDATE, and the overwrite.
RUNS_AFTER = (1, 5, 8, 10, 11)


def _history(t: str) -> list[str]:
    """One commit each: appends, DELETE and UPDATE through deletion vectors, a MERGE that updates, deletes and
    inserts, a key change, a rename, a delete and re-insert of the same keys in one commit (replaceWhere),
    OPTIMIZE (no data change), a copy-on-write UPDATE once deletion vectors are off, and an overwrite."""
    return [
        f"INSERT INTO {t} SELECT id, concat('v', id), id % 3 FROM range(30)",
        f"INSERT INTO {t} SELECT id, concat('w', id), id % 3 FROM range(30, 40)",
        f"DELETE FROM {t} WHERE id % 7 = 0",
        f"UPDATE {t} SET v = 'upd' WHERE id % 5 = 1",
        f"MERGE INTO {t} d USING (SELECT id, 'm' AS v, 2L AS g FROM range(35, 45)) s ON d.id = s.id "
        "WHEN MATCHED AND s.id = 36 THEN DELETE WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        f"UPDATE {t} SET id = id + 100 WHERE id IN (2, 3)",  # a key change: 2 and 3 must go
        f"ALTER TABLE {t} RENAME COLUMN v TO label",
        f"INSERT INTO {t} REPLACE WHERE g = 1 SELECT id, 'again', g FROM {t} WHERE g = 1",
        f"OPTIMIZE {t}",
        f"ALTER TABLE {t} SET TBLPROPERTIES (delta.enableDeletionVectors = false)",
        f"UPDATE {t} SET label = 'cow' WHERE id % 4 = 0",  # copy-on-write: whole files rewritten
        f"INSERT OVERWRITE {t} SELECT * FROM {t} WHERE id < 20",
    ]


def _final_equals_delta(spark, sink, path: str, target: TargetName) -> None:
    columns = spark.read.format("delta").load(path).columns
    version = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"]
    assert_rows_equal(
        delta_rows(spark, path, version, columns),
        clickhouse_rows(sink, target, columns),
        f"{target} at {version}",
    )


def test_a_spark_history_without_a_feed_replicates_from_the_log_as_its_twin_does_from_the_feed(
    spark, sink, cli, tmp_path
):
    tables = {
        "log": (str(tmp_path / "nofeed"), ""),
        "cdf": (str(tmp_path / "feed"), "delta.enableChangeDataFeed = true, "),
    }
    targets = {kind: TargetName("from_log", kind) for kind in tables}
    for path, feed in tables.values():
        spark.sql(
            f"CREATE TABLE delta.`{path}` (id BIGINT, v STRING, g BIGINT) USING delta "
            f"TBLPROPERTIES ({feed}{FEATURES})"
        )
    histories = {kind: _history(f"delta.`{path}`") for kind, (path, _) in tables.items()}
    log_path, log_target = tables["log"][0], targets["log"]
    for step in range(len(histories["log"])):  # the table without a feed: replicated now and then
        spark.sql(histories["log"][step])
        if step not in RUNS_AFTER:
            continue
        result = cli.replicate(
            "run",
            log_path,
            str(log_target),
            "--once",
            "--max-rows-per-read",
            "40",
            "--on-schema-change",
            "follow",
        )
        if step == RUNS_AFTER[0]:
            initial = cli.events(result, "initial_load")[0]
            assert (initial["choice"], initial["version"]) == ("changes", 0)
        _final_equals_delta(spark, sink, log_path, log_target)
    feed_path = tables["cdf"][0]  # its twin with a feed: the whole history at once, in ranges
    for statement in histories["cdf"]:
        spark.sql(statement)
    cli.replicate("run", feed_path, str(targets["cdf"]), "--once", "--max-rows-per-read", "40",
                  "--initial-load", "changes", "--on-schema-change", "follow")  # fmt: skip
    _final_equals_delta(spark, sink, feed_path, targets["cdf"])
    columns = spark.read.format("delta").load(log_path).columns
    listed = {r["pipeline"]: r for r in json.loads(cli("status", "--json").stdout)}
    assert (listed[str(log_target)]["changes_from"], listed[str(targets["cdf"])]["changes_from"]) == (
        "log",
        "cdf",
    )
    assert_rows_equal(
        clickhouse_rows(sink, targets["cdf"], columns), clickhouse_rows(sink, log_target, columns), "twins"
    )
    # The feed would have refused it: the option forces the feed, and says what to do.
    result = cli.replicate(
        "run", tables["log"][0], "from_log.forced", "--once", "--changes-from", "cdf", expect=1
    )
    assert "The Change Data Feed is not enabled" in result.stderr


@pytest.mark.parametrize("reader", ["spark", "clickhouse"])
def test_a_feed_enabled_late_is_read_from_the_log_before_it_and_from_the_feed_after(
    spark, sink, cli, tmp_path, reader
):
    path = str(tmp_path / "late")
    t = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {t} (id BIGINT, v STRING, g BIGINT) USING delta")
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id), id % 3 FROM range(20)")
    spark.sql(f"UPDATE {t} SET v = 'before' WHERE id < 5")
    # the table replaced with a column more: its old files are read as they were, without it
    spark.sql(f"CREATE OR REPLACE TABLE {t} USING delta AS SELECT *, id * 10 AS w FROM {t} WHERE id != 11")
    spark.sql(f"ALTER TABLE {t} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"DELETE FROM {t} WHERE id = 7")
    spark.sql(f"UPDATE {t} SET v = 'after' WHERE id > 15")
    target = TargetName("from_log", f"late_{reader}")
    validated = cli("validate", "--table", path, "--primary-key", "id", "--target", str(target))
    assert (
        "changes derived from the Delta log's file actions up to version 3 and from the change data feed from "
        "version 4 on" in validated.stdout
    )
    result = cli.replicate("run", path, str(target), "--once", "--reader", reader)
    assert cli.events(result, "initial_load")[0]["choice"] == "changes"  # not a snapshot, as before
    _final_equals_delta(spark, sink, path, target)


@pytest.mark.parametrize("tracked", [True, False], ids=["row tracking", "compared rows"])
def test_rows_a_rewrite_copied_are_not_written_again(spark, sink, cli, tmp_path, monkeypatch, tracked):
    """Copy-on-write rewrites whole files: only the rows a MERGE or UPDATE changed are written (their inserts
    and tombstones), not the rows it copied, whether row tracking marks them or they are found by comparing
    rows (compared here however few they are); a RESTORE, whose rows keep their old commit versions, is
    replicated by comparing rows too."""
    monkeypatch.setattr(rowcopies, "COMPARED_FROM_ROWS", 0)
    path = str(tmp_path / f"rewritten_{tracked}")
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, v STRING, g BIGINT, f DOUBLE) USING delta "
        f"TBLPROPERTIES (delta.enableRowTracking = {str(tracked).lower()}, delta.enableDeletionVectors = false)"
    )
    spark.sql(  # one file; NaN, -0.0 and NULL among the rows each commit copies
        f"INSERT INTO {t} SELECT id, IF(id = 4, NULL, concat('v', id)), id % 3, "
        "CASE id WHEN 5 THEN double('NaN') WHEN 6 THEN -0.0 ELSE id / 2 END FROM range(0, 20, 1, 1)"
    )
    target = TargetName("from_log", f"rewritten_{tracked}")
    cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    spark.sql(
        f"MERGE INTO {t} d USING (SELECT id, 'm' AS v, 2L AS g, 0.5 AS f FROM range(1, 3) UNION ALL "
        "SELECT 100, 'n', 1, 1.0) s ON d.id = s.id WHEN MATCHED AND s.id = 2 THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql(f"UPDATE {t} SET id = 103 WHERE id = 3")  # a key change: 3 must go
    if tracked:
        # One commit's rows cannot be split into smaller reads: its anti-join is not forced to hash them all
        # in memory (a sort-merge join spills).
        copies = Copies({v: datetime.now() for v in (2, 3)}, ("id",))
        planned = scanned_changes(spark, path, 2, 3, coarse=True, copies=copies)._jdf.queryExecution()
        assert "LeftAnti" in planned.sparkPlan().toString()
        assert "ShuffledHashJoin" not in planned.sparkPlan().toString()
    result = cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    # 1 updated, 2 deleted, 100 inserted; 103 inserted, 3 deleted: none of the 17 rows each commit copied
    assert sum(e["rows"] for e in cli.events(result, "batch")) == 5
    _final_equals_delta(spark, sink, path, target)
    spark.sql(f"RESTORE TABLE {t} TO VERSION AS OF 1")
    result = cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    if not tracked:  # 1, 2 and 3 as they were, 100 and 103 gone: none of the 17 rows it restored unchanged
        assert sum(e["rows"] for e in cli.events(result, "batch")) == 5
    _final_equals_delta(spark, sink, path, target)


def _vector_scans(frame) -> list[str]:
    """The scans of `frame`'s plan that read files through deletion-vector row filters, by Delta index."""
    scans = []
    for child in python_list(frame._jdf.queryExecution().logical().children()):
        if child.getClass().getSimpleName() == "LogicalRelation":
            index = child.relation().location()
            if not index.rowIndexFilters().isEmpty():
                scans.append(index.getClass().getSimpleName())
    return scans


def test_no_scan_is_planned_for_rows_a_deletion_vector_stopped_marking_when_there_are_none(
    spark, sink, cli, tmp_path
):
    """A DELETE or UPDATE through deletion vectors re-adds a file with a larger vector: its range reads the
    rows the vector newly marks (deletes) and plans no scan for rows it stopped marking, as there are none.
    A RESTORE shrinks the vector: its range reads the rows it brings back. FINAL equals the table after
    each."""
    path = str(tmp_path / "vectors")
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, v STRING) USING delta TBLPROPERTIES (delta.enableDeletionVectors = true)"
    )
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 20, 1, 1)")  # one file
    target = TargetName("from_log", "vectors")
    cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    spark.sql(f"DELETE FROM {t} WHERE id IN (1, 2)")  # version 2
    spark.sql(f"UPDATE {t} SET v = 'u' WHERE id = 3")  # version 3
    grown = scanned_changes(spark, path, 2, 3, coarse=True)
    assert _vector_scans(grown) == ["TahoeRemoveFileIndex"] * 2
    assert sorted((r["id"], r["_change_type"]) for r in grown.collect()) == [
        (1, "delete"), (2, "delete"), (3, "delete"), (3, "insert")
    ]  # fmt: skip
    cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    _final_equals_delta(spark, sink, path, target)
    spark.sql(f"RESTORE TABLE {t} TO VERSION AS OF 1")  # version 4: 1, 2 and 3 as they were
    shrunk = scanned_changes(spark, path, 4, 4, coarse=True)
    assert _vector_scans(shrunk) == ["CdcAddFileIndex"]  # (the UPDATE's new file is removed whole)
    assert sorted((r["id"], r["_change_type"]) for r in shrunk.collect()) == [
        (1, "insert"), (2, "insert"), (3, "delete"), (3, "insert")
    ]  # fmt: skip
    cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    _final_equals_delta(spark, sink, path, target)


def test_row_tracked_rewrites_of_a_partitioned_table_write_only_what_changed(spark, sink, cli, tmp_path):
    """Row-tracked rewrites of a partitioned table, whose target's sorting key includes the partition: every
    seventh row updated, a row moved to another partition (its old partition's row deleted), a key changed,
    rows deleted; the rows written are exactly the changed ones and FINAL equals the table."""
    path = str(tmp_path / "tracked_parts")
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, v STRING, g BIGINT) USING delta PARTITIONED BY (g) "
        "TBLPROPERTIES (delta.enableRowTracking = true, delta.enableDeletionVectors = false)"
    )
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id), id % 2 FROM range(0, 300, 1, 2)")
    target = TargetName("from_log", "tracked_parts")
    design = ("--order-by", "g,id", "--partition-by", "g")
    cli.replicate("run", path, str(target), "--once", "--reader", "spark", *design)
    spark.sql(
        f"MERGE INTO {t} d USING (SELECT id, 'm' AS v, id % 2 AS g FROM range(0, 300, 7) "
        "UNION ALL SELECT 500, 'n', 1) s ON d.id = s.id "
        "WHEN MATCHED AND s.id % 11 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )  # 43 matched: 4 deleted (0, 77, 154, 231), 39 updated; 500 inserted
    spark.sql(f"UPDATE {t} SET g = 1 - g WHERE id = 100")  # moves to the other partition
    spark.sql(f"UPDATE {t} SET id = 1000 WHERE id = 101")  # a key change
    result = cli.replicate("run", path, str(target), "--once", "--reader", "spark", *design)
    # 48 rows read and written, none of the 250 or so each rewrite copied: the 42 inserts (39 updated, 500,
    # 100 moved, 1000), the 4 deleted keys' tombstones, and those of the moved row's old partition and of the
    # changed key
    assert [e["rows"] for e in cli.events(result, "range_read")] == [48]
    assert sum(e["rows"] for e in cli.events(result, "batch")) == 48
    _final_equals_delta(spark, sink, path, target)


@pytest.mark.parametrize("tracked", [True, False], ids=["row_tracking", "copy_on_write"])
def test_a_range_is_derived_from_the_files_it_found_and_those_it_leaves(
    spark, sink, cli, tmp_path, monkeypatch, tracked
):
    """A range of copy-on-write commits is derived at once (netchanges.py): for each key gone a tombstone at
    its delete with the values the target holds; nothing for a key inserted and deleted within the range, no
    tombstone for one deleted and inserted again; an OPTIMIZE among them moves rows without changing them.
    With row tracking, each changed row once, at its last change; without, every row of a file still there
    at the end, at the version that wrote that file. ClickHouse's reader derives it at once too (rangereads.py),
    every row of those files, with the same tombstones. FINAL equals the table, on both readers."""
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)  # (however few rows it rewrites)
    path = str(tmp_path / f"net_{tracked}")
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, v STRING) USING delta "
        f"TBLPROPERTIES (delta.enableRowTracking = {str(tracked).lower()}, delta.enableDeletionVectors = false)"
    )
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 10, 1, 2)")  # version 1, two files
    target, by_clickhouse = (
        TargetName("from_log", f"net_{tracked}"),
        TargetName("from_log", f"net_{tracked}_ch"),
    )
    for name, reader in ((target, "spark"), (by_clickhouse, "clickhouse")):
        cli.replicate("run", path, str(name), "--once", "--reader", reader)
    commits = _rewrites_in_one_range(spark, path)
    copies = rowcopies.rewrites(commits, ("id",))
    assert copies is not None and sorted(copies.times) == [2, 3, 4, 5, 6, 7] and copies.tracked == tracked
    derived = scanned_changes(spark, path, 2, 7, coarse=True, copies=copies).collect()
    inserts = (
        [(1, "b", "insert", 3), (2, "again", "insert", 7), (30, "v4", "insert", 6)] if tracked else _EVERY_ROW
    )
    found = sorted((r["id"], r["v"], r["_change_type"], r["_commit_version"]) for r in derived)
    assert found == sorted(inserts + _GONE)
    result = cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    assert sum(e["rows"] for e in cli.events(result, "batch")) == len(inserts + _GONE)
    _final_equals_delta(spark, sink, path, target)
    cli.replicate("run", path, str(by_clickhouse), "--once", "--reader", "clickhouse")
    assert _written_since(sink, by_clickhouse, 1) == sorted(_EVERY_ROW + _GONE)
    _final_equals_delta(spark, sink, path, by_clickhouse)


def test_a_range_of_deletion_vectors_is_derived_at_once_by_clickhouse(
    spark, sink, cli, tmp_path, monkeypatch
):
    """The same range with deletion vectors (and row tracking and column mapping): each MERGE, UPDATE and
    DELETE re-adds the files it changes with a larger vector. ClickHouse reads each file as it was at a
    version, so it derives the range at once (rangereads.py) with the same rows as without vectors: a file
    re-added is found before the range and is there at its end, and the rows its vectors deleted are
    tombstones at their delete. Spark derives it commit by commit. FINAL equals the table, on both readers."""
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)
    path = str(tmp_path / "net_vectors")
    t = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {t} (id BIGINT, v STRING) USING delta TBLPROPERTIES ({FEATURES})")
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 10, 1, 2)")  # version 1, two files
    by_spark, by_clickhouse = TargetName("from_log", "net_dv"), TargetName("from_log", "net_dv_ch")
    for name, reader in ((by_spark, "spark"), (by_clickhouse, "clickhouse")):
        cli.replicate("run", path, str(name), "--once", "--reader", reader)
    commits = _rewrites_in_one_range(spark, path)
    # (3 rewrote its two-row file whole; 4, an OPTIMIZE, removed files with vectors)
    assert [c.version for c in commits if c.files is not None and c.files.vectors] == [2, 4, 5, 6]
    copies = rowcopies.rewrites(commits, ("id",))
    assert copies is None or not copies.times  # (Spark: commit by commit)
    cli.replicate("run", path, str(by_clickhouse), "--once", "--reader", "clickhouse")
    assert _written_since(sink, by_clickhouse, 1) == sorted(_EVERY_ROW + _GONE)
    _final_equals_delta(spark, sink, path, by_clickhouse)
    cli.replicate("run", path, str(by_spark), "--once", "--reader", "spark")
    _final_equals_delta(spark, sink, path, by_spark)


# What the range of _rewrites_in_one_range leaves, derived at once: each gone key's one tombstone, at its
# delete (3's first file was rewritten at 2); every row of a file there at the end, at the version that wrote
# it (OPTIMIZE wrote one file, which versions 5 and 6 rewrote or re-added).
_GONE = [(3, "v3", "delete", 5), (4, "v4", "delete", 6)]
_KEPT = [(1, "b")] + [(i, f"v{i}") for i in (0, 5, 6, 7, 8, 9)] + [(30, "v4")]
_EVERY_ROW = [(i, v, "insert", 6) for i, v in _KEPT] + [(2, "again", "insert", 7)]


def _rewrites_in_one_range(spark, path: str) -> list:
    """Versions 2..7 of the table at `path` (ids 0..9 at version 1): a MERGE, an UPDATE, an OPTIMIZE, a
    DELETE, a key change and a re-insert. Their commits, as the log records them."""
    t = f"delta.`{path}`"
    spark.sql(
        f"MERGE INTO {t} d USING (SELECT * FROM VALUES (1, 'a', 'u'), (2, '', 'd'), (20, 'n', 'u') AS s(id, v, op)) s "
        "ON d.id = s.id WHEN MATCHED AND s.op = 'd' THEN DELETE WHEN MATCHED THEN UPDATE SET d.v = s.v "
        "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
    )  # version 2
    spark.sql(f"UPDATE {t} SET v = 'b' WHERE id = 1")  # 3: 1 changed again
    spark.sql(f"OPTIMIZE {t}")  # 4: every row moved, none changed
    spark.sql(f"DELETE FROM {t} WHERE id IN (3, 20)")  # 5: 20 never reached the target
    spark.sql(f"UPDATE {t} SET id = 30 WHERE id = 4")  # 6: a key change, 4 gone
    spark.sql(f"INSERT INTO {t} VALUES (2, 'again')")  # 7: 2 back
    return [
        parse_commit(v, (Path(path) / "_delta_log" / f"{v:020}.json").read_text(), 0) for v in range(2, 8)
    ]


def _written_since(sink, target: TargetName, version: int) -> list[tuple]:
    """The rows written to `target` after `version`: (id, v, insert or delete, their version), sorted."""
    written = sink.query_arrow(
        f"SELECT id, v, _is_deleted, _commit_version FROM {schema.qualified(target)} "
        f"WHERE _commit_version > {version}"
    ).to_pylist()
    return sorted(
        (r["id"], r["v"], "delete" if r["_is_deleted"] else "insert", r["_commit_version"]) for r in written
    )


def test_a_row_tracked_range_whose_every_new_file_is_removed_again_writes_nothing(
    spark, sink, cli, tmp_path, monkeypatch
):
    """Rows inserted, updated and deleted within one row-tracked range never reach the target: derived at
    once, the range has no file before it and none at its end, and writes nothing."""
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)
    path = str(tmp_path / "net_none")
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, v STRING) USING delta "
        "TBLPROPERTIES (delta.enableRowTracking = true, delta.enableDeletionVectors = false)"
    )
    target = TargetName("from_log", "net_none")
    cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE {t} SET v = 'c' WHERE id = 1")
    spark.sql(f"DELETE FROM {t}")
    result = cli.replicate("run", path, str(target), "--once", "--reader", "spark")
    assert [e["rows"] for e in cli.events(result, "range_read")] == [0]
    _final_equals_delta(spark, sink, path, target)


_histories = itertools.count()
# One commit of a row-tracked table without a feed: a MERGE (ids upserted, ids deleted), a key change (to a key
# no row has), or a row moved to the other partition.
_commits = st.one_of(
    st.tuples(
        st.just("merge"),
        st.lists(st.integers(0, 220), max_size=12, unique=True),
        st.lists(st.integers(0, 220), max_size=4, unique=True),
    ),
    st.tuples(st.just("rekey"), st.integers(0, 220)),
    st.tuples(st.just("move"), st.integers(0, 220)),
)


@settings(max_examples=3, derandomize=True, database=None, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    st.integers(1, 200),
    st.lists(st.tuples(_commits, st.booleans()), min_size=2, max_size=5),
    st.sampled_from((1, 40, 500_000)),
)
def test_generated_row_tracked_rewrites_replicate_exactly(
    spark, sink, cli, tmp_path, monkeypatch, rows, commits, size
):
    """Generated histories of copy-on-write rewrites on a row-tracked, partitioned table without a feed,
    written by Spark (MERGEs that update, delete and insert, key changes, rows moved between partitions),
    replicated after the commits drawn and at the end in ranges of a drawn size, each derived at once
    wherever it can be (netchanges.py), whether that pays or not: FINAL equals the table."""
    monkeypatch.setattr(changeset.FileSpan, "pays", lambda span: span.derivable)
    n = next(_histories)
    path = str(tmp_path / f"tracked_history_{n}")
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, v STRING, g BIGINT) USING delta PARTITIONED BY (g) "
        "TBLPROPERTIES (delta.enableRowTracking = true, delta.enableDeletionVectors = false)"
    )
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id), id % 2 FROM range(0, {rows}, 1, 2)")
    target = TargetName("from_log", f"tracked_history_{n}")

    def replicate() -> None:
        cli.replicate("run", path, str(target), "--once", "--reader", "spark", "--order-by", "g,id",
                      "--partition-by", "g", "--max-rows-per-read", str(size))  # fmt: skip
        _final_equals_delta(spark, sink, path, target)

    replicate()
    for step, (drawn, run_after) in enumerate(commits):
        if _commit_drawn(spark, t, step, drawn) and run_after:
            replicate()
    replicate()


def _commit_drawn(spark, t: str, step: int, drawn: tuple) -> bool:
    """Spark commits one drawn change to `t`; False where it draws nothing to commit."""
    kind, *args = drawn
    if kind == "merge":
        upserted, deleted = args[0], [i for i in args[1] if i not in args[0]]
        source = ", ".join(
            [f"({i}, 'u{step}', {i % 2}, 'u')" for i in upserted] + [f"({i}, '', 0, 'd')" for i in deleted]
        )
        if not source:
            return False
        spark.sql(
            f"MERGE INTO {t} d USING (SELECT * FROM VALUES {source} AS s(id, v, g, op)) s ON d.id = s.id "
            "WHEN MATCHED AND s.op = 'd' THEN DELETE WHEN MATCHED THEN UPDATE SET d.v = s.v "
            "WHEN NOT MATCHED AND s.op = 'u' THEN INSERT (id, v, g) VALUES (s.id, s.v, s.g)"
        )
    elif kind == "rekey":
        spark.sql(f"UPDATE {t} SET id = {1000 + step} WHERE id = {args[0]}")
    elif kind == "move":
        spark.sql(f"UPDATE {t} SET g = 1 - g WHERE id = {args[0]}")
    elif kind == "replace":  # the same keys deleted and written again in one commit
        ids = ", ".join(str(i) for i in args[0])
        spark.sql(f"INSERT INTO {t} REPLACE WHERE id IN ({ids}) SELECT id, 'again{step}', g FROM {t} "
                  f"WHERE id IN ({ids})")  # fmt: skip
    else:
        spark.sql(f"OPTIMIZE {t}")
    return True


def _rows_at(sink, target: TargetName, version: int) -> int:
    """The rows a run wrote at `version` (a merge keeps the newest row of a key: these survive it)."""
    table = sink.query_arrow(
        f"SELECT count() AS n FROM {schema.qualified(target)} WHERE _commit_version = {version}"
    )
    return int(table.column("n")[0].as_py())


@pytest.mark.parametrize(
    "properties",
    [
        "delta.enableRowTracking = true, delta.enableDeletionVectors = false",
        "delta.enableDeletionVectors = true",
    ],
    ids=["row tracking", "deletion vectors"],
)
def test_clickhouse_reads_only_the_rows_a_commit_changed(spark, sink, cli, tmp_path, properties):
    """--reader clickhouse on a table without a feed, each commit read on its own: a row-tracked rewrite's
    inserts are the rows whose commit version is its own, a deletion-vector commit's the files it adds anew,
    and the tombstones are the removed keys no added row holds, so the rows a commit copied or kept are neither
    read as changes nor written. The sorting key holds a column that is NULL in some rows: a copied row with a
    NULL there is held, not deleted."""
    path = str(tmp_path / "commits_ch")
    t = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {t} (id BIGINT, v STRING, g BIGINT) USING delta TBLPROPERTIES ({properties})")
    spark.sql(
        f"INSERT INTO {t} SELECT id, concat('v', id), CASE WHEN id % 4 = 0 THEN NULL ELSE id % 3 END "
        "FROM range(0, 20, 1, 1)"
    )  # one file: every rewrite below copies the rows it does not change
    target = TargetName("from_log", "commits_dv" if "DeletionVectors = true" in properties else "commits_rt")
    run = ("--once", "--reader", "clickhouse", "--order-by", "g,id")
    cli.replicate("run", path, str(target), *run)
    spark.sql(
        f"MERGE INTO {t} d USING (SELECT id, 'm' AS v, 2L AS g FROM range(1, 3) UNION ALL SELECT 100, 'n', 1) s "
        "ON d.id = s.id WHEN MATCHED AND s.id = 2 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    )  # version 2: 1 updated (its old sorting key (1, 1) goes), 2 deleted, 100 inserted
    spark.sql(f"UPDATE {t} SET id = 103 WHERE id = 3")  # version 3: a key change, 3 must go
    spark.sql(f"DELETE FROM {t} WHERE id = 4")  # version 4: a row whose g is NULL
    result = cli.replicate("run", path, str(target), *run)
    assert cli.events(result, "committed")[-1]["version"] == 4
    # none of the 17 or so rows each commit copied or kept: inserts 1 and 100 and tombstones (1, 1) and 2;
    # insert 103 and tombstone 3; tombstone 4
    assert [_rows_at(sink, target, v) for v in (2, 3, 4)] == [4, 2, 1]
    _final_equals_delta(spark, sink, path, target)


_tracked_commits = st.one_of(
    _commits,
    st.tuples(st.just("replace"), st.lists(st.integers(0, 220), min_size=1, max_size=4, unique=True)),
    st.tuples(st.just("optimize")),
)


@pytest.mark.parametrize(
    "properties",
    [
        "delta.enableRowTracking = true, delta.enableDeletionVectors = false",
        "delta.enableDeletionVectors = true",
    ],
    ids=["row tracking", "deletion vectors"],
)
@settings(max_examples=3, derandomize=True, database=None, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    st.integers(1, 200),
    st.lists(st.tuples(_tracked_commits, st.booleans()), min_size=2, max_size=6),
    st.sampled_from((1, 40, 500_000)),
)
def test_generated_histories_read_by_clickhouse_commit_by_commit_replicate_exactly(
    spark, sink, cli, tmp_path, properties, rows, commits, size
):
    """Generated histories on a table without a feed, written by Spark (MERGEs that update, delete and insert,
    key changes, changes of a sorting-key column that is NULL in some rows, a delete and re-insert of the same
    keys in one commit, OPTIMIZE), replicated by --reader clickhouse after the commits drawn and at the end in
    ranges of a drawn size: FINAL equals the table. With row tracking each commit's files are read as they
    are; with deletion vectors, through the table at its versions."""
    n = next(_histories)
    path = str(tmp_path / f"commit_history_{n}")
    t = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {t} (id BIGINT, v STRING, g BIGINT) USING delta TBLPROPERTIES ({properties})")
    spark.sql(
        f"INSERT INTO {t} SELECT id, concat('v', id), CASE WHEN id % 5 = 0 THEN NULL ELSE id % 2 END "
        f"FROM range(0, {rows}, 1, 2)"
    )
    target = TargetName("from_log", f"commit_history_{n}")

    def replicate() -> None:
        cli.replicate("run", path, str(target), "--once", "--reader", "clickhouse", "--order-by", "g,id",
                      "--max-rows-per-read", str(size))  # fmt: skip
        _final_equals_delta(spark, sink, path, target)

    replicate()
    for step, (drawn, run_after) in enumerate(commits):
        if _commit_drawn(spark, t, step, drawn) and run_after:
            replicate()
    replicate()
