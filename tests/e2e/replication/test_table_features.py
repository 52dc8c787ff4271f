"""Delta table features in the data: each table written by Spark with the feature on, replicated by `run` and
`snapshot` with each reader, and FINAL compared with Delta at the committed version. Where ClickHouse's Delta
reader cannot read a feature, `--reader clickhouse` is refused before anything is written."""

from __future__ import annotations

import json
import os
from decimal import Decimal

import pytest

from cdc2ch.model.config import TargetName
from tests.support.helpers import clickhouse_rows, committed_version, delta_rows

READERS = ("spark", "clickhouse")
CDF = "delta.enableChangeDataFeed = true"


def _sql(spark, *statements):
    for s in statements:
        spark.sql(s)


def _log_version(path: str) -> int:
    return max(int(n[:-5]) for n in os.listdir(f"{path}/_delta_log") if n.endswith(".json"))


def _log_actions(path: str, kind: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(f"{path}/_delta_log")):
        if name.endswith(".json"):
            with open(f"{path}/_delta_log/{name}") as fh:
                out += [a[kind] for a in map(json.loads, fh) if kind in a]
    return out


def _columns(sink, target: TargetName) -> dict[str, str]:
    return dict(
        sink.query_rows(
            "SELECT name, type FROM system.columns WHERE database = {d:String} AND table = {t:String}",
            {"d": target.database, "t": target.table},
        )
    )


_EXPECTED: dict[tuple[str, int], tuple[list[str], list[tuple]]] = {}


def _replicated(spark, sink, path, target, *, latest=True):
    """FINAL equals Delta at the pipeline's committed version (the latest one, unless `latest` is False),
    row for row (tests.support.helpers.assert_replicated; Delta's side read once per version)."""
    version = committed_version(sink, target.database, str(target))
    if latest:
        assert version == _log_version(path)
    if (path, version) not in _EXPECTED:
        columns = spark.read.format("delta").option("versionAsOf", version).load(path).columns
        _EXPECTED[(path, version)] = (columns, delta_rows(spark, path, version, columns))
    columns, expected = _EXPECTED[(path, version)]
    actual = clickhouse_rows(sink, target, columns)
    assert sorted(expected, key=repr) == sorted(actual, key=repr), (
        f"{target} differs from Delta {path}@{version}: missing "
        f"{[r for r in expected if r not in actual][:5]}, extra {[r for r in actual if r not in expected][:5]}"
    )


def _run_and_snapshot(cli, spark, sink, path, database, name, key="id", readers=READERS):
    """Replicate the table with `run` and with `snapshot`, with each reader, into targets of their own."""
    for reader in readers:
        for command in ("run", "snapshot"):
            target = TargetName(database, f"{name}_{command}_{reader}")
            once = ("--once",) if command == "run" else ()
            cli.replicate(command, path, target, *once, "--reader", reader, key=key)
            _replicated(spark, sink, path, target)


def test_deletion_vectors(spark, sink, cli, database, tmp_path):
    """DELETE, UPDATE and MERGE write deletion vectors; OPTIMIZE and REORG … APPLY (PURGE) rewrite the files
    (no data change). Both readers apply the vectors, in the change data feed and in snapshots."""
    path = str(tmp_path / "dv")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, v STRING) USING delta "
        f"TBLPROPERTIES ({CDF}, delta.enableDeletionVectors = true)",
        f"INSERT INTO delta.`{path}` SELECT id, concat('v', id) FROM range(30)",
        f"DELETE FROM delta.`{path}` WHERE id % 5 = 0",
        f"UPDATE delta.`{path}` SET v = 'upd' WHERE id % 3 = 0",
        f"MERGE INTO delta.`{path}` t USING (SELECT id, concat('m', id) AS v FROM range(25, 35)) s "
        f"ON t.id = s.id WHEN MATCHED AND s.id = 26 THEN DELETE WHEN MATCHED THEN UPDATE SET v = s.v "
        f"WHEN NOT MATCHED THEN INSERT *",
    )
    assert sum(1 for a in _log_actions(path, "add") if a.get("deletionVector")) >= 3
    runs = {r: TargetName(database, f"dv_run_{r}") for r in READERS}
    for reader, target in runs.items():
        cli.replicate("run", path, target, "--once", "--reader", reader)
        _replicated(spark, sink, path, target)
    # A snapshot at version 3 (after the DELETE and UPDATE: files with deletion vectors), then `run`.
    for reader in READERS:
        snap = TargetName(database, f"dv_snap_{reader}")
        cli.replicate("snapshot", path, snap, "--reader", reader, "--version", "3")
        _replicated(spark, sink, path, snap, latest=False)

    _sql(
        spark,
        f"OPTIMIZE delta.`{path}`",
        f"DELETE FROM delta.`{path}` WHERE id IN (1, 2)",
        f"UPDATE delta.`{path}` SET v = 'late' WHERE id = 4",
        f"REORG TABLE delta.`{path}` APPLY (PURGE)",
        f"INSERT INTO delta.`{path}` VALUES (100, 'new')",
    )
    operations = [a["operation"] for a in _log_actions(path, "commitInfo")]
    assert "OPTIMIZE" in operations and "REORG" in operations, operations
    for reader, target in runs.items():
        cli.replicate("run", path, target, "--once", "--reader", reader)
        _replicated(spark, sink, path, target)
    for reader in READERS:  # the snapshots at 3 catch up with run
        snap = TargetName(database, f"dv_snap_{reader}")
        cli.replicate("run", path, snap, "--once", "--reader", reader)
        _replicated(spark, sink, path, snap)


@pytest.mark.parametrize("mode, reader", [("name", "spark"), ("id", "clickhouse")])
def test_column_mapping_rename_and_drop(mode, reader, spark, sink, cli, database, tmp_path):
    """Column mapping reads the physical columns by id or name: a RENAME or DROP stops replication
    (`--on-schema-change fail`) at its version, and `resync` rebuilds the table. A dropped column added
    again under the same name starts empty; its old values must not come back."""
    path = str(tmp_path / f"cm_{mode}")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, a STRING, b STRING, c INT) USING delta "
        f"TBLPROPERTIES ({CDF}, delta.columnMapping.mode = '{mode}')",
        f"INSERT INTO delta.`{path}` VALUES (1, 'a1', 'b1', 1), (2, 'a2', 'b2', 2)",
        f"UPDATE delta.`{path}` SET c = 20 WHERE id = 2",
    )
    target = TargetName(database, f"cm_{mode}")
    cli.replicate("run", path, target, "--once", "--reader", reader)
    _replicated(spark, sink, path, target)
    _sql(
        spark,
        f"INSERT INTO delta.`{path}` VALUES (3, 'a3', 'b3', 3)",  # v3: followed
        f"ALTER TABLE delta.`{path}` RENAME COLUMN a TO `a new`",  # v4
        f"ALTER TABLE delta.`{path}` DROP COLUMN b",
        f"ALTER TABLE delta.`{path}` ADD COLUMNS (b STRING)",
        f"INSERT INTO delta.`{path}` VALUES (4, 'a4', 4, 'b4')",
        f"UPDATE delta.`{path}` SET `a new` = 'x' WHERE id = 1",
        f"DELETE FROM delta.`{path}` WHERE id = 2",
    )
    err = " ".join(cli.replicate("run", path, target, "--once", "--reader", reader, expect=1).stderr.split())
    assert "schema changed at version 4" in err and "RENAME COLUMN a TO a new" in err, err
    assert "--on-schema-change resync" in err
    assert committed_version(sink, database, str(target)) == 3
    assert "a" in _columns(sink, target) and "a new" not in _columns(sink, target)

    result = cli.replicate("run", path, target, "--once", "--reader", reader, "--on-schema-change", "resync")
    assert cli.events(result, "resync_done")[0]["version"] == _log_version(path)
    assert list(_columns(sink, target))[:4] == ["id", "a new", "c", "b"]
    _replicated(spark, sink, path, target)
    assert sink.query_rows(
        f"SELECT id, b FROM {database}.cm_{mode} FINAL WHERE NOT _is_deleted ORDER BY id"
    ) == [
        (1, None),
        (3, None),
        (4, "b4"),
    ]
    # A DROP alone under `fail` stops too; the table then goes on after a resync.
    _sql(
        spark, f"ALTER TABLE delta.`{path}` DROP COLUMN c", f"UPDATE delta.`{path}` SET b = 'y' WHERE id = 3"
    )
    err = " ".join(cli.replicate("run", path, target, "--once", "--reader", reader, expect=1).stderr.split())
    assert "DROP COLUMNS" in err and "column 'c' is no longer in the Delta table" in err, err
    cli.replicate("run", path, target, "--once", "--reader", reader, "--on-schema-change", "resync")
    _replicated(spark, sink, path, target)
    snap = TargetName(database, f"cm_{mode}_snap")
    cli.replicate("snapshot", path, snap, "--reader", reader)
    _replicated(spark, sink, path, snap)


def test_type_widening(spark, sink, cli, database, tmp_path):
    """int → bigint, smallint → int, float → double, int → double, decimal(5,2) → decimal(12,4) and
    date → timestamp_ntz: files written before the change are read with the wider type."""
    path = str(tmp_path / "widen")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, i INT, s SMALLINT, f FLOAT, n INT, d DECIMAL(5,2), dt DATE) "
        f"USING delta TBLPROPERTIES ({CDF}, delta.enableTypeWidening = true, "
        f"'delta.feature.timestampNtz' = 'supported')",
        f"INSERT INTO delta.`{path}` VALUES (1, 1, 1, 1.5, 1, 1.25, DATE'2020-01-01'), "
        f"(2, 2, 2, 2.5, 2, 2.25, DATE'1960-02-03')",
        f"INSERT INTO delta.`{path}` VALUES (3, 3, 3, 3.5, 3, 3.25, NULL)",
    )
    targets = {r: TargetName(database, f"widen_{r}") for r in READERS}
    for reader, target in targets.items():
        cli.replicate("run", path, target, "--once", "--reader", reader)
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` ALTER COLUMN i TYPE BIGINT",
        f"ALTER TABLE delta.`{path}` ALTER COLUMN s TYPE INT",
        f"ALTER TABLE delta.`{path}` ALTER COLUMN f TYPE DOUBLE",
        f"ALTER TABLE delta.`{path}` ALTER COLUMN n TYPE DOUBLE",
        f"ALTER TABLE delta.`{path}` ALTER COLUMN d TYPE DECIMAL(12,4)",
        f"ALTER TABLE delta.`{path}` ALTER COLUMN dt TYPE TIMESTAMP_NTZ",
        f"INSERT INTO delta.`{path}` VALUES (4, 5000000000, 100000, 1.0E300, 0.1, 12345678.1234, "
        f"TIMESTAMP_NTZ'2021-01-01 12:34:56.789012')",
        f"UPDATE delta.`{path}` SET i = i + 4000000000 WHERE id = 3",
        f"DELETE FROM delta.`{path}` WHERE id = 2",
    )
    for reader, target in targets.items():
        result = cli.replicate("run", path, target, "--once", "--reader", reader)
        widened = {e["column"]: e["type"] for e in cli.events(result, "column_widened")}
        assert widened == {
            "i": "Nullable(Int64)",
            "s": "Nullable(Int32)",
            "f": "Nullable(Float64)",
            "n": "Nullable(Float64)",
            "d": "Nullable(Decimal(12, 4))",
            "dt": "Nullable(DateTime64(6))",
        }, reader
        _replicated(spark, sink, path, target)
    _run_and_snapshot(cli, spark, sink, path, database, "widened")


def test_row_tracking_and_liquid_clustering(spark, sink, cli, database, tmp_path):
    """Row tracking's hidden row ids and commit versions (materialized in the files by UPDATE and MERGE) and
    liquid clustering's re-clustered files stay out of the target: only the table's own columns arrive."""
    path = str(tmp_path / "rt")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, region STRING, v INT) USING delta CLUSTER BY (region) "
        f"TBLPROPERTIES ({CDF}, delta.enableRowTracking = true)",
        f"INSERT INTO delta.`{path}` VALUES (1, 'eu', 1), (2, 'us', 2), (3, 'eu', 3)",
        f"INSERT INTO delta.`{path}` VALUES (4, 'ap', 4), (5, 'us', 5)",
        f"UPDATE delta.`{path}` SET v = v * 10 WHERE region = 'eu'",
        f"OPTIMIZE delta.`{path}`",
        f"MERGE INTO delta.`{path}` t USING (SELECT 5 AS id, 'us' AS region, 50 AS v UNION ALL "
        f"SELECT 6, 'sa', 6) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        f"DELETE FROM delta.`{path}` WHERE id = 2",
        f"ALTER TABLE delta.`{path}` CLUSTER BY (id)",
        f"INSERT INTO delta.`{path}` VALUES (7, 'eu', 7)",
    )
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    assert any(r["key"] == "delta.rowTracking.materializedRowIdColumnName" for r in properties)
    assert any(a.get("operation") == "OPTIMIZE" for a in _log_actions(path, "commitInfo"))
    _run_and_snapshot(cli, spark, sink, path, database, "rt")
    for reader in READERS:
        for command in ("run", "snapshot"):
            user = [c for c in _columns(sink, TargetName(database, f"rt_{command}_{reader}")) if c[0] != "_"]
            assert user == ["id", "region", "v"]


def test_timestamp_ntz(spark, sink, cli, database, tmp_path):
    """TIMESTAMP_NTZ (no time zone) keeps its wall-clock value, microseconds and range ends, in a data and a
    partition column, with both readers."""
    path = str(tmp_path / "ntz")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, t TIMESTAMP_NTZ, p TIMESTAMP_NTZ) USING delta "
        f"PARTITIONED BY (p) TBLPROPERTIES ({CDF})",
        f"INSERT INTO delta.`{path}` VALUES "
        f"(1, TIMESTAMP_NTZ'2024-01-02 03:04:05.123456', TIMESTAMP_NTZ'2024-01-01 10:00:00.5'), "
        f"(2, TIMESTAMP_NTZ'1900-01-01 00:00:00.000001', TIMESTAMP_NTZ'1901-01-01 00:00:00'), "
        f"(3, NULL, NULL)",
        f"UPDATE delta.`{path}` SET t = TIMESTAMP_NTZ'2299-12-31 23:59:59.999999' WHERE id = 2",
    )
    _run_and_snapshot(cli, spark, sink, path, database, "ntz")
    assert _columns(sink, TargetName(database, "ntz_run_clickhouse"))["t"] == "Nullable(DateTime64(6))"
    got = sink.query_rows(f"SELECT toString(t) FROM {database}.ntz_snapshot_clickhouse FINAL WHERE id = 2")
    assert got == [("2299-12-31 23:59:59.999999",)]


VARIANTS = [  # (id, JSON text given to parse_json) — SQL NULL for id 6
    (1, '{"a": 1, "b": [1, 2.5, "x"], "c": {"d": null}, "e": {}}'),
    (2, '"a string"'),
    (3, "12345678901234567890.5"),
    (4, "[true, false, null]"),
    (5, "null"),
    (6, None),
    (7, '{"ü": "日本語 🚀", "n": -0.001}'),
]


def _variant_table(spark, path):
    values = ", ".join(
        f"({i}, {'NULL' if j is None else 'parse_json(' + repr(j) + ')'}, "
        f"array(parse_json('{{\"k\": {i}}}'), parse_json('\"s\"')), named_struct('x', parse_json('{i}.50'), 'y', {i}))"
        for i, j in VARIANTS
    )
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, j VARIANT, arr ARRAY<VARIANT>, st STRUCT<x: VARIANT, y: INT>) "
        f"USING delta TBLPROPERTIES ({CDF})",
        f"INSERT INTO delta.`{path}` VALUES {values}",
        f"""UPDATE delta.`{path}` SET j = parse_json('{{"updated": [1, {{"z": null}}]}}') WHERE id = 2""",
        f"DELETE FROM delta.`{path}` WHERE id = 4",
    )


def _assert_variants(spark, sink, path, target, updated_1=False):
    """The ClickHouse String holds each value's JSON text: equal to Delta's, as text and as JSON values
    (decimals exact), nested ones included."""
    want = {
        r["id"]: (r["j"], r["arr"], r["x"], r["y"])
        for r in spark.read.format("delta")
        .load(path)
        .selectExpr(
            "id",
            "to_json(j) AS j",
            "transform(arr, v -> to_json(v)) AS arr",
            "to_json(st.x) AS x",
            "st.y AS y",
        )
        .collect()
    }
    got = {
        i: (j, list(arr), st["x"], st["y"])
        for i, j, arr, st in sink.query_rows(
            f"SELECT id, j, arr, st FROM {target} FINAL WHERE NOT _is_deleted"
        )
    }
    assert got == {i: (j, list(arr), x, y) for i, (j, arr, x, y) in want.items()}

    def value(text):
        return None if text is None else json.loads(text, parse_float=Decimal)

    expected = {i: value(j) for i, j in VARIANTS if i != 4}
    expected[2] = {"updated": [1, {"z": None}]}
    if updated_1:
        expected[1] = {"after": "snapshot"}
    assert {i: value(j) for i, (j, *_) in got.items()} == expected
    assert got[5][0] == "null" and got[6][0] is None  # a JSON null is not a missing value
    assert got[3][0] == "12345678901234567890.5" and got[2][1] == ['{"k":2}', '"s"']


def test_variant_as_json_text(spark, sink, cli, database, tmp_path):
    """VARIANT becomes a String holding the value's JSON text with --reader spark (run, snapshot, snapshot
    then run); --reader clickhouse is refused before anything is written, naming the columns."""
    path = str(tmp_path / "var")
    _variant_table(spark, path)
    for command in ("run", "snapshot"):
        target = TargetName(database, f"var_{command}")
        cli.replicate(command, path, target, *(("--once",) if command == "run" else ()))
        assert committed_version(sink, database, str(target)) == _log_version(path)
        assert _columns(sink, target)["j"] == "Nullable(String)"
        assert _columns(sink, target)["arr"] == "Array(Nullable(String))"
        _assert_variants(spark, sink, path, f"{database}.var_{command}")
    _sql(spark, f"""UPDATE delta.`{path}` SET j = parse_json('{{"after": "snapshot"}}') WHERE id = 1""")
    cli.replicate("run", path, TargetName(database, "var_snapshot"), "--once")
    _assert_variants(spark, sink, path, f"{database}.var_snapshot", updated_1=True)

    for command in ("run", "snapshot"):
        target = TargetName(database, f"var_ch_{command}")
        once = ("--once",) if command == "run" else ()
        err = " ".join(
            cli.replicate(command, path, target, *once, "--reader", "clickhouse", expect=2).stderr.split()
        )
        assert "VARIANT columns (j, arr, st)" in err and "--reader spark" in err, err
        assert "nothing was written" in err
        assert sink.query_rows(
            "SELECT count() FROM system.tables WHERE database = {d:String} AND name LIKE 'var_ch%'",
            {"d": database},
        ) == [(0,)]
        assert sink.query_rows(
            f"SELECT count() FROM {database}.cdc2ch_state WHERE pipeline = {{p:String}}", {"p": str(target)}
        ) == [(0,)]


def test_variant_added_later_stops_the_clickhouse_reader(spark, sink, cli, database, tmp_path):
    """A pipeline on --reader clickhouse whose table gains a VARIANT column while it runs stops before that
    version, with everything before it committed; a new start is refused; --reader spark then goes on."""
    import threading

    from cdc2ch.base.errors import ConfigError
    from cdc2ch.replication.pipeline import Replicator
    from cdc2ch.source.sparkread.deltasource import DeltaSource
    from tests.support.helpers import job_config

    path = str(tmp_path / "var_later")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, v STRING) USING delta TBLPROPERTIES ({CDF})",
        f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')",
    )
    target = TargetName(database, "var_later")
    replicator = Replicator(
        job_config(path, target, cli.dsn, reader="clickhouse"),
        DeltaSource(spark, path),
        sink,
        threading.Event(),
    )
    try:
        replicator.start()
        replicator.step()
        assert committed_version(sink, database, str(target)) == 1
        _sql(
            spark,
            f"INSERT INTO delta.`{path}` VALUES (3, 'c')",  # v2
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.feature.variantType' = 'supported')",
            f"ALTER TABLE delta.`{path}` ADD COLUMNS (j VARIANT)",
            f"""INSERT INTO delta.`{path}` VALUES (4, 'd', parse_json('{{"x": [1]}}'))""",
        )
        with pytest.raises(ConfigError) as refused:
            replicator.step()
    finally:
        replicator.close()
    err = " ".join(str(refused.value).split())
    assert "VARIANT columns (j)" in err and "--reader spark" in err, err
    assert "replication stopped before versions 4..5, with version 3 committed" in err, err
    assert committed_version(sink, database, str(target)) == 3
    assert "j" not in _columns(sink, target)
    err = " ".join(
        cli.replicate("run", path, target, "--once", "--reader", "clickhouse", expect=2).stderr.split()
    )
    assert "VARIANT columns (j)" in err and "replication stopped with version 3 committed" in err, err
    cli.replicate("run", path, target, "--once", "--reader", "spark")
    assert committed_version(sink, database, str(target)) == _log_version(path)
    assert sink.query_rows(f"SELECT id, v, j FROM {target} FINAL ORDER BY id") == [
        (1, "a", None),
        (2, "b", None),
        (3, "c", None),
        (4, "d", '{"x":[1]}'),
    ]


def test_the_change_feed_is_read_as_a_file_scan_and_equals_the_documented_read(spark, tmp_path, monkeypatch):
    """`DeltaSource.changes` plans Delta's change feed as its file scan (CDCReader.changesToBatchDF), not
    through the row-by-row relation of `readChangeFeed`, and gives the same rows as that read, on a table
    with column mapping, deletion vectors, a renamed column and every kind of change."""
    from cdc2ch.model.schema import user_fields
    from cdc2ch.source.sparkread import deltasource as delta
    from cdc2ch.source.sparkread.deltasource import DeltaSource

    path = str(tmp_path / "scan")
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` (id INT, v STRING, n DOUBLE) USING delta TBLPROPERTIES ({CDF}, "
        "delta.enableDeletionVectors = true, delta.columnMapping.mode = 'name')",
        f"INSERT INTO delta.`{path}` SELECT id, concat('v', id), id / 2 FROM range(40)",
        f"DELETE FROM delta.`{path}` WHERE id % 5 = 0",
        f"ALTER TABLE delta.`{path}` RENAME COLUMN v TO label",
        f"UPDATE delta.`{path}` SET label = 'upd' WHERE id % 3 = 0",
        f"MERGE INTO delta.`{path}` t USING (SELECT id, 'm' AS label, 0.0 AS n FROM range(35, 45)) s "
        "ON t.id = s.id WHEN MATCHED AND s.id = 36 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *",
    )
    source = DeltaSource(spark, path)
    latest = source.latest_version()

    def plan(changes) -> str:
        return changes.frame._jdf.queryExecution().analyzed().toString()

    def user_columns(changes) -> list:
        return [(f["name"], f["type"], f["nullable"]) for f in user_fields(changes.schema)]

    for start, end in ((1, 2), (4, latest), (1, 1)):
        scanned = source.changes(start, end)
        assert "DeltaCDFRelation" not in plan(scanned)
        with monkeypatch.context() as m:  # a local table's read is planned when first used
            m.setattr(delta, "_scanned_changes", lambda *_: None)
            documented = source.changes(start, end)
            assert "DeltaCDFRelation" in plan(documented)
        assert user_columns(scanned) == user_columns(documented)
        order = [("id", "ascending"), ("_version", "ascending")]
        got, want = (c.arrow_rows(False).sort_by(order) for c in (scanned, documented))
        assert got.num_rows > 0 and got.equals(want), (start, end)
    # A service's warm-up reads one row through the same frame and Arrow step (None would mean it failed).
    assert all(source.warm_up(immutable) is not None for immutable in (False, True))
