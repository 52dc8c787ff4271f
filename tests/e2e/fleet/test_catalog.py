"""Catalog names for --table, through a persistent Hive metastore (Derby, in a temp dir): one Spark process
writes managed Delta tables, separate `cdc2ch` processes replicate them by name. Derby admits one JVM at a
time, so the processes take turns. Also: state tables from before locations were recorded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cdc2ch.clickhouse.state.statestore import STATE_TABLE, StateStore
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from tests.support.helpers import Proc, assert_replicated, create_table

WRITER = textwrap.dedent(
    """
    import json, sys
    from cdc2ch.model.config import SparkSettings
    from cdc2ch.source.spark.session import session

    spark = session(SparkSettings("local[1]", tuple(json.loads(sys.argv[1]).items())))
    sql = spark.sql
    sql("CREATE DATABASE sales")
    sql("CREATE TABLE sales.orders (id INT, item STRING, qty INT) USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    sql("INSERT INTO sales.orders VALUES (1, 'pen', 2), (2, 'ink', 1), (3, 'pad', 5)")
    sql("UPDATE sales.orders SET qty = 7 WHERE id = 2")
    sql("CREATE VIEW sales.recent AS SELECT * FROM sales.orders WHERE id > 1")
    rows = sorted(tuple(r) for r in sql("SELECT id, item, qty FROM sales.orders").collect())
    print(json.dumps({"rows": rows, "location": sql("DESCRIBE DETAIL sales.orders").collect()[0]["location"]}))
    """
)


def _hive_conf(tmp: Path) -> dict[str, str]:
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={tmp}/metastore_db;create=true",
        "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
        "spark.hadoop.hive.metastore.schema.verification": "false",
        "spark.sql.warehouse.dir": str(tmp / "warehouse"),
    }


def _write(tmp: Path, conf: dict) -> dict:
    script = tmp / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(conf)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,  # derby.log lands here
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cdc2ch(*args: str, cwd: Path, expect: int = 0, env: dict | None = None) -> Proc:
    proc = Proc(*args, cwd=str(cwd), env=env)
    code = proc.wait()
    assert code == expect, f"cdc2ch {args[0]} exited {code}, expected {expect}:\n{proc.stderr[-3000:]}"
    return proc


def _final(dsn: str, table: str, cwd: Path) -> list[tuple]:
    out = subprocess.run(
        [sys.executable, "-m", "cdc2ch", "query", "--clickhouse", dsn, "--format", "JSONCompactEachRow",
         f"SELECT id, item, qty FROM cdc2ch.{table} FINAL WHERE _is_deleted = 0 ORDER BY id"],
        capture_output=True, text=True, timeout=120, cwd=cwd, check=True,
    ).stdout  # fmt: skip
    return [tuple(json.loads(line)) for line in out.splitlines()]


def test_tables_named_through_a_hive_metastore(spark, tmp_path):
    conf = _hive_conf(tmp_path)
    dsn = f"chdb://{tmp_path / 'ch'}"
    first = _write(tmp_path, conf)
    location = first["location"].removeprefix("file:")
    assert location == str(tmp_path / "warehouse" / "sales.db" / "orders")

    # A separate process replicates the table by name, its catalog configured with --spark-conf.
    flags = [a for k, v in conf.items() for a in ("--spark-conf", f"{k}={v}")]
    run = _cdc2ch("run", "--table", "sales.orders", "--primary-key", "id", "--clickhouse", dsn, "--once", *flags,
                  cwd=tmp_path)  # fmt: skip
    assert _final(dsn, "orders", tmp_path) == [tuple(r) for r in first["rows"]]
    (started,) = run.events("start")
    assert (started["pipeline"], started["source"], started["location"]) == (
        "cdc2ch.orders",
        "spark_catalog.sales.orders",
        location,
    )

    # More writes (by path, from this process: the metastore is not needed to write the files).
    spark.sql(f"INSERT INTO delta.`{location}` VALUES (4, 'nib', 3), (5, 'cap', 9)")
    spark.sql(f"DELETE FROM delta.`{location}` WHERE id = 1")
    spark.sql(f"UPDATE delta.`{location}` SET item = 'INK' WHERE id = 2")

    # A config file naming tables, its catalog in [spark-conf]: one fine, one missing, one a view.
    config = tmp_path / "cdc2ch.toml"
    config.write_text(
        f'clickhouse = "{dsn}"\nonce = true\n'
        + "".join(
            f'[[pipelines]]\ntable = "{t}"\nprimary-key = "id"\n'
            for t in ("spark_catalog.sales.orders", "sales.nope", "sales.recent")
        )
        + "[spark-conf]\n"
        + "".join(f'"{k}" = "{v}"\n' for k, v in conf.items())
    )
    run = _cdc2ch("run", "--config", str(config), cwd=tmp_path, expect=1)
    expected = spark.read.format("delta").load(location).select("id", "item", "qty").collect()
    assert _final(dsn, "orders", tmp_path) == sorted(tuple(r) for r in expected)
    assert "2 of 3 pipelines failed" in run.stderr.splitlines()[-1], run.stderr[-2000:]
    failed = {e["pipeline"]: e["error"] for e in run.events("pipeline_failed")}
    nope = failed["cdc2ch.nope"]
    assert "there is no table sales.nope in schema spark_catalog.sales of catalog 'spark_catalog'" in nope
    assert "spark.sql.catalogImplementation=hive" in nope and "hive.metastore.uris" in nope
    assert "spark_catalog.sales.recent is a view" in failed["cdc2ch.recent"]

    # status needs no JVM (so no catalog): it reads the log at the recorded location.
    nojvm = {"JAVA_HOME": "/nonexistent", "PATH": "/nonexistent"}
    status = _cdc2ch(
        "status", "--clickhouse", dsn, "--target", "cdc2ch.orders", "--json", cwd=tmp_path, env=nojvm
    )
    (row,) = json.loads(status.stdout)
    assert (row["name"], row["source"], row["location"]) == (
        "spark_catalog.sales.orders",
        "spark_catalog.sales.orders",
        location,
    )
    assert row["versions_behind"] == 0 and row["error"] is None, row
    table = _cdc2ch(
        "status", "--clickhouse", dsn, "--target", "cdc2ch.orders", "--wide", cwd=tmp_path, env=nojvm
    ).stdout
    header, line = table.splitlines()
    assert header.split()[-2:] == ["source", "location"] and line.split()[-2:] == [row["source"], location]


def test_names_in_the_sessions_catalog(spark, cli, sink, database, tmp_path):
    """Every command takes a name (here through the in-process session's own catalog); a name whose table
    was dropped and created again elsewhere is refused, not mixed; a path pipeline may be named later."""
    spark.sql(f"CREATE DATABASE {database}")
    name, target = f"{database}.items", TargetName(database, "items")
    first, second = tmp_path / "a", tmp_path / "b"
    create_table(spark, str(first), "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{first}` VALUES (1, 'a'), (2, 'b')")
    # Replicated by path first, then by name: the same pipeline and offset, now recording the name.
    cli.replicate("run", str(first), target, "--once")
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{first}'")
    spark.sql(f"INSERT INTO {name} VALUES (3, 'c')")
    cli.replicate("run", name, target, "--once")
    state = StateStore(sink, database).load(str(target))
    assert (state.source, state.location, state.committed_version) == (f"spark_catalog.{name}", str(first), 2)
    assert_replicated(spark, sink, str(first), target)
    checked = cli("validate", "--table", name, "--primary-key", "id", "--target", str(target)).stdout
    assert f"spark_catalog.{name} at {first}" in checked and checked.startswith("ok")

    # Dropped, and created again elsewhere under the same name.
    spark.sql(f"DROP TABLE {name}")
    create_table(spark, str(second), "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{second}` VALUES (7, 'z')")
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{second}'")
    refused = cli.replicate("run", name, target, "--once", expect=1).stderr
    assert "dropped and recreated" in refused and str(first) in refused and str(second) in refused
    assert StateStore(sink, database).load(str(target)).committed_version == 2  # nothing moved
    # What the message advises: drop the target and start over.
    sink.command(f"DROP TABLE {schema.qualified(target)}")
    cli.replicate("run", name, target, "--once", "--reset")
    assert_replicated(spark, sink, str(second), target)
    state = StateStore(sink, database).load(str(target))
    assert state.location == str(second) and state.table_id

    # Created again at the same place (as a metastore does with a managed table): another Delta table id.
    shutil.rmtree(second)
    create_table(spark, str(second), "id BIGINT, name STRING")
    for i in range(3):
        spark.sql(f"INSERT INTO delta.`{second}` VALUES ({10 + i}, 'n')")
    refused = cli.replicate("run", name, target, "--once", expect=1).stderr
    assert "dropped and recreated" in refused and state.table_id in refused


# The offsets table as releases before catalog names created it.
OLD_STATE_DDL = """CREATE TABLE {table} (pipeline String, source String, target String, committed_version Int64,
pending_version Int64, rows_written UInt64, updated_at DateTime64(3, 'UTC'))
ENGINE = ReplacingMergeTree(updated_at) ORDER BY pipeline"""


def test_a_state_table_from_before_locations_gets_them(spark, cli, sink, database, tmp_path):
    """An offsets table without `location` and `table_id` is read as is (status reads without changing it)
    and gains the columns when a run next claims the pipeline; the run records them."""
    store = StateStore(sink, database)
    sink.ensure_database(database)
    sink.command(OLD_STATE_DDL.format(table=f"{schema.quote(database)}.{STATE_TABLE}"))
    assert store.load_all() == []
    path = str(tmp_path / "old")
    create_table(spark, path, "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    target = TargetName(database, "old")
    # A row as an earlier release wrote it.
    sink.command(
        f"INSERT INTO {schema.quote(database)}.{STATE_TABLE} VALUES "
        f"('{target}', '{path}', '{target}', -1, -1, 0, now64(3))"
    )
    assert store.load(str(target)).location == ""  # read as "not recorded"
    cli.replicate("run", path, target, "--once")
    state = StateStore(sink, database).load(str(target))
    assert (state.committed_version, state.location, state.source) == (1, path, path) and state.table_id
    assert {"location", "table_id"} <= set(sink.table_columns(TargetName(database, STATE_TABLE)))


@pytest.mark.parametrize("text", ["orders", "a.b.c.d"])
def test_a_table_that_is_neither_a_path_nor_a_name_is_refused(cli, database, text):
    result = cli(
        "run", "--table", text, "--primary-key", "id", "--target", f"{database}.x", "--once", expect=2
    )
    assert "neither a path nor a catalog table name" in result.stderr
