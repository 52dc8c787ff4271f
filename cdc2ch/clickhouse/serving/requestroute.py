"""The one route of `run --serve` that changes anything: `POST /cdc2ch/request`, a pause, resume or resync of
one pipeline, which the service records itself (in its control table) while its database stays read-only to
every client. No SQL crosses it: a JSON object of known fields, each checked here, and the service's own
code decides what is written. A service that takes requests says so in its /ping answer, so a client tells
it from a ClickHouse server without sending either a statement.

Both ends are here: `parse` for the service, `takes_requests` and `send` for `cdc2ch pause/resume/resync`,
which reach it with the credentials their connection (`status`'s) was opened with.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from cdc2ch.base.errors import ConfigError, SinkError, one_line, summarise
from cdc2ch.clickhouse.serving.httpservice import ClientError
from cdc2ch.model.records import PAUSE, RESUME, RESYNC

PATH = "/cdc2ch/request"
ANNOUNCE = "X-Cdc2ch-Requests"  # header of a service's /ping answer: the path it takes requests at
ACTIONS = (PAUSE, RESUME, RESYNC)
LONGEST = {"action": 20, "pipeline": 1000, "reason": 4000, "database": 1000, "by": 300}  # characters
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Ask:
    """One request: `database` (None: wherever the pipeline has its records) tells apart pipelines of one
    name in several databases; `by`, user@host of whoever asked."""

    action: str
    pipeline: str
    reason: str = ""
    database: str | None = None
    by: str | None = None


def parse(body: bytes, content_type: str) -> Ask:
    """The request a POST to PATH carries, or ClientError (400, 415) naming what is wrong with it."""
    if content_type != "application/json":
        raise ClientError(415, f"{PATH} takes a JSON object (Content-Type: application/json).")
    try:
        fields = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ClientError(400, f"The body of a request to {PATH} is not JSON.") from None
    if not isinstance(fields, dict):
        raise ClientError(400, f"The body of a request to {PATH} must be a JSON object.")
    unknown = sorted(set(fields) - set(LONGEST))
    if unknown:
        raise ClientError(
            400, f"Unknown fields {', '.join(map(repr, unknown))}: known are {', '.join(LONGEST)}."
        )
    for name, value in fields.items():
        if value is None and name in ("reason", "database", "by"):
            continue
        if not isinstance(value, str) or len(value) > LONGEST[name]:
            raise ClientError(400, f"Field {name!r} must be a text of at most {LONGEST[name]} characters.")
        if name != "reason" and _CONTROL.search(value):
            raise ClientError(400, f"Field {name!r} holds a control character.")
    if fields.get("action") not in ACTIONS:
        raise ClientError(400, f"Field 'action' must be one of {', '.join(ACTIONS)}.")
    if not fields.get("pipeline"):
        raise ClientError(400, "Field 'pipeline' must name a pipeline.")
    return Ask(
        fields["action"],
        fields["pipeline"],
        fields.get("reason") or "",
        fields.get("database"),
        fields.get("by"),
    )


# -- the client's end ------------------------------------------------------------------------------------
def takes_requests(client: dict[str, Any]) -> bool:
    """Whether the ClickHouse HTTP interface `client` (clickhouse_connect.get_client arguments) reaches is a
    cdc2ch service that takes requests: asked of /ping, which a ClickHouse server answers as well."""
    try:
        with _open(client, "/ping", None) as answer:
            return answer.headers.get(ANNOUNCE) == PATH
    except (OSError, ValueError):  # urllib's errors are OSErrors: whatever it is, it takes no requests
        return False


def send(client: dict[str, Any], ask: Ask) -> str:
    """Have the service record `ask`: the sentence it answers with. ConfigError for a request it refuses
    (an unknown pipeline, ...), SinkError when it cannot be reached or fails."""
    where = _base(client)
    what = f"the {ask.action} of pipeline {ask.pipeline!r}"
    try:
        with _open(client, PATH, json.dumps(asdict(ask)).encode()) as answer:
            return str(json.loads(answer.read())["message"])
    except urllib.error.HTTPError as exc:
        said = _said(exc)
        if exc.code == 400:
            raise ConfigError(said) from None
        if exc.code in (401, 403):
            raise ConfigError(
                f"The cdc2ch service at {where} refused the credentials of user {client.get('username')!r}, "
                f"so {what} was not recorded: give the password `cdc2ch status` would send (the service's "
                f"CDC2CH_SERVE_PASSWORD). Nothing was changed."
            ) from None
        raise SinkError(
            f"The cdc2ch service at {where} could not record {what} (HTTP {exc.code}): {said.rstrip('.')}. "
            f"`cdc2ch status` shows whether it was; run the same command again if not."
        ) from None
    except (OSError, ValueError, KeyError) as exc:  # unreachable, timed out, an answer that is not ours
        raise SinkError(
            f"Cannot reach the cdc2ch service at {where} to record {what}: "
            f"{summarise(one_line(str(getattr(exc, 'reason', exc))), 300).rstrip('.')}. Check that it still "
            f"runs (`cdc2ch status`) and run the same command again; nothing was recorded."
        ) from None


def _said(exc: urllib.error.HTTPError) -> str:
    """The service's words in an error answer: its JSON `error`, or the ClickHouse error text."""
    try:
        body = exc.read()
    except OSError:
        body = b""
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return summarise(one_line(body.decode("utf-8", "replace")), 400) or f"HTTP {exc.code}"


def _base(client: dict[str, Any]) -> str:
    """scheme://user@host:port, as messages show it (never the password)."""
    host = client["host"]
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if client.get("secure") else "http"
    return f"{scheme}://{client.get('username', 'default')}@{host}:{client['port']}"


def _open(client: dict[str, Any], path: str, data: bytes | None):
    """A request to `path` of the interface, authenticated and trusting what the client's connection trusts."""
    base = _base(client)
    scheme, _, rest = base.partition("://")
    url = f"{scheme}://{rest.partition('@')[2]}{path}"
    user, password = client.get("username", "default"), client.get("password", "")
    headers = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    if data is not None:
        headers["Content-Type"] = "application/json"
    context = None
    if client.get("secure"):
        context = ssl.create_default_context()
        if client.get("ca_cert"):
            context.load_verify_locations(client["ca_cert"])
    timeout = float(client.get("send_receive_timeout" if data is not None else "connect_timeout", 10.0))
    request = urllib.request.Request(url, data, headers, method="POST" if data is not None else "GET")
    return urllib.request.urlopen(request, timeout=timeout, context=context)
