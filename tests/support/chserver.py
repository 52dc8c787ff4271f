"""Test-only ClickHouse over HTTP, no server needed.

`ChServer` is cdc2ch's own ClickHouse HTTP interface (cdc2ch/clickhouse/serving/endpoint.py), writable, on the
in-process chdb engine, on 127.0.0.1; `FaultProxy` forwards to any ClickHouse HTTP endpoint (ChServer or a real
server) and injects faults.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from urllib.parse import parse_qsl, urlsplit

from cdc2ch.clickhouse.serving.endpoint import ClickHouseHTTP
from cdc2ch.clickhouse.serving.engine import Engine, split_insert
from cdc2ch.clickhouse.serving.httpservice import Handler, HTTPService, decompress

ERROR_NAMES = {3: "UNEXPECTED_END_OF_FILE", 159: "TIMEOUT_EXCEEDED", 164: "READONLY", 209: "SOCKET_TIMEOUT",
               202: "TOO_MANY_SIMULTANEOUS_QUERIES", 210: "NETWORK_ERROR", 236: "ABORTED", 242: "TABLE_IS_READ_ONLY",
               241: "MEMORY_LIMIT_EXCEEDED", 252: "TOO_MANY_PARTS", 319: "UNKNOWN_STATUS_OF_INSERT",
               394: "QUERY_WAS_CANCELLED", 425: "SYSTEM_ERROR", 516: "AUTHENTICATION_FAILED"}  # fmt: skip


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


class ChServer(ClickHouseHTTP):
    """The ClickHouse HTTP interface on the chdb engine at `chdb_path`, writable, as a server would be.

    Requests run on chdb connection handles of their own (cdc2ch.clickhouse.serving.engine). Handles share the one
    engine a process may host, so this runs beside the session's embedded clickhouse-connect client, and
    their USE/SET state is private. A `session_id` keeps its handle, so SET statements persist.
    """

    def __init__(self, chdb_path: str, user: str = "default", password: str = "", max_sessions: int = 64):
        super().__init__(
            Engine(chdb_path, readonly=False, max_sessions=max_sessions), user=user, password=password
        )


class _ProxyHandler(Handler):
    def reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0) instead of an orderly close."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # the socket's last reference: close() below really closes it
        self.connection.close()


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
    def parse(cls, h: Handler) -> Request:
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

    def rows(self) -> list[dict] | None:
        """The rows of an Arrow or JSONEachRow insert, as dicts (None for anything else)."""
        import json

        table = self.arrow()
        if table is not None:
            return table.to_pylist()
        data = decompress(self.body, self.headers.get("Content-Encoding"))
        _, rows, fmt = split_insert(self.params.get("query", "").encode(), data)
        if not rows or not fmt or fmt.lower() != "jsoneachrow":
            return None
        return [json.loads(line) for line in rows.decode().splitlines() if line.strip()]

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


class FaultProxy(HTTPService):
    """An HTTP proxy in front of a ClickHouse HTTP endpoint (ChServer or a real server) that injects faults.

    `add_fault(action, match=lambda req: ..., times=1, **options)` arms a rule; a request fires the first
    armed rule it matches. Actions:
      reset        abort the client connection (TCP RST) without forwarding: the write never happened
      reset_after  forward, then abort instead of answering: the write happened, the client never heard
      delay        sleep `seconds` before forwarding
      error        answer like ClickHouse with exception `code` (242) and HTTP `status` (500), no forwarding
      call         call `fn(req)` (it may block, kill or signal), then forward (unless `forward=False`)
      answer       answer `body` (bytes) with HTTP 200 instead of forwarding (e.g. another server version)
    `down()` refuses connections and drops open ones; `up()` listens on the same port again.
    `settle()` waits until no request is in flight: what a client killed in `fn` sent has landed (or not).
    """

    ACTIONS = ("reset", "reset_after", "delay", "error", "call", "answer")
    handler_class = _ProxyHandler

    def __init__(self, upstream_host: str, upstream_port: int, timeout: float = 300):
        super().__init__()
        self.upstream, self.timeout = (upstream_host, upstream_port), timeout
        self.log: list[str] = []  # every forwarded statement (whitespace collapsed, first 80 chars)
        self.fired: list[tuple[str, str]] = []  # (action, statement) of every fault that fired
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._busy = 0  # requests being handled

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

    down = HTTPService.stop

    def settle(self, timeout: float = 60) -> None:
        with self._idle:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout):
                raise TimeoutError(f"{self!r}: {self._busy} request(s) still in flight after {timeout} s")

    def handle(self, h: _ProxyHandler) -> None:
        with self._lock:
            self._busy += 1
        try:
            self._handle(h)
        finally:
            with self._lock:
                self._busy -= 1
                self._idle.notify_all()

    def _handle(self, h: _ProxyHandler) -> None:
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
        if action == "answer":
            return h.reply(200, opts["body"], {"Content-Type": "text/tab-separated-values; charset=UTF-8"})
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
