"""A newcomer's first hour (issue 17), with real components: the real command in-process (`cli`), real
separate processes where the point is a second process, real Spark and the real embedded engine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from cdc2ch.model.config import TargetName
from tests.support.helpers import Proc, create_table

COLS = "id BIGINT, name STRING"

# A process holding an embedded directory open the way cdc2ch does (and naming itself in it), without Spark.
HOLD = textwrap.dedent(
    """
    import sys, time
    from cdc2ch.clickhouse.connection.dsn import connect
    sink = connect(sys.argv[1])
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# -- item 4 (ClickHouse's own lines) and item 9: a second process on the embedded engine ---------------------
def test_a_second_process_on_an_embedded_directory_exits_75_with_one_clear_paragraph(tmp_path):
    dsn = f"chdb://{tmp_path / 'clickhouse'}"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, dsn], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        for args in (
            ["query", "SELECT 1"],
            ["run", "--table", str(tmp_path / "t"), "--primary-key", "id", "--once"],
        ):
            second = Proc(*args, "--clickhouse", dsn)
            code = second.wait(120)
            err = second.stderr
            assert code == 75, f"cdc2ch {args[0]} exited {code}:\n{err}"  # today: 1
            assert f"The embedded ClickHouse database at {tmp_path / 'clickhouse'} is in use by" in err
            assert f"pid {holder.pid}" in err
            # Only cdc2ch's paragraph: not the engine's own `Code: 76. DB::Exception: Cannot lock file`.
            assert "DB::Exception" not in err and "Cannot lock file" not in err
            assert len(_lines(err)) == 1, err
            if args[0] == "query":
                assert err.startswith("cdc2ch: error: "), err
            else:  # --log-format json: the same paragraph as one JSON event, so every line parses
                event = json.loads(err)
                assert event["event"] == "error" and event["exit_code"] == 75, event
                assert event["message"].startswith("The embedded ClickHouse database at "), event
    finally:
        holder.kill()
        holder.wait()


# -- item 4: clickhouse-connect's warnings above cdc2ch's message ---------------------------------------------
def test_an_unreachable_server_is_reported_once_without_driver_warnings():
    proc = Proc("query", "SELECT 1", "--clickhouse", "http://default@127.0.0.1:9/default")
    assert proc.wait(120) == 1
    err = proc.stderr
    assert "Cannot connect to ClickHouse at http://default@127.0.0.1:9/default" in err
    assert "Unexpected Http Driver Exception" not in err and "Traceback" not in err  # today: five of them
    assert len(_lines(err)) == 1 and err.startswith("cdc2ch: error: "), err


# -- item 5: query sends the SQL as written -------------------------------------------------------------------
def test_query_respects_the_users_format_and_says_what_is_wrong(cli, database):
    assert cli("query", "SELECT 1 AS x FORMAT JSONEachRow").stdout == '{"x":1}\n'  # today: a syntax error
    assert cli("query", "select 2 as y format CSVWithNames;").stdout == '"y"\n2\n'
    assert cli("query", "SELECT 'FORMAT' AS f", "--format", "TSV").stdout == "FORMAT\n"  # a string, no clause
    assert cli("query", "SELECT 1 AS x", "--format", "JSONEachRow").stdout == '{"x":1}\n'
    # Statements that return nothing are sent as they are (a FORMAT after VALUES would be read as data).
    cli("query", f"CREATE DATABASE {database}")
    cli("query", f"CREATE TABLE {database}.q (x Int8) ENGINE = MergeTree ORDER BY x")
    assert cli("query", f"INSERT INTO {database}.q VALUES (7)").stdout == ""
    assert cli("query", f"SELECT x FROM {database}.q", "--format", "TSV").stdout == "7\n"

    empty = cli("query", "  ;", expect=2)
    assert "The query is empty" in empty.stderr and "FORMAT" not in empty.stderr  # today: 'FORMAT' unknown
    bad = cli("query", "SELECT nope", expect=1)
    assert (
        "Unknown expression identifier" in bad.stderr and "Fix the statement and run it again." in bad.stderr
    )
    assert "last committed version" not in bad.stderr  # replication's advice, not a query's


# -- item 6: a target belongs to one pipeline -----------------------------------------------------------------
def test_a_config_cannot_take_a_flag_runs_target_under_another_name(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "orders")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    target = f"{database}.orders"
    cli.replicate("run", path, target, "--once")  # its pipeline: the target's name
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'c')")

    config = tmp_path / "cdc2ch.toml"
    entry = f'table = "{path}"\nprimary-key = "id"\ntarget = "{target}"\n'
    config.write_text(f'[[pipelines]]\nname = "orders"\n{entry}')
    checked = cli("validate", "--config", str(config), expect=2)  # today: ok
    (line,) = [ln for ln in checked.stdout.splitlines() if ln.startswith("FAIL")]
    assert f"already replicated by pipeline '{target}'" in line and f'name = "{target}"' in line
    failed = cli("run", "--config", str(config), "--once", expect=1)
    assert f"already replicated by pipeline '{target}'" in " ".join(failed.stderr.split())
    assert "schema changed" not in failed.stderr
    assert sink.query_rows(
        f"SELECT count() FROM {database}.cdc2ch_state FINAL WHERE pipeline = 'orders'"
    ) == [(0,)]

    # Adopted under the owner's name, it resumes after the flag run.
    config.write_text(f'[[pipelines]]\nname = "{target}"\n{entry}')
    cli("validate", "--config", str(config))
    cli("run", "--config", str(config), "--once")
    assert sink.query_rows(f"SELECT id FROM {target} FINAL ORDER BY id") == [(1,), (2,), (3,)]


# -- item 8: status as a monitoring check ---------------------------------------------------------------------
def test_status_max_lag_names_the_pipelines_behind(spark, cli, database, tmp_path):
    path = str(tmp_path / "lagging")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    target = f"{database}.lagging"
    cli.replicate("run", path, target, "--once")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (2, 'b')")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'c')")
    result = cli("status", "--target", target, "--max-lag", "1", expect=2)
    err = " ".join(result.stderr.split())
    assert f"1 pipeline(s) behind by more than --max-lag 1: {target} (2 versions" in err  # today: nothing
    assert json.loads(cli("status", "--target", target, "--json").stdout)[0]["versions_behind"] == 2


def test_status_on_a_missing_embedded_directory_is_an_error(tmp_path):
    missing = tmp_path / "typo" / "clickhouse"
    proc = Proc("status", "--max-lag", "15m", "--clickhouse", f"chdb://{missing}")
    code = proc.wait(120)
    assert code == 1, proc.stderr  # today: 0, "No pipelines found." and a new empty database
    assert f"There is no embedded ClickHouse database at {missing}" in proc.stderr
    assert not missing.exists() and not (tmp_path / "typo").exists()


# -- item 10: duplicate keys across commits -------------------------------------------------------------------
def test_duplicate_keys_across_commits_are_reported_by_run_and_validate(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "dups")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (1, 'b'), (2, 'x')")  # v1: key 1 twice
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'c')")  # v2: key 1 again, no delete in between
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'd'), (1, 'e')")  # v3: twice more
    spark.sql(f"UPDATE delta.`{path}` SET name = 'y' WHERE id = 2")  # v4: an update is no duplicate
    target = TargetName(database, "dups")

    checked = cli("validate", "--table", path, "--primary-key", "id", "--target", str(target))  # exit 0
    (warn,) = [ln for ln in checked.stdout.splitlines() if ln.startswith("WARN")]  # today: no such line
    assert "holds 5 rows for 1 primary-key value(s) of id (e.g. id=1)" in " ".join(warn.split())

    result = cli.replicate("run", path, target, "--once", "--reader", "spark")  # counted on Spark's rows
    (across,) = cli.events(result, "duplicate_keys_across_commits")  # today: only the per-commit ones
    assert (across["duplicate_keys"], across["extra_rows"]) == (1, 2)
    assert (across["first_version"], across["last_version"], across["example_key"]) == (2, 3, {"id": "1"})
    within = cli.events(result, "duplicate_keys")
    assert sorted((w["version"], w["extra_rows"]) for w in within) == [(1, 1), (3, 1)]
    assert sink.query_rows(f"SELECT count() FROM {target} FINAL WHERE id = 1") == [(1,)]
