"""The target tables' DDL: create a target table (and its current-state view), and follow additive or widening
Delta schema changes."""

from __future__ import annotations

import dataclasses

from cdc2ch.base.errors import ConfigError, SinkError
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.footprint import drop_database_if_empty, tables_of
from cdc2ch.clickhouse.tables import adopt
from cdc2ch.model import renames, schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign
from cdc2ch.model.view import current_select, view_name

log = get_logger("cdc2ch.clickhouse.tables.ddl")


def create_target(
    sink: Sink,
    target: TargetName,
    types: dict[str, str],
    design: TableDesign,
    comment: str | None = None,
) -> None:
    """Create the target table (and its database) for rows of `types`, as `design` says. A table ClickHouse
    refuses (a codec, setting or partition expression it does not take) leaves no new database behind."""
    new = tables_of(sink, target.database) is None
    sink.ensure_database(target.database)
    try:
        for sql in sink.placement.target(target, types, design, comment):
            sink.command(sql, what="create the target table")
    except SinkError:
        if new:
            drop_database_if_empty(sink, target.database)
        raise
    log.info("target_created", target=str(target), columns=len(types))


def evolve_target(sink: Sink, target: TargetName, change: schema.SchemaDiff, design: TableDesign) -> None:
    """Apply the changes: renames and drops (--on-schema-change follow), then new columns (NULL in older
    rows) and wider types. Each statement is a no-op when repeated (IF EXISTS), so a rerun after a crash
    midway, or on a cluster after the shards' tables went first, finishes the step."""
    for old, new in change.renamed:
        clause = f"RENAME COLUMN IF EXISTS {schema.quote(old)} TO {schema.quote(new)}"
        for sql in sink.placement.alter_columns(target, clause):
            sink.command(sql, what=f"rename column {old!r} to {new!r}")
        log.info("column_renamed", target=str(target), column=old, to=new)
    for name in change.dropped:
        for sql in sink.placement.alter_columns(target, f"DROP COLUMN IF EXISTS {schema.quote(name)}"):
            sink.command(sql, what=f"drop column {name!r}")
        log.info("column_dropped", target=str(target), column=name)
    # New columns go after the last user column, before cdc2ch's own, in Delta's order.
    existing = list(sink.table_columns(target) or {})
    after = existing[max(existing.index("_commit_version") - 1, 0)] if "_commit_version" in existing else None
    for name, ch_type in change.added.items():
        position = f" AFTER {schema.quote(after)}" if after else ""
        clause = f"ADD COLUMN IF NOT EXISTS {schema.column_sql(name, ch_type, design)}{position}"
        for sql in sink.placement.alter_columns(target, clause):
            sink.command(sql, what=f"add column {name!r}")
        after = name
        log.info("column_added", target=str(target), column=name, type=ch_type)
    for name, (old, new) in change.modified.items():
        for sql in sink.placement.alter_columns(target, f"MODIFY COLUMN {schema.quote(name)} {new}"):
            sink.command(sql, what=f"widen column {name!r} to {new}", settings={"mutations_sync": 2})
        log.info("column_widened", target=str(target), column=name, was=old, type=new)


def prepare_target(
    sink: Sink,
    target: TargetName,
    types: dict[str, str],
    design: TableDesign,
    comment: str | None = None,
    moves: renames.TargetMoves | None = None,
) -> schema.SchemaDiff:
    """Create the target table, or evolve it to take rows of `types` (rename and drop the columns of `moves`,
    add columns, widen types).

    Returns the difference between the table and `types` (none for a table just created); when it has
    breaking changes the table is left as it was and the caller decides what to tell the user.
    """
    existing = sink.table_columns(target)
    if existing is None:
        create_target(sink, target, types, design, comment)
        return schema.diff(types, types, design.identity)
    if moves is None:
        change = schema.diff(existing, types, design.identity)
    else:  # judged as the table will be once renamed: all of it in place, or nothing
        renamed, dropped, refused = renames.pending(list(schema.user_columns(existing)), moves)
        change = schema.diff(renames.renamed_columns(existing, renamed, dropped), types, design.identity)
        change = dataclasses.replace(
            change, breaking=refused + change.breaking, renamed=tuple(renamed), dropped=tuple(dropped)
        )
    if not change.breaking:
        evolve_target(sink, target, change, design)
    return change


class ClickHouseTables:
    """The target table as the replication loop and snapshots see it (the TargetTables port)."""

    def __init__(self, sink: Sink, target: TargetName, design: TableDesign):
        self.sink, self.target, self.design = sink, target, design
        self.table_sql = schema.qualified(target)
        self.view = view_name(target, design.current_view)
        self._view_kept = self.view is None  # replaced once per process, then with each change of columns

    def _named(self, suffix: str) -> TargetName:
        return TargetName(self.target.database, self.target.table + suffix)

    def prepare(
        self, types: dict[str, str], comment: str | None = None, moves: renames.TargetMoves | None = None
    ) -> schema.SchemaDiff:
        """prepare_target, and the current-state view replaced in the same step as the table's DDL (a
        table ClickHouse refuses, or a breaking change, leaves the view as it was)."""
        if not self._view_kept:
            self._check_view_name()
        change = prepare_target(self.sink, self.target, types, self.design, comment, moves)
        if not change.breaking and (not self._view_kept or not change.empty):
            self.keep_view()
        return change

    def keep_view(self) -> None:
        """Create or replace the current-state view over the table's columns as they are now."""
        columns = schema.user_columns(self.sink.table_columns(self.target) or {})
        if self.view is None or not columns:  # no view, or no table to show
            return
        if self.view.database != self.target.database:
            self.sink.ensure_database(self.view.database)
        for sql in self.sink.placement.view(self.view, current_select(self.target, list(columns))):
            self.sink.command(sql, what=f"replace the view {self.view}")
        self._view_kept = True

    def _check_view_name(self) -> None:
        """Refuse, before any DDL, a --current-view name an existing table (not a view) has."""
        assert self.view is not None  # (not _view_kept)
        rows = self.sink.query_rows(
            "SELECT engine FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            {"db": self.view.database, "t": self.view.table},
            what="look up the current-state view",
        )
        if rows and rows[0][0] != "View":
            raise ConfigError(
                f"The current-state view of {self.target} would be {self.view}, but that name is taken by a "
                f"{rows[0][0]} table, which cdc2ch does not replace. Nothing was written. Choose another name "
                f"with --current-view NAME, or --current-view none for no view."
            )

    def check(self, types: dict[str, str], new: bool) -> None:
        adopt.check(self.sink, self.target, self.design, types, new)

    def comment(self, suffix: str = "") -> str | None:
        return self.comments(suffix)[0]

    def comments(self, *suffixes: str) -> list[str | None]:
        stored = [self.sink.placement.stored(self._named(s)) for s in suffixes]
        found = self.sink.table_comments(self.target.database, [t.table for t in stored])
        return [found.get(t.table) for t in stored]

    def drop(self, suffix: str) -> None:
        for sql in self.sink.placement.drop(self._named(suffix)):
            self.sink.command(sql, what=f"drop {self._named(suffix)}")

    def exchange(self, suffix: str, design: TableDesign | None = None) -> None:
        """Swap in the table built under `suffix` (with `design`, default the target's)."""
        for sql in self.sink.placement.swap(self._named(suffix), self.target, design or self.design):
            self.sink.command(sql, what="swap in the rebuilt table")
        self.settle(design)

    def settle(self, design: TableDesign | None = None) -> None:
        """Finish a swap (again, after a crash right after it): on a cluster, the Distributed table's columns."""
        for sql in self.sink.placement.settle(self.target, design or self.design):
            self.sink.command(sql, what="follow the swapped table")
        # The view reads the target by name, so it already reads the swapped table: give it its columns.
        self.keep_view()
