"""A small threaded HTTP(S) service on the standard library: one thread per connection, a bound on open
connections, idle keep-alive connections closed, request bodies read within a limit (chunked, compressed or
as a form). The ClickHouse HTTP interface (endpoint.py) is one; tests' stand-ins for other servers are others.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import zlib
from collections.abc import Sequence
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import lz4.frame

try:
    from compression import zstd  # Python 3.14+
except ImportError:
    from backports import zstd  # comes with clickhouse-connect

from cdc2ch.base.errors import ConfigError

MAX_REQUEST = 64 << 20  # bytes of a request body, and of it decompressed


IDLE_SECONDS = 30  # a connection waiting longer for its next request is closed


MAX_CONNECTIONS = 512  # open at once; more are closed as they come


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


_DIGITS, _HEX = re.compile(r"[0-9]{1,19}"), re.compile(rb"[0-9A-Fa-f]{1,16}")


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
