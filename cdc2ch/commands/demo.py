"""`cdc2ch demo`: a small Delta table with Spark, replicated into the embedded ClickHouse."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.commands import status as report
from cdc2ch.fleet.runner import Runner
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.tableref import DELTA_LOG
from cdc2ch.replication.metrics import Metrics
from cdc2ch.source.spark.session import session

COLUMNS = ["id", "name", "city", "balance"]


def build_table(spark, path: str) -> list[str]:
    """Write a short history; returns one line per Delta version describing it."""
    t = f"delta.`{path}`"
    steps = [
        (
            f"CREATE TABLE {t} (id BIGINT, name STRING, city STRING, balance DECIMAL(12,2)) USING delta "
            f"TBLPROPERTIES (delta.enableChangeDataFeed = true)",
            "create table (CDF on)",
        ),
        (
            f"INSERT INTO {t} VALUES (1,'Ada','London',100.00),(2,'Grace','New York',250.50),"
            f"(3,'Linus','Helsinki',75.25),(4,'Edsger','Amsterdam',0.00),(5,'Barbara','Boston',980.10)",
            "insert 5 customers",
        ),
        (
            f"INSERT INTO {t} VALUES (6,'Ken','Berkeley',12.00),(7,'Margaret','Boston',640.00)",
            "insert 2 more",
        ),
        (f"UPDATE {t} SET balance = balance + 10 WHERE city = 'Boston'", "UPDATE: Boston customers +10"),
        (f"DELETE FROM {t} WHERE id = 4", "DELETE: customer 4"),
        (
            f"MERGE INTO {t} AS c USING (SELECT * FROM VALUES (1,'Ada','Cambridge',120.00,'upsert'),"
            f"(3,'Linus','Helsinki',0.00,'remove'),(8,'Dennis','Murray Hill',42.00,'upsert') "
            f"AS s(id,name,city,balance,op)) AS s ON c.id = s.id "
            f"WHEN MATCHED AND s.op = 'remove' THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET name = s.name, city = s.city, balance = s.balance "
            f"WHEN NOT MATCHED THEN INSERT (id, name, city, balance) VALUES (s.id, s.name, s.city, s.balance)",
            "MERGE: update 1, delete 3, insert 8",
        ),
    ]
    for sql, _ in steps:
        spark.sql(sql)
    return [f"  v{v}: {what}" for v, (_, what) in enumerate(steps)]


def _grid(title: str, rows: list[tuple]) -> list[str]:
    return [title, *report.aligned(COLUMNS, [list(r) for r in rows], empty="")]


def calling(cwd: Path) -> tuple[list[str], str]:
    """How a shell in `cwd` calls this cdc2ch: the lines to run first (none when the `cdc2ch` on PATH is this
    one) and the command itself. `make demo` starts .venv/bin/cdc2ch, which is on no PATH until activated."""
    bindir = Path(sys.executable).parent
    script, activate = bindir / "cdc2ch", bindir / "activate"
    found = shutil.which("cdc2ch")
    if found and script.is_file() and Path(found).resolve() == script.resolve():
        return [], "cdc2ch"
    if script.is_file() and activate.is_file():
        return [f"source {_shown(activate, cwd)}    # puts cdc2ch on your PATH"], "cdc2ch"
    if script.is_file():
        return [], _shown(script, cwd)
    return [], f"{shlex.quote(sys.executable)} -m cdc2ch"


def _shown(path: Path, cwd: Path) -> str:
    """`path` as typed in `cwd`: relative below it (.venv/bin/activate), else absolute; quoted for a shell."""
    inside = os.path.commonpath([path, cwd]) == str(cwd)
    return shlex.quote(os.path.relpath(path, cwd) if inside else str(path))


def run_demo(demo_dir: str, echo: Callable[[str], None]) -> bool:
    root = Path(demo_dir).resolve()
    if root.exists():
        shutil.rmtree(root)
    table_path = str(root / "delta" / "customers")
    dsn = f"chdb://{root / 'clickhouse'}"
    echo(f"Starting Spark and writing a Delta table at {table_path} ...")
    spark = session()
    history = build_table(spark, table_path)
    echo("Delta history:")
    for line in history:
        echo(line)

    cfg = RunConfig(
        table=table_path,
        primary_key=("id",),
        target=TargetName("cdc2ch", "customers"),
        clickhouse_dsn=dsn,
        pipeline="cdc2ch.customers",
        once=True,
    )
    with connect(dsn) as sink:
        # Through the runner, as `cdc2ch run` does: the pipeline's health (last success) is recorded too.
        Runner([cfg], spark, sink, threading.Event(), Metrics()).run()
        replicated = sink.query_rows(
            "SELECT id, name, city, balance FROM cdc2ch.customers FINAL WHERE _is_deleted = 0 ORDER BY id"
        )
        # FINAL hides tombstones; the raw rows still hold them.
        tombstones = sink.query_rows(
            "SELECT id FROM cdc2ch.customers GROUP BY id HAVING argMax(_is_deleted, _version) = 1 ORDER BY id"
        )
        rows = report.collect(sink, lambda: spark)
    delta_rows = [
        tuple(r) for r in spark.read.format("delta").load(table_path).orderBy("id").select(*COLUMNS).collect()
    ]

    left = _grid("Delta table (Spark)", delta_rows)
    right = _grid(f"ClickHouse {dsn}: SELECT ... FROM cdc2ch.customers FINAL", replicated)
    width = max(len(s) for s in left) + 4
    echo("")
    for i in range(max(len(left), len(right))):
        echo(
            ((left[i] if i < len(left) else "").ljust(width) + (right[i] if i < len(right) else "")).rstrip()
        )
    match = [tuple(map(str, r)) for r in delta_rows] == [tuple(map(str, r)) for r in replicated]
    echo("")
    echo(f"Soft-deleted keys kept as tombstones: {', '.join(str(t[0]) for t in tombstones) or 'none'}")
    echo("Tables match." if match else "TABLES DIFFER.")
    echo("")
    echo(report.render_table(rows))
    echo("")
    first, cdc2ch = calling(Path.cwd())
    echo("Look inside, from this shell:")
    for line in [
        *first,
        f'{cdc2ch} query "SELECT * FROM cdc2ch.customers FINAL" --clickhouse {shlex.quote(dsn)}',
        f"{cdc2ch} status --clickhouse {shlex.quote(dsn)}",
    ]:
        echo(f"  {line}")
    echo('Then replicate a table of your own: docs/getting-started.md, "Your own table".')
    return match


if __name__ == "__main__":
    # `python -m cdc2ch.commands.demo --write-table PATH`: only the demo's Delta table, for setups that replicate it
    # themselves (docker-compose.yml). An existing table is left alone, so reruns are harmless.
    import argparse

    from cdc2ch.model.config import SparkSettings

    parser = argparse.ArgumentParser(
        prog="python -m cdc2ch.commands.demo",
        description="Write the demo Delta table (CDF on) and nothing else.",
    )
    parser.add_argument("--write-table", required=True, metavar="PATH", help="where to write the Delta table")
    parser.add_argument("--spark-master", default="local[2]", help="Spark master (default: local[2])")
    args = parser.parse_args()
    table = Path(args.write_table).resolve()
    if (table / DELTA_LOG).is_dir():
        print(f"Delta table {table} already exists; left as is.")
    else:
        for line in build_table(session(SparkSettings(master=args.spark_master)), str(table)):
            print(line)
        print(f"Wrote the demo Delta table at {table} (primary key: id).")
