"""The test-only ClickHouse HTTP endpoint (tests/support/chserver.py) and its fault proxy, driven by clickhouse-connect
and by cdc2ch's own sink. Fast: no Spark."""

from __future__ import annotations

import os
import threading
import time
import urllib.request

import clickhouse_connect
import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from cdc2ch.base.errors import SinkError
from cdc2ch.clickhouse.connection.dsn import connect

DEDUP_TABLE = (
    "CREATE TABLE {db}.t (id UInt32, s String) ENGINE = ReplacingMergeTree ORDER BY id "
    "SETTINGS non_replicated_deduplication_window = 100"
)
REAL_SERVER = bool(os.environ.get("CDC2CH_TEST_CLICKHOUSE_URL"))


def client(ep, port: int | None = None, **kw):
    """A clickhouse-connect HTTP client as cdc2ch opens one (lz4), optionally through a proxy port."""
    opts = dict(host=ep.host, port=port or ep.port, username=ep.user, password=ep.password, compress="lz4")
    return clickhouse_connect.get_client(**{**opts, **kw})


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.uint32()), "s": [f"v{i}" for i in ids]})


@pytest.fixture
def ch(clickhouse_http, database):
    """A client on a fresh database holding the dedup table `t`."""
    c = client(clickhouse_http)
    c.command(f"CREATE DATABASE {database}")
    c.command(DEDUP_TABLE.format(db=database))
    yield c
    c.command(f"DROP DATABASE IF EXISTS {database}")
    c.close()


def count(c, database: str) -> int:
    return c.command(f"SELECT count() FROM {database}.t")


# -- the endpoint ---------------------------------------------------------------------------------------
def test_ping_and_connect(clickhouse_http):
    with urllib.request.urlopen(f"http://{clickhouse_http.host}:{clickhouse_http.port}/ping") as resp:
        assert resp.read() == b"Ok.\n"
    c = client(clickhouse_http)
    assert c.server_version and c.command("SELECT 1") == 1
    assert c.command("SELECT 1 WHERE 0") == ""  # an empty result set, not a write summary


def test_insert_dedup_token_keeps_one_copy(ch, database):
    for _ in range(2):
        ch.insert_arrow(
            f"{database}.t",
            rows(1, 2),
            settings={"insert_deduplicate": 1, "insert_deduplication_token": "tok"},
        )
    assert count(ch, database) == 2
    # The token is what dedups: another token (or none) lands again.
    ch.insert_arrow(
        f"{database}.t", rows(1, 2), settings={"insert_deduplicate": 1, "insert_deduplication_token": "t2"}
    )
    ch.insert_arrow(f"{database}.t", rows(1, 2), settings={"insert_deduplicate": 0})
    assert count(ch, database) == 6


def test_queries_parameters_and_formats(ch, database):
    ch.insert(f"{database}.t", [[1, "x"], [2, "tab\there 'q'"], [3, "y"]], column_names=["id", "s"])  # Native
    q = f"SELECT id FROM {database}.t WHERE s = {{p:String}} ORDER BY id"
    assert ch.query(q, parameters={"p": "x"}).result_rows == [(1,)]
    assert ch.query(q, parameters={"p": "tab\there 'q'"}).result_rows == [(2,)]
    table = ch.query_arrow(f"SELECT id, s FROM {database}.t ORDER BY id")
    assert table.column("id").to_pylist() == [1, 2, 3] and table.column("s")[0].as_py() == "x"
    tsv = ch.raw_query(f"SELECT id, s FROM {database}.t WHERE id != 2 ORDER BY id", fmt="TSV")
    assert tsv == b"1\tx\n3\ty\n"


def test_database_setting_and_bad_setting(clickhouse_http, ch, database):
    c = client(clickhouse_http, database=database)
    c.command("INSERT INTO t VALUES (7, 'seven')")  # unqualified: resolved in the client's database
    assert c.query("SELECT currentDatabase(), count() FROM t").result_rows == [(database, 1)]
    assert c.query("SELECT getSetting('max_threads')", settings={"max_threads": 3}).result_rows == [(3,)]
    with pytest.raises(DatabaseError, match="Code: 115"):
        c.command("SELECT 1", settings={"no_such_setting_xyz": 1})
    # A SET lasts for the client's session; per-call settings only for their statement; other clients never.
    c.command("SET max_threads = 7")
    assert c.command("SELECT getSetting('max_threads')", settings={"max_threads": 5}) == 5
    assert c.command("SELECT getSetting('max_threads')") == 7
    assert client(clickhouse_http).command("SELECT getSetting('max_threads')") != 7


def test_sql_error_is_database_error(ch, database):
    with pytest.raises(DatabaseError, match="Code: 60") as err:
        ch.query(f"SELECT * FROM {database}.missing")
    assert "UNKNOWN_TABLE" in str(err.value)


def test_wrong_password_rejected_at_connect(clickhouse_http):
    with pytest.raises(DatabaseError, match="516") as err:
        client(clickhouse_http, password=clickhouse_http.password + "-wrong")
    assert "AUTHENTICATION_FAILED" in str(err.value)


@pytest.mark.skipif(REAL_SERVER, reason="ChServer shares the embedded engine only without a real server")
def test_chserver_shares_the_embedded_engine(chserver, sink, ch, database):
    ch.insert_arrow(f"{database}.t", rows(1, 2, 3))
    assert sink.query_rows(f"SELECT count() FROM {database}.t") == [(3,)]
    sink.command(f"INSERT INTO {database}.t VALUES (4, 'from chdb')")
    assert count(ch, database) == 4


def test_cdc2ch_sink_over_http(http_sink, database):
    http_sink.ensure_database(database)
    http_sink.command(DEDUP_TABLE.format(db=database))
    for _ in range(2):
        assert http_sink.insert_arrow(f"{database}.t", rows(1, 2, 3), token="batch-1") == 3
    assert http_sink.query_rows(f"SELECT count() FROM {database}.t") == [(3,)]
    got = http_sink.query_rows(f"SELECT s FROM {database}.t WHERE id = {{i:UInt32}}", {"i": 2})
    assert got == [("v2",)]
    http_sink.command(f"DROP DATABASE {database}")


# -- the fault proxy ------------------------------------------------------------------------------------
@pytest.fixture
def via(clickhouse_http, fault_proxy, ch):
    """A client through the proxy (created before any fault is armed)."""
    c = client(clickhouse_http, port=fault_proxy.port)
    yield c
    c.close()


def is_insert(req) -> bool:
    return req.is_insert


def test_proxy_forwards_and_logs(fault_proxy, via, database):
    via.insert_arrow(f"{database}.t", rows(1))
    assert count(via, database) == 1
    assert any(s.startswith(f"INSERT INTO {database}.t") for s in fault_proxy.log)
    assert f"SELECT count() FROM {database}.t" in fault_proxy.log  # whitespace collapsed
    assert "SELECT version(), timezone()" in fault_proxy.log  # clickhouse-connect's handshake
    assert fault_proxy.hits() == 0


def test_reset_loses_the_request(fault_proxy, via, ch, database):
    fault_proxy.add_fault("reset", match=is_insert)
    with pytest.raises(OperationalError, match="(?i)reset by peer"):
        via.insert_arrow(f"{database}.t", rows(1))
    assert fault_proxy.hits("reset") == 1 and count(ch, database) == 0
    via.insert_arrow(f"{database}.t", rows(1))  # the rule is spent
    assert count(ch, database) == 1


def test_reset_after_loses_only_the_answer(fault_proxy, via, ch, database):
    fault_proxy.add_fault("reset_after", match=is_insert)
    with pytest.raises(OperationalError, match="(?i)reset by peer"):
        via.insert_arrow(f"{database}.t", rows(1, 2))
    assert fault_proxy.hits("reset_after") == 1
    assert count(ch, database) == 2  # the write happened


def test_delay(fault_proxy, via):
    fault_proxy.add_fault("delay", match=lambda req: "sleepy" in req.sql, seconds=0.6)
    started = time.monotonic()
    assert via.command("SELECT 'sleepy'") == "sleepy"
    assert time.monotonic() - started >= 0.6
    started = time.monotonic()
    via.command("SELECT 'sleepy'")
    assert time.monotonic() - started < 0.5 and fault_proxy.hits("delay") == 1


def test_error_answers_like_clickhouse(fault_proxy, via, ch, database):
    fault_proxy.add_fault("error", match=is_insert, code=242, times=2)
    for _ in range(2):
        with pytest.raises(DatabaseError, match="Code: 242") as err:
            via.insert_arrow(f"{database}.t", rows(1))
        assert err.value.code == 242 and "TABLE_IS_READ_ONLY" in str(err.value)
    via.insert_arrow(f"{database}.t", rows(1))
    assert fault_proxy.hits("error") == 2 and count(ch, database) == 1


def test_call_sees_the_request_then_forwards(fault_proxy, via, ch, database):
    seen, arrived, release = [], threading.Event(), threading.Event()

    def hold(req):
        seen.append(req)
        arrived.set()
        assert release.wait(10)

    fault_proxy.add_fault("call", match=is_insert, fn=hold)
    worker = threading.Thread(target=via.insert, args=(f"{database}.t", [[5, "n"]], ["id", "s"]))
    worker.start()
    assert arrived.wait(10)
    time.sleep(0.2)
    assert worker.is_alive() and count(ch, database) == 0  # held in fn, not forwarded yet
    release.set()
    worker.join(10)
    req = seen[0]  # a Native insert: statement and data in one lz4-compressed, chunked body
    assert req.sql == f"INSERT INTO {database}.t (`id`, `s`) FORMAT Native" and req.method == "POST"
    assert req.headers.get("Content-Encoding") == "lz4" and req.headers.get("Transfer-Encoding") == "chunked"
    assert req.params.get("session_id") and req.params.get("database") is None
    assert count(via, database) == 1


def test_settle_waits_for_what_is_still_being_forwarded(fault_proxy, via, ch, database):
    """A client killed in `fn` stops waiting at once, while the proxy still forwards its statement."""
    called, release = threading.Event(), threading.Event()
    fault_proxy.add_fault("call", match=is_insert, fn=lambda req: (called.set(), release.wait(10)))
    worker = threading.Thread(target=via.insert, args=(f"{database}.t", [[6, "s"]], ["id", "s"]), daemon=True)
    worker.start()
    assert called.wait(10)
    assert count(ch, database) == 0  # what a test would see if it looked now
    threading.Timer(0.3, release.set).start()
    fault_proxy.settle()
    assert count(ch, database) == 1
    worker.join(10)


def test_forever_rules_and_clear(fault_proxy, via):
    fault_proxy.add_fault("error", code=159, times=None)
    for _ in range(3):
        with pytest.raises(DatabaseError, match="Code: 159"):
            via.command("SELECT 1")
    fault_proxy.clear()
    assert via.command("SELECT 1") == 1 and fault_proxy.hits("error") == 3


def test_down_refuses_and_up_restores_the_same_port(clickhouse_http, fault_proxy, via):
    port = fault_proxy.port
    fault_proxy.down()
    with pytest.raises(OperationalError, match="(?i)refused"):
        via.command("SELECT 1")
    with pytest.raises(OperationalError, match="(?i)refused"):
        client(clickhouse_http, port=port)
    fault_proxy.up()
    assert fault_proxy.port == port
    assert via.command("SELECT 1") == 1
    assert client(clickhouse_http, port=port).command("SELECT 2") == 2


def test_sink_retries_through_faults_without_duplicates(
    clickhouse_http, fault_proxy, ch, database, monkeypatch
):
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    monkeypatch.delenv("CDC2CH_CLICKHOUSE_PASSWORD_FILE", raising=False)
    s = connect(fault_proxy.url_for(clickhouse_http.user), retries=3)
    fault_proxy.add_fault("reset_after", match=is_insert)  # landed, unacknowledged: the retry must dedup
    fault_proxy.add_fault("reset", match=is_insert)  # then one lost outright
    assert s.insert_arrow(f"{database}.t", rows(1, 2), token="v1") == 2
    assert fault_proxy.hits() == 2 and count(ch, database) == 2
    forever = fault_proxy.add_fault("reset", match=is_insert, times=None)
    with pytest.raises(SinkError):
        s.insert_arrow(f"{database}.t", rows(3), token="v2")
    assert forever.fired == 3 and count(ch, database) == 2  # gave up after `retries` attempts
    s.close()
