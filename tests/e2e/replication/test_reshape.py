"""`cdc2ch reshape`: a live replica rebuilt with a new sorting key and partitions while commits keep arriving,
swapped in atomically; killed with -9 at each step and run again, it finishes with a table equal to Delta."""

from __future__ import annotations

import json
import re
import signal
import threading

from cdc2ch.model.config import TargetName
from tests.e2e.clickhouse.test_faults import _env
from tests.e2e.replication.test_design import COLUMNS, DESIGN, _moves, delta_table
from tests.support.helpers import Proc, assert_replicated, committed_version, create_table, latest_version

SIDE = "__cdc2ch_reshape"


def _sorting(sink, target: TargetName) -> tuple[str, str]:
    """The table's sorting key and partition key, as ClickHouse shows them (one column without brackets)."""
    sorting, partition = sink.query_rows(
        "SELECT sorting_key, partition_key FROM system.tables WHERE database = {d:String} AND name = {t:String}",
        {"d": target.database, "t": target.table},
    )[0]
    return sorting.removeprefix("(").removesuffix(")"), partition


def _leftovers(sink, target: TargetName) -> list:
    tables = sink.query_rows(
        "SELECT name FROM system.tables WHERE database = {d:String} AND name LIKE {t:String}",
        {"d": target.database, "t": f"%{SIDE}%"},
    )
    states = sink.query_rows(
        f"SELECT pipeline FROM `{target.database}`.cdc2ch_state FINAL WHERE pipeline LIKE {{p:String}}",
        {"p": f"%{SIDE}%"},
    )
    return tables + states


def test_reshape_while_commits_keep_arriving(spark, sink, cli, database, tmp_path):
    path = delta_table(spark, tmp_path, "live", 600)
    target = TargetName(database, "live")
    cli.replicate("run", path, target, "--once")
    assert _sorting(sink, target) == ("id", "")

    writer = threading.Thread(target=_moves, args=(spark, path))  # five commits during the reshape
    writer.start()
    result = cli.replicate("reshape", path, target, *DESIGN)
    writer.join()
    assert "reshaped at version" in result.stdout
    assert _sorting(sink, target) == ("city, id", "toYYYYMM(created_at)")
    assert _leftovers(sink, target) == []

    refused = cli.replicate("run", path, target, "--once", expect=2)  # the old design no longer fits
    assert "sorted by (city, id)" in " ".join(refused.stderr.split())
    cli.replicate("run", path, target, "--once", *DESIGN)
    assert_replicated(spark, sink, path, target)
    assert committed_version(sink, database, str(target)) == latest_version(spark, path)
    report = cli.replicate("verify", path, target, *DESIGN, "--json")
    assert json.loads(report.stdout)[0]["ok"]


def test_reshape_refuses_a_pipeline_with_nothing_replicated(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "empty")
    create_table(spark, path, COLUMNS)
    result = cli.replicate("reshape", path, TargetName(database, "empty"), *DESIGN, expect=1)
    assert "no replica to reshape" in " ".join(result.stderr.split())
    assert sink.query_rows(f"SELECT count() FROM system.tables WHERE database = '{database}'")[0][0] == 0


def test_reshape_killed_at_each_step_finishes_when_run_again(
    spark, cli, http_sink, clickhouse_http, fault_proxy, database, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    path = delta_table(spark, tmp_path, "killed", 3000)
    target = TargetName(database, "killed")
    side = f"`{target.table}{SIDE}`"
    base = [
        "--table",
        path,
        "--primary-key",
        "id",
        "--target",
        str(target),
        "--clickhouse",
        fault_proxy.url_for(),
    ]
    cli("run", *base, "--once")
    # ClickHouse reads for the killed processes: no JVM to start each time (Spark's reshape is tested above)
    reshape = ["reshape", *base, *DESIGN, "--reader", "clickhouse", "--batch-size", "500",
               "--max-rows-per-read", "1000", "--log-format", "json"]  # fmt: skip
    proc = None

    def kill(req):
        proc.kill_9()

    def into_side(snapshot: bool):
        def match(req) -> bool:
            token = req.params.get("insert_deduplication_token", "")
            # a snapshot chunk's, or a catch-up range's (pipeline:start-end:clickhouse)
            kind = ":snap" in token if snapshot else re.search(r":\d+-\d+:", token) is not None
            return req.is_insert and side in req.sql and kind

        return match

    exchange = lambda req: "EXCHANGE TABLES" in req.sql  # noqa: E731
    points = {
        "snapshot": dict(match=into_side(True), fn=kill, forward=False),
        "catch-up": dict(match=into_side(False), fn=kill, forward=False),
        "before the swap": dict(match=exchange, fn=kill, forward=False),
        "after the swap": dict(match=exchange, fn=kill),  # killed, and the swap still happens
    }
    t = f"delta.`{path}`"
    for i, (name, fault) in enumerate(points.items()):
        spark.sql(f"UPDATE {t} SET city = concat('k', city), amount = amount + 1 WHERE id % 17 = {i}")
        if name == "catch-up":  # commits the side table has to catch up with, after its snapshot
            _moves(spark, path)
        fault_proxy.clear()
        rule = fault_proxy.add_fault("call", **fault)
        proc = Proc(*reshape, env=_env(clickhouse_http))
        assert proc.wait() == -signal.SIGKILL, f"{name}: not killed\n{proc.stderr[-3000:]}"
        fault_proxy.settle()  # after the swap, the EXCHANGE is forwarded once the kill is sent
        assert rule.fired == 1, name
        if name != "after the swap":  # readers still see the old table, whole
            assert _sorting(http_sink, target) == ("id", ""), name
            cli("run", *base, "--once")  # and `run` keeps it current
            assert_replicated(spark, http_sink, path, target)

    fault_proxy.clear()
    spark.sql(f"DELETE FROM {t} WHERE id % 19 = 0")
    done = Proc(*reshape, env=_env(clickhouse_http))
    assert done.wait() == 0, done.stderr[-3000:]
    assert _sorting(http_sink, target) == ("city, id", "toYYYYMM(created_at)")
    assert _leftovers(http_sink, target) == []
    cli("run", *base, *DESIGN, "--once")
    assert_replicated(spark, http_sink, path, target)
    assert committed_version(http_sink, database, str(target)) == latest_version(spark, path)


def test_reshape_refuses_a_database_that_cannot_exchange_tables(spark, sink, cli, database, tmp_path):
    path = delta_table(spark, tmp_path, "ordinary", 50)
    sink.command(
        f"CREATE DATABASE {database} ENGINE = Ordinary", settings={"allow_deprecated_database_ordinary": 1}
    )
    target = TargetName(database, "ordinary")
    cli.replicate("run", path, target, "--once")
    result = cli.replicate("reshape", path, target, *DESIGN, expect=2)
    assert "cannot swap two tables atomically" in " ".join(result.stderr.split())
    assert _sorting(sink, target) == ("id", "") and _leftovers(sink, target) == []
