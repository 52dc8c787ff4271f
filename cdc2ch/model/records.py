"""What cdc2ch records per pipeline in its own tables (clickhouse/state/): the offset (the last Delta version
whose changes have all landed, and the range being written), its health, its last verify, the latest request
made of it, and its target's last compaction."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from cdc2ch.base.errors import StateError
from cdc2ch.model.tableref import is_path, same_location


def stamp_after(previous: datetime) -> datetime:
    """Now, or 1 ms after `previous` if the clock has not moved past it: the rows these tables keep per
    pipeline are ReplacingMergeTree(updated_at), so the newest write must always have the greatest stamp."""
    return max(datetime.now(timezone.utc), previous + timedelta(milliseconds=1))


@dataclass(frozen=True)
class PipelineState:
    pipeline: str
    source: str
    target: str
    committed_version: int
    pending_version: int
    rows_written: int
    updated_at: datetime
    # Where the table's files were when last resolved: for a catalog name, what the catalog said (states
    # recorded before names existed have "" here, and their `source` is the path).
    location: str = ""
    table_id: str = ""  # the Delta table's id (metaData.id); "" where not recorded
    # How the pipeline began (replication/startup/initial.py), e.g. "snapshot at version 12", and why; "" where not
    # recorded (pipelines started before this was).
    initial_load: str = ""
    initial_reason: str = ""
    # Where the last committed range's changes came from (model/changeset.py: cdc or log); "" where not recorded.
    changes_from: str = ""
    # The reader that wrote the last range (spark or clickhouse: what `auto` chose); "" where not recorded.
    reader: str = ""

    @property
    def recorded_location(self) -> str:
        return self.location or (self.source if is_path(self.source) else "")

    def check_matches(self, source: str, target: str, location: str = "", table_id: str = "") -> None:
        """The stored offset is of this table and target. One table may be named by path or by catalog
        name (the same location); a name now placed elsewhere is another table (dropped and recreated)."""
        same_table = self.source == source or same_location(self.recorded_location, location)
        if not same_table or self.target != target:
            raise StateError(
                f"Pipeline {self.pipeline!r} replicates {self.source} into {self.target}, not {source} into "
                f"{target}. Use another --pipeline name, or --reset to repoint it."
            )
        was = self.recorded_location
        if was and location and not same_location(was, location):
            raise self._other_table(f"from {was}, but the catalog now places it at {location}")
        if self.table_id and table_id and self.table_id != table_id:
            raise self._other_table(
                f"(Delta table id {self.table_id}), but {location or source} now holds table {table_id}"
            )

    def _other_table(self, what: str) -> StateError:
        return StateError(
            f"Pipeline {self.pipeline!r} replicated {self.source} {what}: the table was dropped and recreated, "
            f"or the name points at another table. {self.target} holds the old table's rows, so cdc2ch will not "
            f"mix the two (the new table's versions would not supersede them). Drop {self.target}, then "
            f"`cdc2ch run --reset` (or `cdc2ch snapshot --reset`) loads the new table."
        )

    def relabelled(self, source: str, location: str, table_id: str) -> "PipelineState":
        """The same table under the name (or path), location and id it was reached by now."""
        return replace(self, source=source, location=location, table_id=table_id or self.table_id)

    def began(self, initial_load: str, reason: str) -> "PipelineState":
        """The same state, recording how the pipeline began and why."""
        return replace(self, initial_load=initial_load, initial_reason=reason)

    @staticmethod
    def epoch() -> datetime:
        return datetime(1970, 1, 1, tzinfo=timezone.utc)

    def _touched(self, **changes: Any) -> "PipelineState":
        return replace(self, updated_at=stamp_after(self.updated_at), **changes)

    def advanced(self, version: int, rows: int) -> "PipelineState":
        """Versions up to `version` have landed."""
        return self._touched(
            committed_version=version, pending_version=version, rows_written=self.rows_written + rows
        )

    def writing(self, end: int, origin: str = "", reader: str = "") -> "PipelineState":
        """About to write the range ending at `end`, its changes from `origin`, read by `reader`; not committed
        yet."""
        return self._touched(
            pending_version=end, changes_from=origin or self.changes_from, reader=reader or self.reader
        )

    @property
    def interrupted_range(self) -> tuple[int, int] | None:
        """The range a previous attempt started writing and did not commit."""
        if self.pending_version > self.committed_version:
            return (self.committed_version + 1, self.pending_version)
        return None


@dataclass(frozen=True)
class Health:
    """How a pipeline fares: its last good poll and its last error (kept after a recovery, with its time)."""

    pipeline: str
    source: str
    target: str
    last_success_at: datetime | None = None
    last_error: str = ""
    last_error_kind: str = ""
    last_error_at: datetime | None = None
    failures: int = 0  # consecutive failed attempts; 0 once an attempt succeeds

    def succeeded(self, at: datetime) -> "Health":
        return replace(self, last_success_at=at, failures=0)

    def failed(self, at: datetime, error: str, kind: str) -> "Health":
        return replace(
            self, last_error=error, last_error_kind=kind, last_error_at=at, failures=self.failures + 1
        )


@dataclass(frozen=True)
class Verified:
    """The last `cdc2ch verify` of a pipeline."""

    pipeline: str
    version: int
    ok: bool
    summary: str
    finished_at: datetime


PAUSE, RESUME, RESYNC = "pause", "resume", "resync"
RESYNCED = "resynced"  # written by the service once a requested resync is done: the pipeline runs
ACTIONS = (PAUSE, RESUME, RESYNC, RESYNCED)


@dataclass(frozen=True)
class Request:
    """The latest request for a pipeline."""

    pipeline: str
    action: str
    reason: str
    by: str
    at: datetime

    @property
    def paused(self) -> bool:
        return self.action == PAUSE

    @property
    def resync_pending(self) -> bool:
        return self.action == RESYNC


@dataclass(frozen=True)
class Compacted:
    """A target's last compaction, and the tombstones every compaction of it recorded has removed."""

    target: str
    finished_at: datetime
    removed: int
    kept: int
    seconds: float
    removed_total: int
