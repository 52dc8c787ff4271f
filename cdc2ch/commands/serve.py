"""`cdc2ch run --serve HOST:PORT`: the embedded engine of the running process over the ClickHouse HTTP
interface, so that `cdc2ch status/query`, clickhouse-client, Grafana and any clickhouse-connect user can read
while replication goes on (chdb lets one process open a directory; this one shares it).

As much of the interface as those clients use: statements in the `query` parameter and/or the body, URL
settings and `param_*` bindings, `database`, `default_format`, sessions, multipart forms, request and
response compression (lz4, zstd, gzip, deflate), /ping, ClickHouse's error codes and HTTP statuses. The
statements run in cdc2ch.clickhouse.served (read-only unless asked). Credentials are checked as ClickHouse
does (HTTP basic auth, X-ClickHouse-User/Key headers, or `user`/`password` parameters) against one user whose
password comes from CDC2CH_SERVE_PASSWORD. TLS with a certificate and key; one thread per connection;
bounded request bodies, compressed or not.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import os
import re
import socket
import ssl
import threading
import uuid
import zlib
from collections.abc import Sequence
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import lz4.frame

try:
    from compression import zstd  # Python 3.14+
except ImportError:
    from backports import zstd  # comes with clickhouse-connect

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse.served import Engine
from cdc2ch.clickhouse.server import SERVE_PASSWORD_ENV as PASSWORD_ENV

MAX_REQUEST = 64 << 20  # bytes of a request body, and of it decompressed
MAX_ANONYMOUS = 1 << 20  # the same before the request's credentials are known (they may be in a form)
IDLE_SECONDS = 30  # a connection waiting longer for its next request is closed
MAX_CONNECTIONS = 512  # open at once; more are closed as they come
MAX_QUERIES, QUEUE_SECONDS = 16, 10.0  # statements at once; how long one more waits for a turn
# The HTTP status a real server gives some exception codes (ClickHouse's exceptionCodeToHTTPStatus); else 500.
HTTP_STATUS = {516: 403, 192: 403, 193: 403, 497: 403, 194: 401, 6: 400, 27: 400, 36: 400, 53: 400, 62: 400,
               46: 404, 47: 404, 60: 404, 73: 404, 81: 404, 115: 404, 159: 408, 209: 503}  # fmt: skip
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DIGITS, _HEX = re.compile(r"[0-9]{1,19}"), re.compile(rb"[0-9A-Fa-f]{1,16}")
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


class ClientError(Exception):
    """A request this server refuses before ClickHouse sees it: (HTTP status, message)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"Code: 1001. DB::Exception: {message}")
        self.status = status


def decompress(data: bytes, encoding: str | None, limit: int = MAX_REQUEST) -> bytes:
    """Undo a request's Content-Encoding, refusing more than `limit` bytes out. clickhouse-connect sends one
    lz4 frame per block: read them all."""
    enc = (encoding or "identity").strip().lower()
    if enc == "identity" or not data:
        return data
    if enc not in ("lz4", "zstd", "gzip", "deflate"):
        raise ClientError(415, f"Unknown Content-Encoding {enc!r}.")
    try:
        return _inflate(data, enc, limit)
    except ClientError:
        raise
    except Exception as exc:  # lz4's RuntimeError, zlib.error, ZstdError: the client's bytes, not our fault
        raise ClientError(400, f"The request body is not valid {enc}: {exc}.") from None


def _inflate(data: bytes, enc: str, limit: int) -> bytes:
    too_big = ClientError(413, f"The decompressed request body is larger than {limit} bytes.")
    if enc in ("lz4", "zstd"):
        out, size = [], 0
        while data:
            frame = lz4.frame.LZ4FrameDecompressor() if enc == "lz4" else zstd.ZstdDecompressor()
            chunk = frame.decompress(data, max_length=limit - size + 1)
            size += len(chunk)
            if size > limit:
                raise too_big
            if not frame.eof:
                raise ClientError(400, f"Truncated {enc} frame in the request body.")
            out.append(chunk)
            data = frame.unused_data
        return b"".join(out)
    inflated = zlib.decompressobj(31 if enc == "gzip" else 15).decompress(data, limit + 1)
    if len(inflated) > limit:
        raise too_big
    return inflated


def form_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The fields of a multipart/form-data body (ClientError 400 for one that is not)."""
    form = BytesParser().parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    parts: Any = form.get_payload()  # a list of parts, or else what fails below
    try:
        return {
            p.get_param("name", header="content-disposition"): p.get_payload(decode=True).decode()
            for p in parts
        }
    except (AttributeError, TypeError, UnicodeDecodeError):  # not parts; a nested multipart; not UTF-8
        raise ClientError(
            400, "Malformed multipart/form-data body: send named fields of UTF-8 text."
        ) from None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    timeout = IDLE_SECONDS
    # A reply is two writes (headers, then body): with Nagle's algorithm the body waits for the client's
    # delayed ACK of the headers, about 40 ms on every answer that has rows.
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self):
        self.server.owner.handle(self)

    do_POST = do_GET

    def setup(self):  # track connections so stop() can drop idle keep-alive ones
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, on this connection's thread, not in accept()
        with self.server.owner.connections_lock:
            self.server.owner.connections.add(self.connection)

    def finish(self):
        with self.server.owner.connections_lock:
            self.server.owner.connections.discard(self.connection)
        super().finish()

    def body(self, limit: int | None = None) -> bytes:
        """The raw request body, by Content-Length or chunked transfer encoding, up to `limit` bytes. A body
        that cannot be framed closes the connection: what follows it is not a request."""
        limit = limit if limit is not None else 1 << 62
        too_big = ClientError(413, f"The request body is larger than {limit} bytes.")
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = self.headers.get("Content-Length") or "0"
            if not _DIGITS.fullmatch(length.strip()):  # int() takes "-1", "+1", "1_0": read(-1) reads to EOF
                self.close_connection = True
                raise ClientError(400, f"Bad Content-Length {length[:40]!r}.")
            if int(length) > limit:
                self.close_connection = True  # the body stays unread
                raise too_big
            return self.rfile.read(int(length))
        parts, size = [], 0
        while True:
            line = self.rfile.readline(100).split(b";")[0].strip()
            if not _HEX.fullmatch(line):
                self.close_connection = True
                raise ClientError(400, f"Bad chunk size {line[:40]!r} in a chunked request body.")
            if not (chunk := int(line, 16)):
                break
            size += chunk
            if size > limit:
                self.close_connection = True
                raise too_big
            parts.append(self.rfile.read(chunk))
            self.rfile.readline(100)
        while self.rfile.readline(65537).strip():  # trailers, up to the blank line
            pass
        return b"".join(parts)

    def reply(
        self, status: int, body: bytes, headers: dict[str, Any] | Sequence[tuple[str, Any]] = ()
    ) -> None:
        self.send_response(status)
        for k, v in headers.items() if isinstance(headers, dict) else headers:
            self.send_header(
                k, _CONTROL.sub("", str(v))
            )  # a query_id with CR LF would write headers of its own
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: HTTPService
    request_queue_size = (
        1024  # listen backlog: with socketserver's 5, a burst of connections waits out SYN retries
    )

    def verify_request(self, request, client_address) -> bool:
        """At most `max_connections` open at once (a thread each): slow clients cannot take every thread."""
        with self.owner.connections_lock:
            return len(self.owner.connections) < self.owner.max_connections

    def __init__(self, address, handler, family):
        self.address_family = family
        super().__init__(address, handler)

    def handle_error(self, request, client_address):
        pass  # a client gone mid-request, a failed TLS handshake: that connection's business only


class HTTPService:
    """A ThreadingHTTPServer served from a daemon thread, optionally with TLS; a context manager.
    Subclasses answer requests in `handle(handler)`."""

    handler_class = Handler

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.host, self.port, self.tls, self.max_connections = host, port, tls, max_connections
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        self._server: _Server | None = None

    def start(self):
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            server = _Server((self.host, self.port), self.handler_class, family)  # SO_REUSEADDR
        except OSError as exc:
            raise ConfigError(
                f"Cannot listen on {self.host}:{self.port}: {exc.strerror or exc}. Choose another address or "
                f"port (or stop whatever listens there)."
            ) from None
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        server.owner = self
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), name="cdc2ch-serve", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening (new connections are refused) and drop open keep-alive connections."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.connections_lock:
            for sock in self.connections:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle(self, h: Handler) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


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
        max_request: int = MAX_REQUEST,
        max_queries: int = MAX_QUERIES,
        max_connections: int = MAX_CONNECTIONS,
    ):
        super().__init__(host, port, tls, max_connections)
        self.engine, self.user, self.password, self.max_request = engine, user, password, max_request
        self.max_queries = max_queries
        self._queries = threading.BoundedSemaphore(max_queries)  # statements running at once

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
                return h.reply(200, b"Ok.\n", headers)
            given, user, password = self._credentials(h, params)
            trusted = self._authenticated(user, password)
            if given and not trusted:
                h.close_connection = True  # its body stays unread
                return self._refuse(h, user, given, headers)
            # Until credentials are known a small body only, which may be a form that carries them.
            limit = self.max_request if trusted else min(self.max_request, MAX_ANONYMOUS)
            body = decompress(h.body(limit), h.headers.get("Content-Encoding"), limit)
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


# -- what `run --serve` starts ---------------------------------------------------------------------------
def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:8123 for IPv6), or PORT alone for 127.0.0.1."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    try:
        number = int(port)
        if not 0 <= number <= 65535:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"--serve {text!r} is not an address to listen on: use HOST:PORT, e.g. 127.0.0.1:8123 (this host "
            f"only), 0.0.0.0:8123 (every interface) or [::1]:8123."
        ) from None
    return host or "0.0.0.0", number


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError("TLS needs both --serve-tls-cert and --serve-tls-key (PEM files).")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"Cannot use the TLS certificate {cert} with key {key}: {getattr(exc, 'strerror', None) or exc}."
        ) from None
    return context


def serve_engine(
    path: str, address: str, user: str, writable: bool, tls_cert: str | None, tls_key: str | None
) -> ClickHouseHTTP:
    """Start serving the embedded engine at `path` (this process's) on `address`."""
    host, port = parse_address(address)
    server = ClickHouseHTTP(
        Engine(path, readonly=not writable),
        host,
        port,
        user=user,
        password=os.environ.get(PASSWORD_ENV, ""),
        tls=tls_context(tls_cert, tls_key),
    )
    return server.start()
