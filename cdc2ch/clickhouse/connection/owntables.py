"""What one connection knows of cdc2ch's own tables (`cdc2ch_*`): which exist, with which columns, and which
it created, so that a start-up looks them all up in one query and creates none twice.

A table seen or created stays known (cdc2ch drops its own tables only through `forget`); a table not seen is
looked for again each time it is asked about, since another process may create it at any moment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

OWN_PREFIX = "cdc2ch_"


class OwnTables:
    """`query(sql, parameters, what)` runs a query on the connection and returns its rows. `seen_suffices`:
    whether a table seen needs no CREATE (False: only a creation by this connection counts)."""

    def __init__(self, query: Callable[..., list[tuple]], seen_suffices: bool = True):
        self._query = query
        self._seen_suffices = seen_suffices
        self._seen: dict[str, dict[str, frozenset[str]]] = {}  # database -> {table: its columns}
        self._created: set[tuple[str, str]] = set()  # (database, table) created by this connection
        self._databases: set[str] = set()  # databases created by this connection
        self._lock = threading.Lock()

    def _look(self, database: str) -> dict[str, frozenset[str]]:
        rows = self._query(
            "SELECT table, groupArray(name) FROM system.columns "
            "WHERE database = {db:String} AND startsWith(table, {own:String}) GROUP BY table",
            {"db": database, "own": OWN_PREFIX},
            what="look up cdc2ch's tables",
        )
        seen = {table: frozenset(columns) for table, columns in rows}
        with self._lock:
            self._seen[database] = seen
        return seen

    def columns(self, database: str, table: str) -> frozenset[str] | None:
        """The table's columns, or None when it does not exist (looked up unless seen before)."""
        found = self._seen.get(database, {}).get(table)
        return found if found is not None else self._look(database).get(table)

    def exists(self, database: str, table: str) -> bool:
        return (database, table) in self._created or self.columns(database, table) is not None

    def ready(self, database: str, table: str) -> bool:
        """Whether the table needs no CREATE: created by this connection, or seen where that suffices."""
        if (database, table) in self._created:
            return True
        return self._seen_suffices and table in self._seen.get(database, {})

    def database_ready(self, database: str) -> bool:
        """Whether the database needs no CREATE (as `ready`: one of its tables seen is proof it exists)."""
        if database in self._databases:
            return True
        return self._seen_suffices and bool(self._seen.get(database))

    def created(self, database: str, table: str) -> None:
        with self._lock:
            self._databases.add(database)
            self._created.add((database, table))

    def database_created(self, database: str) -> None:
        with self._lock:
            self._databases.add(database)

    def forget(self, database: str) -> None:
        """Everything known of `database`: its tables were dropped or altered by this connection."""
        with self._lock:
            self._seen.pop(database, None)
            self._databases.discard(database)
            self._created = {(db, t) for db, t in self._created if db != database}

    def forget_all(self) -> None:
        """Everything known: a table or database was found missing, perhaps dropped by someone else."""
        with self._lock:
            self._seen.clear()
            self._databases.clear()
            self._created.clear()
