"""Every command that writes, pointed at a ClickHouse that lets it only read (readonly=1, as a read-only user
of a server has): one paragraph saying so, exit 1, the refused statement sent once (a refusal is not a
fault to retry), and nothing changed.

The endpoint is the session's engine served read-only (cdc2ch.clickhouse.serving.endpoint, readonly=1 applied by
ClickHouse itself), behind a FaultProxy that records every statement it forwards.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cdc2ch.clickhouse.serving.endpoint import ClickHouseHTTP
from cdc2ch.clickhouse.serving.engine import Engine
from cdc2ch.model.config import TargetName
from tests.support.chserver import FaultProxy
from tests.support.helpers import committed_version, create_table

PASSWORD = "read-only-s3cret"
READS = ("SELECT", "SHOW", "DESCRIBE", "DESC", "EXISTS", "WITH", "EXPLAIN")


@pytest.fixture(scope="module")
def replica(spark, cli, chdb_dsn, tmp_path_factory):
    """A table replicated into the session's engine, then that engine served read-only behind a proxy."""
    path = str(tmp_path_factory.mktemp("readonly") / "orders")
    create_table(spark, path, "id BIGINT, city STRING, amount DOUBLE")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'Oslo', 1.5), (2, 'Lima', 2.5), (3, 'Kyiv', 3.5)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 2")
    target = TargetName("readonly_cmds", "orders")
    cli.replicate("run", path, target, "--once")
    spark.sql(f"UPDATE delta.`{path}` SET amount = 9.5 WHERE id = 1")  # something for run to write
    with ClickHouseHTTP(Engine(chdb_dsn[len("chdb://") :], readonly=True), password=PASSWORD) as http:
        with FaultProxy("127.0.0.1", http.port) as proxy:
            yield path, target, proxy


COMMANDS = {
    "run": ["run", "--once"],
    "run a new pipeline": ["run", "--once", "--target", "readonly_cmds.orders_new"],
    "snapshot": ["snapshot"],
    "reshape": ["reshape", "--order-by", "city,id"],
    "verify --repair": ["verify", "--repair"],
}


@pytest.mark.parametrize("name", [*COMMANDS, "compact"])
def test_a_read_only_clickhouse_is_refused_once_in_one_paragraph(name, replica, cli, sink, monkeypatch):
    path, target, proxy = replica
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", PASSWORD)
    before = committed_version(sink, target.database, str(target))
    tables = sink.query_rows(f"SHOW TABLES FROM {target.database}")
    proxy.log.clear()
    if name == "compact":
        args = ["compact", "--target", str(target)]
    else:
        command, *extra = COMMANDS[name]
        args = [command, "--table", path, "--primary-key", "id", "--retries", "5"]
        args += extra if "--target" in extra else ["--target", str(target), *extra]
    if name == "verify --repair":  # a key Delta does not have: something to repair
        sink.command(
            f"INSERT INTO {target} (id, city, amount, _commit_version, _commit_timestamp, _change_type, "
            f"_is_deleted, _version) VALUES (99, 'Nowhere', 0, 0, now64(3), 'insert', 0, 3)"
        )
        tables = sink.query_rows(f"SHOW TABLES FROM {target.database}")
    result = cli(*args, "--clickhouse", proxy.url_for(), expect=1)

    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    message = json.loads(last)["message"] if last.startswith("{") else last  # compact logs no JSON
    assert "may only read" in message, last
    assert "attempts" not in message, last  # not "could not be reached after 5 attempts"
    writes = Counter(s for s in proxy.log if not s.upper().startswith(READS))
    assert writes and max(writes.values()) == 1, writes  # refused once, never retried
    assert committed_version(sink, target.database, str(target)) == before
    assert sink.query_rows(f"SHOW TABLES FROM {target.database}") == tables
