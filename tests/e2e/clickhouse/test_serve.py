"""`cdc2ch run --serve`: the embedded engine over the ClickHouse HTTP interface while replication goes on.

Driven with clickhouse-connect over real HTTP: read-only enforcement by ClickHouse itself, credentials as
ClickHouse takes them, TLS, concurrent readers during writes (in this process, on the session's engine), and
a real `run --serve` process that `status` and `query` find by themselves while readers query FINAL, and that
`pause` and `resume` reach while its data stays read-only.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import clickhouse_connect
import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from deltalake import DeltaTable

from cdc2ch.clickhouse.connection import embedded
from cdc2ch.clickhouse.connection import remote as server
from cdc2ch.clickhouse.serving.endpoint import ClickHouseHTTP, Limits
from cdc2ch.clickhouse.serving.engine import Engine
from cdc2ch.clickhouse.serving.httpservice import tls_context
from tests.support.helpers import Proc, create_table, java_home_that_waits, latest_version

PASSWORD = "serve-s3cret"


@pytest.fixture
def served(chdb_dsn, sink, database):
    """The session's engine served read-only with a password, and a table `t` with versions of rows."""
    sink.command(f"CREATE DATABASE {database}")
    sink.command(
        f"CREATE TABLE {database}.t (id UInt32, v UInt32, _version UInt64, _is_deleted UInt8) "
        f"ENGINE = ReplacingMergeTree(_version, _is_deleted) ORDER BY id"
    )
    sink.insert_arrow(f"{database}.t", _rows(0))
    with ClickHouseHTTP(Engine(chdb_dsn[len("chdb://") :]), password=PASSWORD) as http:
        yield http
    sink.command(f"DROP DATABASE {database}")


def _rows(version: int, n: int = 1000) -> pa.Table:
    """Every key at value `version` (one insert: readers see all of it or none)."""
    return pa.table(
        {
            "id": pa.array(range(n), pa.uint32()),
            "v": pa.array([version] * n, pa.uint32()),
            "_version": pa.array([version] * n, pa.uint64()),
            "_is_deleted": pa.array([0] * n, pa.uint8()),
        }
    )


def _client(http: ClickHouseHTTP, **kw):
    opts = dict(host="127.0.0.1", port=http.port, username="default", password=PASSWORD, compress="lz4")
    return clickhouse_connect.get_client(**{**opts, **kw})


def _basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _status(url: str, data: bytes | None = None, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers or {})) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_read_only_and_credentials(served, database, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("secret-line\n")
    base = f"http://127.0.0.1:{served.port}/"
    assert _status(base + "ping") == 200  # no credentials needed, as on a server
    assert _status(base + "?query=SELECT%201") == 401  # none given
    assert _status(base + "?query=SELECT%201&user=default&password=wrong") == 403
    assert _status(base + f"?query=SELECT%201&user=default&password={PASSWORD}") == 200
    assert (
        _status(
            base + "?query=SELECT%201", headers={"X-ClickHouse-User": "default", "X-ClickHouse-Key": PASSWORD}
        )
        == 200
    )
    for password in ("", "wrong"):
        with pytest.raises(DatabaseError, match="516"):
            _client(served, password=password)

    c = _client(served)
    assert c.command(f"SELECT count() FROM {database}.t FINAL WHERE _is_deleted = 0") == 1000
    # URL settings are applied (Grafana sets max_execution_time on every query; clickhouse-connect, seeing
    # readonly=1 in system.settings as with any read-only user, sends none) ...
    sql = urllib.parse.quote("SELECT getSetting('max_execution_time')")
    url = f"{base}?query={sql}&max_execution_time=17&user=default&password={PASSWORD}"
    with urllib.request.urlopen(url) as resp:
        assert resp.read() == b"17\n"
    # ... then readonly=1, which no statement can lift: ClickHouse itself refuses writes, DDL, SET and files.
    for sql in (
        f"INSERT INTO {database}.t (id, v, _version, _is_deleted) VALUES (1, 1, 1, 0)",
        f"CREATE TABLE {database}.u (id UInt32) ENGINE = Memory",
        f"DROP TABLE {database}.t",
        "SET readonly = 0",
        f"SELECT count() FROM {database}.t SETTINGS readonly = 0",
        "SELECT * FROM file('/etc/hostname', 'LineAsString')",
        "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
        # What readonly=1 let through on the embedded engine (found by tests/e2e/clickhouse/test_fuzz_serve.py).
        f"SELECT 1 INTO OUTFILE '{tmp_path}/out.txt'",
        "KILL QUERY WHERE 1",
        "SYSTEM STOP MERGES",
        f"DESCRIBE file('{secret}', 'CSVWithNames')",
        f"SELECT 1; DROP TABLE {database}.t",
    ):
        with pytest.raises(DatabaseError, match=r"Code: (164|497)\b"):
            c.command(sql)
    # URL settings naming files were applied before readonly=1: the template file was read.
    qs = urllib.parse.urlencode(
        {"query": "SELECT 1 FORMAT Template", "format_template_row": secret, "password": PASSWORD}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{base}?{qs}")
    text = err.value.read().decode()
    assert "Code: 164" in text and "secret-line" not in text and not list(tmp_path.glob("out*")), text
    with pytest.raises(DatabaseError, match="164"):
        c.insert_arrow(f"{database}.t", _rows(1))
    assert c.command(f"SELECT count() FROM {database}.t") == 1000  # nothing landed
    # Request bodies are bounded, compressed or not.
    small = ClickHouseHTTP(Engine(served.engine.path), password=PASSWORD, limits=Limits(request=1000)).start()
    try:
        body = b"SELECT 1 -- " + b"x" * 2000
        url = f"http://127.0.0.1:{small.port}/?user=default&password={PASSWORD}"
        assert _status(url, body) == 413
    finally:
        small.stop()


def test_an_answer_with_rows_is_not_held_back(served, database):
    """A reply goes out as headers, then body: with Nagle's algorithm on, the body of every answer that has
    rows waited for the client's delayed ACK of the headers (about 40 ms, each query of a poll)."""
    client = _client(served, autogenerate_session_id=False)

    def median_ms(sql: str) -> float:
        times = []
        for _ in range(9):
            started = time.perf_counter()
            client.query(sql)
            times.append((time.perf_counter() - started) * 1000)
        return sorted(times)[len(times) // 2]

    empty, with_rows = median_ms("SELECT 1 WHERE 0"), median_ms(f"SELECT id FROM {database}.t LIMIT 3")
    assert with_rows < empty + 25, f"answers with rows took {with_rows:.1f} ms, empty ones {empty:.1f} ms"


def test_connections_and_framing_are_bounded(served):
    """Found by test_fuzz_serve.py: a negative Content-Length (or chunk size) read the stream to its
    end, unbounded; anyone could make the server hold a 64 MiB body per connection; a listen backlog of 5
    made a burst of connections wait out SYN retries; and every connection took a thread, without a cap."""
    for head in (b"Content-Length: -1", b"Transfer-Encoding: chunked\r\n\r\n-5"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as s:  # our side stays open
            s.sendall(b"POST / HTTP/1.1\r\n" + head + b"\r\n\r\nSELECT 1")
            assert s.recv(4096).startswith(b"HTTP/1.1 400"), head
    # Before its credentials are known a request may not make the server hold a large body: wrong ones are
    # refused before it is read, and without any only a small one (a form may carry them) is read.
    for auth, status in ((b"X-ClickHouse-Key: wrong\r\n", b"403"), (b"", b"413")):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as s:
            s.sendall(b"POST / HTTP/1.1\r\n" + auth + b"Content-Length: 60000000\r\n\r\nSELECT 1")
            assert s.recv(4096).startswith(b"HTTP/1.1 " + status), auth
    # A query_id is echoed in a header: its CR LF must not start headers of the client's own.
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as s:
        s.sendall(b"GET /?query_id=a%0d%0aSet-Cookie:%20evil=1 HTTP/1.1\r\n\r\n")
        head = s.recv(4096).split(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 401") and b"\r\nSet-Cookie" not in head, head
    started, burst = time.monotonic(), []
    try:
        for _ in range(100):
            burst.append(socket.create_connection(("127.0.0.1", served.port), timeout=5))
        assert time.monotonic() - started < 1.0
    finally:
        for s in burst:
            s.close()
    capped = ClickHouseHTTP(
        Engine(served.engine.path), password=PASSWORD, limits=Limits(connections=4)
    ).start()
    try:
        held = [socket.create_connection(("127.0.0.1", capped.port), timeout=5) for _ in range(4)]
        time.sleep(0.3)  # each is being read by its own thread
        with socket.create_connection(("127.0.0.1", capped.port), timeout=5) as extra:
            assert extra.recv(100) == b""  # closed as it came
        for s in held:
            s.close()
        time.sleep(0.3)
        assert _status(f"http://127.0.0.1:{capped.port}/ping") == 200  # slots come back
    finally:
        capped.stop()


def test_concurrent_readers_see_whole_inserts(served, sink, database):
    """Readers in threads query FINAL while this process's own client inserts versions: each answer is one
    version of every key, never a mix or a gap."""
    stop = threading.Event()
    seen: list[tuple] = []
    errors: list[BaseException] = []

    def read():
        c = _client(served)
        try:
            while not stop.is_set():
                seen.append(c.query(f"SELECT count(), min(v), max(v) FROM {database}.t FINAL").result_rows[0])
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for version in range(1, 30):
        sink.insert_arrow(f"{database}.t", _rows(version))
        time.sleep(0.02)
    stop.set()
    for t in readers:
        t.join(30)
    assert not errors, errors[0]
    assert len(seen) > 20 and all(count == 1000 and lo == hi for count, lo, hi in seen), seen[:10]
    assert len({lo for _, lo, _ in seen}) > 3  # the readers saw replication go on


@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl makes the test certificate")
def test_tls(served, chdb_dsn, database, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    https = ClickHouseHTTP(
        Engine(chdb_dsn[len("chdb://") :]), password=PASSWORD, tls=tls_context(str(cert), str(key))
    ).start()
    try:
        assert https.url.startswith("https://default@127.0.0.1:")
        c = _client(https, secure=True, ca_cert=str(cert))
        assert c.command(f"SELECT count() FROM {database}.t FINAL") == 1000
        with pytest.raises(Exception):  # noqa: B017  an unverified certificate is refused by the client
            _client(https, secure=True)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP on a TLS port
            _status(f"http://127.0.0.1:{https.port}/ping")
    finally:
        https.stop()


# -- a real `run --serve` --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_serve_while_replicating(spark, monkeypatch, tmp_path):
    path = str(tmp_path / "t")
    create_table(spark, path, "id BIGINT, v BIGINT")
    n = 200
    spark.createDataFrame([(i, 0) for i in range(n)], "id BIGINT, v BIGINT").write.format("delta").mode(
        "append"
    ).save(path)
    data = tmp_path / "clickhouse"
    dsn, port = f"chdb://{data}", _free_port()
    env = {"CDC2CH_SERVE_PASSWORD": PASSWORD}
    home = {**env, "CDC2CH_HOME": str(tmp_path)}  # the default directory is $CDC2CH_HOME/clickhouse
    config = tmp_path / "cdc2ch.toml"
    entry = f'[[pipelines]]\ntable = "{path}"\nprimary-key = "id"\nreader = "spark"\n'  # gated below
    config.write_text(f'clickhouse = "{dsn}"\npoll-interval = 0.2\n{entry}')
    gate = tmp_path / "spark-may-start"  # Spark's JVM starts once it exists: its first range waits for it
    gated = java_home_that_waits(tmp_path / "gated-jdk", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    slow = {"JAVA_HOME": str(gated)}
    args = ["run", "--config", str(config), "--serve", f"127.0.0.1:{port}"]
    service = Proc(*args, env={**env, **slow}, cwd=str(tmp_path))
    try:
        serving = service.wait_for("serving", 300)
        assert serving["url"] == f"http://default@127.0.0.1:{port}/" and serving["writable"] is False
        assert PASSWORD not in service.stderr
        c = clickhouse_connect.get_client(host="127.0.0.1", port=port, username="default", password=PASSWORD)
        final = "SELECT count(), min(v), max(v) FROM cdc2ch.t FINAL WHERE _is_deleted = 0"
        # Paused while Spark starts, before the pipeline has any record: the file says where it is, the
        # service records it as one it runs, and holds it before it writes anything (before: exit 2, "No
        # pipeline named 'cdc2ch.t' has a record").
        first = ["--config", str(config), "--pipeline", "cdc2ch.t"]
        pause = Proc("pause", *first, "--reason", "not yet", env=home, cwd=str(tmp_path))
        assert pause.wait(120) == 0, pause.stderr[-3000:]
        assert "Pipeline cdc2ch.t (cdc2ch) paused: the service running it holds no claim" in pause.stdout
        gate.touch()
        assert service.wait_for("paused", 300)["reason"] == "not yet"
        assert not service.events("committed") and not service.events("claimed"), [
            (e["event"], e.get("timestamp")) for e in service.events()
        ]
        tables = "SELECT name FROM system.tables WHERE database = 'cdc2ch' AND name = 't'"
        assert not c.query(tables).result_rows  # nothing written
        resume = Proc("resume", *first, env=home, cwd=str(tmp_path))
        assert resume.wait(120) == 0 and "resumed: the service running it" in resume.stdout, resume.stderr
        service.wait_for("committed", 300)  # the table exists, with the first version

        # Readers query FINAL while commits arrive: every answer is one Delta version of all keys.
        seen, errors, stop = [], [], threading.Event()

        def read():
            reader = clickhouse_connect.get_client(
                host="127.0.0.1", port=port, username="default", password=PASSWORD
            )
            try:
                while not stop.is_set():
                    rows = reader.query(final).result_rows
                    if rows[0][0]:
                        seen.append(rows[0])
                    time.sleep(0.01)
            except BaseException as exc:
                errors.append(exc)

        readers = [threading.Thread(target=read) for _ in range(3)]
        for t in readers:
            t.start()
        commits = 6
        deadline = time.monotonic() + 300
        for k in range(1, commits + 1):  # each replicated before the next: readers see versions go by
            _set_v(path, k)
            while c.query(final).result_rows[0] != (n, k, k):
                assert time.monotonic() < deadline, service.stderr[-3000:]
                time.sleep(0.2)
        latest = latest_version(spark, path)
        stop.set()
        for t in readers:
            t.join(30)
        assert not errors, errors[0]
        assert seen and all(count == n and lo == hi for count, lo, hi in seen), seen[:10]
        assert len({lo for _, lo, _ in seen}) > 1  # the readers saw replication go on

        # `status` and `query` on the directory find the service by themselves.
        status = Proc("status", "--clickhouse", dsn, "--json", env=env, cwd=str(tmp_path))
        assert status.wait() == 0, status.stderr[-3000:]
        (row,) = json.loads(status.stdout)
        assert row["committed_version"] == latest and row["last_error"] is None
        query = Proc(
            "query", "SELECT count() FROM cdc2ch.t FINAL", "--format", "TSV", "--clickhouse", dsn, env=env
        )
        assert query.wait() == 0 and query.stdout.split() == [str(n)], query.stderr
        # `verify` on the directory goes through the service too, while commits arrive; it writes nothing
        # there (its verdict is printed, not kept).
        verify = Proc("verify", "--table", path, "--primary-key", "id", "--clickhouse", dsn, "--json",
                      env=env, cwd=str(tmp_path))  # fmt: skip
        for k in range(commits + 1, commits + 4):
            _set_v(path, k)
        assert verify.wait(300) == 0, verify.stderr[-3000:]
        (report,) = json.loads(verify.stdout)
        assert report["ok"] and report["delta_rows"] == n, report
        assert "verify_not_recorded" in verify.stderr and "Code: 164" not in verify.stderr
        tables = c.query("SELECT name FROM system.tables WHERE database = 'cdc2ch'").result_rows
        assert ("cdc2ch_verify",) not in tables, tables
        # Without the password they are refused, and told where it goes.
        denied = Proc("query", "SELECT 1", "--clickhouse", dsn, env={"CDC2CH_SERVE_PASSWORD": ""})
        assert denied.wait() != 0 and "CDC2CH_SERVE_PASSWORD" in denied.stderr, denied.stderr
        # `pause` and `resume` from another shell, as docs/guides/day-two.md writes them (the default directory, no
        # --clickhouse): they reach the service on its read-only endpoint, with the credentials `status`
        # sends, and the service records them itself (issue 68: "only lets this process read", exit 2).
        pause = Proc("pause", "--pipeline", "cdc2ch.t", "--reason", "by hand", env=home, cwd=str(tmp_path))
        assert pause.wait(120) == 0, pause.stderr[-3000:]
        assert "Pipeline cdc2ch.t (cdc2ch) paused: the service running it (" in pause.stdout, pause.stdout
        paused = _nth_event(service, "paused", 2, 60)
        assert paused["reason"] == "by hand" and "@" in paused["by"], paused
        assert service.events("request_recorded")[2]["action"] == "pause"
        held = c.query(final).result_rows[0]
        _set_v(path, 100)
        time.sleep(1)  # five polls: still held
        assert c.query(final).result_rows[0] == held
        resume = Proc("resume", "--pipeline", "cdc2ch.t", env=home, cwd=str(tmp_path))
        assert resume.wait(120) == 0 and "Pipeline cdc2ch.t (cdc2ch) resumed: " in resume.stdout, (
            resume.stderr
        )
        deadline = time.monotonic() + 120
        while c.query(final).result_rows[0] != (n, 100, 100):
            assert time.monotonic() < deadline, service.stderr[-3000:]
            time.sleep(0.2)
        _nth_event(service, "resumed", 2, 10)
        # The route takes requests, checked, and nothing else: no statement, no unknown action or pipeline,
        # no client without the password.
        route, auth = f"http://127.0.0.1:{port}/cdc2ch/request", _basic("default", PASSWORD)
        as_json = {**auth, "Content-Type": "application/json"}
        asks = {"action": "pause", "pipeline": "cdc2ch.t"}
        assert _status(route, json.dumps(asks).encode(), {"Content-Type": "application/json"}) == 401
        assert _status(route, b"INSERT INTO cdc2ch.t (id, v) VALUES (1, 99)", auth) == 415
        assert _status(route, json.dumps({**asks, "action": "drop"}).encode(), as_json) == 400
        assert _status(route, json.dumps({**asks, "sql": "SELECT 1"}).encode(), as_json) == 400
        assert _status(route, json.dumps({**asks, "pipeline": "nope"}).encode(), as_json) == 400
        assert _status(route, None, auth) == 405
        assert len(service.events("request_recorded")) == 4  # pauses and resumes only
        # A write is refused: read-only unless --serve-writable.
        with pytest.raises(DatabaseError, match="164"):
            c.command("INSERT INTO cdc2ch.t (id, v) VALUES (1, 99)")

        # What readers see is the Delta table; also through cdc2ch's own client, as `status` opens it.
        monkeypatch.setenv("CDC2CH_SERVE_PASSWORD", PASSWORD)
        with server.connect(serving["url"], 1, served=True) as reader:
            replicated = reader.query_rows("SELECT id, v FROM cdc2ch.t FINAL WHERE _is_deleted = 0")
        delta = [tuple(r) for r in spark.read.format("delta").load(path).select("id", "v").collect()]
        assert sorted(replicated) == sorted(delta)
    finally:
        gate.touch()
        service.signal(signal.SIGTERM)
        code = service.wait()
    assert code == 0, service.stderr[-3000:]
    assert embedded._service(data) is None  # withdrawn from the holder file


def _set_v(path: str, value: int) -> None:
    """A commit setting `v` of every row (delta-rs: a version in a fraction of what Spark's UPDATE takes)."""
    DeltaTable(path).update(updates={"v": str(value)})


def _nth_event(proc: Proc, name: str, n: int, timeout: float) -> dict:
    """The process's `n`th event `name`, once logged."""
    deadline = time.monotonic() + timeout
    while len(proc.events(name)) < n:
        assert time.monotonic() < deadline, f"no {n}th {name!r} event in {timeout}s:\n{proc.stderr[-3000:]}"
        time.sleep(0.1)
    return proc.events(name)[n - 1]
