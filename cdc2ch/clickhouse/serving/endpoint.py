"""`cdc2ch run --serve HOST:PORT`: the embedded engine of the running process over the ClickHouse HTTP
interface, so that `cdc2ch status/query`, clickhouse-client, Grafana and any clickhouse-connect user can read
while replication goes on (chdb lets one process open a directory; this one shares it).

As much of the interface as those clients use: statements in the `query` parameter and/or the body, URL
settings and `param_*` bindings, `database`, `default_format`, sessions, multipart forms, request and
response compression (lz4, zstd, gzip, deflate), /ping, ClickHouse's error codes and HTTP statuses. The
statements run in cdc2ch.clickhouse.serving.engine (read-only unless asked). Credentials are checked as ClickHouse
does (HTTP basic auth, X-ClickHouse-User/Key headers, or `user`/`password` parameters) against one user whose
password comes from CDC2CH_SERVE_PASSWORD. TLS with a certificate and key; one thread per connection;
bounded request bodies, compressed or not. Besides the interface, one route of cdc2ch's own: the pipeline
requests of cdc2ch.clickhouse.serving.requestroute, handled by the service's code, never by a statement.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import json
import os
import re
import ssl
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

import lz4.frame

try:
    from compression import zstd  # Python 3.14+
except ImportError:
    from backports import zstd  # comes with clickhouse-connect

from cdc2ch.base.errors import Cdc2chError, ConfigError
from cdc2ch.clickhouse.connection.remote import SERVE_PASSWORD_ENV as PASSWORD_ENV
from cdc2ch.clickhouse.serving import requestroute
from cdc2ch.clickhouse.serving.engine import Engine
from cdc2ch.clickhouse.serving.httpservice import (
    IDLE_SECONDS,
    MAX_CONNECTIONS,
    MAX_REQUEST,
    ClientError,
    Handler,
    HTTPService,
    decompress,
    form_fields,
    parse_address,
    tls_context,
)

MAX_ANONYMOUS = 1 << 20  # the same before the request's credentials are known (they may be in a form)
MAX_QUERIES, QUEUE_SECONDS = 16, 10.0  # statements at once; how long one more waits for a turn
# The HTTP status a real server gives some exception codes (ClickHouse's exceptionCodeToHTTPStatus); else 500.
HTTP_STATUS = {516: 403, 192: 403, 193: 403, 497: 403, 194: 401, 6: 400, 27: 400, 36: 400, 53: 400, 62: 400,
               46: 404, 47: 404, 60: 404, 73: 404, 81: 404, 115: 404, 159: 408, 209: 503}  # fmt: skip
AUTH_FAILED = (
    "Code: 516. DB::Exception: {}: Authentication failed: password is incorrect, or there is no user with "
    "such name. (AUTHENTICATION_FAILED)"
)


def exception_code(text: str) -> tuple[int, str]:
    """An error's ClickHouse code and its text from `Code: N.` on; 1001 (std::exception) for an error that
    carries no code, its text then written as ClickHouse writes one."""
    found = re.search(r"Code: (\d+)", text)
    if found is None:
        return 1001, f"Code: 1001. DB::Exception: {text}"
    return int(found.group(1)), text[found.start() :]


@dataclass(frozen=True)
class Limits:
    """What one client may take of the endpoint: bytes of a request, statements and connections at once."""

    request: int = MAX_REQUEST
    queries: int = MAX_QUERIES
    connections: int = MAX_CONNECTIONS


class ClickHouseHTTP(HTTPService):
    """The ClickHouse HTTP interface on an Engine, for one user."""

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 0,
        user: str = "default",
        password: str = "",
        tls: ssl.SSLContext | None = None,
        limits: Limits = Limits(),
        requests: Callable[[requestroute.Ask], str] | None = None,
    ):
        super().__init__(host, port, tls, limits.connections)
        self.engine, self.user, self.password, self.max_request = engine, user, password, limits.request
        # records a pipeline request, the sentence saying what happens next (None: no such route)
        self.requests = requests
        self.max_queries = limits.queries
        self._queries = threading.BoundedSemaphore(limits.queries)  # statements running at once

    @property
    def url(self) -> str:
        """How a client on this host reaches it (cdc2ch's DSN form: the user, never the password)."""
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1" if host != "::" else "::1"
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls else 'http'}://{self.user}@{host}:{self.port}/"

    def start(self):
        self.engine.open()
        try:
            return super().start()
        except BaseException:
            self.engine.close()
            raise

    def stop(self) -> None:
        super().stop()
        self.engine.close()

    def handle(self, h: Handler) -> None:
        url = urlsplit(h.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        headers = {
            "X-ClickHouse-Server-Display-Name": "cdc2ch",
            "X-ClickHouse-Query-Id": params.get("query_id") or str(uuid.uuid4()),
            "X-ClickHouse-Timezone": self.engine.timezone,
            "Keep-Alive": f"timeout={IDLE_SECONDS}",
        }
        try:
            if url.path == "/ping":
                h.body(MAX_ANONYMOUS)
                return h.reply(
                    200,
                    b"Ok.\n",
                    headers | ({requestroute.ANNOUNCE: requestroute.PATH} if self.requests else {}),
                )
            given, user, password = self._credentials(h, params)
            trusted = self._authenticated(user, password)
            if given and not trusted:
                h.close_connection = True  # its body stays unread
                return self._refuse(h, user, given, headers)
            # Until credentials are known a small body only, which may be a form that carries them.
            limit = self.max_request if trusted else min(self.max_request, MAX_ANONYMOUS)
            body = decompress(h.body(limit), h.headers.get("Content-Encoding"), limit)
            if url.path == requestroute.PATH and self.requests:  # credentials in headers or the URL: no form
                return self._take(h, body, headers) if trusted else self._refuse(h, user, given, headers)
            if h.headers.get_content_type() == "multipart/form-data":  # form-encoded query and parameters
                params.update(form_fields(h.headers["Content-Type"], body))
                body = b""
                given, user, password = self._credentials(h, params)
                trusted = self._authenticated(user, password)
            if not trusted:
                return self._refuse(h, user, given, headers)
            if not params.get("query") and not body:
                return h.reply(200, b"Ok.\n", headers)
            if not self._queries.acquire(timeout=QUEUE_SECONDS):
                raise RuntimeError(
                    f"Code: 202. DB::Exception: Too many simultaneous queries. Maximum: {self.max_queries}. "
                    f"(TOO_MANY_SIMULTANEOUS_QUERIES)"
                )
            try:
                out, more = self.engine.execute(params.get("query", "").encode(), body, params)
            finally:
                self._queries.release()
        except Exception as exc:  # chdb's errors carry ClickHouse's own "Code: N. DB::Exception: ... (NAME)"
            return self._error(h, exc, headers)
        headers |= more
        codecs = {"lz4": lz4.frame.compress, "zstd": zstd.compress, "gzip": gzip.compress}
        accepted = [e.strip() for e in h.headers.get("Accept-Encoding", "").split(",") if e.strip() in codecs]
        if out and accepted and params.get("enable_http_compression") == "1":
            out, headers["Content-Encoding"] = codecs[accepted[0]](out), accepted[0]
        h.reply(200, out, headers)

    def _take(self, h: Handler, body: bytes, headers: dict) -> None:
        """A pipeline request (requestroute.PATH): checked, then recorded by the service; answered in JSON."""
        assert self.requests is not None
        headers |= {"Content-Type": "application/json; charset=UTF-8"}
        if h.command != "POST":
            return h.reply(405, _json(error=f"{requestroute.PATH} takes POST requests only."), headers)
        try:
            ask = requestroute.parse(body, h.headers.get_content_type())
        except ClientError as exc:
            return h.reply(exc.status, _json(error=str(exc).partition("DB::Exception: ")[2]), headers)
        if not self._queries.acquire(timeout=QUEUE_SECONDS):
            return h.reply(503, _json(error="The service is busy: too many requests at once."), headers)
        try:
            said = self.requests(ask)
        except Cdc2chError as exc:  # the service's own paragraph: an unknown pipeline, a failed write
            return h.reply(400 if isinstance(exc, ConfigError) else 500, _json(error=str(exc)), headers)
        finally:
            self._queries.release()
        h.reply(200, _json(message=said), headers)

    def _refuse(self, h: Handler, user: str, given: bool, headers: dict) -> None:
        """ClickHouse's answer to missing (401) or wrong (403) credentials."""
        headers["WWW-Authenticate"] = 'Basic realm="ClickHouse", charset="UTF-8"'
        self._error(h, RuntimeError(AUTH_FAILED.format(user)), headers, 403 if given else 401)

    def _error(self, h: Handler, exc: Exception, headers: dict, status: int | None = None) -> None:
        code, text = exception_code(str(exc))
        if status is None:
            status = exc.status if isinstance(exc, ClientError) else HTTP_STATUS.get(code, 500)
        headers |= {"X-ClickHouse-Exception-Code": str(code), "Content-Type": "text/plain; charset=UTF-8"}
        h.reply(status, f"{text} (version {self.engine.version})\n".encode(), headers)

    @staticmethod
    def _credentials(h: Handler, params: dict) -> tuple[bool, str, str]:
        """(whether any were given, user, password), from where ClickHouse looks for them."""
        auth = h.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return True, "", ""
            return True, user, password
        if "X-ClickHouse-User" in h.headers or "X-ClickHouse-Key" in h.headers:
            return True, h.headers.get("X-ClickHouse-User", "default"), h.headers.get("X-ClickHouse-Key", "")
        given = "user" in params or "password" in params
        return given, params.get("user", "default"), params.get("password", "")

    def _authenticated(self, user: str, password: str) -> bool:
        same_user = hmac.compare_digest(user.encode(), self.user.encode())
        return hmac.compare_digest(password.encode(), self.password.encode()) and same_user


def _json(**fields: str) -> bytes:
    return json.dumps(fields).encode()


def serve_engine(
    path: str,
    address: str,
    user: str,
    writable: bool,
    tls_cert: str | None,
    tls_key: str | None,
    requests: Callable[[requestroute.Ask], str] | None = None,
) -> ClickHouseHTTP:
    """Start serving the embedded engine at `path` (this process's) on `address`; `requests` records the
    pipeline requests that come to requestroute.PATH."""
    host, port = parse_address(address)
    server = ClickHouseHTTP(
        Engine(path, readonly=not writable),
        host,
        port,
        user=user,
        password=os.environ.get(PASSWORD_ENV, ""),
        tls=tls_context(tls_cert, tls_key),
        requests=requests,
    )
    return server.start()
