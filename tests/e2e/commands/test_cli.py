"""The command line as users meet it: help texts, status, query, bad input, and the demo."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from delta.tables import DeltaTable

from cdc2ch.cli import main
from cdc2ch.model.config import TargetName
from tests.support.doc_examples import disagreements, examples
from tests.support.helpers import create_table, vacuum_everything, without_cdc2ch

COLS = "id BIGINT, name STRING"
GETTING_STARTED = Path(__file__).resolve().parents[3] / "docs" / "getting-started.md"


def test_every_option_is_explained():
    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0
    for name, command in main.commands.items():
        assert name in top.output
        result = runner.invoke(main, [name, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert (command.help or "").split("\n")[0].strip()[:30] in " ".join(result.output.split())
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help and len(param.help) > 15, f"{name} {param.opts} has no real help"
                assert param.opts[-1] in result.output, f"{param.opts} missing from `cdc2ch {name} --help`"


@pytest.fixture
def small_table(spark, tmp_path):
    path = str(tmp_path / "small")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE delta.`{path}` SET name = 'B' WHERE id = 2")
    return path


def test_status_and_query(spark, cli, database, small_table):
    target = TargetName(database, "small")
    cli.replicate(
        "run",
        small_table,
        target,
        "--once",
        "--from-version",
        "1",
        "--reader",
        "spark",  # whose ranking writes each key's newest row only (rows_written below)
    )
    spark.sql(f"INSERT INTO delta.`{small_table}` VALUES (3, 'c')")
    spark.sql(f"INSERT INTO delta.`{small_table}` VALUES (4, 'd')")

    report = json.loads(cli("status", "--target", str(target), "--json").stdout)
    assert len(report) == 1
    row = report[0]
    # Left two versions behind: the lag is what the Delta log says, commit time of 4 minus that of 2.
    history = {
        r["version"]: r["ts"]
        for r in DeltaTable.forPath(spark, small_table)
        .history()
        .selectExpr("version", "unix_millis(timestamp) AS ts")
        .collect()
    }
    assert (row["committed_version"], row["latest_version"], row["versions_behind"]) == (2, 4, 2)
    assert row["seconds_behind"] == pytest.approx((history[4] - history[2]) / 1000, abs=0.002)
    assert row["seconds_behind"] > 0
    assert row["rows_written"] == 2  # two inserts, then an update of one: each key's newest row is written
    assert (
        row["pipeline"] == str(target) and row["error"] is None and row["last_success"] and row["last_commit"]
    )
    text = cli("status", "--target", str(target), "--wide").stdout
    assert text.splitlines()[0].split()[:7] == [
        "pipeline",
        "target",
        "committed",
        "latest",
        "behind",
        "behind_s",
        "rows_written",
    ]
    assert str(target) in text

    # Monitoring checks: exit 2 past the limit, in versions or in time.
    cli("status", "--target", str(target), "--max-lag", "2")
    cli("status", "--target", str(target), "--max-lag", "1", expect=2)
    cli("status", "--target", str(target), "--max-lag", "1h")
    cli("status", "--target", str(target), "--max-lag", "0s", expect=2)
    cli("run", "--table", small_table, "--primary-key", "id", "--target", str(target), "--once")
    cli("status", "--target", str(target), "--max-lag", "0")

    out = cli("query", f"SELECT id, name FROM {database}.small FINAL ORDER BY id", "--format", "TSV").stdout
    assert out.splitlines() == ["1\ta", "2\tB", "3\tc", "4\td"]


@pytest.mark.parametrize(
    "make_args, expect_code, message",
    [
        (lambda p, t: ["--table", p + "-missing", "--primary-key", "id"], 1, "does not exist"),
        (lambda p, t: ["--table", str(Path(p).parent), "--primary-key", "id"], 1, "is not a Delta table"),
        (lambda p, t: ["--table", p, "--primary-key", "nope"], 1, "'nope' are not in the Delta table"),
        (
            lambda p, t: ["--table", p, "--primary-key", "id", "--from-version", "99"],
            1,
            "beyond the latest version",
        ),
        (lambda p, t: ["--table", p, "--primary-key", "id", "--spark-conf", "novalue"], 2, "key=value"),
        (
            lambda p, t: [
                "--table",
                p,
                "--primary-key",
                "id",
                "--clickhouse",
                "http://u:s3cret@localhost:1/db",
            ],
            2,
            "contains a password",
        ),
        (lambda p, t: ["--table", p, "--primary-key", "id", "--clickhouse", "mysql://x"], 1, "not a DSN"),
        (
            lambda p, t: [
                "--table",
                p,
                "--primary-key",
                "id",
                "--reader",
                "clickhouse",
                "--writer",
                "executors",
            ],
            2,
            "drop --writer executors, or use --reader spark",
        ),
    ],
    ids=[
        "missing-path",
        "not-delta",
        "unknown-key",
        "version-beyond-latest",
        "bad-spark-conf",
        "password-in-dsn",
        "bad-dsn",
        "pushdown-with-executors",
    ],
)
def test_bad_input_is_refused_without_writing(
    make_args, expect_code, message, spark, sink, cli, database, small_table
):
    target = TargetName(database, "refused")
    result = cli(
        "run", *make_args(small_table, target), "--target", str(target), "--once", expect=expect_code
    )
    err = " ".join(result.stderr.split())
    assert message in err
    assert "s3cret" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    # Nothing was written: no table, no offset.
    assert sink.query_rows(f"SELECT count() FROM system.tables WHERE database = '{database}'")[0][0] == 0


def test_cdf_not_enabled(spark, cli, database, tmp_path):
    path = str(tmp_path / "nocdf")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta")
    result = cli(
        "run", "--table", path, "--primary-key", "id", "--target", f"{database}.nocdf", "--once",
        "--changes-from", "cdf", expect=1,
    )  # fmt: skip
    assert (
        "Change Data Feed is not enabled" in result.stderr and "delta.enableChangeDataFeed" in result.stderr
    )


@pytest.mark.parametrize("reader", ["spark", "clickhouse"])
def test_null_key_is_refused(reader, spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "nullkey")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (NULL, 'b')")
    target = f"{database}.nullkey_{reader}"
    result = cli.replicate("run", path, target, "--once", "--reader", reader, expect=1)
    assert "1 row(s) in versions 0..1" in " ".join(result.stderr.split())
    assert "null in primary-key column 'id'" in " ".join(result.stderr.split())
    # Refused input creates nothing: no target table, no offset, no lock or health table (issue 17, item 7;
    # an empty target table and an offset at -1 were left behind before).
    assert sink.query_rows(f"SELECT name FROM system.tables WHERE database = '{database}'") == []


@pytest.mark.skipif(os.environ.get("CDC2CH_SKIP_SLOW") == "1", reason="starts its own Spark")
def test_demo_command(tmp_path):
    """The README's demo, as a user runs it: a fresh process, its own Spark and embedded ClickHouse, started
    from a shell with no `cdc2ch` on its PATH, as `make demo` starts .venv/bin/cdc2ch."""
    shell = {**os.environ, "PATH": without_cdc2ch(os.environ["PATH"])}
    proc = subprocess.run(
        [sys.executable, "-m", "cdc2ch", "demo", "--dir", str(tmp_path / "cdc2ch-demo")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=shell,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # What Getting started shows of `make demo` (docs/getting-started.md): its lines and its exit status.
    (shown,) = [
        e for e in examples(GETTING_STARTED.read_text(encoding="utf-8")) if e.script.startswith("make demo")
    ]
    assert disagreements(shown, proc.returncode, out) == [], out
    assert "Tables match." in out
    assert "Soft-deleted keys kept as tombstones: 3, 4" in out
    assert "cdc2ch.customers" in out and "behind_s" in out
    # The demo's pipeline records its success like any run: the status table shows it caught up and well.
    status_line = next(line for line in out.splitlines() if line.startswith("cdc2ch.customers"))
    assert status_line.split()[-1] == "ok" and status_line.split()[2:4] == ["0", "0"], status_line
    # It ends with the commands to look inside, which work as printed in that same shell (issue 68, item 5).
    lines = out.splitlines()
    look = next(i for i, line in enumerate(lines) if line.startswith("Look inside"))
    commands = [line.strip() for line in itertools.takewhile(lambda s: s.startswith("  "), lines[look + 1 :])]
    assert commands, out  # before: `Look inside: cdc2ch query …`, `cdc2ch: command not found` in that shell
    looked = subprocess.run(
        ["bash", "-e", "-c", "\n".join(commands)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=shell,
    )
    assert looked.returncode == 0, looked.stderr
    assert "Dennis" in looked.stdout, looked.stdout  # the query's rows
    assert "cdc2ch.customers" in looked.stdout, looked.stdout  # the status's pipeline


def _state(sink, database: str, pipeline: str) -> tuple[int, int]:
    return sink.query_rows(
        f"SELECT committed_version, pending_version FROM {database}.cdc2ch_state FINAL WHERE pipeline = {{p:String}}",
        {"p": pipeline},
    )[0]


def test_cdf_gap_vacuum_and_expired_log_ask_for_a_snapshot(spark, sink, cli, database, tmp_path):
    """Changes that Delta no longer has (CDF switched off for a while, files vacuumed, log entries expired)
    stop the pipeline at its committed version, with the resync command in the message."""

    def run_once(path: str, target: str, expect: int = 0, *extra: str) -> str:
        result = cli(
            "run", "--table", path, "--primary-key", "id", "--target", target, "--once", *extra, expect=expect
        )
        return " ".join(result.stderr.split())

    # CDF off and on again: versions 2..3 have no change data.
    path = str(tmp_path / "gap")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    target = f"{database}.gap"
    run_once(path, target)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (2, 'b')")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'c')")
    cdf = ("--changes-from", "cdf")  # by default versions 2..3 are read from the log
    err = run_once(path, target, 1, *cdf)
    assert "was enabled at version 4" in err and "cannot start at 2" in err and "cdc2ch snapshot" in err
    assert _state(sink, database, target) == (1, 1)
    checked = cli(
        "validate", "--table", path, "--primary-key", "id", "--target", target, *cdf, expect=2
    ).stdout
    assert "FAIL" in checked and "was enabled at version 4" in checked

    # VACUUM removed the change files (and the rewritten data files) of versions not yet replicated.
    path = str(tmp_path / "vacuumed")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    target = f"{database}.vacuumed"
    run_once(path, target)
    spark.sql(f"UPDATE delta.`{path}` SET name = 'B' WHERE id = 2")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    vacuum_everything(spark, path)
    err = run_once(path, target, expect=1)
    assert "are gone (removed by VACUUM or log retention)" in err and "resync with `cdc2ch snapshot`" in err
    assert _state(sink, database, target)[0] == 1

    # The same without a feed: the rows of the removed files its changes are derived from are gone.
    path = str(tmp_path / "vacuumed_log")
    spark.sql(f"CREATE TABLE delta.`{path}` ({COLS}) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    target = f"{database}.vacuumed_log"
    run_once(path, target)
    spark.sql(f"UPDATE delta.`{path}` SET name = 'B' WHERE id = 2")
    vacuum_everything(spark, path)
    err = run_once(path, target, expect=1)
    assert "are gone (removed by VACUUM or log retention)" in err and "resync with `cdc2ch snapshot`" in err
    assert _state(sink, database, target)[0] == 1

    # Log retention removed commits 0..3 after a checkpoint at 4; the pipeline stood at 1.
    path = str(tmp_path / "expired")
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({COLS}) USING delta TBLPROPERTIES "
        f"(delta.enableChangeDataFeed = true, delta.checkpointInterval = 4)"
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    target = f"{database}.expired"
    run_once(path, target)
    for i in range(2, 6):
        spark.sql(f"INSERT INTO delta.`{path}` VALUES ({i}, 'x')")
    log_dir = Path(path) / "_delta_log"
    assert (log_dir / f"{4:020d}.checkpoint.parquet").exists()
    for v in range(4):
        for f in log_dir.glob(f"{v:020d}.*"):
            f.unlink()
    err = run_once(path, target, expect=1)
    assert "Versions 2..3" in err and "no longer in the Delta log" in err and "cdc2ch snapshot" in err
    assert _state(sink, database, target) == (1, 1)


def test_duplicate_keys_in_one_version_are_counted(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "dups")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (1, 'b'), (2, 'c'), (2, 'd'), (2, 'e'), (3, 'f')")
    result = cli("run", "--table", path, "--primary-key", "id", "--target", f"{database}.dups", "--once",
                 "--reader", "spark")  # fmt: skip  # Spark's rows are counted on their way (not ClickHouse's)
    (warning,) = cli.events(result, "duplicate_keys")
    assert (warning["version"], warning["duplicate_keys"], warning["extra_rows"]) == (1, 2, 3)
    assert warning["level"] == "warning" and warning["example_key"] == {"id": "1"}
