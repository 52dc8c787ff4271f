"""Delta schema changes: added columns and widened types are followed in place; drops, renames and
narrowing stop at the version that made them, or rebuild the table with --on-schema-change resync."""

from __future__ import annotations

import pytest

from cdc2ch.model.config import TargetName
from tests.support.helpers import SinkTap, assert_replicated, committed_version, job_config, latest_version


def _sql(spark, *statements):
    for s in statements:
        spark.sql(s)


def _columns(sink, target: TargetName) -> dict[str, str]:
    return dict(
        sink.query_rows(
            "SELECT name, type FROM system.columns WHERE database = {d:String} AND table = {t:String}",
            {"d": target.database, "t": target.table},
        )
    )


def test_added_columns_are_added_and_filled(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "add")
    target = TargetName(database, "add")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id BIGINT, name STRING) USING delta "
        f"TBLPROPERTIES (delta.enableChangeDataFeed = true)",
        f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')",
    )
    cli.replicate("run", path, target, "--once")
    # One run covers versions before and after each change: the reads must be split at them.
    _sql(
        spark,
        f"INSERT INTO delta.`{path}` VALUES (3, 'c')",
        f"ALTER TABLE delta.`{path}` ADD COLUMNS (score DOUBLE, tag STRING)",
        f"INSERT INTO delta.`{path}` VALUES (4, 'd', 1.5, 'x')",
        f"UPDATE delta.`{path}` SET score = 9.0 WHERE id = 1",
    )
    spark.createDataFrame(
        [(5, "e", 2.5, "y", 7)], "id BIGINT, name STRING, score DOUBLE, tag STRING, extra INT"
    ).write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    result = cli.replicate("run", path, target, "--once")
    added = {e["column"]: e["type"] for e in cli.events(result, "column_added")}
    assert added == {
        "score": "Nullable(Float64)",
        "tag": "Nullable(String)",
        "extra": "Nullable(Int32)",
    }
    assert len({(e["start"], e["end"]) for e in cli.events(result, "batch")}) >= 3  # ranges, by either reader
    assert_replicated(spark, sink, path, target)
    assert committed_version(sink, database, str(target)) == latest_version(spark, path)


def test_widened_types_are_modified(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "widen")
    target = TargetName(database, "widen")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, small SMALLINT, f FLOAT, d DECIMAL(5,2), dt DATE, "
        f"s STRUCT<x: INT>) USING delta "
        f"TBLPROPERTIES (delta.enableChangeDataFeed = true, delta.enableTypeWidening = true)",
        f"INSERT INTO delta.`{path}` VALUES (1, 1, 1.5, 1.25, DATE'1960-01-01', named_struct('x', 1))",
    )
    cli.replicate("run", path, target, "--once")
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` ALTER COLUMN small TYPE INT",
        f"ALTER TABLE delta.`{path}` ALTER COLUMN f TYPE DOUBLE",
        f"ALTER TABLE delta.`{path}` ALTER COLUMN d TYPE DECIMAL(10,4)",
        f"ALTER TABLE delta.`{path}` ADD COLUMNS (s.y STRING)",
        f"INSERT INTO delta.`{path}` VALUES (2, 100000, 2.5, 123456.1234, DATE'2300-01-01', "
        f"named_struct('x', 2, 'y', 'why'))",
        f"UPDATE delta.`{path}` SET small = small + 70000 WHERE id = 1",
    )
    result = cli.replicate("run", path, target, "--once")
    widened = {e["column"]: e["type"] for e in cli.events(result, "column_widened")}
    assert widened == {
        "small": "Nullable(Int32)",
        "f": "Nullable(Float64)",
        "d": "Nullable(Decimal(10, 4))",
        "s": "Tuple(`x` Nullable(Int32), `y` Nullable(String))",
    }
    assert _columns(sink, target)["small"] == "Nullable(Int32)"
    assert_replicated(spark, sink, path, target)


@pytest.fixture
def mapped_table(spark, tmp_path):
    """A column-mapping table (drops and renames need it), replicated up to version 1."""
    path = str(tmp_path / "mapped")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, name STRING, `select` STRING, gone STRING) USING delta "
        f"TBLPROPERTIES (delta.enableChangeDataFeed = true, delta.columnMapping.mode = 'name', "
        f"delta.minReaderVersion = 2, delta.minWriterVersion = 5)",
        f"INSERT INTO delta.`{path}` VALUES (1, 'a', 's1', 'g1'), (2, 'b', 's2', 'g2')",
    )
    return path


def test_rename_stops_at_its_version_then_resync_rebuilds(spark, sink, cli, database, mapped_table):
    path, target = mapped_table, TargetName(database, "mapped")
    cli.replicate("run", path, target, "--once")
    _sql(
        spark,
        f"INSERT INTO delta.`{path}` VALUES (3, 'c', 's3', 'g3')",  # v2: still followed
        f"ALTER TABLE delta.`{path}` RENAME COLUMN `select` TO `sel.ect`",  # v3
        f"INSERT INTO delta.`{path}` VALUES (4, 'd', 's4', 'g4')",
        f"ALTER TABLE delta.`{path}` DROP COLUMN gone",
        f"DELETE FROM delta.`{path}` WHERE id = 1",
    )
    result = cli.replicate("run", path, target, "--once", expect=1)
    err = " ".join(result.stderr.split())
    assert "schema changed at version 3" in err and "RENAME COLUMN select TO `sel.ect`" in err
    assert "column 'select' is no longer in the Delta table" in err and "--on-schema-change resync" in err
    assert committed_version(sink, database, str(target)) == 2  # everything before the change landed
    assert "select" in _columns(sink, target)

    result = cli.replicate("run", path, target, "--once", "--on-schema-change", "resync")
    assert cli.events(result, "resync_done")[0]["version"] == latest_version(spark, path)
    assert set(_columns(sink, target)) >= {"id", "name", "sel.ect"} and "gone" not in _columns(sink, target)
    assert sink.table_comment(TargetName(database, "mapped__cdc2ch_resync")) is None  # side table gone
    assert committed_version(sink, database, str(target)) == latest_version(spark, path)
    assert_replicated(spark, sink, path, target)

    _sql(spark, f"UPDATE delta.`{path}` SET `sel.ect` = 'new' WHERE id = 2")
    cli.replicate("run", path, target, "--once")
    assert_replicated(spark, sink, path, target)


def test_resync_interrupted_after_the_swap_finishes_on_restart(spark, sink, cli, database, mapped_table):
    """A crash between swapping in the rebuilt table and recording its version: the next start sees the
    rebuilt table's marker and moves the offset instead of replaying changes the table already holds."""
    import threading

    from cdc2ch.replication.pipeline import Replicator
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    path, target = mapped_table, TargetName(database, "mapped")
    cli.replicate("run", path, target, "--once")
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` DROP COLUMN gone",
        f"INSERT INTO delta.`{path}` VALUES (5, 'e', 's5')",
    )

    class Crash(Exception):
        pass

    class CrashAfterSwap(SinkTap):
        def command(self, sql, *args, **kwargs):
            out = self.inner.command(sql, *args, **kwargs)
            if sql.startswith("EXCHANGE TABLES"):
                raise Crash
            return out

    cfg = job_config(path, target, cli.dsn, on_schema_change="resync")
    with pytest.raises(Crash):
        Replicator(
            cfg, DeltaSource(spark, path), CrashAfterSwap(sink, lambda t: None), threading.Event()
        ).run()
    assert committed_version(sink, database, str(target)) == 1  # swapped, but not recorded

    result = cli.replicate("run", path, target, "--once")
    assert cli.events(result, "resync_recovered")[0]["version"] == latest_version(spark, path)
    assert committed_version(sink, database, str(target)) == latest_version(spark, path)
    assert sink.table_comment(TargetName(database, "mapped__cdc2ch_resync")) is None
    assert_replicated(spark, sink, path, target)


def test_key_widening_and_narrowing_stop(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "keyw")
    target = TargetName(database, "keyw")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, v BIGINT) USING delta "
        f"TBLPROPERTIES (delta.enableChangeDataFeed = true, delta.enableTypeWidening = true)",
        f"INSERT INTO delta.`{path}` VALUES (1, 1)",
    )
    cli.replicate("run", path, target, "--once")
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` ALTER COLUMN id TYPE BIGINT",
        f"INSERT INTO delta.`{path}` VALUES (2, 2)",
    )
    err = " ".join(cli.replicate("run", path, target, "--once", expect=1).stderr.split())
    assert (
        "schema changed at version 2" in err and "primary-key column 'id' widened from Int32 to Int64" in err
    )
    assert committed_version(sink, database, str(target)) == 1

    # An overwrite with a narrower type is not a widening either.
    path2 = str(tmp_path / "narrow")
    target2 = TargetName(database, "narrow")
    spark.createDataFrame([(1, 10)], "id INT, v BIGINT").write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).save(path2)
    cli.replicate("run", path2, target2, "--once")
    spark.createDataFrame([(1, 10)], "id INT, v INT").write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true"
    ).save(path2)
    err = " ".join(cli.replicate("run", path2, target2, "--once", expect=1).stderr.split())
    assert (
        "schema changed at version 1" in err
        and "column 'v' changed type from Nullable(Int64) to Nullable(Int32)" in err
    )
