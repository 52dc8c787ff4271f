"""A Delta Sharing server for tests: local Delta tables (written by Spark) shared over the protocol's REST API.

`SharingServer` listens on 127.0.0.1 (stdlib ThreadingHTTPServer, daemon thread), checks the bearer token,
answers the protocol's endpoints in the parquet response format (tests/support/sharing_tables.py builds the bodies
from the table's Delta log, tests/support/sharing_log.py reads it) and serves the data files itself at pre-signed-like
URLs that expire. `oauth` adds an OAuth 2.0 client-credentials token endpoint (the profile kind
`oauth_client_credentials`) whose short-lived access tokens the API accepts as bearer tokens.
Fault hooks (`fail`, `slow`, `expire_urls`) let a test break it on purpose; `requests` records what clients asked.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import re
import secrets
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from tests.support.sharing_log import SharingError, invalid
from tests.support.sharing_tables import SharedTable, Signer

PREFIX = "/delta-sharing"
TOKEN_PATH = "/oauth/token"
TABLE = re.compile(r"^/shares/([^/]+)/schemas/([^/]+)/tables/([^/]+)(/[a-z]+)?$")
EXPIRED = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>Request has expired"
    b"</Message></Error>"
)
DENIED = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SignatureDoesNotMatch</Code></Error>"
MISSING = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code></Error>"


class _Rule:
    def __init__(self, path_contains: str, times: int, **what):
        self.path_contains, self.left, self.what = path_contains, times, what


class SharingServer:
    def __init__(self, token: str | None = None, url_ttl: float = 3600.0):
        self.token = token or "dss-" + secrets.token_hex(16)  # a fresh token per server unless one is given
        self.url_ttl = url_ttl
        self.requests: list[tuple[str, str]] = []
        self._tables: dict[tuple[str, str, str], SharedTable] = {}
        self._files: dict[str, list] = {}  # url id -> [absolute path, expiration ms, revoked]
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self.endpoint = ""
        self.client: tuple[str, str] | None = None  # (client id, client secret) the token endpoint accepts
        self.token_ttl = 3600
        self.issued: dict[str, float] = {}  # access token -> expires at (time.time())
        self.token_calls: list[int] = []  # the status of each token endpoint call
        self.refused = 0  # API requests answered 401

    @property
    def token_endpoint(self) -> str:
        return self.endpoint.rsplit(PREFIX, 1)[0] + TOKEN_PATH

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> SharingServer:
        handler = type("Handler", (_Handler,), {"sharing": self})
        self._httpd = _Quiet(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}{PREFIX}"
        threading.Thread(target=self._httpd.serve_forever, name="sharing-server", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> SharingServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- set-up --------------------------------------------------------------------------------------
    def share(self, name: str, path: str | os.PathLike, *, history: bool = True) -> str:
        """Share the Delta table at `path` as `share.schema.table`; without history, time travel and change
        queries are refused as the reference server refuses them."""
        share, schema, table = name.split(".")
        with self._lock:
            self._tables[(share.lower(), schema.lower(), table.lower())] = SharedTable(
                share, schema, table, str(path), history
            )
        return name

    def profile(self, directory: str | os.PathLike) -> str:
        path = Path(directory) / f"sharing-{secrets.token_hex(4)}.share"
        body = {"shareCredentialsVersion": 1, "endpoint": self.endpoint, "bearerToken": self.token}
        path.write_text(json.dumps(body))
        return str(path)

    def oauth(self, ttl: int = 3600) -> tuple[str, str]:
        """Turn on the token endpoint for a fresh client (id, secret); its access tokens live `ttl` seconds."""
        with self._lock:
            self.client = ("cdc2ch-" + secrets.token_hex(4), "oss-" + secrets.token_hex(16))
            self.token_ttl = ttl
            return self.client

    def oauth_profile(
        self, directory: str | os.PathLike, secret: str | None = None, scope: str | None = None
    ) -> str:
        """A shareCredentialsVersion 2 profile of type oauth_client_credentials for the `oauth` client
        (`secret` replaces its client secret: a wrong one)."""
        assert self.client is not None, "call oauth() first"
        path = Path(directory) / f"sharing-oauth-{secrets.token_hex(4)}.share"
        body = {"shareCredentialsVersion": 2, "type": "oauth_client_credentials", "endpoint": self.endpoint,
                "tokenEndpoint": self.token_endpoint, "clientId": self.client[0],
                "clientSecret": secret or self.client[1], **({"scope": scope} if scope else {})}  # fmt: skip
        path.write_text(json.dumps(body))
        return str(path)

    @property
    def secrets(self) -> tuple[str, ...]:
        """What must never show up in a client's output: the bearer token, client secret, access tokens."""
        with self._lock:
            return (self.token, *(self.client[1:] if self.client else ()), *self.issued)

    @staticmethod
    def url(profile_path: str, name: str) -> str:
        return f"{profile_path}#{name}"

    # -- fault hooks ---------------------------------------------------------------------------------
    def fail(
        self,
        status: int,
        *,
        path_contains: str = "",
        times: int = 1,
        retry_after: float | None = None,
        body: str | None = None,
    ) -> None:
        """The next `times` requests whose path?query contains `path_contains` are answered `status`."""
        with self._lock:
            self._rules.append(_Rule(path_contains, times, status=status, retry_after=retry_after, body=body))

    def slow(self, seconds: float, *, path_contains: str = "", times: int = 1) -> None:
        """The next `times` matching requests wait `seconds` before being answered."""
        with self._lock:
            self._rules.append(_Rule(path_contains, times, delay=seconds))

    def expire_urls(self) -> None:
        """Every file URL issued so far is expired from now on (a GET answers 403, as S3 does)."""
        with self._lock:
            for entry in self._files.values():
                entry[2] = True

    # -- used by the handler -------------------------------------------------------------------------
    def _record(self, method: str, target: str) -> list[dict]:
        """Log the request; return the fault rules it consumes (a failure at most, any delays)."""
        hits = []
        with self._lock:
            self.requests.append((method, target))
            for rule in self._rules:
                if rule.left > 0 and rule.path_contains in target:
                    if "status" in rule.what and any("status" in h for h in hits):
                        continue
                    rule.left -= 1
                    hits.append(rule.what)
            self._rules = [r for r in self._rules if r.left > 0]
        return hits

    def _table(self, share: str, schema: str, name: str) -> SharedTable:
        with self._lock:
            table = self._tables.get((share.lower(), schema.lower(), name.lower()))
        if table is None:
            raise SharingError(
                404,
                "RESOURCE_DOES_NOT_EXIST",
                f"[Share/Schema/Table] '{share}/{schema}/{name}' does not exist, please contact your share "
                "provider for further information.",
            )
        return table

    def _all_tables(self) -> list[SharedTable]:
        with self._lock:
            return list(self._tables.values())

    def _tables_in(self, share: str, schema: str | None = None) -> list[SharedTable]:
        found = [t for t in self._all_tables() if t.share.lower() == share.lower()]
        if not found:
            raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"share '{share}' not found")
        if schema is not None:
            found = [t for t in found if t.schema.lower() == schema.lower()]
            if not found:
                raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"schema '{schema}' not found")
        return found

    def _signer(self, table: SharedTable, host: str, file_id_scheme: str) -> Signer:
        def sign(relative: str) -> tuple[str, int]:
            path = str(Path(table.path) / unquote(relative))
            expires = int((time.time() + self.url_ttl) * 1000)
            key = secrets.token_urlsafe(24)
            with self._lock:
                self._files[key] = [path, expires, False]
            return f"http://{host}/files/{key}/{quote(Path(path).name)}?expires={expires}", expires

        return Signer(sign, file_id_scheme)

    def _file(self, key: str) -> tuple[str, int, bool] | None:
        with self._lock:
            entry = self._files.get(key)
            return None if entry is None else tuple(entry)


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # Clients dropping kept-alive sockets is normal; anything else is printed.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _page(items: list[dict], params: dict[str, str]) -> dict:
    """Offset pagination: maxResults per page, nextPageToken the next offset."""
    try:
        start = int(params.get("pageToken") or 0)
        size = int(params.get("maxResults", 500))
    except ValueError:
        raise invalid("expected a number but the string didn't have the appropriate format") from None
    out: dict = {"items": items[start : start + size]}
    if start + size < len(items):
        out["nextPageToken"] = str(start + size)
    return out


class _Handler(BaseHTTPRequestHandler):
    sharing: SharingServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: tests assert on `requests` instead
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    # -- plumbing ------------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"errorCode": code, "message": message}).encode()
        self._send(status, body, {"Content-Type": "application/json; charset=utf-8", **(extra or {})})

    def _serve(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else b""
        for hit in self.sharing._record(method, self.path):
            if "delay" in hit:
                time.sleep(hit["delay"])
            else:
                extra = {"Retry-After": f"{hit['retry_after']:g}"} if hit["retry_after"] is not None else {}
                text = hit["body"] or json.dumps({"errorCode": "INTERNAL_ERROR", "message": "injected fault"})
                self._send(hit["status"], text.encode(), {"Content-Type": "application/json", **extra})
                return
        parts = urlsplit(self.path)
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        try:
            if parts.path.startswith("/files/") and method in ("GET", "HEAD"):
                return self._serve_file(parts.path, params)
            if parts.path == TOKEN_PATH and method == "POST":
                return self._issue_token(body)
            if not parts.path.startswith(PREFIX):
                raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"no such endpoint: {parts.path}")
            if not self._authorized():
                with self.sharing._lock:
                    self.sharing.refused += 1
                return self._error(401, "UNAUTHENTICATED", "The bearer token is missing or incorrect.")
            self._route(method, parts.path[len(PREFIX) :], params, body)
        except SharingError as e:
            self._error(e.status, e.code, e.message)
        except (ValueError, KeyError, TypeError) as e:
            self._error(400, "MALFORMED_REQUEST", str(e))
        except Exception:  # the reference hides internal errors' messages
            traceback.print_exc()
            self._error(500, "INTERNAL_ERROR", "")

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.sharing.token}".encode()):
            return True
        token = given[len("Bearer ") :] if given.startswith("Bearer ") else ""
        with self.sharing._lock:
            return self.sharing.issued.get(token, 0.0) > time.time()  # an access token, until it expires

    def _issue_token(self, body: bytes) -> None:
        """RFC 6749 section 4.4: grant_type=client_credentials, the client authenticated with HTTP Basic (as
        the delta-sharing connectors send it) or with client_id/client_secret in the form."""
        s = self.sharing
        form = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        given = (form.get("client_id", ""), form.get("client_secret", ""))
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(auth[6:]).decode("utf-8").partition(":")
                given = (unquote(user), unquote(password))
            except ValueError:
                given = ("", "")
        if form.get("grant_type") != "client_credentials":
            status, answer = 400, {"error": "unsupported_grant_type"}
        elif s.client is None or not (
            hmac.compare_digest(given[0].encode(), s.client[0].encode())
            and hmac.compare_digest(given[1].encode(), s.client[1].encode())
        ):
            status, answer = (
                401,
                {"error": "invalid_client", "error_description": "Client authentication failed"},
            )
        else:
            token = "oat-" + secrets.token_hex(16)
            with s._lock:
                s.issued[token] = time.time() + s.token_ttl
            status, answer = 200, {"access_token": token, "token_type": "Bearer", "expires_in": s.token_ttl}
        with s._lock:
            s.token_calls.append(status)
        extra = {"WWW-Authenticate": 'Basic realm="token"'} if status == 401 else {}
        self._send(
            status,
            json.dumps(answer).encode(),
            {"Content-Type": "application/json", "Cache-Control": "no-store", **extra},
        )

    def _capabilities(self) -> dict[str, str]:
        raw = (self.headers.get("delta-sharing-capabilities") or "").lower()
        return dict(p.split("=", 1) for p in raw.split(";") if p.count("=") == 1)

    def _ndjson(self, version: int, lines: list[dict], file_id_scheme: str | None = None) -> None:
        body = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        headers = {
            "Content-Type": "application/x-ndjson; charset=utf-8",
            "Delta-Table-Version": str(version),
            "delta-sharing-capabilities": "responseformat=parquet",
        }
        if file_id_scheme:
            headers["fileidhash"] = file_id_scheme
        self._send(200, body, headers)

    def _json(self, payload: dict) -> None:
        self._send(200, json.dumps(payload).encode(), {"Content-Type": "application/json; charset=utf-8"})

    # -- the API -------------------------------------------------------------------------------------
    def _route(self, method: str, path: str, params: dict[str, str], body: bytes) -> None:
        s = self.sharing
        segments = path.strip("/").split("/")
        if method == "GET" and path == "/shares":
            names = sorted({t.share for t in s._all_tables()})
            return self._json(_page([{"name": n} for n in names], params))
        if method == "GET" and len(segments) == 2 and segments[0] == "shares":
            return self._json({"share": {"name": s._tables_in(segments[1])[0].share}})
        if method == "GET" and len(segments) == 3 and segments[2] == "schemas":
            tables = s._tables_in(segments[1])
            names = sorted({t.schema for t in tables})
            return self._json(_page([{"name": n, "share": tables[0].share} for n in names], params))
        if method == "GET" and len(segments) == 3 and segments[2] == "all-tables":
            return self._json(_page([t.item() for t in s._tables_in(segments[1])], params))
        if method == "GET" and len(segments) == 5 and segments[4] == "tables":
            return self._json(_page([t.item() for t in s._tables_in(segments[1], segments[3])], params))
        m = TABLE.match(path)
        if not m:
            raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"no such endpoint: {method} {path}")
        table = s._table(*m.groups()[:3])
        action = m.group(4)
        scheme = self._file_id_scheme()
        sign = s._signer(table, self.headers.get("Host", "127.0.0.1"), scheme or "parquet")
        if (method, action) in (("HEAD", None), ("GET", "/version")):
            version = table.version(params.get("startingTimestamp"))
            return self._send(200, b"", {"Delta-Table-Version": str(version)})
        if method == "GET" and action == "/metadata":
            return self._ndjson(*table.metadata(params, self._capabilities()))
        if method == "POST" and action == "/query":
            request = json.loads(body or b"{}")
            return self._ndjson(*table.query(request, self._capabilities(), sign), scheme)
        if method == "GET" and action == "/changes":
            return self._ndjson(*table.changes(params, self._capabilities(), sign), scheme)
        raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"no such endpoint: {method} {path}")

    def _file_id_scheme(self) -> str | None:
        raw = self.headers.get("fileidhash")
        if raw is None:
            return None
        if raw.strip().lower() not in ("parquet", "delta"):
            raise invalid(f"Unsupported fileidhash: '{raw}'. Supported: parquet, delta")
        return raw.strip().lower()

    def _serve_file(self, path: str, params: dict[str, str]) -> None:
        key = path.split("/")[2]
        found = self.sharing._file(key)
        if found is None or params.get("expires") != str(found[1]):
            return self._send(403, DENIED, {"Content-Type": "application/xml"})
        local, expires, revoked = found
        if revoked or expires <= time.time() * 1000:
            return self._send(403, EXPIRED, {"Content-Type": "application/xml"})
        try:
            data = Path(local).read_bytes()
        except FileNotFoundError:
            return self._send(404, MISSING, {"Content-Type": "application/xml"})
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        rng = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
        if rng and (rng.group(1) or rng.group(2)):
            first, last = rng.groups()
            if first == "":
                start, end = max(0, len(data) - int(last)), len(data) - 1
            else:
                start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, data[start : end + 1], headers)
        self._send(200, data, headers)
