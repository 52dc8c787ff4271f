"""A small Delta Sharing client: profile files and the REST calls cdc2ch needs (version, metadata, changes,
query, and query since a version), over the standard library's HTTP.

Its own client rather than the `delta-sharing` connector: the connector pins pyarrow below the version
cdc2ch runs, reads into pandas in one process, and cdc2ch needs only four calls whose answers it hands to
Spark tasks (source/sharing/sharefiles.py). The protocol: delta-io/delta-sharing PROTOCOL.md.

The profile's secrets (bearer token, client secret) stay in the Profile object: never in messages, logs,
reprs or process arguments (a spark-submit gets the profile's path, never its contents).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone

from cdc2ch.base import retry
from cdc2ch.base.errors import ConfigError, SourceError, summarise

ATTEMPTS = 6  # per request, for 429, 5xx and connection failures
MAX_WAIT = 30.0  # seconds between attempts at most, whatever Retry-After asks
TIMEOUT = 60.0  # seconds per request
REPORT_TIMEOUT = 5.0  # seconds per request of a report (SharingClient.impatient)
USER_AGENT = "cdc2ch"
PAGE = 500  # tables per page of a share listing


@dataclass(frozen=True)
class Profile:
    """A profile file: where the server is and how to authenticate (secrets kept out of repr)."""

    path: str  # absolute
    endpoint: str  # without a trailing slash
    version: int
    bearer_token: str | None = field(default=None, repr=False)
    expiration: datetime | None = None
    token_endpoint: str | None = None
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    scope: str | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.bearer_token, self.client_secret) if s)


def _profile_error(path: str, why: str) -> ConfigError:
    return ConfigError(
        f"The Delta Sharing profile {path} {why}. A profile is the JSON file the data provider gives you "
        f'({{"shareCredentialsVersion": 1, "endpoint": "https://…", "bearerToken": "…"}}); pass it as '
        f"--table <profile file>#<share>.<schema>.<table>."
    )


def load_profile(path: str, now: datetime | None = None) -> Profile:
    """Read and check a profile file; ConfigError with a paragraph for a missing, unreadable, malformed or
    expired one (the message never quotes the file's contents)."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise _profile_error(path, "does not exist") from None
    except OSError as exc:
        raise _profile_error(path, f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError
    except ValueError:
        raise _profile_error(path, "is not a JSON object") from None
    try:
        version = int(data["shareCredentialsVersion"])
    except (KeyError, TypeError, ValueError):
        raise _profile_error(path, "has no shareCredentialsVersion") from None
    endpoint = str(data.get("endpoint") or "").rstrip("/")
    if not endpoint.startswith(("http://", "https://")):
        raise _profile_error(path, "has no http(s) endpoint")
    kind = data.get("type") or ("bearer_token" if version == 1 else None)
    if version not in (1, 2) or kind not in ("bearer_token", "oauth_client_credentials"):
        raise _profile_error(
            path,
            f"is of a kind cdc2ch does not read (shareCredentialsVersion {version}, type {kind!r}); cdc2ch "
            f"reads bearer-token profiles (version 1) and OAuth client-credentials profiles (version 2, "
            f"type oauth_client_credentials)",
        )
    if kind == "oauth_client_credentials":
        missing = [k for k in ("tokenEndpoint", "clientId", "clientSecret") if not data.get(k)]
        if missing:
            raise _profile_error(path, f"lacks {', '.join(missing)} (an oauth_client_credentials profile)")
        return Profile(path, endpoint, version, token_endpoint=str(data["tokenEndpoint"]).rstrip("/"),
                       client_id=str(data["clientId"]), client_secret=str(data["clientSecret"]),
                       scope=data.get("scope"))  # fmt: skip
    if not data.get("bearerToken"):
        raise _profile_error(path, "has no bearerToken")
    expiration = None
    if data.get("expirationTime"):
        try:
            expiration = datetime.fromisoformat(str(data["expirationTime"]).replace("Z", "+00:00"))
        except ValueError:
            raise _profile_error(path, "has an expirationTime that is not an ISO 8601 time") from None
        if expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=timezone.utc)
        if expiration <= (now or datetime.now(timezone.utc)):
            raise ConfigError(
                f"The bearer token of Delta Sharing profile {path} expired at {expiration.isoformat()} "
                f"(its expirationTime). Ask the data provider for a new profile file and replace this one; "
                f"the pipeline resumes where it stopped."
            )
    return Profile(path, endpoint, version, str(data["bearerToken"]), expiration)


class HttpError(Exception):
    """A non-2xx answer: status, Retry-After seconds (or None), the server's message."""

    def __init__(self, status: int, retry_after: float | None, message: str, code: str = ""):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.retry_after, self.message, self.code = status, retry_after, message, code


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        from email.utils import parsedate_to_datetime

        return max((parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return None


def transient(exc: BaseException) -> bool:
    """Worth another attempt: throttling, a server error, or no answer at all."""
    if isinstance(exc, HttpError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (urllib.error.URLError, ConnectionError, TimeoutError))


class SharingClient:
    """The REST calls on one shared table. `table_url` is its endpoint URL (what cdc2ch records)."""

    def __init__(self, profile: Profile, share: str, schema: str, table: str, log=None):
        self.profile = profile
        self.share, self.schema, self.table = share, schema, table
        s, sc, t = (urllib.parse.quote(n, safe="") for n in (share, schema, table))
        self.table_url = f"{profile.endpoint}/shares/{s}/schemas/{sc}/tables/{t}"
        self.name = f"{share}.{schema}.{table}"
        self.log = log
        self.attempts, self.timeout = ATTEMPTS, TIMEOUT
        self._token: tuple[str, float] | None = None  # (access token, expires at) for OAuth profiles
        self._lock = threading.Lock()

    def impatient(self) -> None:
        """One attempt per call, answered within REPORT_TIMEOUT: for reports (`status`), where a server that
        does not answer is one row's error, not minutes of waiting for every row after it."""
        self.attempts, self.timeout = 1, REPORT_TIMEOUT

    # -- auth ---------------------------------------------------------------------------------------
    def _bearer(self) -> str:
        p = self.profile
        if p.bearer_token:
            return p.bearer_token
        with self._lock:
            if self._token is None or self._token[1] < time.time():
                self._token = self._oauth_token()
            return self._token[0]

    def _forget(self, token: str) -> bool:
        """Drop a cached access token the server refused (revoked, or expired early); True when it was."""
        with self._lock:
            if self.profile.bearer_token or self._token is None or self._token[0] != token:
                return False
            self._token = None
            return True

    def _oauth_token(self) -> tuple[str, float]:
        p = self.profile
        assert p.token_endpoint is not None  # an OAuth profile's (load_profile)
        basic = base64.b64encode(f"{p.client_id}:{p.client_secret}".encode()).decode()
        body = "grant_type=client_credentials" + (f"&scope={urllib.parse.quote(p.scope)}" if p.scope else "")
        req = urllib.request.Request(
            p.token_endpoint, data=body.encode(), method="POST",
            headers={"Authorization": f"Basic {basic}", "Accept": "application/json",
                     "Content-Type": "application/x-www-form-urlencoded", "User-Agent": USER_AGENT},
        )  # fmt: skip
        try:
            answer = json.loads(self._send(req)[1])
            token, lifetime = str(answer["access_token"]), float(answer.get("expires_in", 3600))
            # Renewed a quarter of its lifetime (a minute at most) before it expires: short-lived tokens are
            # reused too, rather than fetched for every request.
            return token, time.time() + lifetime - min(60.0, lifetime / 4)
        except HttpError as exc:
            if exc.status in (400, 401, 403):
                raise SourceError(
                    f"The OAuth token endpoint {p.token_endpoint} of Delta Sharing profile {p.path} refused "
                    f"its client credentials (HTTP {exc.status}). Check the profile with the data provider "
                    f"(the client secret may have been rotated)."
                ) from None
            raise
        except (KeyError, ValueError):
            raise SourceError(
                f"The OAuth token endpoint {p.token_endpoint} of Delta Sharing profile {p.path} answered "
                f"without an access_token. Check the profile with the data provider."
            ) from None

    # -- transport ------------------------------------------------------------------------------------
    def _send(self, req: urllib.request.Request) -> tuple[dict, bytes]:
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read() or b""
            try:
                detail = json.loads(body)
                message, code = str(detail.get("message") or ""), str(detail.get("errorCode") or "")
            except ValueError:
                message, code = body.decode("utf-8", "replace"), ""
            raise HttpError(
                exc.code, retry_after(exc.headers.get("Retry-After")), self.redact(message), code
            ) from None

    def redact(self, text: str) -> str:
        for secret in self.profile.secrets + ((self._token[0],) if self._token else ()):
            text = text.replace(secret, "***")
        return text

    def request(
        self, method: str, suffix: str, query: dict | None = None, body: dict | None = None, base: str = ""
    ):
        """(headers, body) of one call on the table (on `base`, a URL of the server, instead when given),
        retried on 429/5xx/connection failures with capped exponential backoff that honours Retry-After;
        SourceError for what retrying cannot mend."""
        url = (base or self.table_url) + suffix
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})

        def once():
            for again in (False, True):
                token = self._bearer()
                req = urllib.request.Request(
                    url, method=method, data=json.dumps(body).encode() if body is not None else None,
                    headers={"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT,
                             "Content-Type": "application/json; charset=utf-8"},
                )  # fmt: skip
                try:
                    return self._send(req)
                except HttpError as exc:
                    if again or exc.status != 401 or not self._forget(token):
                        raise  # a 401 on a fresh access token is the server's answer

        def on_retry(attempt, exc, wait):
            if self.log is not None:
                self.log.warning("sharing_retry", call=suffix or "/", attempt=attempt, wait_s=round(wait, 1),
                                 error=summarise(self.redact(str(exc)), 200))  # fmt: skip

        try:
            return retry.call(once, self.attempts, transient, on_retry, base=0.5, max_wait=MAX_WAIT,
                              hint=lambda e: getattr(e, "retry_after", None))  # fmt: skip
        except HttpError as exc:
            raise self.error(exc, suffix) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceError(
                f"The Delta Sharing server {self.profile.endpoint} (profile {self.profile.path}) could not be "
                f"reached after {retry.attempts(self.attempts)}: {summarise(self.redact(str(reason)), 300)}. Check the "
                f"network and the endpoint; the pipeline resumes where it stopped."
            ) from None

    def error(self, exc: HttpError, suffix: str) -> SourceError:
        """A server refusal as a paragraph (see also sharedsource.py for the history and version cases)."""
        p = self.profile
        if exc.status in (401, 403):
            return SourceError(
                f"The Delta Sharing server {p.endpoint} refused the credentials of profile {p.path} for table "
                f"{self.name} (HTTP {exc.status}). The token may have expired or been revoked, or the share "
                f"may no longer include this table: ask the data provider for a new profile file and replace "
                f"{p.path}; the pipeline resumes where it stopped."
            )
        if exc.status == 429 or exc.status >= 500:
            return SourceError(
                f"The Delta Sharing server {p.endpoint} kept failing for table {self.name} (HTTP {exc.status} "
                f"after {retry.attempts(self.attempts)}: {summarise(exc.message, 300)}). Nothing was written for the "
                f"failed read; run again later, the pipeline resumes where it stopped."
            )
        return SharingRefused(exc.status, exc.code, exc.message, suffix, self.name, p.endpoint)

    # -- calls ------------------------------------------------------------------------------------------
    def version(self, starting_timestamp: str | None = None) -> int:
        headers, _ = self.request("GET", "/version", {"startingTimestamp": starting_timestamp})
        return int(headers["delta-table-version"])

    def tables(self) -> list[tuple[str, str]]:
        """(schema, table) of every table of the share in the client's schema, or of the whole share when
        the schema is empty (the server's /tables and /all-tables listings, every page)."""
        share = f"{self.profile.endpoint}/shares/{urllib.parse.quote(self.share, safe='')}"
        suffix = (
            f"/schemas/{urllib.parse.quote(self.schema, safe='')}/tables" if self.schema else "/all-tables"
        )
        out, token = [], None
        while True:
            page = json.loads(
                self.request("GET", suffix, {"maxResults": PAGE, "pageToken": token}, base=share)[1]
            )
            out += [(item["schema"], item["name"]) for item in page.get("items") or ()]
            token = page.get("nextPageToken")
            if not token:
                return out

    def metadata(self) -> tuple[dict, dict]:
        """(protocol, metaData) of the latest version."""
        lines = parse_lines(self.request("GET", "/metadata")[1], self.name)
        return _one(lines, "protocol"), _one(lines, "metaData")

    def changes(self, start: int, end: int) -> list[dict]:
        """Every line of the change data feed of versions [start, end]: protocol, metaData (the latest and,
        historical, one per version that changed it) and the add/remove/cdf file actions."""
        query = {"startingVersion": start, "endingVersion": end, "includeHistoricalMetadata": "true"}
        return parse_lines(self.request("GET", "/changes", query)[1], self.name)

    def query_since(self, start: int, end: int) -> list[dict]:
        """Every line of the table's data change files of versions [start, end] (a query with startingVersion,
        which needs history shared, not a change data feed): protocol, the metaData at `start` and each later
        one, and each version's `add` and `remove` files. `end` is a hint: the server may answer later
        versions too (shareanswer.sliced cuts them off)."""
        body = {"startingVersion": int(start), "endingVersion": int(end)}
        return parse_lines(self.request("POST", "/query", body=body)[1], self.name)

    def query(self, version: int | None) -> list[dict]:
        """The lines of the table as of `version` (None: the latest): protocol, metaData and file actions."""
        body = {} if version is None else {"version": int(version)}
        return parse_lines(self.request("POST", "/query", body=body)[1], self.name)


class SharingRefused(SourceError):
    """A 4xx answer other than 401/403; sharedsource.py turns the known cases into advice."""

    def __init__(self, status: int, code: str, message: str, call: str, table: str, endpoint: str):
        self.status, self.code, self.message, self.call = status, code, message, call
        super().__init__(
            f"The Delta Sharing server {endpoint} refused {call or 'a request'} on table {table} "
            f"(HTTP {status} {code}: {summarise(message, 400)})."
        )


def parse_lines(body: bytes, table: str) -> list[dict]:
    """The ndjson lines of an answer; a parquet-format client must refuse a delta-format answer and an
    answer that reports an error mid-stream (EndStreamAction.errorMessage)."""
    out = []
    for line in body.decode("utf-8").splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "endStreamAction" in action and (action["endStreamAction"] or {}).get("errorMessage"):
            raise SourceError(
                f"The Delta Sharing server failed while answering for table {table}: "
                f"{summarise(action['endStreamAction']['errorMessage'], 300)}. Run again later."
            )
        out.append(action)
    return out


def _one(lines: list[dict], key: str) -> dict:
    for line in lines:
        if key in line:
            return line[key] or {}
    return {}
