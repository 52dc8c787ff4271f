"""The poll/commit loop: Delta versions -> CDF -> target rows -> ClickHouse batches -> offset.

For each version range [s, e]: read the CDF once, insert every batch, and only then record
committed_version = e. A crash anywhere replays [s, e]; replayed rows carry the same key and version,
so FINAL is unaffected, and the same batches carry the same deduplication tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, replace

import structlog

from cdc2ch import changes, schema
from cdc2ch.clickhouse import ddl
from cdc2ch.clickhouse.lock import PipelineLock
from cdc2ch.clickhouse.state import PipelineState, StateStore
from cdc2ch.clickhouse.transport import Sink
from cdc2ch.config import RunConfig, TargetName
from cdc2ch.errors import ConfigError, SchemaChangeError, SinkError, SourceError, StateError
from cdc2ch.metrics import Metrics, PipelineMetrics
from cdc2ch.progress import Progress
from cdc2ch.sink import distributed
from cdc2ch.source import pushdown
from cdc2ch.source.delta import Commit, DeltaSource

log = structlog.get_logger("cdc2ch.pipeline")

MAX_VERSIONS_PER_READ = 1000
MAX_TASK_PARTITIONS = 256
PUSHDOWN_RANGE_FACTOR = 10
RESYNC_SUFFIX = "__cdc2ch_resync"
_MARKER = "cdc2ch: rebuilt by resync of pipeline {pipeline} at Delta version {version}"


def resync_marker(pipeline: str, version: int) -> str:
    return _MARKER.format(pipeline=pipeline, version=version)


def parse_resync_marker(comment: str | None, pipeline: str) -> int | None:
    prefix = _MARKER.split("{version}")[0].format(pipeline=pipeline)
    if comment and comment.startswith(prefix) and comment[len(prefix) :].isdigit():
        return int(comment[len(prefix) :])
    return None


def describe(commit: Commit) -> str:
    """A commit as a user would name it: the operation and, for schema changes, its columns."""
    p = commit.parameters
    if commit.operation == "RENAME COLUMN":
        return f"RENAME COLUMN {p.get('oldColumnPath')} TO {p.get('newColumnPath')}"
    for key in ("columns", "column"):
        if p.get(key):
            return f"{commit.operation} {p[key][:200]}"
    return commit.operation


def plan_ranges(
    commits: list[Commit],
    max_rows: int,
    max_versions: int = MAX_VERSIONS_PER_READ,
    breaks: Collection[int] = (),
) -> list[tuple[int, int]]:
    """Group consecutive versions into read ranges of at most ~max_rows estimated change rows.

    A version is never split; one larger than max_rows gets a range of its own. A version in `breaks`
    (a schema or metadata change) always starts a range: a CDF read may not span one.
    """
    ranges: list[tuple[int, int]] = []
    start = prev = None
    rows = 0
    for c in commits:
        if start is not None and (
            rows + c.estimated_rows > max_rows or c.version - start >= max_versions or c.version in breaks
        ):
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

    def __init__(
        self,
        cfg: RunConfig,
        source: DeltaSource,
        sink: Sink,
        stop: threading.Event | None = None,
        metrics: PipelineMetrics | None = None,
    ):
        self.cfg = cfg
        self.metrics = metrics or Metrics().pipeline(cfg.pipeline)
        self.source = source
        self.sink = sink
        self.store = StateStore(sink, cfg.target.database)
        self.stop = stop or threading.Event()
        self.table_sql = schema.qualified(cfg.target)
        self.log = log.bind(pipeline=cfg.pipeline)
        self.lock = PipelineLock(sink, cfg.target.database, cfg.pipeline, cfg.lock_ttl)
        self.writer = "driver"  # `run` chooses once its inputs are checked

    def prepare_target(self, types: dict[str, str], comment: str | None = None) -> schema.SchemaDiff:
        """Create the target table, or evolve it to take rows of `types` (add columns, widen types).

        Returns the difference; when it has breaking changes the table is left as it was.
        """
        cfg = self.cfg
        existing = self.sink.table_columns(cfg.target)
        if existing is None:
            ddl.create_target(self.sink, cfg.target, types, cfg.primary_key, comment)
            return schema.diff(types, types, cfg.primary_key)
        change = schema.diff(existing, types, cfg.primary_key)
        if not change.breaking:
            ddl.evolve_target(self.sink, cfg.target, change)
        return change


class Replicator(TableJob):
    # -- start-up ---------------------------------------------------------------------------------
    def check_inputs(self) -> tuple[int, PipelineState | None]:
        """Check table, keys, change data feed, offsets and options, writing nothing (what `validate` runs).
        Returns the first version to replicate and the stored state."""
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
        self.writer = self.choose_writer()
        return start, stored

    def initial_state(self) -> PipelineState:
        """Where to start: the stored offset, or --from-version/--from-timestamp for a new pipeline.

        Everything is checked before anything is written.
        """
        cfg = self.cfg
        uri = self.source.uri
        start, _ = self.check_inputs()
        self.lock.acquire()  # inputs are fine: from here on this process writes
        stored = self.store.load(cfg.pipeline)  # again, now that nobody else can move it
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

    def choose_writer(self) -> str:
        """driver: collect each range and insert from this process. executors: Spark tasks insert their own
        partitions (server targets only). auto: executors on a cluster with a server target."""
        wanted, remote = self.cfg.writer, self.sink.task_client is not None
        if self.cfg.reader == "clickhouse":
            if wanted == "executors":
                raise ConfigError(
                    "--reader clickhouse has ClickHouse read and insert the changes itself, so Spark tasks have "
                    "nothing to write: drop --writer executors, or use --reader spark."
                )
            pushdown.lake_function(self.source.uri)  # refuses a URI ClickHouse cannot read, before any write
            return "clickhouse"
        if wanted == "executors" and not remote:
            raise ConfigError(
                "--writer executors needs a ClickHouse server target: the embedded engine lives inside this "
                "process, out of the Spark tasks' reach. Use --writer driver (the default for embedded) or an "
                "http(s):// --clickhouse."
            )
        if wanted == "auto":
            local = self.source.spark.sparkContext.master.startswith("local")
            return "executors" if remote and not local else "driver"
        return wanted

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
    def catch_up(self, state: PipelineState, latest: int | None = None) -> PipelineState:
        """Replicate everything after state.committed_version up to `latest` (default: the latest version)."""
        start = state.committed_version + 1
        commits = self.source.commits(start, latest)
        if not commits:
            return state
        self._check_contiguous(start, commits)
        breaks = {c.version for c in commits if c.metadata}  # a CDF read may not span one
        ranges = plan_ranges(commits, self.rows_per_range(), breaks=breaks)
        if state.interrupted_range:
            # Replay exactly what the interrupted attempt was writing: same batches, same tokens.
            s0, e0 = state.interrupted_range
            self.log.info("resuming_interrupted_range", start=s0, end=e0)
            ranges = [(s0, e0)] + plan_ranges(
                [c for c in commits if c.version > e0], self.rows_per_range(), breaks=breaks
            )
        by_version = {c.version: c for c in commits}
        newest = commits[-1]
        progress = None
        if len(ranges) > 1:  # a long catch-up: show how it goes
            total = sum(c.estimated_rows for c in commits)
            progress = Progress(f"catch-up {self.cfg.pipeline}", total, len(ranges), unit="range")
        for s, e in ranges:
            if self.stop.is_set():
                break
            cdf = self.source.changes(s, e)
            types = schema.column_types(cdf.schema.jsonValue(), self.cfg.primary_key)
            change = self.prepare_target(types)
            if change.breaking:
                return self._schema_broken(state, by_version.get(s) if s in breaks else None, s, e, change)
            state = state.writing(e)
            self.store.save(state)
            estimate = sum(by_version[v].estimated_rows for v in range(s, e + 1) if v in by_version)
            result = self.replicate_range(cdf, s, e, state, estimate)
            if not result.committed:
                break
            state = state.advanced(e, result.rows)
            self.store.save(state)
            self.log.info("committed", version=e, rows=result.rows, total_rows=state.rows_written)
            self.metrics.lag(e, newest.version, (newest.timestamp - by_version[e].timestamp).total_seconds())
            if progress is not None:
                progress.advance(result.rows, 1)
        if progress is not None:
            progress.done()
        return state

    def rows_per_range(self) -> int:
        """A range read by Spark is collected whole, so --max-rows-per-read bounds it. ClickHouse streams its
        own reads: there the bound only limits what a crash makes it replay, and fewer, larger statements
        save it re-reading the Delta log for each."""
        factor = PUSHDOWN_RANGE_FACTOR if self.writer == "clickhouse" else 1
        return self.cfg.max_rows_per_read * factor

    def _check_contiguous(self, start: int, commits: list[Commit]) -> None:
        """Versions missing from the log (expired by log retention) cannot be replayed: never skip them."""
        expected = range(start, commits[-1].version + 1)
        have = {c.version for c in commits}
        missing = [v for v in expected if v not in have]
        if missing:
            raise SourceError(
                f"Versions {missing[0]}..{missing[-1]} of {self.source.uri} are no longer in the Delta log "
                f"(log retention removed them), so their changes cannot be replayed. Resync with `cdc2ch snapshot "
                f"--table {self.source.uri} --primary-key {','.join(self.cfg.primary_key)} --target "
                f"{self.cfg.target} --reset`, then `cdc2ch run` continues after the snapshot."
            )

    def _schema_broken(
        self, state: PipelineState, commit: Commit | None, start: int, end: int, change: schema.SchemaDiff
    ) -> PipelineState:
        at = f"version {start}" if commit is not None or start == end else f"versions {start}..{end}"
        what = f" ({describe(commit)})" if commit else ""
        reason = f"{at} of {self.source.uri}{what}: " + "; ".join(change.breaking)
        if self.cfg.on_schema_change == "resync":
            return self.resync(state, reason)
        raise SchemaChangeError(
            f"The Delta schema changed at {reason}. ClickHouse table {self.cfg.target} cannot follow this in "
            f"place, so replication stopped with version {state.committed_version} committed. Run again with "
            f"--on-schema-change resync to rebuild {self.cfg.target} from a snapshot of the new schema (readers "
            f"keep the old table until the new one is swapped in), or replicate into a new --target."
        )

    def replicate_range(
        self, cdf, start: int, end: int, state: PipelineState, estimate: int = 0
    ) -> RangeResult:
        cfg = self.cfg
        t0 = time.monotonic()
        if self.writer == "clickhouse":
            return self._replicate_in_clickhouse(cdf, start, end, t0)
        frame = changes.to_table_rows(cdf, cfg.immutable_keys)
        if self.writer == "executors":
            return self._replicate_on_executors(frame, start, end, estimate, t0)
        rows = self.source.collect(frame, "the change data feed", start, end)
        read_s = time.monotonic() - t0
        where = f"versions {start}..{end} of {self.source.uri}"
        changes.check_keys(rows, cfg.primary_key, where)
        order = changes.replay_order(rows, cfg.primary_key)
        for dup in changes.duplicate_keys(rows, cfg.primary_key, order):
            self.log.warning("duplicate_keys", where=where, **dup)
        self.log.info("range_read", start=start, end=end, rows=rows.num_rows, seconds=round(read_s, 3))
        written = 0
        for i, batch in enumerate(changes.batches(rows, cfg.batch_size, order)):
            if self.stop.is_set():
                self.log.warning(
                    "range_abandoned",
                    start=start,
                    end=end,
                    reason="stop requested",
                    batches_written=i,
                    committed=state.committed_version,
                )
                return RangeResult(start, end, written, False)
            t1 = time.monotonic()
            token = changes.batch_token(f"{cfg.pipeline}:{start}-{end}:{i}", batch)
            n = self.sink.insert_arrow(self.table_sql, batch, token)
            written += n
            seconds = time.monotonic() - t1
            self.metrics.batch(n, batch.nbytes, seconds)
            self.log.info(
                "batch", start=start, end=end, batch=i, rows=batch.num_rows, seconds=round(seconds, 3)
            )
        return RangeResult(start, end, written, True)

    def _replicate_on_executors(self, frame, start: int, end: int, estimate: int, t0: float) -> RangeResult:
        """Spark tasks insert their partitions; the partition count follows the range's estimated rows
        (the same on a replay, so the same batches and tokens)."""
        cfg = self.cfg
        partitions = max(1, min(MAX_TASK_PARTITIONS, -(-max(estimate, 1) // cfg.batch_size)))
        try:
            rows, batches = distributed.write_partitions(
                frame,
                self.sink.task_client,
                self.table_sql,
                cfg.primary_key,
                partitions,
                cfg.batch_size,
                f"{cfg.pipeline}:{start}-{end}",
                cfg.retries,
            )
        except Exception as exc:
            text = str(exc)
            if distributed.NULL_KEY_MARK in text:
                key, nulls, version = text.split(distributed.NULL_KEY_MARK + ":", 1)[1].split(":")[:3]
                where = f"versions {start}..{end} of {self.source.uri}"
                raise changes.null_key_error(int(nulls), key, version.split()[0], where) from exc
            if "ClickHouse" in text or "clickhouse_connect" in text:
                first = next((ln for ln in text.splitlines() if "ClickHouse" in ln), text)[:400]
                raise SinkError(
                    f"Spark tasks failed to insert versions {start}..{end} into {self.table_sql} after "
                    f"{cfg.retries} attempts each (and Spark's task retries): {first}. The offset was not moved; "
                    f"run again once ClickHouse is healthy."
                ) from exc
            raise self.source.translate(exc, "the change data feed", start, end) from exc
        # Tasks insert on the executors: their bytes are not seen here, and one observation covers the range.
        self.metrics.batch(rows, 0, time.monotonic() - t0, batches)
        self.log.info(
            "range_written",
            start=start,
            end=end,
            rows=rows,
            batches=batches,
            partitions=partitions,
            writer="executors",
            seconds=round(time.monotonic() - t0, 3),
        )
        return RangeResult(start, end, rows, True)

    def _replicate_in_clickhouse(self, cdf, start: int, end: int, t0: float) -> RangeResult:
        """Push-down: one INSERT ... SELECT in which ClickHouse reads the range's change data feed itself.

        A replay sends the same statement with the same deduplication token; rows ClickHouse stores again
        anyway (its blocks need not repeat exactly) carry the same keys and versions, so FINAL is unchanged.
        """
        cfg = self.cfg
        columns = [c for c in cdf.columns if c not in pushdown.CDF_COLUMNS]
        before = self.sink.row_count(self.table_sql)
        try:
            with self.sink.reads_files():
                summary = self.sink.command(
                    pushdown.cdf_insert(self.table_sql, self.source.uri, columns, cfg.immutable_keys),
                    what=f"read versions {start}..{end} of {self.source.uri} into {self.table_sql}",
                    settings={
                        **pushdown.cdf_settings(start, end),
                        "insert_null_as_default": 0,  # a null key fails the insert instead of becoming 0 or ''
                        "insert_deduplicate": 1,
                        "insert_deduplication_token": f"{cfg.pipeline}:{start}-{end}:clickhouse",
                    },
                )
        except SinkError as exc:
            if "NULL" in str(exc) and ("Nullable" in str(exc) or "CANNOT_INSERT_NULL" in str(exc)):
                found = self._null_keys_in_lake(start, end)
                if found is not None:
                    raise found from exc
            raise
        # A server reports the rows written; the embedded engine does not, so count (a background merge
        # at the same moment can make this a little low; it only feeds the rows_written figure).
        rows = int(getattr(summary, "written_rows", 0) or 0) or max(
            self.sink.row_count(self.table_sql) - before, 0
        )
        seconds = time.monotonic() - t0
        nbytes = summary.written_bytes() if hasattr(summary, "written_bytes") else 0
        self.metrics.batch(rows, int(nbytes or 0), seconds)
        self.log.info(
            "batch", start=start, end=end, batch=0, rows=rows, reader="clickhouse", seconds=round(seconds, 3)
        )
        return RangeResult(start, end, rows, True)

    def _null_keys_in_lake(self, start: int, end: int) -> SourceError | None:
        """The insert failed on a null: count the null keys (on this error path only) to say where."""
        lake = pushdown.lake_function(self.source.uri)
        for key in self.cfg.primary_key:
            with self.sink.reads_files():
                nulls, version = self.sink.query_rows(
                    f"SELECT count(), min(_commit_version) FROM {lake} WHERE {schema.quote(key)} IS NULL",
                    what="count null keys",
                    settings=pushdown.cdf_settings(start, end),
                )[0]
            if nulls:
                return changes.null_key_error(
                    nulls, key, version, f"versions {start}..{end} of {self.source.uri}"
                )
        return None

    # -- resync -----------------------------------------------------------------------------------
    def resync_table(self) -> TargetName:
        return TargetName(self.cfg.target.database, self.cfg.target.table + RESYNC_SUFFIX)

    def _drop_resync_table(self, what: str) -> None:
        self.sink.command(f"DROP TABLE IF EXISTS {schema.qualified(self.resync_table())}", what=what)

    def resync(self, state: PipelineState, reason: str) -> PipelineState:
        """Rebuild the target from a snapshot at the latest version into a side table, swap it in, and
        continue from there. Crash-safe: each table carries a comment naming the version it was built at."""
        from cdc2ch.snapshot import Snapshotter

        cfg = self.cfg
        side = self.resync_table()
        version = self.source.latest().version
        marker = resync_marker(cfg.pipeline, version)
        if self.sink.table_comment(side) not in (None, marker):
            self._drop_resync_table("drop a stale side table")
        self.log.warning("resync_start", reason=reason, version=version, side_table=str(side))
        job = Snapshotter(
            replace(cfg, target=side, pipeline=cfg.pipeline + RESYNC_SUFFIX, snapshot_version=version),
            self.source,
            self.sink,
            self.stop,
        )
        rows = job.load(version, comment=marker)
        if rows is None:
            return state
        self.sink.command(
            f"EXCHANGE TABLES {schema.qualified(side)} AND {self.table_sql}", what="swap in the rebuilt table"
        )
        state = self._finish_resync(state, version, rows)
        self.log.warning("resync_done", version=version, rows=rows)
        return state

    def _finish_resync(self, state: PipelineState, version: int, rows: int) -> PipelineState:
        state = state.advanced(version, rows)
        self.store.save(state)
        self._drop_resync_table("drop the replaced table")
        return state

    def recover_resync(self, state: PipelineState) -> PipelineState:
        """After a crash in the middle of a resync: finish the hand-over if the swap had happened."""
        built_at = parse_resync_marker(self.sink.table_comment(self.cfg.target), self.cfg.pipeline)
        if built_at is not None and built_at > state.committed_version:
            self.log.warning("resync_recovered", version=built_at)
            return self._finish_resync(state, built_at, 0)
        side = self.resync_table()
        side_at = parse_resync_marker(self.sink.table_comment(side), self.cfg.pipeline)
        if side_at is not None and side_at <= state.committed_version:
            self._drop_resync_table("drop the replaced table")
        return state

    def warm_up(self) -> None:
        """A service's first change should be visible as quickly as the rest: a fresh JVM spends seconds
        loading and compiling the CDF read path on its first read, so pay that at start-up by reading one
        row of the newest commit's changes. Best effort: a failure here only means a slower first read."""
        t0 = time.monotonic()
        try:
            latest = self.source.latest_version()
            changes.to_table_rows(self.source.changes(latest, latest), self.cfg.immutable_keys).limit(
                1
            ).toArrow()
        except Exception as exc:  # e.g. no change data for that version: the real reads will say so
            self.log.debug("warm_up_skipped", reason=str(exc)[:200])
            return
        self.log.info("warmed_up", seconds=round(time.monotonic() - t0, 3))

    # -- life cycle (the runner drives these; run() is the single-pipeline loop) ---------------------
    def start(self) -> PipelineState:
        """Check the inputs, claim the pipeline, and finish any interrupted resync."""
        self.state = self.recover_resync(self.initial_state())
        self.log.info(
            "start",
            source=self.source.uri,
            target=str(self.cfg.target),
            committed=self.state.committed_version,
        )
        return self.state

    def step(self) -> bool:
        """One poll: replicate whatever is new. True when versions were committed."""
        before = self.state.committed_version
        latest = self.source.latest()
        self.metrics.lag(before, latest.version, self.source.lag(before, latest)[1] or 0.0)
        if before < latest.version:
            self.state = self.catch_up(self.state, latest.version)
        return self.state.committed_version != before

    def close(self) -> None:
        self.lock.release()
        state = getattr(self, "state", None)
        if state is not None:
            self.log.info("stopped", committed=state.committed_version, rows_written=state.rows_written)

    def run(self) -> PipelineState:
        """Catch up, then (unless --once) poll until asked to stop."""
        try:
            self.start()
            if not self.cfg.once:
                self.warm_up()
            while not self.stop.is_set():
                progressed = self.step()
                if self.cfg.once:
                    break
                if not progressed:  # nothing new: wait; else look again at once
                    self.stop.wait(self.cfg.poll_interval)
        finally:
            self.close()
        return self.state
