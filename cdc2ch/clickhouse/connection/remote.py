"""The server target: a ClickHouse server over HTTP(S) through clickhouse-connect.

The password never travels on the command line: it comes from CDC2CH_CLICKHOUSE_PASSWORD or the file
named by CDC2CH_CLICKHOUSE_PASSWORD_FILE.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError

from cdc2ch.base import retry
from cdc2ch.base.errors import ConfigError, SinkError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection import compatibility
from cdc2ch.clickhouse.connection.placement import OneServer
from cdc2ch.clickhouse.connection.transport import Sink, TargetTraits
from cdc2ch.clickhouse.faults import cause

log = get_logger("cdc2ch.clickhouse")

PASSWORD_ENV = "CDC2CH_CLICKHOUSE_PASSWORD"
PASSWORD_FILE_ENV = "CDC2CH_CLICKHOUSE_PASSWORD_FILE"
SERVE_PASSWORD_ENV = "CDC2CH_SERVE_PASSWORD"  # `run --serve`'s password, also what its readers send


def redact(dsn: str) -> str:
    """The DSN with any password replaced, safe to print."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable DSN>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def password() -> str:
    if os.environ.get(PASSWORD_FILE_ENV):
        path = Path(os.environ[PASSWORD_FILE_ENV])
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"Cannot read the ClickHouse password file {path} ({PASSWORD_FILE_ENV}): {exc.strerror}."
            ) from exc
    return os.environ.get(PASSWORD_ENV, "")


def _timeouts(query: str, display: str) -> dict[str, float]:
    """connect_timeout / send_receive_timeout (seconds) from the DSN's query string."""
    out = {"connect_timeout": 10.0, "send_receive_timeout": 300.0}
    for key, value in parse_qsl(query):
        if key not in out:
            raise ConfigError(
                f"The ClickHouse DSN {display} has an unknown parameter {key!r}; supported: "
                f"connect_timeout and send_receive_timeout (seconds)."
            )
        try:
            out[key] = float(value)
        except ValueError:
            raise ConfigError(
                f"The ClickHouse DSN parameter {key}={value!r} is not a number of seconds."
            ) from None
    return out


def connect(
    dsn: str,
    retries: int,
    served: bool = False,
    ca_cert: str | None = None,
    placement: OneServer | None = None,
) -> Sink:
    """`served`: the ClickHouse HTTP interface of a `cdc2ch run --serve` (password from
    CDC2CH_SERVE_PASSWORD; `ca_cert` its TLS certificate, trusted besides the system's). `placement`: one
    server (default) or a cluster, whose statements all carry its client settings."""
    placement = placement or OneServer()
    try:
        parts = urlsplit(dsn)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        raise ConfigError(
            f"The ClickHouse DSN {redact(dsn)} cannot be parsed ({exc}): use http(s)://user@host:8123/database, "
            f"with an IPv6 address in brackets (http://default@[::1]:8123/)."
        ) from None
    where = SERVE_PASSWORD_ENV if served else f"{PASSWORD_ENV} (or {PASSWORD_FILE_ENV})"
    if parts.password is not None:
        raise ConfigError(
            f"The ClickHouse DSN {redact(dsn)} contains a password. Remove it from the DSN and put it in the "
            f"{PASSWORD_ENV} environment variable (or a file named by {PASSWORD_FILE_ENV}) so it never "
            f"shows in process lists or logs."
        )
    secure = parts.scheme in ("https", "clickhouses")
    try:
        port = parts.port or (8443 if secure else 8123)
    except ValueError as exc:
        raise ConfigError(f"The ClickHouse DSN {dsn} has an invalid port.") from exc
    if not parts.hostname:
        raise ConfigError(f"The ClickHouse DSN {dsn} names no host: use http(s)://user@host:8123/database.")
    display = urlunsplit(parts._replace(query="", fragment=""))
    if "/" in parts.path.strip("/"):
        raise ConfigError(
            f"The ClickHouse DSN {display} names {parts.path.strip('/')!r} as its database: the path after the "
            f"host is one database name (http(s)://user@host:8123/database)."
        )
    timeouts = _timeouts(parts.query, display)

    kwargs: dict[str, Any] = dict(
        host=parts.hostname,
        port=port,
        username=unquote(parts.username or "default"),
        password=os.environ.get(SERVE_PASSWORD_ENV, "") if served else password(),
        database=unquote(parts.path.strip("/")) or "default",
        secure=secure,
        compress="lz4",
        # No server session: cdc2ch needs none, and without one calls from two threads never collide.
        autogenerate_session_id=False,
        **timeouts,
        **({"ca_cert": ca_cert} if ca_cert else {}),
        **({"settings": dict(placement.client_settings)} if placement.client_settings else {}),
    )

    # A server that is restarting or briefly unreachable gets the same bounded backoff as any call.
    tries = 0

    def open_client() -> Any:
        nonlocal tries
        tries += 1
        return clickhouse_connect.get_client(**kwargs)

    def on_retry(attempt: int, exc: BaseException, wait: float) -> None:
        log.warning(
            "clickhouse_retry", what="connect", attempt=attempt, wait_s=round(wait, 2), error=cause(exc)
        )

    try:
        client = retry.call(open_client, retries, codes.is_transient, on_retry)
    except ClickHouseError as exc:
        code = codes.error_code(exc)
        if code in codes.CREDENTIALS_REJECTED:
            raise SinkError(
                f"ClickHouse at {display} rejected the credentials for user {parts.username or 'default'!r}. "
                f"Check the user in the DSN and the password in {where}.",
                code=code,
            ) from exc
        # A server too old for the driver's start-up queries answers them with an error: ask its version
        # the plainest way, so the user hears it is too old rather than that it cannot be reached.
        version = compatibility.probe(
            kwargs["host"], port, secure, kwargs["username"], kwargs["password"], ca_cert
        )
        old = compatibility.too_old(version, display)
        if old is not None:
            raise old from exc
        text = cause(exc)
        if kwargs["password"]:
            text = text.replace(kwargs["password"], "***")
        detail = summarise(text, 300).rstrip(".")
        if version is not None:  # it answers: the network is not the problem
            raise SinkError(
                f"ClickHouse at {display} (version {version}) refused the client's first queries: {detail}. "
                f"Nothing was written; check the user's settings and privileges on that server.",
                code=code,
            ) from exc
        raise SinkError(
            f"Cannot connect to ClickHouse at {display} ({retry.attempts(tries)}): {detail}. Check "
            f"host, port and network, and that the server is running; nothing was written.",
            code=code,
        ) from exc
    old = compatibility.too_old(client.server_version, display)
    if old is not None:
        client.close()
        raise old
    return Sink(
        client,
        display,
        retries,
        opener=lambda: clickhouse_connect.get_client(**kwargs),
        traits=TargetTraits(task_client=kwargs, placement=placement),
    )
