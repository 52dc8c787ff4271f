"""Statements that arrive over the ClickHouse HTTP interface (endpoint.py), run on the embedded engine of this
process (chdb).

Each request runs on a chdb connection handle of its own. Handles share the one engine a process hosts,
the replicator's own client included, and run in parallel (chdb serialises calls per handle only), each
with its own USE and SET state. An insert becomes visible whole (one part per block), so a reader's
SELECT ... FINAL never sees half of one: replication and any number of readers go on side by side.

Read-only (the default): the request's URL settings are applied, then readonly=1, then the statement. So
ClickHouse itself refuses writes, DDL, SET, SETTINGS clauses and table functions (file(), url(), ...), and
no statement can lift it (changing readonly is a change of settings). What readonly lets through on an
engine whose one user holds every grant (INTO OUTFILE, KILL, SYSTEM, settings naming files, ...) is refused
first by cdc2ch.clickhouse.serving.readonly. Sessions keep no state then.
Writable: a `session_id` keeps its handle, so SET persists as on a server; URL settings last one statement.
Statements that read local files run as the embedded target runs them (cdc2ch.clickhouse.connection.fileroot), so a
client's `--reader clickhouse` reads a local Delta table as it would through a server allowed to.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from contextlib import nullcontext
from typing import TYPE_CHECKING

import chdb

from cdc2ch.clickhouse.connection.fileroot import from_root, reads_local_files
from cdc2ch.clickhouse.serving import readonly as gate

if TYPE_CHECKING:
    from chdb.state.sqlitelike import Connection

# URL parameters the HTTP layer consumes; any other (but param_*) is a ClickHouse setting for the statement.
HTTP_ONLY = {
    "query", "database", "default_format", "session_id", "session_timeout", "session_check", "query_id", "user",
    "password", "quota_key", "compress", "decompress", "buffer_size", "wait_end_of_query", "role",
    "client_protocol_version", "enable_http_compression", "http_zlib_compression_level",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
}  # fmt: skip
# `INSERT INTO ... FORMAT X` then data. No quote may precede FORMAT, so a string literal cannot fake one.
_INSERT_FORMAT = re.compile(rb"^\s*(INSERT\s+INTO\s[^']*?)\bFORMAT\s+(\w+)", re.I | re.S)
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.I)


def split_insert(query: bytes, body: bytes) -> tuple[bytes, bytes | None, str | None]:
    """(statement, data, format): an `INSERT ... FORMAT X`'s data is what follows the format name (the whole
    body when the statement came in the `query` parameter). Other statements: (query + body, None, None)."""
    text = query + b"\n" + body if query and body else query or body
    m = _INSERT_FORMAT.match(text)
    if not m:
        return text, None, None
    if query and m.end() <= len(query):
        return m.group(1), body, m.group(2).decode()
    rest = text[m.end() :]
    rest = rest.lstrip(b" \t") if rest[:1] in (b" ", b"\t") else rest
    rest = rest[2:] if rest[:2] == b"\r\n" else rest[1:] if rest[:1] == b"\n" else rest
    return m.group(1), rest, m.group(2).decode()


class SessionLocked(RuntimeError):
    def __init__(self, session: str):
        super().__init__(
            f"Code: 373. DB::Exception: Session {session} is locked by a concurrent client. (SESSION_IS_LOCKED)"
        )


class Engine:
    """Runs HTTP requests' statements on the chdb engine at `path` (opened by `open`, which keeps one handle
    for as long as it serves)."""

    def __init__(self, path: str, readonly: bool = True, max_sessions: int = 64):
        self.path = os.path.realpath(path)  # chdb compares engine paths literally
        self.readonly, self.max_sessions = readonly, max_sessions
        self.version = self.timezone = ""
        self._lock = threading.Lock()  # guards the sessions table, not the statements
        # least recent first
        self._sessions: OrderedDict[str, tuple[Connection, threading.Lock]] = OrderedDict()
        self._base: Connection | None = None

    def open(self) -> Engine:
        self._base = chdb.connect(self.path)
        info = self._base.query("SELECT version(), timezone()", "TSV").bytes().decode().split()
        self.version, self.timezone = info
        return self

    def close(self) -> None:
        with self._lock:
            handles = [conn for conn, _ in self._sessions.values()] + ([self._base] if self._base else [])
            self._sessions.clear()
            self._base = None
        for conn in handles:
            conn.close()

    def execute(self, query: bytes, body: bytes, params: dict) -> tuple[bytes, dict]:
        """Run one request's statement: (response body, response headers). ClickHouse's errors propagate
        with their text, `Code: N. DB::Exception: ...`."""
        stmt, data, fmt = split_insert(query, body)
        settings = {k: v for k, v in params.items() if k not in HTTP_ONLY and not k.startswith("param_")}
        binds = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
        if self.readonly:
            settings.pop("readonly", None)  # set below, last
            gate.check_settings(settings)
            gate.check_statement(stmt)
        session = None if self.readonly else params.get("session_id")
        conn, busy = self._session(session) if session else (chdb.connect(self.path), None)
        undo: list[str] = []  # puts a session's handle back: URL settings last one statement only
        try:
            self._apply(conn, params.get("database"), settings, undo if session else None)
            if self.readonly:
                conn.query("SET readonly = 1", "TSV")
            with from_root() if not self.readonly and reads_local_files(stmt) else nullcontext():
                return self._insert(conn, stmt, data, fmt) if fmt else self._query(conn, stmt, binds, params)
        finally:
            for sql in reversed(undo):
                try:
                    conn.query(sql, "TSV")
                except Exception:
                    pass  # e.g. USE of a database the statement dropped
            if busy is not None:
                busy.release()
            else:
                conn.close()

    def _session(self, session: str):
        """The session's handle, held (a second request of a busy session is refused, as by a server)."""
        with self._lock:
            entry = self._sessions.pop(session, None) or (chdb.connect(self.path), threading.Lock())
            self._sessions[session] = entry
            while len(self._sessions) > self.max_sessions:
                _, (old, old_busy) = self._sessions.popitem(last=False)
                if old_busy.acquire(blocking=False):
                    old.close()
        conn, busy = entry
        if not busy.acquire(blocking=False):
            raise SessionLocked(session)
        return conn, busy

    @staticmethod
    def _apply(conn, database: str | None, settings: dict, undo: list[str] | None) -> None:
        """USE the request's database and SET its settings, noting in `undo` how to reverse them."""
        if database:
            if undo is not None:
                current = conn.query("SELECT currentDatabase()", "TSV").bytes().decode().strip()
                undo.append(f"USE {ident(current)}")
            conn.query(f"USE {ident(database)}", "TSV")
        if settings and undo is not None:
            names = ", ".join(map(literal, settings))
            rows = conn.query(
                f"SELECT name, value, changed FROM system.settings WHERE name IN ({names})", "JSONEachRow"
            )
            old = {r["name"]: r for r in map(json.loads, rows.bytes().splitlines()) if r["changed"]}
            undo += [
                f"SET {ident(k)} = {literal(old[k]['value']) if k in old else 'DEFAULT'}" for k in settings
            ]
        for name, value in settings.items():
            conn.query(f"SET {ident(name)} = {literal(value)}", "TSV")  # unknown setting: error 115

    @staticmethod
    def _insert(conn, stmt: bytes, data: bytes | None, fmt: str) -> tuple[bytes, dict]:
        inserter = conn.send_insert(stmt.decode(), fmt)
        try:
            if data:
                inserter.append(data)
            res = inserter.finish()
        except BaseException:
            inserter.cancel()
            raise
        return b"", {"X-ClickHouse-Summary": summary(res.rows_written, res.bytes_written, 0, 0, res.elapsed)}

    @staticmethod
    def _query(conn, stmt: bytes, binds: dict, params: dict) -> tuple[bytes, dict]:
        try:
            sql: str | bytes = stmt.decode()
        except UnicodeDecodeError:  # binary-bound parameters
            sql = stmt
        explicit = _TRAILING_FORMAT.search(sql) if isinstance(sql, str) else None
        fmt = explicit.group(1) if explicit else params.get("default_format") or "TabSeparated"
        # With no FORMAT clause, ask for names too: only a statement with a result set prints them.
        probe = not explicit and fmt in ("TabSeparated", "TSV")
        res = conn.query(sql, "TabSeparatedWithNames" if probe else fmt, params=binds)
        out = res.bytes() or b""
        headers = {"Content-Type": "application/octet-stream"}
        if explicit or out:
            headers["X-ClickHouse-Format"] = fmt  # a result set, even if empty
        if probe and out:
            out = out.split(b"\n", 1)[1]
        counts = res.rows_written(), res.bytes_written(), res.rows_read(), res.bytes_read(), res.elapsed()
        return out, headers | {"X-ClickHouse-Summary": summary(*counts)}


def ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def literal(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def summary(written_rows, written_bytes, read_rows, read_bytes, elapsed: float) -> str:
    names = "written_rows", "written_bytes", "read_rows", "read_bytes"
    counts = dict(zip(names, map(str, (written_rows, written_bytes, read_rows, read_bytes))))
    return json.dumps(counts | {"elapsed_ns": str(int(elapsed * 1e9))})
