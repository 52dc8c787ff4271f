"""A pipeline's offset: the last Delta version whose changes have all landed, and the range being written."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from cdc2ch.errors import StateError


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

    def check_matches(self, source: str, target: str) -> None:
        if self.source != source or self.target != target:
            raise StateError(
                f"Pipeline {self.pipeline!r} replicates {self.source} into {self.target}, not {source} into "
                f"{target}. Use another --pipeline name, or --reset to repoint it."
            )

    @staticmethod
    def epoch() -> datetime:
        return datetime(1970, 1, 1, tzinfo=timezone.utc)

    def _touched(self, **changes) -> "PipelineState":
        return replace(self, updated_at=stamp_after(self.updated_at), **changes)

    def advanced(self, version: int, rows: int) -> "PipelineState":
        """Versions up to `version` have landed."""
        return self._touched(
            committed_version=version, pending_version=version, rows_written=self.rows_written + rows
        )

    def writing(self, end: int) -> "PipelineState":
        """About to write the range ending at `end`; not committed yet."""
        return self._touched(pending_version=end)

    @property
    def interrupted_range(self) -> tuple[int, int] | None:
        """The range a previous attempt started writing and did not commit."""
        if self.pending_version > self.committed_version:
            return (self.committed_version + 1, self.pending_version)
        return None
