"""`cdc2ch snapshot`: load a Delta table as of version N, resumably, and hand over to `run` at N + 1.

Every row is written live at `_version = N * 4 + 3`, so changes replicated from N + 1 on (possibly by a
`run` going on at the same time) outrank it. Work goes chunk by chunk (Spark scan partitions, or groups
of files for the ClickHouse reader); each finished chunk is recorded in ClickHouse, and a restart with
the same arguments skips it. At the end, keys still alive in ClickHouse from before N but absent from
the snapshot are tombstoned at N (a resync after VACUUM must not leave them behind), and the offset
moves to N unless the pipeline is already past it.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias

from cdc2ch.base.errors import SchemaChangeError, SourceError, StateError, error_text, out_of_memory
from cdc2ch.base.log import get_logger
from cdc2ch.model import contract, schema
from cdc2ch.model.changeset import Commit
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.replication import plan, readers
from cdc2ch.replication.budget import UNLIMITED, Leases, RowBudget
from cdc2ch.replication.fullload.progress import Progress
from cdc2ch.replication.metrics import PipelineMetrics
from cdc2ch.replication.ports import ChangeSource, SnapshotFrame, SnapshotPorts
from cdc2ch.replication.projection import designed_source
from cdc2ch.replication.readers import check_clickhouse_reads

log = get_logger("cdc2ch.snapshot")
# What a snapshot is read from: the data files and their rows (None: unknown), or Spark's frame of the table.
_Table: TypeAlias = "list[tuple[str, int | None]] | SnapshotFrame"


class Snapshotter:
    """One table at one version into the target; `stop` asks it to end after the current chunk."""

    def __init__(
        self,
        cfg: RunConfig,
        source: ChangeSource,
        ports: SnapshotPorts,
        stop: threading.Event | None = None,
        budget: RowBudget = UNLIMITED,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        """A snapshot on a ClickHouse target: replication/target.py's clickhouse_snapshotter."""
        self.cfg, self.source, self.ports = cfg, designed_source(source, cfg.design), ports
        self.log = log.bind(pipeline=cfg.pipeline)
        self.metrics = metrics  # a `run`'s: rows loaded so far, for its dashboard
        self.stop = stop or threading.Event()
        self.budget = budget  # the rows the process's pipelines may hold at once
        self.tables, self.store, self.chunks = ports.tables, ports.store, ports.chunks
        self.loaded: tuple[int, int] | None = None  # (version, rows) of a finished run

    def run(self, comment: str | None = None) -> PipelineState | None:
        """Load the table as of cfg.snapshot_version (default: the latest) into the target (created with
        `comment` if missing) and hand the pipeline over to `run`; None when stopped between chunks."""
        cfg = self.cfg
        latest = self.source.latest().version
        version = latest if cfg.snapshot_version is None else cfg.snapshot_version
        if version > latest:
            raise StateError(
                f"--version {version} is beyond the latest version of {self.source.uri}, which is {latest}."
            )
        commit = self.source.commits(version, version)
        if not commit:
            raise SourceError(
                f"Version {version} of {self.source.uri} is no longer in the Delta log (log retention). "
                f"Snapshot a later version, e.g. the latest ({latest})."
            )
        cfg = self.cfg = readers.resolved(
            cfg, self.source, self.ports.remote_target, self.ports.lake_reader, self.log, version
        )
        if cfg.reader == "clickhouse":
            check_clickhouse_reads(
                self.source,
                self.ports.lake_reader,
                self.source.schema_at(version),
                self.source.protocol(),
                self.source.properties(),
            )
        stored = self.store.load(cfg.pipeline)
        if stored is None:
            plan.check_owner(cfg.pipeline, str(cfg.target), self.store.load_all())
        if stored and not cfg.reset:
            stored.check_matches(
                self.source.uri, str(cfg.target), self.source.location, self.source.table_id()
            )
        t0 = time.monotonic()
        if self.stop.is_set():  # stopped while the inputs were checked: no claim after it
            return None
        self.ports.lock.acquire()
        try:
            rows = self.load(version, commit[0], comment)
            if rows is None:  # stopped between chunks
                self.log.warning("snapshot_interrupted", version=version)
                return None
            state = self._hand_over(stored, version, rows)
        finally:
            self.ports.lock.release()
        self.loaded = (version, rows)
        self.log.info(
            "snapshot_done",
            version=version,
            rows=rows,
            seconds=round(time.monotonic() - t0, 3),
            committed=state.committed_version,
        )
        return state

    def load(self, version: int, commit: Commit | None = None, comment: str | None = None) -> int | None:
        """Write the table as of `version` into the target (created with `comment` if missing) and
        tombstone keys the snapshot no longer has. Returns the rows written, or None when stopped."""
        cfg = self.cfg
        commit = commit or self.source.commits(version, version)[0]
        ts_ms = commit.timestamp_ms
        table, table_schema = self._read_from(version)
        if self.stop.is_set():  # stopped while Spark started or planned: no table created after it
            return None
        if cfg.reader == "clickhouse":  # again for a resync, which comes here directly
            check_clickhouse_reads(self.source, self.ports.lake_reader, table_schema)
        types = schema.column_types(table_schema, cfg.design)
        stored = self.store.load(cfg.pipeline)
        self.tables.check(types, new=stored is None or stored.committed_version < 0)
        change = self.tables.prepare(types, comment)
        if change.breaking:
            raise SchemaChangeError(
                f"The existing ClickHouse table {cfg.target} does not fit version {version} of "
                f"{self.source.uri}: {'; '.join(change.breaking)}. Drop the table first (it is rebuilt from "
                f"the snapshot) or snapshot into a new --target."
            )
        self.store.ensure()
        self.log.info("snapshot_start", source=self.source.uri, version=version, reader=cfg.reader)
        if cfg.reader == "spark":
            assert not isinstance(table, list)  # the files are listed for --reader clickhouse only
            rows = self._spark_chunks(table, version, ts_ms)
        else:
            rows = self._clickhouse_chunks(table, version, ts_ms, list(types))
        if rows is not None:  # keys alive from before `version` that the snapshot did not write: gone by then
            self.ports.target.sweep(cfg.pipeline, version, ts_ms, list(types))
        return rows

    # -- readers ----------------------------------------------------------------------------------
    def _read_from(self, version: int) -> tuple[_Table, dict[str, Any]]:
        """What the chunks are read from, and the schema: for --reader clickhouse on a local table the files
        and schema its log names (no JVM), else Spark's frame of the table."""
        files = self.source.snapshot_files(version) if self.cfg.reader == "clickhouse" else None
        if files is not None:
            return files, self.source.schema_at(version)
        frame = self.ports.frame(self.source.snapshot(version))
        return frame, frame.schema()

    def _lake_files(self, table: _Table, version: int) -> tuple[list[str], int]:
        """The files of `version` ClickHouse reads, and their rows: from the log's (path, rows) list `table`
        where it counts every file's rows, else from Spark's frame (started for it if need be)."""
        if isinstance(table, list) and all(n is not None for _, n in table):
            return [p for p, _ in table], sum(n or 0 for _, n in table)  # (none is None)
        frame = self.ports.frame(self.source.snapshot(version)) if isinstance(table, list) else table
        return frame.files()

    def _spark_chunks(self, table: SnapshotFrame, version: int, ts_ms: int) -> int | None:
        cfg = self.cfg
        frame = table.chunks(version, ts_ms, cfg.max_rows_per_read)
        total = frame.total
        plan = "spark:" + frame.fingerprint()
        done = self.chunks.done(cfg.pipeline, version, plan)
        todo = [chunk for chunk in range(frame.count) if chunk not in done]
        # The next chunk is read while this one is written (the JVM reads while the engine inserts) when
        # the row budget has room for both. Leaving the block waits for a read under way, so no Spark job
        # outlives the snapshot.
        rows = -(-total // max(frame.count, 1))  # a chunk's rows (the files are split evenly)
        with (
            Progress(f"snapshot v{version}", total, frame.count, len(frame.files)) as progress,
            Leases(self.budget, self.stop) as leases,
            ThreadPoolExecutor(1, thread_name_prefix="cdc2ch-snapshot-read") as pool,
        ):
            self._advance(progress, sum(done.values()), len(done))
            pending = None
            for i, chunk in enumerate(todo):
                if self.stop.is_set() or not leases.need(chunk, rows):
                    return None
                if pending is None:
                    pending = pool.submit(frame.read, chunk)
                try:
                    data = pending.result()
                except Exception as exc:
                    raise self._read_error(exc, version, chunk, total // max(1, len(frame.files))) from exc
                pending = None
                if i + 1 < len(todo) and leases.ahead(todo[i + 1], rows):
                    pending = pool.submit(frame.read, todo[i + 1])
                n = 0
                if data is not None:
                    where = f"version {version} of {self.source.uri}"
                    n = self.ports.target.insert(data, cfg, where, (version, plan, chunk))
                data = None  # written: give its share of the budget back
                leases.done(chunk)
                self.chunks.record(cfg.pipeline, version, plan, chunk, n)
                self.log.info("chunk", version=version, chunk=chunk, of=frame.count, rows=n)
                self._advance(progress, n, 1)
            progress.done()
        return sum(self.chunks.done(cfg.pipeline, version, plan).values())

    def _advance(self, progress: Progress, rows: int, chunks: int) -> None:
        progress.advance(rows, chunks)
        if self.metrics is not None:
            self.metrics.snapshot_progress(progress.rows, progress.total_rows)

    def _read_error(self, exc: Exception, version: int, chunk: int, rows_per_file: int) -> Exception:
        """A chunk's read failure in the user's terms; running out of memory says what to change."""
        text = error_text(exc)
        if not out_of_memory(text):
            error: Exception = self.source.translate(exc, f"chunk {chunk} of the snapshot", version, None)
            return error
        return SourceError(
            f"Spark ran out of memory reading chunk {chunk} of the snapshot of version {version} of "
            f"{self.source.uri}. A chunk, about --max-rows-per-read rows ({self.cfg.max_rows_per_read:,}), is "
            f"held whole in memory (the files of this version hold {rows_per_file:,} rows each on average). "
            f"Read smaller chunks with a lower --max-rows-per-read, give Spark more memory (--spark-conf "
            f"spark.driver.memory=4g), or load with --reader clickhouse, which streams the files. Chunks "
            f"already loaded are recorded: the same command resumes after them."
        )

    def _clickhouse_chunks(self, table: _Table, version: int, ts_ms: int, columns: list[str]) -> int | None:
        """Push-down: ClickHouse reads the Delta table itself, a group of files per INSERT ... SELECT."""
        cfg = self.cfg
        files, total = self._lake_files(table, version)
        count = max(1, min(len(files), math.ceil(total / cfg.max_rows_per_read)))
        groups = [files[i::count] for i in range(count)]
        plan = "clickhouse:" + hashlib.sha1("\0".join([str(count), *files]).encode()).hexdigest()[:16]
        done = self.chunks.done(cfg.pipeline, version, plan)
        meta = contract.sql_fixed_meta(version, ts_ms, contract.SNAPSHOT)
        with Progress(f"snapshot v{version}", total, count, len(files)) as progress:
            self._advance(progress, sum(done.values()), len(done))
            for chunk, group in enumerate(groups):
                if chunk in done or not group:
                    continue
                if self.stop.is_set():
                    return None
                n = self.ports.target.load_files(
                    cfg, self.source.location, group, (columns, meta), (version, plan, chunk)
                )
                self.chunks.record(cfg.pipeline, version, plan, chunk, n)
                self.log.info("chunk", version=version, chunk=chunk, of=count, rows=n, files=len(group))
                self._advance(progress, n, 1)
            progress.done()
        return sum(self.chunks.done(cfg.pipeline, version, plan).values())

    # -- finish -----------------------------------------------------------------------------------
    def _hand_over(self, stored: PipelineState | None, version: int, rows: int) -> PipelineState:
        """Point the pipeline at `version` unless it is already further (a `run` went on meanwhile)."""
        current = self.store.load(self.cfg.pipeline)
        if current is not None and current.committed_version >= version and not self.cfg.reset:
            self.log.info("offset_kept", committed=current.committed_version, snapshot=version)
            return current
        state = plan.state_pointed_at(
            current or stored,
            self.cfg.pipeline,
            self.source.uri,
            str(self.cfg.target),
            version,
            rows,
            self.source.location,
            self.source.table_id(),
        )
        self.store.save(state)
        return state
