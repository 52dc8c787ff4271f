"""Test-only ClickHouse over HTTP, no server needed.

`ChServer` speaks the ClickHouse HTTP interface (as much as clickhouse-connect uses) on the in-process chdb
engine; `FaultProxy` forwards to any ClickHouse HTTP endpoint (ChServer or a real server) and injects faults.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import re
import socket
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import chdb
import lz4.frame

try:
    from compression import zstd  # Python 3.14+
except ImportError:
    from backports import zstd  # comes with clickhouse-connect

# URL parameters the HTTP layer consumes; any other (but param_*) is a ClickHouse setting for the statement.
HTTP_ONLY = {
    "query", "database", "default_format", "session_id", "session_timeout", "session_check", "query_id", "user",
    "password", "quota_key", "compress", "decompress", "buffer_size", "wait_end_of_query", "role",
    "client_protocol_version", "enable_http_compression", "http_zlib_compression_level",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
}  # fmt: skip
# The HTTP status a real server gives some exception codes (ClickHouse's exceptionCodeToHTTPStatus); else 500.
HTTP_STATUS = {516: 403, 192: 403, 193: 403, 497: 403, 194: 401, 6: 400, 27: 400, 36: 400, 53: 400, 62: 400,
               46: 404, 47: 404, 60: 404, 73: 404, 81: 404, 115: 404, 159: 408, 209: 503}  # fmt: skip
ERROR_NAMES = {3: "UNEXPECTED_END_OF_FILE", 159: "TIMEOUT_EXCEEDED", 164: "READONLY", 209: "SOCKET_TIMEOUT",
               202: "TOO_MANY_SIMULTANEOUS_QUERIES", 210: "NETWORK_ERROR", 236: "ABORTED", 242: "TABLE_IS_READ_ONLY",
               241: "MEMORY_LIMIT_EXCEEDED", 252: "TOO_MANY_PARTS", 319: "UNKNOWN_STATUS_OF_INSERT",
               394: "QUERY_WAS_CANCELLED", 425: "SYSTEM_ERROR", 516: "AUTHENTICATION_FAILED"}  # fmt: skip
AUTH_FAILED = (
    "Code: 516. DB::Exception: {}: Authentication failed: password is incorrect, or there is no user with "
    "such name. (AUTHENTICATION_FAILED)"
)
# `INSERT INTO ... FORMAT X` then data. No quote may precede FORMAT, so a string literal cannot fake one.
_INSERT_FORMAT = re.compile(rb"^\s*(INSERT\s+INTO\s[^']*?)\bFORMAT\s+(\w+)", re.I | re.S)
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.I)


@dataclass(frozen=True)
class Endpoint:
    """Where a ClickHouse HTTP interface listens; `dsn` is cdc2ch's form (the password goes by env)."""

    host: str
    port: int
    user: str = "default"
    password: str = ""

    @property
    def dsn(self) -> str:
        return f"http://{self.user}@{self.host}:{self.port}/"


def decompress(data: bytes, encoding: str | None) -> bytes:
    """Undo a request's Content-Encoding. clickhouse-connect sends one lz4 frame per block: read them all."""
    enc = (encoding or "identity").strip().lower()
    if enc == "identity" or not data:
        return data
    if enc == "lz4":
        out = []
        while data:
            frame = lz4.frame.LZ4FrameDecompressor()
            out.append(frame.decompress(data))
            if not frame.eof:
                raise ValueError("truncated lz4 frame")
            data = frame.unused_data
        return b"".join(out)
    return {"zstd": zstd.decompress, "gzip": gzip.decompress, "deflate": zlib.decompress}[enc](data)


def split_insert(query: bytes, body: bytes) -> tuple[bytes, bytes | None, str | None]:
    """(statement, data, format): an `INSERT ... FORMAT X`'s data is what follows the format name (the whole
    body when the statement came in the `query` parameter). Other statements: (query + body, None, None)."""
    text = query + b"\n" + body if query and body else query or body
    m = _INSERT_FORMAT.match(text)
    if not m:
        return text, None, None
    if query and m.end() <= len(query):
        return m.group(1), body, m.group(2).decode()
    rest = text[m.end() :]
    rest = rest.lstrip(b" \t") if rest[:1] in (b" ", b"\t") else rest
    rest = rest[2:] if rest[:2] == b"\r\n" else rest[1:] if rest[:1] == b"\n" else rest
    return m.group(1), rest, m.group(2).decode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_GET(self):
        self.server.owner.handle(self)

    do_POST = do_GET

    def setup(self):  # track connections so stop() can drop idle keep-alive ones
        super().setup()
        with self.server.owner._conns_lock:
            self.server.owner._conns.add(self.connection)

    def finish(self):
        with self.server.owner._conns_lock:
            self.server.owner._conns.discard(self.connection)
        super().finish()

    def body(self) -> bytes:
        """The raw request body, by Content-Length or chunked transfer encoding."""
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            parts.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline().strip():  # trailers, up to the blank line
            pass
        return b"".join(parts)

    def reply(self, status: int, body: bytes, headers: dict | list = ()) -> None:
        self.send_response(status)
        for k, v in headers.items() if isinstance(headers, dict) else headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0) instead of an orderly close."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # the socket's last reference: close() below really closes it
        self.connection.close()

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients vanishing mid-request are what these tests are about


class _Serving:
    """A ThreadingHTTPServer on 127.0.0.1, served from a daemon thread; a context manager."""

    def __init__(self):
        self.port = 0
        self._server: _Server | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    def start(self):
        self._server = _Server(("127.0.0.1", self.port), _Handler)  # SO_REUSEADDR: the same port again
        self._server.owner = self
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening (new connections are refused) and drop open keep-alive connections."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._conns_lock:
            for sock in self._conns:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ChServer(_Serving):
    """The ClickHouse HTTP interface on the chdb engine at `chdb_path`.

    Requests run on chdb connection handles (`chdb.connect(path)`) of their own. Handles share the one engine
    a process may host, so this runs beside the session's embedded clickhouse-connect client, and their
    USE/SET state is private. A `session_id` keeps its handle, so SET statements persist as on a server.
    Execution is serialized by one lock.
    """

    def __init__(self, chdb_path: str, user: str = "default", password: str = "", max_sessions: int = 64):
        super().__init__()
        self.path = os.path.realpath(chdb_path)  # chdb compares engine paths literally
        self.user, self.password, self.max_sessions = user, password, max_sessions
        self._lock = threading.Lock()
        self._sessions: dict[str, object] = {}  # session_id -> chdb connection, least recently used first
        self._base = None

    @property
    def url(self) -> str:
        return f"http://{self.user}@127.0.0.1:{self.port}/"

    def start(self):
        self._base = chdb.connect(self.path)  # holds the engine open while serving
        info = self._base.query("SELECT version(), timezone()", "TSV").bytes().decode().split()
        self.version, self.timezone = info
        return super().start()

    def stop(self) -> None:
        super().stop()
        with self._lock:
            for conn in [*self._sessions.values(), *([self._base] if self._base else [])]:
                conn.close()
            self._sessions.clear()
            self._base = None

    def handle(self, h: _Handler) -> None:
        url = urlsplit(h.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        headers = {
            "X-ClickHouse-Server-Display-Name": "chserver",
            "X-ClickHouse-Query-Id": params.get("query_id") or str(uuid.uuid4()),
            "X-ClickHouse-Timezone": self.timezone,
            "Keep-Alive": "timeout=10",
        }
        try:
            body = decompress(h.body(), h.headers.get("Content-Encoding"))
            if url.path == "/ping":
                return h.reply(200, b"Ok.\n")
            if h.headers.get_content_type() == "multipart/form-data":  # form-encoded query and parameters
                form = BytesParser().parsebytes(
                    f"Content-Type: {h.headers['Content-Type']}\r\n\r\n".encode() + body
                )
                params.update((p.get_param("name", header="content-disposition"), p.get_payload(decode=True).decode())
                              for p in form.get_payload())  # fmt: skip
                body = b""
            user, password = self._credentials(h, params)
            if (user, password) != (self.user, self.password):
                raise PermissionError(AUTH_FAILED.format(user))
            if not params.get("query") and not body:
                return h.reply(200, b"Ok.\n")
            out, more = self._execute(params.get("query", "").encode(), body, params)
        except Exception as exc:  # chdb's errors carry ClickHouse's own "Code: N. DB::Exception: ... (NAME)"
            text = str(exc)
            text = text[text.index("Code: ") :] if "Code: " in text else f"Code: 1001. DB::Exception: {text}"
            code = int(re.match(r"Code: (\d+)", text).group(1))
            headers |= {"X-ClickHouse-Exception-Code": str(code), "Content-Type": "text/plain; charset=UTF-8"}
            return h.reply(HTTP_STATUS.get(code, 500), f"{text} (version {self.version})\n".encode(), headers)
        headers |= more
        codecs = {"lz4": lz4.frame.compress, "zstd": zstd.compress, "gzip": gzip.compress}
        accepted = [e.strip() for e in h.headers.get("Accept-Encoding", "").split(",") if e.strip() in codecs]
        if out and accepted and params.get("enable_http_compression") == "1":
            out, headers["Content-Encoding"] = codecs[accepted[0]](out), accepted[0]
        h.reply(200, out, headers)

    @staticmethod
    def _credentials(h: _Handler, params: dict) -> tuple[str, str]:
        auth = h.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            return user, password
        if "X-ClickHouse-User" in h.headers:
            return h.headers["X-ClickHouse-User"], h.headers.get("X-ClickHouse-Key", "")
        return params.get("user", "default"), params.get("password", "")

    def _execute(self, query: bytes, body: bytes, params: dict) -> tuple[bytes, dict]:
        stmt, data, fmt = split_insert(query, body)
        settings = {k: v for k, v in params.items() if k not in HTTP_ONLY and not k.startswith("param_")}
        binds = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
        session = params.get("session_id")
        with self._lock:
            conn = self._sessions.pop(session, None) or chdb.connect(self.path)
            if session:
                self._sessions[session] = conn
                while len(self._sessions) > self.max_sessions:
                    self._sessions.pop(next(iter(self._sessions))).close()
            undo: list[str] = []  # puts a session's handle back: URL settings last one statement only
            try:
                self._apply(conn, params.get("database"), settings, undo if session else None)
                return self._insert(conn, stmt, data, fmt) if fmt else self._query(conn, stmt, binds, params)
            finally:
                for sql in reversed(undo):
                    try:
                        conn.query(sql, "TSV")
                    except Exception:
                        pass  # e.g. USE of a database the statement dropped
                if not session:
                    conn.close()

    @staticmethod
    def _apply(conn, database: str | None, settings: dict, undo: list[str] | None) -> None:
        """USE the request's database and SET its settings, noting in `undo` how to reverse them."""
        if database:
            if undo is not None:
                undo.append(
                    f"USE {_ident(conn.query('SELECT currentDatabase()', 'TSV').bytes().decode().strip())}"
                )
            conn.query(f"USE {_ident(database)}", "TSV")
        if settings and undo is not None:
            names = ", ".join(map(_literal, settings))
            rows = conn.query(
                f"SELECT name, value, changed FROM system.settings WHERE name IN ({names})", "JSONEachRow"
            )
            old = {r["name"]: r for r in map(json.loads, rows.bytes().splitlines()) if r["changed"]}
            undo += [
                f"SET {_ident(k)} = {_literal(old[k]['value']) if k in old else 'DEFAULT'}" for k in settings
            ]
        for name, value in settings.items():
            conn.query(f"SET {_ident(name)} = {_literal(value)}", "TSV")  # unknown setting: error 115

    @staticmethod
    def _insert(conn, stmt: bytes, data: bytes, fmt: str) -> tuple[bytes, dict]:
        inserter = conn.send_insert(stmt.decode(), fmt)
        try:
            if data:
                inserter.append(data)
            res = inserter.finish()
        except BaseException:
            inserter.cancel()
            raise
        return b"", {"X-ClickHouse-Summary": _summary(res.rows_written, res.bytes_written, 0, 0, res.elapsed)}

    @staticmethod
    def _query(conn, stmt: bytes, binds: dict, params: dict) -> tuple[bytes, dict]:
        try:
            sql: str | bytes = stmt.decode()
        except UnicodeDecodeError:  # binary-bound parameters
            sql = stmt
        explicit = _TRAILING_FORMAT.search(sql) if isinstance(sql, str) else None
        fmt = explicit.group(1) if explicit else params.get("default_format") or "TabSeparated"
        # With no FORMAT clause, ask for names too: only a statement with a result set prints them.
        probe = not explicit and fmt in ("TabSeparated", "TSV")
        res = conn.query(sql, "TabSeparatedWithNames" if probe else fmt, params=binds)
        out = res.bytes() or b""
        headers = {"Content-Type": "application/octet-stream"}
        if explicit or out:
            headers["X-ClickHouse-Format"] = fmt  # a result set, even if empty
        if probe and out:
            out = out.split(b"\n", 1)[1]
        counts = res.rows_written(), res.bytes_written(), res.rows_read(), res.bytes_read(), res.elapsed()
        return out, headers | {"X-ClickHouse-Summary": _summary(*counts)}


def _ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _literal(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _summary(written_rows, written_bytes, read_rows, read_bytes, elapsed: float) -> str:
    names = "written_rows", "written_bytes", "read_rows", "read_bytes"
    counts = dict(zip(names, map(str, (written_rows, written_bytes, read_rows, read_bytes))))
    return json.dumps(counts | {"elapsed_ns": str(int(elapsed * 1e9))})


# -- fault injection ------------------------------------------------------------------------------------
@dataclass
class Request:
    """A client request as fault rules see it."""

    method: str
    path: str
    params: dict
    headers: Message  # case-insensitive .get()
    body: bytes  # as received, still Content-Encoded
    sql: str = ""  # the statement: `query` parameter and/or decoded body, without insert data
    is_insert: bool = False
    client_port: int = 0  # the client's TCP port, to find the process that sent it

    @classmethod
    def parse(cls, h: _Handler) -> Request:
        req = cls(
            h.command,
            h.path,
            dict(parse_qsl(urlsplit(h.path).query, keep_blank_values=True)),
            h.headers,
            h.body(),
        )
        try:
            data = decompress(req.body, h.headers.get("Content-Encoding"))
        except Exception:
            data = b""
        stmt, _, fmt = split_insert(req.params.get("query", "").encode(), data)
        req.sql = stmt.decode("utf-8", "replace").strip() + (f" FORMAT {fmt}" if fmt else "")
        req.is_insert = req.sql[:6].upper() == "INSERT"
        req.client_port = h.client_address[1]
        return req

    def arrow(self):
        """The rows of an Arrow insert, as a pyarrow Table (None for anything else)."""
        import pyarrow as pa

        data = decompress(self.body, self.headers.get("Content-Encoding"))
        _, rows, fmt = split_insert(self.params.get("query", "").encode(), data)
        if not rows or not fmt or not fmt.lower().startswith("arrow"):
            return None
        try:
            return pa.ipc.open_stream(rows).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(rows).read_all()

    @property
    def brief(self) -> str:
        return " ".join(self.sql.split())[:80]


@dataclass
class Fault:
    action: str
    match: Callable[[Request], bool]
    times: int | None  # None: every matching request
    options: dict = field(default_factory=dict)
    fired: int = 0


class FaultProxy(_Serving):
    """An HTTP proxy in front of a ClickHouse HTTP endpoint (ChServer or a real server) that injects faults.

    `add_fault(action, match=lambda req: ..., times=1, **options)` arms a rule; a request fires the first
    armed rule it matches. Actions:
      reset        abort the client connection (TCP RST) without forwarding: the write never happened
      reset_after  forward, then abort instead of answering: the write happened, the client never heard
      delay        sleep `seconds` before forwarding
      error        answer like ClickHouse with exception `code` (242) and HTTP `status` (500), no forwarding
      call         call `fn(req)` (it may block, kill or signal), then forward (unless `forward=False`)
    `down()` refuses connections and drops open ones; `up()` listens on the same port again.
    """

    ACTIONS = ("reset", "reset_after", "delay", "error", "call")

    def __init__(self, upstream_host: str, upstream_port: int, timeout: float = 300):
        super().__init__()
        self.upstream, self.timeout = (upstream_host, upstream_port), timeout
        self.log: list[str] = []  # every forwarded statement (whitespace collapsed, first 80 chars)
        self.fired: list[tuple[str, str]] = []  # (action, statement) of every fault that fired
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def url_for(self, user: str = "default", database: str = "") -> str:
        return f"http://{user}@127.0.0.1:{self.port}/{database}"

    def add_fault(
        self, action: str, match: Callable[[Request], bool] | None = None, times: int | None = 1, **options
    ):
        if action not in self.ACTIONS:
            raise ValueError(f"unknown fault {action!r}; one of {self.ACTIONS}")
        fault = Fault(action, match or (lambda req: True), times, options)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def hits(self, action: str | None = None) -> int:
        return sum(1 for a, _ in self.fired if action in (None, a))

    def up(self) -> FaultProxy:
        return self if self._server else self.start()

    down = _Serving.stop

    def handle(self, h: _Handler) -> None:
        req = Request.parse(h)
        with self._lock:
            fault = next(
                (f for f in self._faults if (f.times is None or f.fired < f.times) and f.match(req)), None
            )
            if fault:
                fault.fired += 1
                self.fired.append((fault.action, req.brief))
        action, opts = (fault.action, fault.options) if fault else (None, {})
        if action == "reset":
            return h.reset()
        if action == "error":
            code = opts.get("code", 242)
            name = opts.get("name") or ERROR_NAMES.get(code, "UNKNOWN_EXCEPTION")
            text = f"Code: {code}. DB::Exception: {opts.get('message', 'Injected by FaultProxy')}. ({name})\n"
            headers = {"X-ClickHouse-Exception-Code": str(code), "Content-Type": "text/plain; charset=UTF-8"}
            return h.reply(opts.get("status", 500), text.encode(), headers)
        if action == "delay":
            time.sleep(opts["seconds"])
        if action == "call":
            opts["fn"](req)
            if not opts.get("forward", True):  # the caller killed the client: the write never lands
                return h.reset()
        try:
            status, headers, body = self._forward(req)
        except OSError as exc:  # upstream unreachable: answer as a load balancer would
            return h.reply(502, f"FaultProxy: upstream {self.upstream}: {exc}\n".encode())
        if action == "reset_after":
            return h.reset()
        h.reply(status, body, headers)

    def _forward(self, req: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        hop = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
        conn = http.client.HTTPConnection(*self.upstream, timeout=self.timeout)
        try:
            conn.request(
                req.method, req.path, req.body, {k: v for k, v in req.headers.items() if k.lower() not in hop}
            )
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        self.log.append(req.brief)
        return resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in hop], body

    def __repr__(self) -> str:
        return f"FaultProxy(127.0.0.1:{self.port} -> {self.upstream[0]}:{self.upstream[1]})"
