"""What cdc2ch records about its pipelines, in ClickHouse next to the data (in the target database):
replication offsets (`cdc2ch_state`), snapshot progress (`cdc2ch_snapshot_chunks`), health
(`cdc2ch_health`), the last verify (`cdc2ch_verify`) and the last compaction of each target (`cdc2ch_compact`,
compactlog.py) and what was asked of each pipeline (`cdc2ch_control`, control.py).

An offset is written only after every batch of its version range has landed; the ReplacingMergeTree keeps
the row with the newest `updated_at` per pipeline.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timezone
from typing import overload

from cdc2ch.base import phases
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.layout import LAYOUT_TABLE, Layout
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.records import Health, PipelineState, Verified, stamp_after

STATE_TABLE = "cdc2ch_state"
CHUNKS_TABLE = "cdc2ch_snapshot_chunks"
HEALTH_TABLE = "cdc2ch_health"
VERIFY_TABLE = "cdc2ch_verify"
COMPACT_TABLE = "cdc2ch_compact"
CONTROL_TABLE = "cdc2ch_control"


@overload
def _utc(ts: datetime) -> datetime: ...
@overload
def _utc(ts: None) -> None: ...
def _utc(ts: datetime | None) -> datetime | None:
    """A DateTime64(3, 'UTC') value as the driver returns it (sometimes naive) -> an aware datetime."""
    return ts.replace(tzinfo=timezone.utc) if ts is not None and ts.tzinfo is None else ts


_STATE_FIELDS = (
    "pipeline",
    "source",
    "target",
    "committed_version",
    "pending_version",
    "rows_written",
    "updated_at",
    "location",
    "table_id",
    "initial_load",
    "initial_reason",
    "changes_from",
    "reader",
)
_COLUMNS = "pipeline, source, target, committed_version, pending_version, rows_written, updated_at"

# Columns added to cdc2ch_state after its first release, with their definitions: `ensure` adds them to a
# table created before (a default reads as "not recorded"); readers select them only where they exist.
ADDED_STATE_COLUMNS = {
    "location": "String DEFAULT ''",
    "table_id": "String DEFAULT ''",
    "initial_load": "String DEFAULT ''",
    "initial_reason": "String DEFAULT ''",
    "changes_from": "String DEFAULT ''",
    "reader": "String DEFAULT ''",
}


class ChunkStore:
    """Snapshot progress: the chunks of a snapshot (per pipeline, Delta version and chunk plan) already
    landed, so a restarted snapshot skips them."""

    def __init__(self, sink: Sink, database: str):
        self.sink = sink
        self.database = database
        self._table = f"{schema.quote(database)}.{schema.quote(CHUNKS_TABLE)}"

    def ensure(self) -> None:
        self.sink.ensure_state_table(
            self.database,
            CHUNKS_TABLE,
            "create_snapshot_chunks_table.sql",
            what="create the snapshot progress table",
        )

    def done(self, pipeline: str, version: int, plan: str) -> dict[int, int]:
        """{chunk: rows} of the snapshot chunks already landed for this pipeline, version and plan."""
        rows = self.sink.query_rows(
            f"SELECT chunk, rows FROM {self._table} FINAL "
            f"WHERE pipeline = {{p:String}} AND version = {{v:Int64}} AND plan = {{plan:String}}",
            {"p": pipeline, "v": version, "plan": plan},
            what="read snapshot progress",
        )
        return {int(c): int(n) for c, n in rows}

    def last_version(self, pipeline: str) -> int | None:
        """The version of the pipeline's snapshot whose chunks were recorded last, or None."""
        if not self.sink.own.exists(self.database, CHUNKS_TABLE):
            return None
        rows = self.sink.query_rows(
            f"SELECT version FROM {self._table} WHERE pipeline = {{p:String}} ORDER BY done_at DESC LIMIT 1",
            {"p": pipeline},
            what="read snapshot progress",
        )
        return int(rows[0][0]) if rows else None

    def record(self, pipeline: str, version: int, plan: str, chunk: int, rows: int) -> None:
        """Chunk `chunk` of the plan has landed with `rows` rows."""
        values = {"pipeline": pipeline, "version": version, "plan": plan, "chunk": chunk, "rows": rows}
        self.sink.insert_row(self._table, {**values, "done_at": datetime.now(timezone.utc)})


class StateStore:
    """Replication offsets (`cdc2ch_state`), and through `chunks` the snapshot progress next to them."""

    def __init__(self, sink: Sink, database: str):
        self.sink = sink
        self.database = database
        self._table = f"{schema.quote(database)}.{schema.quote(STATE_TABLE)}"
        self.chunks = ChunkStore(sink, database)
        self._columns: str | None = None  # the select list, once the table's columns are known
        self._layout_known = False  # the layout was checked (or brought up to date) through this store

    def ensure(self) -> None:
        """Create the offsets table (adding the columns of later releases to an older one) and the snapshot
        progress table."""
        self.sink.ensure_state_table(
            self.database, STATE_TABLE, "create_state_table.sql", what="create the state table"
        )
        Layout(self.sink, self.database).upgrade(self._add_columns)
        self._layout_known = True
        self._columns = None
        self.chunks.ensure()

    def _add_columns(self) -> None:
        """Layout 1 to 2: the offsets table of an older release gains the columns added since."""
        for column, definition in ADDED_STATE_COLUMNS.items():
            self.sink.command(
                f"ALTER TABLE {self._table} ADD COLUMN IF NOT EXISTS {schema.quote(column)} {definition}",
                what="add a column to the state table",
            )
        self.sink.own.forget(self.database)  # the columns seen before are not the table's any more

    def exists(self) -> bool:
        return self.sink.own.exists(self.database, STATE_TABLE)

    def _select(self, present: Collection[str] | None = None) -> str | None:
        """The columns to read (an older table, which only a writer upgrades, lacks the added ones); None
        when there is no state table. `present`: the table's columns, when the caller has looked them up."""
        if self._columns is None:
            looked_up = present is None
            if looked_up:
                present = self.sink.own.columns(self.database, STATE_TABLE)
                if present and not set(ADDED_STATE_COLUMNS) <= present:  # seen old: upgraded since, perhaps
                    self.sink.own.forget(self.database)
                    present = self.sink.own.columns(self.database, STATE_TABLE)
            if not present:
                return None
            if looked_up and not self._layout_known:  # (a caller that looked the tables up checks it)
                Layout(self.sink, self.database).check()  # a newer cdc2ch's layout is refused, not misread
                self._layout_known = True
            added = [c if c in present else f"'' AS {c}" for c in ADDED_STATE_COLUMNS]
            self._columns = ", ".join([_COLUMNS, *added])
        return self._columns

    def load_all(self, present: Collection[str] | None = None) -> list[PipelineState]:
        """Every pipeline's offset, in one query. `present`: the table's columns as `state_tables` found
        them (then the table is not looked up again)."""
        columns = self._select(present)
        if columns is None:
            return []
        rows = self.sink.query_rows(
            f"SELECT {columns} FROM {self._table} FINAL ORDER BY pipeline",
            what="read replication offsets",
        )
        return [_state(r) for r in rows]

    def load(self, pipeline: str) -> PipelineState | None:
        columns = self._select()
        if columns is None:
            return None
        rows = self.sink.query_rows(
            f"SELECT {columns} FROM {self._table} FINAL WHERE pipeline = {{p:String}}",
            {"p": pipeline},
            what="read the replication offset",
        )
        return _state(rows[0]) if rows else None

    def snapshot_begun(self, pipeline: str) -> int | None:
        """The version of the pipeline's snapshot whose chunks were recorded last (ChunkStore), or None."""
        return self.chunks.last_version(pipeline)

    def forget(self, pipeline: str) -> None:
        """Remove a pipeline's offset (a side pipeline whose work is done). Idempotent."""
        if self.exists():
            self.sink.command(
                f"ALTER TABLE {self._table} DELETE WHERE pipeline = {schema.literal(pipeline)}",
                what="remove a finished pipeline's offset",
                settings={"mutations_sync": 2},
            )

    def save(self, state: PipelineState) -> None:
        with phases.timed("offsets"):
            self._save(state)

    def _save(self, state: PipelineState) -> None:
        self.sink.insert_row(self._table, {name: getattr(state, name) for name in _STATE_FIELDS})


def _state(row: tuple) -> PipelineState:
    (
        pipeline,
        source,
        target,
        version,
        pending,
        rows,
        updated,
        location,
        table_id,
        initial,
        why,
        origin,
        reader,
    ) = row
    return PipelineState(
        pipeline,
        source,
        target,
        int(version),
        int(pending),
        int(rows),
        _utc(updated),
        location or "",
        table_id or "",
        initial or "",
        why or "",
        origin or "",
        reader or "",
    )


def state_tables(sink: Sink, databases: Collection[str] | None = None) -> dict[str, dict[str, set[str]]]:
    """{database: {table: its columns}} of the offsets, health, verify, compaction, control and layout tables in
    `databases` (None: every database), in one query: what readers of every pipeline's records need to know
    beforehand."""
    parameters: dict = {
        "tables": [STATE_TABLE, HEALTH_TABLE, VERIFY_TABLE, COMPACT_TABLE, CONTROL_TABLE, LAYOUT_TABLE]
    }
    where = ""
    if databases is not None:
        where, parameters["dbs"] = " AND database IN {dbs:Array(String)}", sorted(databases)
    rows = sink.query_rows(
        "SELECT database, table, groupArray(name) FROM system.columns "
        f"WHERE table IN {{tables:Array(String)}}{where} GROUP BY database, table",
        parameters,
        what="find replication state tables",
    )
    out: dict[str, dict[str, set[str]]] = {}
    for db, table, columns in rows:
        out.setdefault(db, {})[table] = set(columns)
    return dict(sorted(out.items()))


_HEALTH_FIELDS = (
    "pipeline",
    "source",
    "target",
    "last_success_at",
    "last_error",
    "last_error_kind",
    "last_error_at",
    "failures",
)


class HealthStore:
    def __init__(self, sink: Sink, database: str):
        self.sink = sink
        self.database = database
        self._table = f"{schema.quote(database)}.{schema.quote(HEALTH_TABLE)}"
        self._last = PipelineState.epoch()  # updated_at of this store's last save

    def ensure(self) -> None:
        self.sink.ensure_state_table(
            self.database, HEALTH_TABLE, "create_health_table.sql", what="create the health table"
        )

    def load_all(self, exists: bool | None = None) -> dict[str, Health]:
        """Every pipeline's health, in one query. `exists`: whether the table exists, when the caller knows
        (None: looked up)."""
        names = list(_HEALTH_FIELDS)
        rows = read_records(
            self.sink,
            TargetName(self.database, HEALTH_TABLE),
            exists,
            f"SELECT {', '.join(names)} FROM {self._table} FINAL ORDER BY pipeline",
            "read pipeline health",
        )
        out = {}
        for row in rows:
            values = dict(zip(names, row))
            for k in ("last_success_at", "last_error_at"):
                values[k] = _utc(values[k])
            values["failures"] = int(values["failures"])
            out[values["pipeline"]] = Health(**values)
        return out

    def save(self, health: Health) -> None:
        self._last = stamp_after(self._last)
        self.sink.insert_row(
            self._table, {**{n: getattr(health, n) for n in _HEALTH_FIELDS}, "updated_at": self._last}
        )


def read_records(sink: Sink, table: TargetName, exists: bool | None, select: str, what: str) -> list[tuple]:
    """The rows `select` reads from one of cdc2ch's record tables, none where the table does not exist.
    `exists`: whether it does, when the caller knows (None: looked up)."""
    if exists is None:
        exists = sink.own.exists(table.database, table.table)
    return sink.query_rows(select, what=what) if exists else []


_VERIFY_FIELDS = (
    "pipeline",
    "version",
    "ok",
    "missing",
    "extra",
    "differing",
    "repaired",
    "summary",
    "finished_at",
)


class VerifyStore:
    def __init__(self, sink: Sink, database: str):
        self.sink = sink
        self.database = database
        self._table = f"{schema.quote(database)}.{schema.quote(VERIFY_TABLE)}"

    def record(self, report) -> None:
        self.sink.ensure_state_table(
            self.database, VERIFY_TABLE, "create_verify_table.sql", what="create the verify results table"
        )
        values = {**report.counts, "pipeline": report.pipeline, "version": report.version, "ok": int(report.ok),
                  "repaired": report.repaired, "summary": report.summary(),
                  "finished_at": datetime.now(timezone.utc)}  # fmt: skip
        self.sink.insert_row(self._table, {n: values[n] for n in _VERIFY_FIELDS})

    def load_all(self, exists: bool | None = None) -> dict[str, Verified]:
        """Every pipeline's last verify, in one query. `exists` as HealthStore.load_all's."""
        rows = read_records(
            self.sink,
            TargetName(self.database, VERIFY_TABLE),
            exists,
            f"SELECT pipeline, version, ok, summary, finished_at FROM {self._table} FINAL",
            "read verify results",
        )
        return {r[0]: Verified(r[0], int(r[1]), bool(r[2]), r[3], _utc(r[4])) for r in rows}
