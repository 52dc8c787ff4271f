"""What a new pipeline's failed first attempt leaves in ClickHouse: nothing a normal exit would not.

`mark` notes the target database's tables before the attempt's first write; `undo` takes back the pipeline's
offset and the tables created since: the target table, cdc2ch's own tables unless another pipeline has rows
in them (a config's pipelines share them), and the database when it was created and is empty again.
"""

from __future__ import annotations

from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.layout import LAYOUT_TABLE
from cdc2ch.clickhouse.state.lock import LOCK_TABLE
from cdc2ch.clickhouse.state.statestore import (
    CHUNKS_TABLE,
    HEALTH_TABLE,
    STATE_TABLE,
    VERIFY_TABLE,
    StateStore,
)
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName

# cdc2ch's own tables that say whose each row is (by a `pipeline` column), and the one that does not.
BY_PIPELINE = (STATE_TABLE, CHUNKS_TABLE, LOCK_TABLE, HEALTH_TABLE, VERIFY_TABLE)
OWN = (*BY_PIPELINE, LAYOUT_TABLE)


def tables_of(sink: Sink, database: str) -> set[str] | None:
    """The names of the tables in `database`, or None when there is no such database."""
    params = {"db": database}
    if not sink.query_rows("SELECT 1 FROM system.databases WHERE name = {db:String}", params):
        return None
    rows = sink.query_rows("SELECT name FROM system.tables WHERE database = {db:String}", params)
    return {name for (name,) in rows}


def drop_database_if_empty(sink: Sink, database: str) -> bool:
    """Drop `database` when it holds no table (one cdc2ch created for a table that was then not kept)."""
    if tables_of(sink, database):
        return False
    for sql in sink.placement.drop_database(database):
        sink.command(sql, what="drop the database")
    sink.own.forget(database)
    return True


class ClickHouseFootprint:
    """The tables one new pipeline's first attempt adds to its target database (the Footprint port)."""

    def __init__(self, sink: Sink, target: TargetName, pipeline: str, view: TargetName | None = None):
        self.sink, self.target, self.pipeline, self.view = sink, target, pipeline, view
        self.before: set[str] | None = None  # the database's tables at mark(); None: no database
        self.view_before = False  # the current-state view existed at mark()
        self.marked = False

    def mark(self) -> None:
        self.before, self.marked = tables_of(self.sink, self.target.database), True
        self.view_before = self.view is not None and self.sink.table_exists(self.view)

    def undo(self) -> list[str]:
        """Take back the pipeline's offset and what was created since mark(); returns the tables dropped.
        Raises SinkError when ClickHouse cannot be reached for it (the next run then resumes as after a
        crash)."""
        if not self.marked:
            return []
        database, before = self.target.database, self.before or set()
        StateStore(self.sink, database).forget(self.pipeline)
        created = (tables_of(self.sink, database) or set()) - before
        dropped = []
        if self.view is not None and not self.view_before and self.sink.table_exists(self.view):
            for sql in self.sink.placement.drop_view(self.view):
                self.sink.command(sql, what=f"drop the view {self.view}")
            dropped.append(self.view.table)
            created.discard(self.view.table)
        stored = self.sink.placement.stored(self.target).table
        if created & {self.target.table, stored}:
            self._drop(self.target)
            dropped.append(self.target.table)
        own = sorted(created & set(OWN))
        if own and not any(self._used_by_others(t) for t in own if t in BY_PIPELINE):
            for table in own:
                self._drop(TargetName(database, table))
            dropped += own
        if self.before is None and drop_database_if_empty(self.sink, database):
            dropped.append(database)
        self.marked = False
        return dropped

    def _used_by_others(self, table: str) -> bool:
        rows = self.sink.query_rows(
            f"SELECT count() FROM {schema.quote(self.target.database)}.{schema.quote(table)} "
            f"WHERE pipeline != {{p:String}}",
            {"p": self.pipeline},
            what="look for other pipelines' rows",
        )
        return bool(rows and rows[0][0])

    def _drop(self, table: TargetName) -> None:
        for sql in self.sink.placement.drop(table):
            self.sink.command(sql, what=f"drop {table}")
        self.sink.own.forget(table.database)
