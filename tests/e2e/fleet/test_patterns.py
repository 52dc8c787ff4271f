"""A pattern in --table replicates every table it matches (Spark and delta-rs tables, mixed keys, with a change
data feed, without one and with one enabled late), reports and skips the ones it cannot follow with nothing
written for them, and lists them in `validate`."""

from __future__ import annotations

import json
import shutil
import signal
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc2ch import api
from cdc2ch.base.errors import ConfigError
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from tests.support.helpers import Proc, assert_replicated, create_table


def _spark_table(spark, path: str, columns: str = "id BIGINT, name STRING", rows: int = 5, cdf: bool = True):
    if cdf:
        create_table(spark, path, columns)
    else:
        spark.sql(f"CREATE TABLE delta.`{path}` ({columns}) USING delta")
    values = ", ".join(
        f"({i}, {i % 2}, 'n{i}')" if "tenant" in columns else f"({i}, 'n{i}')" for i in range(rows)
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES {values}")


# The good tables besides `a`, `b`, `multi` and `late`: delta-rs tables (an independent writer) and more Spark
# ones, so that one pattern serves ~30 tables side by side.
RS_TABLES = [f"rs_{i:02d}" for i in range(14)]
SPARK_TABLES = [f"sp_{i:02d}" for i in range(6)]
GOOD = ["a", "b", "multi", "late", "nocdf", *RS_TABLES, *SPARK_TABLES]
BAD = {"plain": "not a Delta table", "nokey": "'id' are not"}
TWO_COLUMN_KEYS = ("multi", "rs_01", "rs_02")  # given `tenant,id` by --primary-keys


def _rs_table(path: str, number: int) -> None:
    """A delta-rs table with its Change Data Feed on; some with a two-column key, some with a delete."""
    ids = pa.array(range(number + 2), pa.int64())
    columns = {"id": ids, "name": pa.array([f"r{i}" for i in range(number + 2)])}
    if f"rs_{number:02d}" in TWO_COLUMN_KEYS:
        columns["tenant"] = pa.array([i % 2 for i in range(number + 2)], pa.int32())
    write_deltalake(path, pa.table(columns), configuration={"delta.enableChangeDataFeed": "true"})
    if number % 3 == 0:
        DeltaTable(path).delete("id = 0")  # delta-rs writes the change file of this delete


def _lake(spark, root) -> dict[str, str]:
    """A directory of ~30 tables: good ones by Spark and delta-rs with mixed keys, one whose Change Data Feed
    was switched on after its first rows (read from the log before it), one without a feed (read from the log),
    and two that cannot be followed (not Delta, no `id` column; no key at all is covered by the unit layer)."""
    paths = {name: str(root / name) for name in (*GOOD, *BAD)}
    for name in ("a", "b", *SPARK_TABLES):
        _spark_table(spark, paths[name], rows=3 + len(name))
    for number, name in enumerate(RS_TABLES):
        _rs_table(paths[name], number)
    _spark_table(spark, paths["multi"], "id BIGINT, tenant INT, name STRING")
    spark.sql(f"CREATE TABLE delta.`{paths['late']}` (id BIGINT, name STRING) USING delta")
    spark.sql(f"INSERT INTO delta.`{paths['late']}` VALUES (1, 'x'), (2, 'y')")
    spark.sql(f"ALTER TABLE delta.`{paths['late']}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"UPDATE delta.`{paths['late']}` SET name = 'late' WHERE id = 2")
    spark.range(3).write.parquet(paths["plain"])  # a directory, not a Delta table
    _spark_table(spark, paths["nocdf"], cdf=False)
    _spark_table(spark, paths["nokey"], "ident BIGINT, name STRING")
    spark.sql(f"UPDATE delta.`{paths['a']}` SET name = 'changed' WHERE id = 1")
    spark.sql(f"DELETE FROM delta.`{paths['multi']}` WHERE id = 0")
    return paths


def _key(name: str) -> tuple[str, ...]:
    return ("tenant", "id") if name in TWO_COLUMN_KEYS else ("id",)


def test_a_storage_pattern_replicates_what_it_can_and_reports_the_rest(spark, cli, sink, database, tmp_path):
    paths = _lake(spark, tmp_path / "sales")
    pattern = f"{tmp_path}/sales/*"
    keys = ",".join(f"{name}=tenant,id" for name in TWO_COLUMN_KEYS)
    args = ("--table", pattern, "--primary-key", "id", "--primary-keys", keys,
            "--target", f"{database}.{{schema}}_{{table}}")  # fmt: skip

    validated = cli("validate", *args)
    checked = validated.stdout
    assert not cli.events(validated, "table_skipped")  # each skipped table is one WARN line, said once
    for name in GOOD:
        assert f"{paths[name]} -> {database}.sales_{name}" in checked
    assert checked.count("key tenant,id") == len(TWO_COLUMN_KEYS)
    assert "initial load needed: a snapshot" not in checked  # the late table's history is read from its log
    by_table = {line.split(" -> ")[0].split()[-1]: line for line in checked.splitlines() if " -> " in line}
    assert (
        "derived from the Delta log's file actions (the table records no change data feed)"
        in by_table[paths["nocdf"]]
    )
    assert (
        "log's file actions up to version 1 and from the change data feed from version 2 on"
        in by_table[paths["late"]]
    )
    assert "changes from the change data feed (the table records one)" in by_table[paths["a"]]
    warned = [line for line in checked.splitlines() if line.startswith("WARN")]
    assert len(warned) == len(BAD) and not any(line.startswith("FAIL") for line in checked.splitlines())
    for name, why in BAD.items():
        assert any(paths[name] in w and why in w for w in warned), (name, warned)

    # The Python API lists the same, with what to pass to replicate() for each table.
    found = api.discover(spark, table=pattern, primary_key="id",
                         primary_keys={name: ["tenant", "id"] for name in TWO_COLUMN_KEYS},
                         target=f"{database}.{{schema}}_{{table}}")  # fmt: skip
    assert [(t.table, t.primary_key, t.target) for t in found.tables] == [
        (paths[n], _key(n), f"{database}.sales_{n}") for n in sorted(GOOD)
    ]
    assert sorted(s["table"] for s in found.skipped) == sorted(paths[n] for n in BAD)
    with pytest.raises(ConfigError, match="is a pattern of tables. cdc2ch.api.discover"):
        api.replicate(spark, table=pattern, primary_key="id")

    result = cli("run", *args, "--once")
    skipped = {e["table"]: e["reason"] for e in cli.events(result, "table_skipped")}
    assert sorted(skipped) == sorted(paths[n] for n in BAD)
    assert {e["choice"] for e in cli.events(result, "initial_load")} == {"changes"}
    for name in GOOD:
        assert_replicated(spark, sink, paths[name], TargetName(database, f"sales_{name}"))
    tables = sink.query_rows(f"SELECT name, engine FROM system.tables WHERE database = '{database}'")
    assert {t for t, engine in tables if t.startswith("sales_") and engine != "View"} == {
        f"sales_{n}" for n in GOOD
    }
    assert {t for t, engine in tables if engine == "View"} == {f"sales_{n}_current" for n in GOOD}
    # `status` shows each skipped table under the pipeline it would be, with why.
    rows = {r["pipeline"]: r for r in json.loads(cli("status", "--json").stdout)}
    for name, why in BAD.items():
        row = rows[f"{database}.sales_{name}"]
        assert row["last_error_kind"] == "skipped" and why.split(" is")[0] in row["last_error"], row

    # A config file with the pattern: `status --config` lists its tables' pipelines as `run` names them, the
    # skipped ones too, never the template itself (`sales.{table}`).
    config = tmp_path / "sales.toml"
    two = ", ".join(f'{n} = ["tenant", "id"]' for n in TWO_COLUMN_KEYS)
    config.write_text(
        f'[[pipelines]]\ntable = "{pattern}"\nprimary-key = "id"\nprimary-keys = {{ {two} }}\n'
        f'target = "{database}.{{schema}}_{{table}}"\n'
    )
    listed = json.loads(cli("status", "--config", str(config), "--json").stdout)
    assert sorted(r["pipeline"] for r in listed) == sorted(f"{database}.sales_{n}" for n in (*GOOD, *BAD))
    assert all(r["committed_version"] is not None for r in listed if r["pipeline"].split("_", 1)[1] in GOOD)

    # Later commits by both writers reach their targets on the next poll of the same command, and
    # `verify` over the pattern finds every good table equal to Delta.
    spark.sql(f"INSERT INTO delta.`{paths['b']}` VALUES (100, 'new')")
    spark.sql(f"UPDATE delta.`{paths['late']}` SET name = 'later' WHERE id = 1")
    spark.sql(f"UPDATE delta.`{paths['nocdf']}` SET id = 10 WHERE id = 1")  # a key change, from the log
    write_deltalake(
        paths["rs_04"], pa.table({"id": pa.array([100], pa.int64()), "name": ["new"]}), mode="append"
    )
    DeltaTable(paths["rs_05"]).update({"name": "'updated'"}, predicate="id = 1")
    cli("run", *args, "--once")
    for name in ("b", "late", "nocdf", "rs_04", "rs_05"):
        assert_replicated(spark, sink, paths[name], TargetName(database, f"sales_{name}"))
    verified = json.loads(cli("verify", *args, "--json").stdout)
    assert sorted(r["pipeline"] for r in verified if r["ok"]) == sorted(f"{database}.sales_{n}" for n in GOOD)


def test_a_pattern_whose_targets_collide_is_refused(spark, cli, database, tmp_path):
    for schema_name in ("x", "y"):
        _spark_table(spark, str(tmp_path / schema_name / "t"))
    refused = cli.replicate("run", f"{tmp_path}/*/t", f"{database}.{{table}}", "--once", expect=2).stderr
    assert f"Tables {tmp_path}/x/t and {tmp_path}/y/t, both matched by --table" in refused


def test_a_catalog_pattern_replicates_the_schemas_matching_tables(spark, cli, sink, database, tmp_path):
    spark.sql(f"CREATE DATABASE {database}")
    for name in ("orders_eu", "orders_us", "customers"):
        path = str(tmp_path / name)
        _spark_table(spark, path)
        spark.sql(f"CREATE TABLE {database}.{name} USING delta LOCATION '{path}'")
    spark.sql(f"CREATE TABLE {database}.orders_csv USING parquet AS SELECT 1L AS id")  # not Delta
    result = cli.replicate("run", f"{database}.orders_*", f"{database}.{{table}}", "--once")
    for name in ("orders_eu", "orders_us"):
        assert_replicated(spark, sink, str(tmp_path / name), TargetName(database, name))
    assert not sink.table_exists(TargetName(database, "customers"))
    assert not sink.table_exists(TargetName(database, "orders_csv"))
    (skipped,) = cli.events(result, "table_skipped")
    assert skipped["table"] == f"{database}.orders_csv" and "Delta" in skipped["reason"], skipped


def test_a_running_service_follows_new_tables_and_lets_go_of_gone_ones(
    spark, http_sink, clickhouse_http, database, tmp_path
):
    """A service whose pattern matches no table it can follow yet waits for one (where `--once` is refused);
    a table created while `run` serves a pattern gets its pipeline within the discover interval (and its
    rows); a table whose directory goes is let go of, its target kept."""
    lake = tmp_path / "lake"
    spark.range(3).write.parquet(str(lake / "plain"))  # not Delta: skipped
    args = ("run", "--table", f"{lake}/*", "--primary-key", "id", "--target", f"{database}.{{table}}",
            "--clickhouse", clickhouse_http.dsn)  # fmt: skip
    env = {"CDC2CH_CLICKHOUSE_PASSWORD": clickhouse_http.password}
    refused = Proc(*args, "--once", env=env)
    assert refused.wait(240) == 2 and "No table to replicate" in refused.stderr, refused.stderr[-3000:]
    proc = Proc(*args, "--poll-interval", "1", "--discover-interval", "2", env=env)
    try:
        proc.wait_for("waiting_for_tables", timeout=240)
        _spark_table(spark, str(lake / "a"))
        proc.wait_for("committed", timeout=120)
        _spark_table(spark, str(lake / "b"), rows=7)
        created = time.monotonic()
        found = proc.wait_for("table_discovered", timeout=120)
        assert found["table"] == str(lake / "b")
        deadline = time.monotonic() + 120
        while not _final_count(http_sink, TargetName(database, "b")) == 7:
            assert time.monotonic() < deadline, proc.stderr[-3000:]
            time.sleep(0.5)
        print(f"new table to its rows in ClickHouse: {time.monotonic() - created:.1f}s")
        shutil.rmtree(lake / "a")
        gone = proc.wait_for("table_gone", timeout=120)
        assert gone["table"] == str(lake / "a") and gone["target"] == f"{database}.a"
    finally:
        proc.signal(signal.SIGTERM)
        assert proc.wait(120) == 0, proc.stderr[-3000:]
    assert_replicated(spark, http_sink, str(lake / "b"), TargetName(database, "b"))
    assert http_sink.table_exists(TargetName(database, "a"))  # kept


def _final_count(sink, target: TargetName) -> int:
    if not sink.table_exists(target):
        return 0
    return sink.query_rows(f"SELECT count() FROM {schema.qualified(target)} FINAL WHERE _is_deleted = 0")[0][
        0
    ]
