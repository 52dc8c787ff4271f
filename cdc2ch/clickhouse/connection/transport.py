"""`Sink`: one ClickHouse target behind a clickhouse-connect client, whatever that client talks to.

Every call goes through `Sink._call`, the one place where ClickHouse calls are retried (cdc2ch.base.retry,
transient failures only, by error code) and where a clickhouse-connect error becomes a SinkError carrying
its code and a message fit for the user. Opening a client is left to `embedded` and `remote`; the tables
cdc2ch writes are defined in `tables/ddl.py` and the modules of `state/`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
from clickhouse_connect.driver.exceptions import ClickHouseError

from cdc2ch.base import retry
from cdc2ch.base.errors import SinkError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection.clients import Clients
from cdc2ch.clickhouse.connection.owntables import OwnTables
from cdc2ch.clickhouse.connection.placement import OneServer
from cdc2ch.clickhouse.connection.rows import arrow_file, json_row
from cdc2ch.clickhouse.faults import cause
from cdc2ch.model import contract
from cdc2ch.model.config import TargetName

log = get_logger("cdc2ch.clickhouse")
T = TypeVar("T")

MAX_DETAIL = 400  # characters of ClickHouse's own message kept in ours

# clickhouse-connect logs its transport failures ("Unexpected Http Driver Exception", with a traceback)
# before raising them; cdc2ch reports each failure itself, in one paragraph, so the driver's lines would only
# be noise above it. A level set explicitly (by an embedding application) is left alone.
if logging.getLogger("clickhouse_connect").level == logging.NOTSET:
    logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)


@dataclass(frozen=True)
class TargetTraits:
    """What sets one kind of target apart for its calls: the embedded engine reads lake files from where it
    may (`reads_files`), runs small statements without compiling them and has every writer in this process;
    a server gives Spark tasks the arguments to open their own connection and may be a cluster."""

    reads_files: Callable[[], AbstractContextManager] = nullcontext
    small_settings: dict = field(default_factory=dict)  # for statements on a few rows
    one_process: bool = False
    task_client: dict | None = None  # clickhouse_connect.get_client arguments (holds the password)
    placement: OneServer | None = None


class Sink:
    """A ClickHouse target reached through a clickhouse-connect client."""

    def __init__(
        self,
        client: Any,
        display: str,
        retries: int = 5,
        max_wait: float = 10.0,
        wait_base: float = 0.5,
        opener: Callable[[], Any] | None = None,
        traits: TargetTraits = TargetTraits(),
    ):
        # Each call leases a client: threads (pipelines run side by side, lock heartbeats) never share one
        # mid-call, and with `opener` their calls overlap (widen() sets how many at once).
        self.clients = Clients(client, opener)
        self.placement = traits.placement or OneServer()  # one server, or a cluster's nodes (placement.py)
        # cdc2ch_* tables known. A table seen needs no CREATE, except on a cluster (another node may lack it)
        # and on a read-only connection (whose first write, refused by the server, is what it reports).
        readonly = (getattr(client, "server_settings", None) or {}).get("readonly")
        writable = readonly is None or readonly.value == "0"
        self.own = OwnTables(self.query_rows, seen_suffices=self.placement.cluster is None and writable)
        # clickhouse_connect.get_client arguments for Spark tasks to open their own connection (servers only;
        # holds the password, so it is never logged)
        self.task_client = traits.task_client
        self.reads_files = traits.reads_files  # context for statements that read lake files (table functions)
        # settings of statements on a few rows (lookups answered as Python rows, cdc2ch's claims)
        self.small_settings = traits.small_settings
        self.display = display  # the DSN without secrets, for messages
        # Every writer of the database is in this process (the embedded engine: one process holds its
        # directory), so no other process's statement can come between two of this one's.
        self.one_process = traits.one_process
        self._retries = max(1, retries)
        self._max_wait = max_wait
        self._wait_base = wait_base
        password = (traits.task_client or {}).get("password")
        self._secrets = (password,) if password else ()

    def widen(self, calls: int) -> None:
        """Let up to `calls` calls run at once (each on a client of its own, opened when first needed)."""
        self.clients.widen(calls)

    # -- plumbing -------------------------------------------------------------------------------
    def _leased(self, fn: Callable[[Any], T]) -> T:
        with self.clients.lease() as client:
            return fn(client)

    def _call(self, what: str, fn: Callable[[Any], T], replicating: bool = True) -> T:
        """Run one client call: retried while it fails transiently, then any ClickHouse error as a SinkError.
        `replicating`: the call is part of replication, whose offset the advice then speaks of."""

        def on_retry(attempt: int, exc: BaseException, wait: float) -> None:
            log.warning(
                "clickhouse_retry", what=what, attempt=attempt, wait_s=round(wait, 2), error=self._short(exc)
            )

        try:
            return retry.call(
                lambda: self._leased(fn),
                self._retries,
                codes.is_transient,
                on_retry,
                base=self._wait_base,
                max_wait=self._max_wait,
            )
        except ClickHouseError as exc:
            if codes.error_code(exc) in (codes.UNKNOWN_TABLE, codes.UNKNOWN_DATABASE):
                self.own.forget_all()  # dropped behind this process's back: look, and create, again
            raise SinkError(
                f"ClickHouse at {self.display} failed to {what}: {self._short(exc)}. "
                f"{self._advice(exc, replicating)}",
                code=codes.error_code(exc),
            ) from exc

    def _advice(self, exc: ClickHouseError, replicating: bool) -> str:
        if codes.is_transient(exc):
            again = (
                "run the same command again (the replication offset was not moved)"
                if replicating
                else "run the same command again"
            )
            return (
                f"ClickHouse could not be reached after {retry.attempts(self._retries)}; check that it is up and "
                f"reachable, then {again}."
            )
        code = codes.error_code(exc)
        refused = codes.REFUSED.get(code) if code is not None else None
        if refused is not None:
            return refused + (" The replication offset was not moved." if replicating else "")
        if replicating:
            return "Nothing after the last committed version was recorded; fix the cause and run again."
        return "Fix the statement and run it again."

    def _short(self, exc: BaseException) -> str:
        """An exception's cause (faults.cause) without the password, summarised to MAX_DETAIL characters
        (its first sentence, or whole words and an ellipsis) and without a final period."""
        text = cause(exc)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return summarise(text, MAX_DETAIL).rstrip(".")

    def close(self) -> None:
        self.clients.close()

    def __enter__(self) -> "Sink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- statements -----------------------------------------------------------------------------
    def command(self, sql: str, what: str = "run a statement", settings: dict | None = None) -> Any:
        return self._call(what, lambda c: c.command(sql, settings=settings))

    def query_rows(
        self,
        sql: str,
        parameters: dict | None = None,
        what: str = "run a query",
        settings: dict | None = None,
    ) -> list[tuple]:
        settings = {**self.small_settings, **(settings or {})} or None
        return self._call(what, lambda c: c.query(sql, parameters=parameters, settings=settings).result_rows)

    def query_arrow(self, sql: str, what: str = "run a query", settings: dict | None = None) -> pa.Table:
        return self._call(what, lambda c: c.query_arrow(sql, settings=settings))

    def raw_query(self, sql: str, fmt: str | None) -> bytes:
        """Run a user's statement as it is and return ClickHouse's own rendering of the result (in `fmt`,
        unless None: then the statement's own FORMAT clause, or none)."""
        return self._call("run the query", lambda c: c.raw_query(sql, fmt=fmt), replicating=False)

    def insert_arrow(self, table_sql: str, data: pa.Table, token: str | None = None) -> int:
        """Insert Arrow rows into a quoted table name, with the settings of `contract.target_insert(token)`:
        what the client's insert_arrow sends (rows.arrow_file), without its copies."""
        settings = contract.target_insert(token)

        def insert(client) -> None:
            compression = getattr(client, "write_compression", None)
            payload = arrow_file(data, compression if compression in ("lz4", "zstd") else None)
            client.raw_insert(table_sql, data.schema.names, payload, settings=settings, fmt="Arrow")

        self._call(f"insert into {table_sql}", insert)
        return data.num_rows

    def insert_row(self, table_sql: str, values: dict) -> None:
        """Insert one row of cdc2ch's own tables ({column: value}; columns left out take their defaults) into
        a quoted table name, without deduplication (a record written again is a newer record)."""
        self._call(
            f"insert into {table_sql}",
            lambda c: c.raw_insert(
                table_sql, None, json_row(values), settings={"insert_deduplicate": 0}, fmt="JSONEachRow"
            ),
        )

    def row_count(self, table_sql: str) -> int:
        """Rows stored in a table, as written: no FINAL, so tombstones and not yet merged versions count."""
        return int(
            self.query_rows(f"SELECT count() FROM {table_sql}", what=f"count the rows of {table_sql}")[0][0]
        )

    # -- catalog --------------------------------------------------------------------------------
    def ensure_database(self, database: str) -> None:
        if self.own.database_ready(database):
            return
        for sql in self.placement.database(database):
            self.command(sql, what="create the database")
        self.own.database_created(database)

    def ensure_state_table(self, database: str, table: str, template: str, what: str) -> None:
        """Create one of cdc2ch's own tables (and its database) from its sql/ template, if missing (once per
        connection; not at all where a look at the database already found it)."""
        if self.own.ready(database, table):
            return
        self.ensure_database(database)
        self.command(self.placement.state_table(database, table, template), what=what)
        self.own.created(database, table)

    def table_columns(self, target: TargetName) -> dict[str, str] | None:
        """{column: type} in table order, or None when the table does not exist."""
        rows = self.query_rows(
            "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} "
            "ORDER BY position",
            {"db": target.database, "t": target.table},
            what="describe the target table",
        )
        return dict(rows) if rows else None

    def has_setting(self, name: str) -> bool:
        """Whether the server knows the setting `name` (an older release lacks a newer feature's)."""
        listed = getattr(self.clients.first, "server_settings", None)
        if listed:  # the driver read system.settings when it connected: no need to ask again
            return name in listed
        rows = self.query_rows(
            "SELECT count() FROM system.settings WHERE name = {n:String}", {"n": name}, what="read a setting"
        )
        return bool(rows and rows[0][0])

    def table_exists(self, target: TargetName) -> bool:
        return self.table_comment(target) is not None

    def table_comment(self, target: TargetName) -> str | None:
        """The table's comment, or None when the table does not exist."""
        return self.table_comments(target.database, [target.table]).get(target.table)

    def table_comments(self, database: str, tables: list[str]) -> dict[str, str]:
        """{table: its comment} of those of `tables` in `database` that exist, in one query."""
        rows = self.query_rows(
            "SELECT name, comment FROM system.tables WHERE database = {db:String} AND name IN {t:Array(String)}",
            {"db": database, "t": tables},
            what="read a table comment",
        )
        return dict(rows)
