"""What was asked of each pipeline from outside its service (`cdc2ch_control` in its target database):
`pause`, `resume` and `resync` requests, who asked, when and why; a service reads them every poll."""

from __future__ import annotations

from datetime import datetime, timezone

from cdc2ch.base.processes import requester
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.statestore import CONTROL_TABLE, _utc, read_records
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.records import RESYNCED, Request, stamp_after


class ControlStore:
    def __init__(self, sink: Sink, database: str):
        self.sink = sink
        self.database = database
        self._table = f"{schema.quote(database)}.{schema.quote(CONTROL_TABLE)}"

    def request(self, pipeline: str, action: str, reason: str = "", by: str | None = None) -> Request:
        """Record `action` as the pipeline's latest request (after any earlier one, whatever the clocks)."""
        self.sink.ensure_state_table(
            self.database, CONTROL_TABLE, "create_control_table.sql", what="create the control table"
        )
        before = self.load_all(exists=True).get(pipeline)
        at = stamp_after(before.at) if before else datetime.now(timezone.utc)
        made = Request(pipeline, action, reason, by or requester(), at)
        values = {"pipeline": pipeline, "action": action, "reason": reason, "requested_by": made.by,
                  "requested_at": at}  # fmt: skip
        self.sink.insert_row(self._table, values)
        return made

    def load_all(self, exists: bool | None = None) -> dict[str, Request]:
        """{pipeline: its latest request}, in one query. `exists` as HealthStore.load_all's."""
        rows = read_records(
            self.sink,
            TargetName(self.database, CONTROL_TABLE),
            exists,
            f"SELECT pipeline, action, reason, requested_by, requested_at FROM {self._table} FINAL",
            "read pipeline requests",
        )
        return {r[0]: Request(r[0], r[1], r[2], r[3], _utc(r[4])) for r in rows}

    def resynced(self, asked: Request, by: str) -> bool:
        """Record that the resync `asked` for is done, unless a newer request came meanwhile; whether it was."""
        if self.load_all(exists=True).get(asked.pipeline) != asked:
            return False
        self.request(asked.pipeline, RESYNCED, asked.reason, by)
        return True
