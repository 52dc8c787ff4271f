"""`cdc2ch run --serve` attacked from the network (loopback only) while it replicates.

One real `run --serve` process replicates a delta-rs table that a writer thread commits to all along. Hypothesis
(derandomized: CI replays the same requests) draws hostile requests over real sockets: statements and URL
settings that would lift `readonly`, write, read a file or kill a query; malformed HTTP (request lines,
headers, lying or negative Content-Length, bad chunks); missing, wrong and oversized credentials; slow
clients holding connections. None may write a table, read the secret file or write outside, and every
commit still reaches ClickHouse within LAG_BOUND seconds. Every loop is bounded in count and time.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import signal
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.helpers import Proc
from tests.support.hostile import FILE_SETTINGS, REFUSALS, SETTINGS, hostile_requests, malformed

PASSWORD = "fuzz-s3cret"
SECRET = "the-secret-line-7f3a"  # in a file outside the database: no response may contain it
LAG_BOUND = 60.0  # seconds from a Delta commit to its rows in ClickHouse, while under attack
COMMIT_EVERY, MAX_COMMITS = 0.5, 600
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Writer:
    """Commits one row per Delta version every COMMIT_EVERY seconds, and records when each became visible
    through the service: the replicator's lag while the fuzzers run."""

    path: str
    port: int
    committed: dict[int, float] = field(default_factory=dict)  # id -> when its commit was made
    lags: dict[int, float] = field(default_factory=dict)  # id -> seconds until ClickHouse had it
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Writer:
        for target in (self._write, self._watch):
            threading.Thread(target=target, daemon=True).start()
        return self

    def _write(self):
        from deltalake import write_deltalake

        try:
            for k in range(1, MAX_COMMITS):
                if self.stop.wait(COMMIT_EVERY):
                    return
                write_deltalake(self.path, _rows([k]), mode="append")
                self.committed[k] = time.monotonic()
        except BaseException as exc:
            self.errors.append(exc)

    def _watch(self):
        deadline = time.monotonic() + 900
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                seen = int(query(self.port, "SELECT max(id) FROM cdc2ch.t FINAL", timeout=10)[1] or 0)
            except (OSError, ValueError, http.client.HTTPException):
                seen = 0  # counted as lag: the next poll tries again
            now = time.monotonic()
            for k, at in list(self.committed.items()):
                if k <= seen and k not in self.lags:
                    self.lags[k] = now - at
            time.sleep(0.2)

    def pending_lag(self) -> float:
        """The oldest commit not yet seen in ClickHouse, in seconds (0 when none is pending)."""
        now = time.monotonic()
        return max((now - at for k, at in list(self.committed.items()) if k not in self.lags), default=0.0)

    def max_lag(self) -> float:
        return max([*self.lags.values(), self.pending_lag()], default=0.0)


def _rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids])})


@dataclass(repr=False)
class Service:
    port: int
    root: Path
    outside: Path
    secret: Path
    proc: Proc
    writer: Writer
    tables: list


def query(port: int, sql: str, timeout: float = 10, **params) -> tuple[int, str]:
    """An authenticated query over HTTP: (status, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        qs = urllib.parse.urlencode({"user": "default", "password": PASSWORD, **params})
        conn.request("POST", f"/?{qs}", sql.encode())
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace").strip()
    finally:
        conn.close()


def _tables(port: int) -> list:
    sql = "SELECT database, name, engine FROM system.tables WHERE database NOT ILIKE '%system%' ORDER BY ALL"
    status, body = query(port, sql)
    assert status == 200, body
    return body.splitlines()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from deltalake import write_deltalake

    root = tmp_path_factory.mktemp("fuzz serve ü")  # a space and unicode in every path
    path = str(root / "t")
    write_deltalake(path, _rows(range(-20, 1)), configuration={"delta.enableChangeDataFeed": "true"})
    outside = root / "outside"
    outside.mkdir()
    secret = root / "secret.txt"
    secret.write_text(SECRET + "\n")
    port = _free_port()
    proc = Proc(
        "run", "--table", path, "--primary-key", "id", "--clickhouse", f"chdb://{root / 'clickhouse'}",
        "--poll-interval", "0.2", "--spark-master", "local[1]", "--serve", f"127.0.0.1:{port}",
        env={"CDC2CH_SERVE_PASSWORD": PASSWORD}, cwd=str(root),
    )  # fmt: skip
    writer = None
    try:
        proc.wait_for("serving", 300)
        proc.wait_for("committed", 300)
        writer = Writer(path, port).start()
        yield Service(port, root, outside, secret, proc, writer, _tables(port))
    finally:
        if writer:
            writer.stop.set()
        proc.signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, proc.stderr[-3000:]


def _untouched(service: Service, body: str) -> None:
    assert SECRET not in body, body
    assert not list(service.outside.iterdir()), list(service.outside.iterdir())


# -- statements and settings that would lift readonly --------------------------------------------------------
def _send(service: Service, sql: str, params: dict, headers: dict, travel: str) -> tuple[int, str]:
    fill = {"out": service.outside, "secret": service.secret, "root": service.root}
    sql = sql.replace("{out}", str(fill["out"])).replace("{secret}", str(fill["secret"]))
    sql = sql.replace("{root}", str(fill["root"]))
    params = {k: v.format(**fill) for k, v in params.items()}
    body = b""
    headers = {"X-ClickHouse-User": "default", "X-ClickHouse-Key": PASSWORD, **headers}
    if travel == "body":
        body = sql.encode()
    elif travel == "query":
        params["query"] = sql
    elif travel == "split":  # the query parameter and the body are one statement
        cut = len(sql) // 2
        params["query"], body = sql[:cut], sql[cut:].encode()
    else:
        boundary = "fuzzBoundary"
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="query"\r\n\r\n{sql}\r\n--{boundary}--\r\n'
        ).encode()
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
    try:
        conn.request("POST", "/?" + urllib.parse.urlencode(params), body, headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


@settings(FUZZ, max_examples=300)
@given(request=hostile_requests())
def test_no_statement_or_setting_lifts_readonly(service, request):
    sql, params, headers, travel = request
    status, body = _send(service, sql, params, headers, travel)
    assert status != 200, (sql, params, travel, body)
    assert "Code: " in body, body
    _untouched(service, body)


@FUZZ
@given(
    name=st.sampled_from(sorted(FILE_SETTINGS)), sql=st.sampled_from(["SELECT 1", "SELECT * FROM cdc2ch.t"])
)
def test_settings_naming_files_are_refused_with_any_statement(service, name, sql):
    fmt = {"format_schema": "Protobuf", "output_format_schema": "Protobuf"}.get(name, "Template")
    status, body = _send(service, sql, {name: SETTINGS[name][0], "default_format": fmt}, {}, "body")
    assert status != 200 and "READONLY" in body, body
    _untouched(service, body)


# -- malformed HTTP ----------------------------------------------------------------------------------------
def _exchange(port: int, raw: bytes, half_close: bool = True, timeout: float = 3.0) -> tuple[bytes, bool]:
    """Send raw bytes (then close our side, with `half_close`) and read what comes back: (the bytes, whether
    the server said nothing and kept the connection open for `timeout` seconds)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            return b"", False  # the server closed first (e.g. refused an oversized request line)
        out = b""
        for _ in range(1000):
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return out, not out
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
            s.settimeout(0.3)  # an answer came: a keep-alive connection then waits for the next request
        return out, False


@settings(FUZZ, max_examples=300)
@given(request=malformed())
def test_malformed_http_gets_no_data_and_no_stall(service, request):
    raw, ping, half_close = request
    out, stalled = _exchange(service.port, raw, half_close)
    assert not stalled, raw[:300]  # e.g. a negative Content-Length read to the end of the stream
    for status in (int(s) for s in re.findall(rb"HTTP/1\.[01] (\d{3})", out)):
        assert status in REFUSALS or (status == 200 and ping), out[:500]  # no credentials: only /ping answers
    assert b"v1\n" not in out and SECRET.encode() not in out
    assert b"\nSet-Cookie" not in out, out[:500]


@settings(FUZZ, max_examples=150)
@given(
    encoding=st.sampled_from([None, "gzip", "deflate", "lz4", "zstd", "br"]),
    multipart=st.booleans(),
    body=st.binary(max_size=300)
    | st.sampled_from(
        [
            b"--b\r\n\r\nx\r\n--b--\r\n",
            b'--b\r\nContent-Disposition: form-data; name="query"\r\n\r\n\xff\r\n--b--',
        ]
    ),
)
def test_malformed_bodies_with_credentials_are_the_clients_error(service, encoding, multipart, body):
    """Bodies that cannot be decompressed or are no form: a 4xx naming the problem, never a 500."""
    headers = {"X-ClickHouse-User": "default", "X-ClickHouse-Key": PASSWORD}
    if encoding:
        headers["Content-Encoding"] = encoding
    if multipart:
        headers["Content-Type"] = "multipart/form-data; boundary=b"
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        conn.request("POST", "/", body, headers)
        resp = conn.getresponse()
        status, text = resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()
    if status == 200 or (status >= 500 and "Code: 1001" not in text):
        return  # the body reached ClickHouse (an empty one, or text it parsed): its answer is its own
    assert status in (400, 413, 415), (status, text[:300])


# -- credentials -------------------------------------------------------------------------------------------
@settings(FUZZ, max_examples=100)
@given(
    user=st.sampled_from(["default", "", "root", "default\x00", "défault", "x" * 10000]),
    password=st.sampled_from(
        ["", "wrong", PASSWORD + " ", PASSWORD[:-1], "p" * 60000, "ü:ü", PASSWORD.upper()]
    ),
    where=st.sampled_from(["basic", "headers", "params", "multipart", "garbled-basic"]),
)
def test_wrong_credentials_are_refused(service, user, password, where):
    if user == "default" and password == PASSWORD:
        return
    user = "x" * 10000 if user == "long-x" else user  # oversized, but short in a failure's report
    password = "p" * 60000 if password == "long-p" else password
    headers, params, body = {}, {"query": "SELECT v FROM cdc2ch.t"}, b""
    if where == "basic":
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    elif where == "garbled-basic":
        headers["Authorization"] = "Basic " + password + "==?!"
    elif where == "headers":
        headers |= {"X-ClickHouse-User": user.encode("utf-8").decode("latin-1"), "X-ClickHouse-Key": password}
    elif where == "params":
        params |= {"user": user, "password": password}
    else:
        body = (
            f'--b\r\nContent-Disposition: form-data; name="user"\r\n\r\n{user}\r\n'
            f'--b\r\nContent-Disposition: form-data; name="password"\r\n\r\n{password}\r\n--b--\r\n'
        ).encode()
        headers["Content-Type"] = "multipart/form-data; boundary=b"
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        try:
            conn.request("POST", "/?" + urllib.parse.urlencode(params), body, headers)
            resp = conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            return  # refused before any answer (a header too large for the server)
        status, text = resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()
    assert status in (400, 401, 403, 414, 431), (status, text[:300])
    assert "v1" not in text, text[:300]


# -- bodies over the limit and slow clients ------------------------------------------------------------------
def test_oversized_and_slow_clients_leave_readers_and_replication_going(service):
    port = service.port
    auth = f"user=default&password={PASSWORD}"
    # A body declared over the limit is refused before it is read; one sent over the limit, chunked, too.
    out, _ = _exchange(
        port, f"POST /?{auth} HTTP/1.1\r\nContent-Length: {(64 << 20) + 1}\r\n\r\nSELECT 1".encode()
    )
    assert out.startswith(b"HTTP/1.1 413"), out[:300]
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(f"POST /?{auth} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
        # MiB at most: over the 64 MiB limit by more than the kernel may buffer between the two ends, so
        # a server that read on past the limit would take them all
        most = 64 + _tcp_buffer_max("tcp_rmem") + _tcp_buffer_max("tcp_wmem") + 8
        sent = 0
        try:
            for _ in range(most):
                sock.sendall(chunk)
                sent += 1
        except OSError:
            pass  # the server answered 413 and closed
        assert sock.recv(4096).startswith(b"HTTP/1.1 413") and sent < most
    finally:
        sock.close()

    # Slow clients: many connections trickling a request's headers, never finishing them.
    slow: list[socket.socket] = []
    try:
        for _ in range(150):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /?query=SELECT%201 HTTP/1.1\r\n")
            slow.append(s)
        started = time.monotonic()
        while time.monotonic() - started < 10:
            for s in slow:
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    pass
            # Readers with credentials are still answered, promptly.
            t0 = time.monotonic()
            assert query(port, "SELECT count() FROM cdc2ch.t FINAL", timeout=10)[0] == 200
            assert time.monotonic() - t0 < 5
            time.sleep(1)
        assert service.writer.pending_lag() < LAG_BOUND
    finally:
        for s in slow:
            s.close()


# -- the pipeline-request route ---------------------------------------------------------------------------
_FIELD_VALUES = st.none() | st.integers() | st.text(max_size=30) | st.lists(st.text(max_size=5), max_size=2)
_FIELDS = st.sampled_from(["action", "pipeline", "reason", "database", "by", "query", "sql", "", "Action"])


@settings(FUZZ, max_examples=150)
@given(
    body=st.dictionaries(_FIELDS, _FIELD_VALUES | st.sampled_from(["pause", "resync", "resynced", "cdc2ch"]),
                         max_size=6).map(json.dumps).map(str.encode)
    | st.binary(max_size=200)
    | st.sampled_from([b"SELECT 1", b"INSERT INTO cdc2ch.t (id, v) VALUES (1, 'x')", b"null", b"[]"]),
    content_type=st.sampled_from(["application/json", "text/plain", "multipart/form-data; boundary=b", None]),
    method=st.sampled_from(["POST", "POST", "GET"]),
)  # fmt: skip
def test_the_request_route_records_nothing_it_should_not(service, body, content_type, method):
    """`POST /cdc2ch/request` (what `cdc2ch pause` sends a read-only service): whatever else arrives there is
    refused with a 4xx in JSON, never runs as a statement and records nothing (no pipeline named in these
    bodies has records)."""
    headers = {"Authorization": "Basic " + base64.b64encode(f"default:{PASSWORD}".encode()).decode()}
    if content_type:
        headers["Content-Type"] = content_type
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
    try:
        conn.request(method, "/cdc2ch/request", body, headers)
        resp = conn.getresponse()
        status, text = resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()
    assert status in (400, 405, 415), (status, text[:300])
    assert json.loads(text)["error"], text
    assert not service.proc.events("request_recorded")
    _untouched(service, text)


# -- the verdict -------------------------------------------------------------------------------------------
def test_nothing_written_and_replication_kept_pace(service):
    """Last in the module: after every attack, the tables are those the replicator made, nothing was
    written outside, and each commit made meanwhile reached ClickHouse within LAG_BOUND."""
    writer = service.writer
    assert not writer.errors, writer.errors
    deadline = time.monotonic() + 20
    while len(writer.committed) < 10 and time.monotonic() < deadline:
        time.sleep(0.2)
    last = max(writer.committed, default=0)
    assert last >= 10, "the writer committed too little to measure lag"
    deadline = time.monotonic() + LAG_BOUND
    while last not in writer.lags and time.monotonic() < deadline:
        time.sleep(0.2)
    assert writer.max_lag() < LAG_BOUND, (writer.max_lag(), service.proc.stderr[-3000:])
    now = _tables(service.port)
    assert set(service.tables) <= set(now), set(service.tables) - set(now)  # none dropped or renamed
    made = set(now) - set(service.tables)
    assert all(t.startswith("cdc2ch\tcdc2ch_") for t in made), made  # only the replicator's bookkeeping
    _untouched(service, "")
    # Every row is the writer's: none inserted, changed or deleted by a request.
    sql = "SELECT count(), countIf(v != concat('v', toString(id))) FROM cdc2ch.t FINAL WHERE _is_deleted = 0"
    status, body = query(service.port, sql + f" AND id <= {last}")
    assert (status, body.split()) == (200, [str(21 + last), "0"]), body
    print(json.dumps({"commits": last, "max_lag_s": round(writer.max_lag(), 2)}))


def _tcp_buffer_max(name: str) -> int:
    """The most, in MiB, this kernel lets one TCP socket's receive or send buffer grow to."""
    with open(f"/proc/sys/net/ipv4/{name}") as f:
        return -(-int(f.read().split()[2]) // (1 << 20))
