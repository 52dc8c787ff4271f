"""A ClickHouse target named by a DSN: `chdb:///path` (the embedded engine) or `http(s)://user@host:port/db`
(a server; the password comes from the environment, never from the DSN)."""

from __future__ import annotations

from cdc2ch.clickhouse import embedded, server
from cdc2ch.clickhouse.server import redact
from cdc2ch.clickhouse.transport import Sink
from cdc2ch.errors import SinkError

__all__ = ["EMBEDDED_SCHEMES", "SERVER_SCHEMES", "connect", "redact"]

EMBEDDED_SCHEMES = ("chdb:",)
SERVER_SCHEMES = ("http://", "https://", "clickhouse://", "clickhouses://")


def connect(dsn: str, retries: int = 5, create: bool = True, reader: bool = False) -> Sink:
    """Open the target named by a DSN: chdb:///path (embedded) or http(s)://user@host:port/db (server).
    `create` False: an embedded database must exist already (for commands that work on one). A `reader`
    (status, query) of an embedded directory held by a `cdc2ch run --serve` goes through that service."""
    if dsn.startswith(EMBEDDED_SCHEMES):
        return embedded.connect(dsn, retries, create, via_service=reader)
    if dsn.startswith(SERVER_SCHEMES):
        return server.connect(dsn, retries)
    raise SinkError(
        f"--clickhouse {redact(dsn)!r} is not a DSN cdc2ch understands. Use chdb:///absolute/path for the "
        f"embedded engine or http(s)://user@host:8123/database for a server (password in the "
        f"CDC2CH_CLICKHOUSE_PASSWORD environment variable)."
    )
