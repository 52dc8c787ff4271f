"""The poll/commit loop: Delta versions -> CDF -> target rows -> ClickHouse batches -> offset.

For each version range [s, e]: read the CDF once, insert every batch, and only then record
committed_version = e. A crash anywhere replays [s, e]; replayed rows carry the same key and version,
so FINAL is unaffected, and the same batches carry the same deduplication tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import structlog

from cdc2ch import changes, schema
from cdc2ch.config import RunConfig
from cdc2ch.errors import SourceError, StateError
from cdc2ch.sink import Sink
from cdc2ch.source.delta import Commit, DeltaSource
from cdc2ch.state import PipelineState, StateStore

log = structlog.get_logger("cdc2ch.pipeline")

MAX_VERSIONS_PER_READ = 1000


def plan_ranges(
    commits: list[Commit], max_rows: int, max_versions: int = MAX_VERSIONS_PER_READ
) -> list[tuple[int, int]]:
    """Group consecutive versions into read ranges of at most ~max_rows estimated change rows.

    A version is never split; one larger than max_rows gets a range of its own.
    """
    ranges: list[tuple[int, int]] = []
    start = prev = None
    rows = 0
    for c in commits:
        if start is not None and (rows + c.estimated_rows > max_rows or c.version - start >= max_versions):
            ranges.append((start, prev))
            start, rows = None, 0
        if start is None:
            start = c.version
        rows += c.estimated_rows
        prev = c.version
    if start is not None:
        ranges.append((start, prev))
    return ranges


@dataclass(frozen=True)
class RangeResult:
    start: int
    end: int
    rows: int
    committed: bool


class TableJob:
    """One Delta table into one ClickHouse table, with its offsets; `stop` asks it to end early."""

    def __init__(self, cfg: RunConfig, source: DeltaSource, sink: Sink, stop: threading.Event | None = None):
        self.cfg = cfg
        self.source = source
        self.sink = sink
        self.store = StateStore(sink, cfg.target.database)
        self.stop = stop or threading.Event()
        self.table_sql = schema.qualified(cfg.target)
        self.log = log.bind(pipeline=cfg.pipeline)


class Replicator(TableJob):
    # -- start-up ---------------------------------------------------------------------------------
    def initial_state(self) -> PipelineState:
        """Where to start: the stored offset, or --from-version/--from-timestamp for a new pipeline.

        Everything is checked before anything is written.
        """
        cfg = self.cfg
        uri = self.source.uri
        latest = self.source.latest().version
        if self.source.properties().get("delta.enableChangeDataFeed", "false").lower() != "true":
            raise SourceError(
                f"The Change Data Feed is not enabled on {uri}. Enable it with ALTER TABLE delta.`{uri}` "
                f"SET TBLPROPERTIES (delta.enableChangeDataFeed = true); changes are recorded from the next "
                f"version on, so load the table first with `cdc2ch snapshot` and let `cdc2ch run` continue."
            )
        requested = self.source.version_at(cfg.from_timestamp) if cfg.from_timestamp else cfg.from_version
        if requested is not None and requested > latest:
            raise StateError(
                f"--from-version {requested} is beyond the latest version of {uri}, which is "
                f"{latest}. Pass a version between 0 and {latest}."
            )
        stored = self.store.load(cfg.pipeline)
        if stored is not None and not cfg.reset:
            self._check_stored(stored, requested, latest)
            start = stored.committed_version + 1
        else:
            start = requested or 0
        since = self.source.cdf_enabled_since()
        if start < since:
            raise SourceError(
                f"The Change Data Feed of {uri} was enabled at version {since}; versions before it have no "
                f"change data, so replication cannot start at {start}. Load the table first with "
                f"`cdc2ch snapshot --table {uri} --primary-key {','.join(cfg.primary_key)} --target {cfg.target} "
                f"--version {since}` (or a later version); `cdc2ch run` then continues after the snapshot."
            )
        schema.column_types(self.source.snapshot(latest).schema.jsonValue(), cfg.primary_key)

        self.store.ensure()
        if stored is not None and not cfg.reset:
            return stored
        if stored is not None:
            self.log.warning("state_reset", was=stored.committed_version, now=start - 1)
        fresh = PipelineState(
            cfg.pipeline,
            uri,
            str(cfg.target),
            start - 1,
            start - 1,
            stored.rows_written if stored else 0,
            stored.updated_at if stored else PipelineState.epoch(),
        ).advanced(start - 1, 0)
        self.store.save(fresh)
        return fresh

    def _check_stored(self, stored: PipelineState, requested: int | None, latest: int) -> None:
        cfg = self.cfg
        stored.check_matches(self.source.uri, str(cfg.target))
        if requested is not None and requested != stored.committed_version + 1:
            raise StateError(
                f"Pipeline {cfg.pipeline!r} has already replicated up to version {stored.committed_version} "
                f"and would continue at {stored.committed_version + 1}, but {requested} was asked for. Drop "
                f"--from-version/--from-timestamp to resume, or add --reset to start over at {requested}."
            )
        if stored.committed_version > latest:
            raise StateError(
                f"Pipeline {cfg.pipeline!r} has replicated up to version {stored.committed_version}, but the "
                f"latest version of {self.source.uri} is {latest}: the table was recreated. Resync with "
                f"`cdc2ch snapshot --reset` or start over with --reset --from-version 0."
            )

    # -- work -------------------------------------------------------------------------------------
    def catch_up(self, state: PipelineState) -> PipelineState:
        """Replicate everything after state.committed_version up to the latest version."""
        start = state.committed_version + 1
        commits = self.source.commits(start)
        if not commits:
            return state
        ranges = plan_ranges(commits, self.cfg.max_rows_per_read)
        if state.interrupted_range:
            # Replay exactly what the interrupted attempt was writing: same batches, same tokens.
            s0, e0 = state.interrupted_range
            self.log.info("resuming_interrupted_range", start=s0, end=e0)
            ranges = [(s0, e0)] + plan_ranges(
                [c for c in commits if c.version > e0], self.cfg.max_rows_per_read
            )
        for s, e in ranges:
            state = state.writing(e)
            self.store.save(state)
            result = self.replicate_range(s, e, state)
            if not result.committed:
                break
            state = state.advanced(e, result.rows)
            self.store.save(state)
            self.log.info("committed", version=e, rows=result.rows, total_rows=state.rows_written)
            if self.stop.is_set():
                break
        return state

    def replicate_range(self, start: int, end: int, state: PipelineState) -> RangeResult:
        cfg = self.cfg
        t0 = time.monotonic()
        cdf = self.source.changes(start, end)
        types = schema.column_types(cdf.schema.jsonValue(), cfg.primary_key)
        frame = changes.to_table_rows(cdf, cfg.immutable_keys)
        rows = self.source.collect(frame, "the change data feed", start, end)
        read_s = time.monotonic() - t0
        changes.check_keys(rows, cfg.primary_key, f"versions {start}..{end} of {self.source.uri}")
        rows = changes.in_replay_order(rows, cfg.primary_key)
        self.sink.ensure_target(cfg.target, types, cfg.primary_key)
        self.log.info("range_read", start=start, end=end, rows=rows.num_rows, seconds=round(read_s, 3))
        written = 0
        pieces = list(changes.batches(rows, cfg.batch_size))
        for i, batch in enumerate(pieces):
            t1 = time.monotonic()
            token = changes.batch_token(f"{cfg.pipeline}:{start}-{end}:{i}", batch)
            written += self.sink.insert_arrow(self.table_sql, batch, token)
            self.log.info(
                "batch",
                start=start,
                end=end,
                batch=i,
                rows=batch.num_rows,
                seconds=round(time.monotonic() - t1, 3),
            )
            if self.stop.is_set() and i + 1 < len(pieces):
                self.log.warning(
                    "range_abandoned",
                    start=start,
                    end=end,
                    reason="stop requested",
                    committed=state.committed_version,
                )
                return RangeResult(start, end, written, False)
        return RangeResult(start, end, written, True)

    def run(self) -> PipelineState:
        """Catch up, then (unless --once) poll until asked to stop."""
        state = self.initial_state()
        self.log.info(
            "start", source=self.source.uri, target=str(self.cfg.target), committed=state.committed_version
        )
        while not self.stop.is_set():
            latest = self.source.latest().version
            if state.committed_version < latest:
                state = self.catch_up(state)
            if self.cfg.once:
                break
            self.stop.wait(self.cfg.poll_interval)
        self.log.info("stopped", committed=state.committed_version, rows_written=state.rows_written)
        return state
