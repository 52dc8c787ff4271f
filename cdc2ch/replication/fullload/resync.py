"""A schema change the target cannot follow in place: stop, or (`--on-schema-change resync`) rebuild the
target from a snapshot into a side table, swap it in, go on.

Crash-safe: the side table carries a comment naming the pipeline and the version it was built at, so a
restart can tell a finished swap (the target carries a marker newer than the offset: move the offset) from
a stale side table (drop it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cdc2ch.base.errors import SchemaChangeError
from cdc2ch.base.log import Logger
from cdc2ch.model.changeset import Commit
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import PipelineState
from cdc2ch.model.schema import SchemaDiff
from cdc2ch.model.view import NONE as NO_VIEW
from cdc2ch.replication import plan
from cdc2ch.replication.ports import ChangeSource, OffsetStore, TargetTables

SUFFIX = "__cdc2ch_resync"
_MARKER = "cdc2ch: rebuilt by resync of pipeline {pipeline} at Delta version {version}"


def marker(pipeline: str, version: int) -> str:
    return _MARKER.format(pipeline=pipeline, version=version)


def parse_marker(comment: str | None, pipeline: str) -> int | None:
    """The version a table was rebuilt at by this pipeline's resync, or None."""
    prefix = _MARKER.split("{version}")[0].format(pipeline=pipeline)
    if comment and comment.startswith(prefix) and comment[len(prefix) :].isdigit():
        return int(comment[len(prefix) :])
    return None


def side_config(cfg: RunConfig, version: int) -> RunConfig:
    """The snapshot job that rebuilds the table at `version`: into the side table, as a pipeline of its own
    (without a view: the target's follows the swap)."""
    side = TargetName(cfg.target.database, cfg.target.table + SUFFIX)
    design = replace(cfg.design, current_view=NO_VIEW)
    return replace(cfg, target=side, pipeline=cfg.pipeline + SUFFIX, snapshot_version=version, design=design)


class Resync:
    def __init__(
        self,
        cfg: RunConfig,
        source: ChangeSource,
        tables: TargetTables,
        store: OffsetStore,
        load_snapshot: Callable[[RunConfig, int, str], int | None],
        log: Logger,
    ) -> None:
        """`load_snapshot(side config, version, comment)` writes the table at `version` into the side table
        (created with `comment`) and returns its rows, or None when stopped midway."""
        self.cfg, self.pipeline, self.source = cfg, cfg.pipeline, source
        self.tables, self.store, self.load_snapshot, self.log = tables, store, load_snapshot, log

    def broken(
        self, state: PipelineState, commit: Commit | None, start: int, end: int, change: SchemaDiff
    ) -> PipelineState:
        """Versions start..end (of `commit`, when one) changed the schema in a way the table cannot follow in
        place: rebuild it (--on-schema-change resync), or stop with the offset where it is."""
        at = f"version {start}" if commit is not None or start == end else f"versions {start}..{end}"
        what = f" ({plan.describe(commit)})" if commit else ""
        reason = f"{at} of {self.source.uri}{what}: " + "; ".join(change.breaking)
        if self.cfg.on_schema_change == "resync":
            return self.run(state, reason)
        raise SchemaChangeError(
            f"The Delta schema changed at {reason}. ClickHouse table {self.cfg.target} cannot follow this in "
            f"place, so replication stopped with version {state.committed_version} committed. Run again with "
            f"--on-schema-change resync to rebuild {self.cfg.target} from a snapshot of the new schema (readers "
            f"keep the old table until the new one is swapped in), or replicate into a new --target."
        )

    def run(self, state: PipelineState, reason: str) -> PipelineState:
        """Rebuild at the latest version; returns the state after the swap (unchanged when stopped)."""
        version = self.source.latest().version
        mark = marker(self.pipeline, version)
        if self.tables.comment(SUFFIX) not in (None, mark):
            self.tables.drop(SUFFIX)  # left by a resync at another version
        self.log.warning(
            "resync_start", reason=reason, version=version, side_table=str(self.cfg.target) + SUFFIX
        )
        rows = self.load_snapshot(side_config(self.cfg, version), version, mark)
        if rows is None:
            return state
        self.tables.exchange(SUFFIX)
        state = self._finish(state, version, rows)
        self.log.warning("resync_done", version=version, rows=rows)
        return state

    def recover(self, state: PipelineState) -> PipelineState:
        """After a crash in the middle of a resync: finish the hand-over if the swap had happened."""
        swapped, stale = self._left(state)
        if swapped is not None:
            self.log.warning("resync_recovered", version=swapped)
            self.tables.settle()
            return self._finish(state, swapped, 0)
        if stale:
            self.tables.drop(SUFFIX)  # the replaced table, left by a crash after the offset moved
        return state

    def leftover(self, state: PipelineState) -> bool:
        """Whether a crash mid-resync left `recover` something to write."""
        swapped, stale = self._left(state)
        return swapped is not None or stale

    def _left(self, state: PipelineState) -> tuple[int | None, bool]:
        """The version of a swap done but not recorded in the offset, and whether a stale side table is left."""
        built, side = self.tables.comments("", SUFFIX)  # one look at both tables
        built_at, side_at = parse_marker(built, self.pipeline), parse_marker(side, self.pipeline)
        swapped = built_at if built_at is not None and built_at > state.committed_version else None
        return swapped, side_at is not None and side_at <= state.committed_version

    def _finish(self, state: PipelineState, version: int, rows: int) -> PipelineState:
        state = state.advanced(version, rows)
        self.store.save(state)
        self.tables.drop(SUFFIX)
        return state
