"""The server target: a ClickHouse server over HTTP(S) through clickhouse-connect.

The password never travels on the command line: it comes from CDC2CH_CLICKHOUSE_PASSWORD or the file
named by CDC2CH_CLICKHOUSE_PASSWORD_FILE.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError

from cdc2ch.errors import ConfigError, SinkError

PASSWORD_ENV = "CDC2CH_CLICKHOUSE_PASSWORD"
PASSWORD_FILE_ENV = "CDC2CH_CLICKHOUSE_PASSWORD_FILE"


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


def connect(dsn: str, retries: int) -> "Sink":  # noqa: F821
    from cdc2ch.sink import Sink

    parts = urlsplit(dsn)
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
    try:
        client = clickhouse_connect.get_client(
            host=parts.hostname,
            port=port,
            username=unquote(parts.username or "default"),
            password=password(),
            database=unquote(parts.path.strip("/")) or "default",
            secure=secure,
            connect_timeout=10,
            send_receive_timeout=300,
            compress="lz4",
        )
    except ClickHouseError as exc:
        text = " ".join(str(exc).split())
        if "516" in text or "Authentication failed" in text or "AUTHENTICATION_FAILED" in text:
            raise SinkError(
                f"ClickHouse at {display} rejected the credentials for user {parts.username or 'default'!r}. "
                f"Check the user in the DSN and the password in {PASSWORD_ENV} (or {PASSWORD_FILE_ENV})."
            ) from exc
        raise SinkError(
            f"Cannot connect to ClickHouse at {display}: {text[:300]}. Check host, port and network, and that "
            f"the server is running."
        ) from exc
    return Sink(client, display, retries)
