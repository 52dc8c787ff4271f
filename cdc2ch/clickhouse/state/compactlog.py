"""The last compaction of each target table (`cdc2ch_compact` in its database): what `status` shows and when
a service's `--compact-every` compacts it next."""

from __future__ import annotations

from datetime import datetime, timezone

from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.statestore import COMPACT_TABLE, _utc, read_records
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.records import Compacted, stamp_after


class CompactStore:
    def __init__(self, sink: Sink, database: str):
        self.sink = sink
        self.database = database
        self._table = f"{schema.quote(database)}.{schema.quote(COMPACT_TABLE)}"

    def record(self, result) -> Compacted:
        """Record a compaction.CompactResult; returns it as the store now holds it."""
        self.sink.ensure_state_table(
            self.database, COMPACT_TABLE, "create_compact_table.sql", what="create the compaction table"
        )
        before = self.load_all(exists=True).get(result.target)
        now = stamp_after(before.finished_at) if before else datetime.now(timezone.utc)
        total = (before.removed_total if before else 0) + result.dropped
        values = {
            "target": result.target,
            "finished_at": now,
            "cutoff": result.cutoff,
            "removed": result.dropped,
            "kept": result.kept,
            "rows_before": result.rows_before,
            "rows_after": result.rows_after,
            "recovered": result.recovered,
            "seconds": float(result.seconds),
            "removed_total": total,
        }
        self.sink.insert_row(self._table, values)
        return Compacted(result.target, now, result.dropped, result.kept, float(result.seconds), total)

    def load_all(self, exists: bool | None = None) -> dict[str, Compacted]:
        """{target: its last compaction}, in one query. `exists` as HealthStore.load_all's."""
        rows = read_records(
            self.sink,
            TargetName(self.database, COMPACT_TABLE),
            exists,
            f"SELECT target, finished_at, removed, kept, seconds, removed_total FROM {self._table} FINAL",
            "read the last compactions",
        )
        return {r[0]: Compacted(r[0], _utc(r[1]), int(r[2]), int(r[3]), float(r[4]), int(r[5])) for r in rows}
