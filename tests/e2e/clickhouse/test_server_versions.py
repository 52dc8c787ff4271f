"""ClickHouse server versions: a real server too old for cdc2ch (Debian's 18.16.1) is refused by every command
in one paragraph naming its version and the minimum, with nothing created; a feature the server lacks is
refused before anything is written."""

from __future__ import annotations

import socket

import pytest

from tests.support import oldserver
from tests.support.helpers import create_table


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def old_server(tmp_path_factory):
    root, why = oldserver.unpacked()
    if root is None:
        pytest.skip(why)
    port = _free_port()
    server = oldserver.start(root, tmp_path_factory.mktemp("clickhouse-18"), port)
    try:
        yield port
    finally:
        server.kill()
        server.wait(30)


@pytest.mark.parametrize("command", ["run", "snapshot", "status", "verify"])
def test_a_server_too_old_is_refused_by_version_with_nothing_created(
    command, old_server, cli, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", "")
    assert oldserver.query(old_server, "SELECT version()").strip() == "18.16.1"
    before = oldserver.query(old_server, "SHOW DATABASES")
    dsn = oldserver.endpoint(old_server).dsn
    table = ("--table", str(tmp_path / "t"), "--primary-key", "id")
    args = {"run": (*table, "--once"), "snapshot": table, "status": (), "verify": table}[command]
    result = cli(command, *args, "--clickhouse", dsn, expect=1)
    said = " ".join(result.stderr.split())
    assert f"ClickHouse at {dsn} is version 18.16.1, and cdc2ch needs 23.2 or later" in said, said
    assert "Cannot connect" not in said and "clickhouse_retry" not in result.stderr
    assert oldserver.query(old_server, "SHOW DATABASES") == before


def test_the_clickhouse_reader_is_refused_where_the_server_lacks_its_setting(
    spark, cli, sink, database, tmp_path, monkeypatch
):
    """The embedded engine has the setting; a server without it is stood in for by hiding it from the check
    (the only way to have a current engine without it here)."""
    from cdc2ch.clickhouse.connection.transport import Sink

    path = str(tmp_path / "t")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    monkeypatch.setattr(Sink, "has_setting", lambda self, name: name != "delta_lake_snapshot_start_version")
    result = cli("run", "--table", path, "--primary-key", "id", "--target", f"{database}.t", "--reader",
                 "clickhouse", "--once", expect=1)  # fmt: skip
    said = " ".join(result.stderr.split())
    assert "--reader clickhouse needs ClickHouse's setting delta_lake_snapshot_start_version" in said, said
    assert not sink.query_rows(f"SELECT name FROM system.tables WHERE database = '{database}'")


@pytest.mark.parametrize(
    "version, refused", [("22.8.21.38", True), ("23.1.7.30", True), ("23.2.1.2537", False)]
)
def test_the_version_a_server_answers_decides(
    version, refused, fault_proxy, clickhouse_http, cli, monkeypatch
):
    """The test endpoint answers the driver's version query as an older (or just new enough) server would;
    everything else is the real engine behind it."""
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    fault_proxy.add_fault(
        "answer",
        lambda req: req.sql.startswith("SELECT version()"),
        times=None,
        body=f"{version}\tUTC\n".encode(),
    )
    dsn = fault_proxy.url_for(clickhouse_http.user)
    result = cli("status", "--clickhouse", dsn, "--format", "json", expect=1 if refused else 0)
    said = " ".join(result.stderr.split())
    assert (f"is version {version}, and cdc2ch needs 23.2 or later" in said) == refused, said
    assert fault_proxy.hits("answer") >= 1
