"""`cdc2ch verify` on real Spark + Delta + chdb: equal replicas pass, planted drift is found key by key and
column by column, `--repair` mends exactly that, and a verify during a running `run` stays exact."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from cdc2ch.model.config import TargetName
from tests.e2e.replication import test_types as zoo
from tests.support.helpers import assert_replicated, committed_version, job_config

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


def _verify(cli, path, target, *extra, key="id", expect=0):
    result = cli(
        "verify",
        "--table",
        path,
        "--primary-key",
        key,
        "--target",
        str(target),
        "--json",
        *extra,
        expect=expect,
    )
    (report,) = json.loads(result.stdout)
    return report


@pytest.mark.parametrize("reader", ["spark", "clickhouse"])
def test_the_types_zoo_verifies_on_both_readers(reader, spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "types")
    spark.createDataFrame(zoo.ROWS, zoo.SCHEMA).write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).save(path)
    spark.sql(f"UPDATE delta.`{path}` SET s = concat(s, '!'), f64 = -0.0 WHERE k = 3")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 4")
    target = TargetName(database, f"zoo_{reader}")
    cli.replicate("run", path, target, "--once", "--reader", reader, key="k")
    if reader == "clickhouse":
        # ClickHouse's Delta reader wraps a TIMESTAMP after 2262 (a documented limit, see test_types):
        # verify finds exactly that row and column.
        report = _verify(cli, path, target, key="k", expect=1)
        assert (report["missing"], report["extra"], report["differing"]) == (0, 0, 1), report
        assert report["sample"] == [{"kind": "differing", "key": {"k": 2}, "columns": ["ts"]}]
        sink.command(
            f"ALTER TABLE {target} UPDATE ts = toDateTime64('2299-12-31 23:59:59.999999', 6, 'UTC') WHERE k = 2",
            settings={"mutations_sync": 1},
        )
    report = _verify(cli, path, target, key="k")
    assert report["ok"] and report["delta_rows"] == report["target_rows"] == 3, report
    assert_replicated(spark, sink, path, target)  # the independent check agrees


COLUMNS = {  # a column of each kind, and a value to plant in it that differs from every row's
    "s": "'planted'",
    "n": "-1",
    "d": "toDecimal64(0.5, 2)",
    "f": "nan",
    "b": "false",
    "day": "toDate32('1969-07-20')",
    "ts": "toDateTime64('2300-01-01 00:00:00', 6, 'UTC')",
    "bin": "'\\x00'",
    "arr": "[]",
    "m": "map('z', 9)",
    "st": "tuple(7, 'q')",
}


def _drift_table(spark, path: str) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, s STRING, n INT, d DECIMAL(10,2), f DOUBLE, b BOOLEAN, "
        f"day DATE, ts TIMESTAMP, bin BINARY, arr ARRAY<INT>, m MAP<STRING, INT>, st STRUCT<x: INT, y: STRING>) "
        f"USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(
        f"INSERT INTO delta.`{path}` SELECT id, concat('s', id), CAST(id AS INT), CAST(id / 4 AS DECIMAL(10,2)), "
        f"id * 1.5, id % 2 = 0, date_add(DATE'1960-01-01', CAST(id AS INT) * 100), "
        f"timestamp_micros(id * 1000000007), CAST(concat('b', id) AS BINARY), array(CAST(id AS INT), NULL), "
        f"map('a', CAST(id AS INT)), named_struct('x', CAST(id AS INT), 'y', CAST(id AS STRING)) "
        f"FROM range(1, 201)"
    )
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 151")
    spark.sql(f"UPDATE delta.`{path}` SET s = 'updated' WHERE id BETWEEN 40 AND 60")


def test_planted_drift_is_found_and_repaired(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "drift")
    _drift_table(spark, path)
    target = TargetName(database, "drift")
    cli.replicate("run", path, target, "--once")
    assert _verify(cli, path, target)["ok"]

    def alter(sql: str) -> None:
        sink.command(f"ALTER TABLE {target} {sql}", settings={"mutations_sync": 2})

    alter("DELETE WHERE id = 1")  # a live row deleted
    # A tombstone removed, so the deleted key resurfaces: its own part, dropped before a merge folds it in.
    sink.command(f"SYSTEM STOP MERGES {target}")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 150")
    cli.replicate("run", path, target, "--once")
    ((part,),) = sink.query_rows(f"SELECT _part FROM {target} WHERE id = 150 AND _is_deleted = 1")
    sink.command(f"ALTER TABLE {target} DROP PART '{part}'")
    sink.command(f"SYSTEM START MERGES {target}")
    # One value planted in each column, each in its own row, by one mutation (each costs seconds).
    planted = {100 + i: column for i, column in enumerate(COLUMNS)}
    alter(
        "UPDATE "
        + ", ".join(f"`{c}` = if(id = {key}, {COLUMNS[c]}, `{c}`)" for key, c in planted.items())
        + f" WHERE id BETWEEN 100 AND {99 + len(COLUMNS)}"
    )
    sink.command(  # an extra key
        f"INSERT INTO {target} (id, s, _commit_version, _commit_timestamp, _change_type, _is_deleted, _version) "
        f"VALUES (9999, 'ghost', 1, now64(3), 'insert', 0, 7)"
    )
    # A merge version no commit gives (ClickHouse cannot UPDATE it: copy the row lower, drop the original).
    ((v,),) = sink.query_rows(f"SELECT _version FROM {target} FINAL WHERE id = 7")
    sink.command(
        f"INSERT INTO {target} SELECT * REPLACE (_version - 1 AS _version) FROM {target} WHERE id = 7"
    )
    alter(f"DELETE WHERE id = 7 AND _version = {v}")

    report = _verify(cli, path, target, expect=1)
    assert (report["missing"], report["extra"]) == (1, 2), json.dumps(report)
    assert report["differing"] == len(COLUMNS) + 1, report
    by_key = {(d["kind"], d["key"]["id"]): d["columns"] for d in report["sample"]}
    assert ("missing", 1) in by_key and ("extra", 150) in by_key and ("extra", 9999) in by_key, by_key
    for key, column in planted.items():
        assert by_key[("differing", key)] == [column], (key, by_key)
    assert by_key[("differing", 7)] == ["_version"], by_key

    repaired = _verify(cli, path, target, "--repair")  # mends, verifies again: exit 0
    assert repaired["ok"] and repaired["repaired"] == 3 + len(COLUMNS) + 1, repaired
    assert _verify(cli, path, target, "--repair")["repaired"] == 0  # nothing left to do
    assert_replicated(spark, sink, path, target)

    # Later changes still win over the repaired keys.
    spark.sql(f"UPDATE delta.`{path}` SET s = 'after repair' WHERE id IN (1, 100, 7)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 101")
    spark.sql(  # nested values given: a null Array/Map/struct arrives empty (test_types), which assert_replicated
        f"INSERT INTO delta.`{path}` (id, s, arr, m, st) VALUES "  # does not model; verify does
        f"(150, 'back', array(), map(), named_struct('x', NULL, 'y', NULL)), "
        f"(9999, 'real now', array(), map(), named_struct('x', NULL, 'y', NULL))"
    )
    cli.replicate("run", path, target, "--once")
    assert_replicated(spark, sink, path, target)
    assert _verify(cli, path, target)["ok"]

    status = json.loads(cli("status", "--json").stdout)
    (mine,) = [r for r in status if r["target"] == str(target)]
    assert mine["last_verify"].startswith("ok at version") and mine["last_verify_at"], mine


def test_verify_is_exact_while_run_replicates(spark, sink, cli, database, tmp_path, chdb_dsn):
    from cdc2ch.fleet.runner import Runner
    from cdc2ch.replication.metrics import Metrics

    path = str(tmp_path / "busy")
    spark.range(0, 3000).selectExpr("id", "CAST(id AS STRING) AS s", "id % 7 AS g").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", "true").save(path)
    target = TargetName(database, "busy")
    cli.replicate("run", path, target, "--once")
    cfg = replace(job_config(path, target, chdb_dsn, poll_interval=0.1), once=False)
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            Runner([cfg], spark, sink, stop, Metrics()).run()
        except BaseException as exc:  # a run that died says why, not only that rows differ
            failed.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        writes = threading.Event()

        def write() -> None:
            for i in range(6):
                spark.sql(f"UPDATE delta.`{path}` SET s = concat(s, '+') WHERE g = {i}")
                spark.sql(f"DELETE FROM delta.`{path}` WHERE id = {i * 100}")
            writes.set()

        writer = threading.Thread(target=write)
        writer.start()
        seen = set()
        while (not writes.is_set() or len(seen) < 2) and not failed:  # a dead run moves no version
            report = _verify(cli, path, target)
            assert report["ok"], report
            seen.add(report["version"])
        writer.join()
        deadline = time.monotonic() + 120
        while (
            committed_version(sink, database, str(target)) < 12 and time.monotonic() < deadline and not failed
        ):
            time.sleep(0.2)
        assert _verify(cli, path, target)["ok"]
    finally:
        stop.set()
        runner.join(60)
    assert not failed, f"the run beside verify failed: {failed[0]!r}"
    assert_replicated(spark, sink, path, target)
    # A running `run` exposes the last verify's result and time as Prometheus gauges.
    metrics = Metrics()
    Runner([job_config(path, target, chdb_dsn)], spark, sink, threading.Event(), metrics).run()
    labels = {"pipeline": str(target)}
    assert metrics.registry.get_sample_value("cdc2ch_verify_ok", labels) == 1
    assert (
        time.time() - metrics.registry.get_sample_value("cdc2ch_last_verify_timestamp_seconds", labels) < 600
    )
