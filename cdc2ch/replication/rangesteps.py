"""A version range written in three named steps, each idempotent, each leaving after a crash what its
docstring says, so that the replay the offset asks for is harmless (docs/design.md, "The commit protocol"):
prepare the target, write the range, commit the offset."""

from __future__ import annotations

from typing import Any

from cdc2ch.base.log import Logger
from cdc2ch.model.changeset import Changes, Commit, RangeResult
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.model.schema import SchemaDiff
from cdc2ch.replication import follow
from cdc2ch.replication.ports import ChangeSource, Ports, RangeWriter
from cdc2ch.replication.startup.bootstrap import Bootstrap


class RangeSteps:
    def __init__(self, cfg: RunConfig, source: ChangeSource, ports: Ports, bootstrap: Bootstrap, log: Logger):
        self.cfg, self.source, self.ports, self.bootstrap, self.log = cfg, source, ports, bootstrap, log

    def prepare_target(
        self, state: PipelineState, schema_json: dict[str, Any], commit: Commit | None, claimed: bool
    ) -> SchemaDiff:
        """Step 1, prepare the target: create the table, or evolve it to the range's schema (`commit`: the
        range begins at a schema change). A new pipeline (not `claimed`) claims itself here, once the DDL is
        accepted: a table ClickHouse refuses leaves no offset, and one another runner holds gets no DDL
        either. After a crash: the table evolved, the offset unmoved; the replay finds nothing to change."""
        if not claimed:
            self.ports.lock.check()
        change = follow.prepare(self.ports.tables, self.cfg, self.source, commit, state, schema_json)
        if not claimed:
            self.bootstrap.claim_first_range(state)
        return change

    def write_range(
        self, state: PipelineState, changes: Changes, writer: RangeWriter, estimate: int
    ) -> tuple[PipelineState, RangeResult]:
        """Step 2, write the range: record it as being written (pending_version), then insert its rows.
        After a crash: rows of versions past the offset; the replay writes the same keys and versions with
        the same deduplication tokens, so FINAL is unchanged."""
        state = state.writing(changes.end, changes.origin, self.cfg.reader)
        self.ports.store.save(state)
        return state, writer.write(changes, state, estimate)

    def commit_range(self, state: PipelineState, result: RangeResult) -> PipelineState:
        """Step 3, commit the offset: committed_version = the range's end. After a crash: the next attempt
        begins after it."""
        state = state.advanced(result.end, result.rows)
        self.ports.store.save(state)
        self.log.info("committed", version=result.end, rows=result.rows, total_rows=state.rows_written)
        return state
