"""The ClickHouse side: one sink on clickhouse-connect, whatever the target.

`connect(dsn)` picks the transport (embedded chdb or a server over HTTP); everything above works on
`Sink`, which adds bounded retries, target-table DDL and Arrow inserts with deduplication tokens.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import pyarrow as pa
import structlog
from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError, OperationalError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from cdc2ch import schema
from cdc2ch.config import TargetName
from cdc2ch.errors import SinkError

log = structlog.get_logger("cdc2ch.sink")
T = TypeVar("T")

# ClickHouse error codes worth another try: the server is busy, restarting or the network hiccuped.
TRANSIENT_CODES = {3, 159, 164, 202, 209, 210, 236, 242, 252, 319, 394, 425, 999}
_CODE = re.compile(r"Code: (\d+)")


def error_code(exc: BaseException) -> int | None:
    m = _CODE.search(str(exc))
    return int(m.group(1)) if m else None


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError):
        return True
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, DatabaseError) and error_code(exc) in TRANSIENT_CODES


class Sink:
    """A ClickHouse target reached through a clickhouse-connect client."""

    def __init__(
        self,
        client: Any,
        display: str,
        retries: int = 5,
        max_wait: float = 10.0,
        reads_files: Callable[[], AbstractContextManager] = nullcontext,
        task_client: dict | None = None,
    ):
        self.client = client
        # clickhouse_connect.get_client arguments for Spark tasks to open their own connection (servers only;
        # holds the password, so it is never logged)
        self.task_client = task_client
        self.reads_files = reads_files  # context for statements that read lake files (table functions)
        self.display = display  # the DSN without secrets, for messages
        self._retries = max(1, retries)
        self._max_wait = max_wait
        # The lock heartbeat shares the client with the main loop; one call at a time keeps any
        # client (the embedded engine included) safe.
        self._lock = threading.Lock()

    def _locked(self, fn: Callable[[], T]) -> T:
        with self._lock:
            return fn()

    # -- plumbing -------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        retrying = Retrying(
            stop=stop_after_attempt(self._retries),
            wait=wait_exponential(multiplier=0.5, max=self._max_wait),
            retry=retry_if_exception(is_transient),
            reraise=True,
            before_sleep=lambda rs: log.warning(
                "clickhouse_retry", what=what, attempt=rs.attempt_number, error=_short(rs.outcome.exception())
            ),
        )
        try:
            return retrying(lambda: self._locked(fn))
        except ClickHouseError as exc:
            hint = (
                "ClickHouse could not be reached after "
                f"{self._retries} attempts; check that it is up and reachable, then run the same command again "
                "(the replication offset was not moved)."
                if is_transient(exc)
                else "Nothing after the last committed version was recorded; fix the cause and run again."
            )
            raise SinkError(f"ClickHouse at {self.display} failed to {what}: {_short(exc)}. {hint}") from exc

    def command(self, sql: str, what: str = "run a statement", settings: dict | None = None) -> Any:
        return self._call(what, lambda: self.client.command(sql, settings=settings))

    def query_rows(
        self,
        sql: str,
        parameters: dict | None = None,
        what: str = "run a query",
        settings: dict | None = None,
    ) -> list[tuple]:
        return self._call(
            what, lambda: self.client.query(sql, parameters=parameters, settings=settings).result_rows
        )

    def row_count(self, table_sql: str) -> int:
        """Rows stored in a table, as written: no FINAL, so tombstones and not yet merged versions count."""
        return int(
            self.query_rows(f"SELECT count() FROM {table_sql}", what=f"count the rows of {table_sql}")[0][0]
        )

    def query_arrow(self, sql: str, what: str = "run a query", settings: dict | None = None) -> pa.Table:
        return self._call(what, lambda: self.client.query_arrow(sql, settings=settings))

    def raw_query(self, sql: str, fmt: str) -> bytes:
        """Run any statement and return ClickHouse's own rendering of the result."""
        return self._call("run the query", lambda: self.client.raw_query(sql, fmt=fmt))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Sink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tables ---------------------------------------------------------------------------------
    def ensure_database(self, database: str) -> None:
        self.command(f"CREATE DATABASE IF NOT EXISTS {schema.quote(database)}", what="create the database")

    def table_columns(self, target: TargetName) -> dict[str, str] | None:
        rows = self.query_rows(
            "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} "
            "ORDER BY position",
            {"db": target.database, "t": target.table},
            what="describe the target table",
        )
        return dict(rows) if rows else None

    def table_exists(self, target: TargetName) -> bool:
        return self.table_comment(target) is not None

    def table_comment(self, target: TargetName) -> str | None:
        """The table's comment, or None when the table does not exist."""
        rows = self.query_rows(
            "SELECT comment FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            {"db": target.database, "t": target.table},
            what="read a table comment",
        )
        return rows[0][0] if rows else None

    def create_target(
        self,
        target: TargetName,
        types: dict[str, str],
        primary_key: tuple[str, ...],
        comment: str | None = None,
    ) -> None:
        self.ensure_database(target.database)
        self.command(
            schema.target_table_ddl(target, types, primary_key, comment), what="create the target table"
        )
        log.info("target_created", target=str(target), columns=len(types))

    def evolve_target(self, target: TargetName, change: schema.SchemaDiff) -> None:
        """Apply additive and widening changes: new columns (NULL in older rows) and wider types."""
        # New columns go after the last user column, before cdc2ch's own, in Delta's order.
        existing = list(self.table_columns(target) or {})
        after = (
            existing[max(existing.index("_commit_version") - 1, 0)] if "_commit_version" in existing else None
        )
        for name, ch_type in change.added.items():
            position = f" AFTER {schema.quote(after)}" if after else ""
            self.command(
                f"ALTER TABLE {schema.qualified(target)} ADD COLUMN IF NOT EXISTS "
                f"{schema.quote(name)} {ch_type}{position}",
                what=f"add column {name!r}",
            )
            after = name
            log.info("column_added", target=str(target), column=name, type=ch_type)
        for name, (old, new) in change.modified.items():
            self.command(
                f"ALTER TABLE {schema.qualified(target)} MODIFY COLUMN {schema.quote(name)} {new}",
                what=f"widen column {name!r} to {new}",
                settings={"mutations_sync": 2},
            )
            log.info("column_widened", target=str(target), column=name, was=old, type=new)

    def insert_arrow(self, table_sql: str, data: pa.Table, token: str | None = None) -> int:
        """Insert Arrow rows into a quoted table name. A replay with the same token is dropped by
        ClickHouse's insert deduplication; without a token, deduplication is off for this insert."""
        settings = (
            {"insert_deduplicate": 1, "insert_deduplication_token": token}
            if token
            else {"insert_deduplicate": 0}
        )
        self._call(
            f"insert into {table_sql}", lambda: self.client.insert_arrow(table_sql, data, settings=settings)
        )
        return data.num_rows


def _short(exc: BaseException | None) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:400] + "..."


def connect(dsn: str, retries: int = 5) -> Sink:
    """Open the target named by a DSN: chdb:///path (embedded) or http(s)://user@host:port/db (server)."""
    from cdc2ch.sink import embedded, server

    if dsn.startswith("chdb:"):
        return embedded.connect(dsn, retries)
    if dsn.startswith(("http://", "https://", "clickhouse://", "clickhouses://")):
        return server.connect(dsn, retries)
    raise SinkError(
        f"--clickhouse {server.redact(dsn)!r} is not a DSN cdc2ch understands. Use chdb:///absolute/path for the "
        f"embedded engine or http(s)://user@host:8123/database for a server (password in the "
        f"CDC2CH_CLICKHOUSE_PASSWORD environment variable)."
    )
