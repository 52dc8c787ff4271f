"""Which layout cdc2ch's own tables in a database have: recorded in `cdc2ch_layout`, brought up to this
release's by a writer (every step idempotent, so a crash part-way only repeats it; offsets are kept), and
refused, rather than misread, when a newer cdc2ch wrote it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from cdc2ch.base.errors import StateError
from cdc2ch.base.version import __version__
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model import schema

LAYOUT_TABLE = "cdc2ch_layout"
# 1: the tables of releases that recorded no layout (the offsets table may lack later columns);
# 2: the columns of state.ADDED_STATE_COLUMNS up to initial_reason present, and the layout recorded;
# 3: changes_from too;
# 4: reader too (every column of ADDED_STATE_COLUMNS).
LAYOUT = 4
UNRECORDED = 1


class Layout:
    """The layout of the cdc2ch tables in one database."""

    def __init__(self, sink: Sink, database: str):
        self.sink, self.database = sink, database
        self._table = f"{schema.quote(database)}.{schema.quote(LAYOUT_TABLE)}"

    def recorded(self, exists: bool | None = None) -> int:
        """The layout recorded here (UNRECORDED where none is: a release from before layouts). `exists`:
        whether the layout table exists, when the caller has looked (then it is not looked up again)."""
        if exists is None:
            exists = self.sink.own.exists(self.database, LAYOUT_TABLE)
        if not exists:
            return UNRECORDED
        rows = self.sink.query_rows(f"SELECT max(layout) FROM {self._table}", what="read the state layout")
        return int(rows[0][0] or UNRECORDED) if rows else UNRECORDED

    def check(self, exists: bool | None = None) -> int:
        """The recorded layout, refused when newer than this release knows (`exists` as recorded's)."""
        found = self.recorded(exists)
        if found > LAYOUT:
            raise StateError(
                f"The cdc2ch tables in ClickHouse database {self.database} (offsets, claims, health) have "
                f"layout {found}, written by a newer cdc2ch; this one ({__version__}) knows layouts up to "
                f"{LAYOUT} and could misread them, so it did nothing. Run the newer cdc2ch (the release that "
                f"wrote them, or later) on every host that replicates into this database."
            )
        return found

    def upgrade(self, steps: Callable[[], None]) -> None:
        """Bring an older layout up to this release's: `steps` (idempotent) then the record of LAYOUT."""
        if self.check() == LAYOUT:
            return
        steps()
        self.sink.ensure_state_table(
            self.database, LAYOUT_TABLE, "create_layout_table.sql", what="create the layout table"
        )
        self.sink.insert_row(
            self._table,
            {
                "layout": LAYOUT,
                "written_by": f"cdc2ch {__version__}",
                "written_at": datetime.now(timezone.utc),
            },
        )
