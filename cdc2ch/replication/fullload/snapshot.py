"""`cdc2ch snapshot`: load a Delta table as of version N, resumably, and hand over to `run` at N + 1.

Every row is written live at `_version = N * 4 + 3`, so changes replicated from N + 1 on (possibly by a
`run` going on at the same time) outrank it. Work goes chunk by chunk (Spark scan partitions, or groups
of files for the ClickHouse reader); each finished chunk is recorded in ClickHouse, and a restart with
the same arguments skips it. At the end, keys still alive in ClickHouse from before N but absent from
the snapshot are tombstoned at N (a resync after VACUUM must not leave them behind), and the offset
moves to N unless the pipeline is already past it.
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeAlias

from cdc2ch.base.errors import SchemaChangeError, SourceError, StateError, error_text, out_of_memory
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.lock import PipelineLock
from cdc2ch.clickhouse.state.statestore import StateStore
from cdc2ch.clickhouse.tables.ddl import ClickHouseTables
from cdc2ch.model import contract, schema
from cdc2ch.model.commit import Commit
from cdc2ch.model.config import RunConfig
from cdc2ch.model.offset import PipelineState
from cdc2ch.replication import plan, readers
from cdc2ch.replication.budget import UNLIMITED, Leases, RowBudget
from cdc2ch.replication.fullload.progress import Progress
from cdc2ch.replication.metrics import PipelineMetrics
from cdc2ch.replication.ports import ChangeSource
from cdc2ch.replication.projection import DesignedSource, designed_source
from cdc2ch.replication.readers import check_clickhouse_reads
from cdc2ch.replication.writers.driver import InsertInto, insert_rows
from cdc2ch.replication.writers.pushdown import insert_from_lake, insert_settings, lake_access
from cdc2ch.source.sparkread.chunked import ChunkedFrame, arrow_schema
from cdc2ch.source.sparkread.variants import variants_as_json

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = get_logger("cdc2ch.snapshot")
# What a snapshot is read from: the data files and their rows (None: unknown), or Spark's frame of the table.
_Table: TypeAlias = "list[tuple[str, int | None]] | DataFrame"


def _file_path(spark_file: str) -> str:
    """Spark's inputFiles() entry -> the _path ClickHouse reports for it. The entry is a Hadoop path, not
    a URI: a partition directory keeps its own escapes (`p=2024-01-01 10%3A00%3A00`), which ClickHouse
    reports as they are, so nothing is decoded here."""
    scheme, sep, rest = spark_file.partition(":")
    if not sep or "/" in scheme:  # no scheme at all
        return spark_file
    if scheme == "file":  # file:/x, file:///x
        return "/" + rest.lstrip("/")
    return rest[2:] if rest.startswith("//") else rest  # s3a://bucket/key -> bucket/key


def _read_from(source: DesignedSource, reader: str, version: int) -> tuple[_Table, dict[str, Any]]:
    """What the chunks are read from, and the schema: for --reader clickhouse on a local table the files
    and schema its log names (no JVM), else Spark's frame of the table."""
    files = source.snapshot_files(version) if reader == "clickhouse" else None
    if files is not None:
        return files, source.schema_at(version)
    table = source.snapshot(version)
    return table, table.schema.jsonValue()


def _lake_files(source: DesignedSource, table: _Table, version: int) -> tuple[list[str], int]:
    """The files of `version` ClickHouse reads, and their rows: from the log's (path, rows) list `table`
    where it counts every file's rows, else from Spark's frame (started for it if need be)."""
    if isinstance(table, list) and all(n is not None for _, n in table):
        return [p for p, _ in table], sum(n or 0 for _, n in table)  # (none is None)
    table = source.snapshot(version) if isinstance(table, list) else table
    return sorted(_file_path(f) for f in table.inputFiles()), table.count()


class Snapshotter:
    """One table at one version into the target; `stop` asks it to end after the current chunk."""

    def __init__(
        self,
        cfg: RunConfig,
        source: ChangeSource,
        sink: Sink,
        stop: threading.Event | None = None,
        budget: RowBudget = UNLIMITED,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self.cfg, self.source, self.sink = cfg, designed_source(source, cfg.design), sink
        self.metrics = metrics  # a `run`'s: rows loaded so far, for its dashboard
        self.stop = stop or threading.Event()
        self.budget = budget  # the rows the process's pipelines may hold at once
        self.tables = ClickHouseTables(sink, cfg.target, cfg.design)
        self.table_sql = self.tables.table_sql
        self.store = StateStore(sink, cfg.target.database)
        self.chunks = self.store.chunks
        self.lock = PipelineLock(sink, cfg.target.database, cfg.pipeline, cfg.lock_ttl)
        self.log = log.bind(pipeline=cfg.pipeline)
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
            cfg, self.source, self.sink.task_client is not None, self.sink.has_setting, self.log, version
        )
        if cfg.reader == "clickhouse":
            check_clickhouse_reads(
                self.source,
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
        with self.lock:
            rows = self.load(version, commit[0], comment)
            if rows is None:  # stopped between chunks
                self.log.warning("snapshot_interrupted", version=version)
                return None
            state = self._hand_over(stored, version, rows)
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
        ts_ms = int(commit.timestamp.timestamp() * 1000)
        table, table_schema = _read_from(self.source, cfg.reader, version)
        if cfg.reader == "clickhouse":  # again for a resync, which comes here directly
            check_clickhouse_reads(self.source, table_schema)
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
            rows = self._spark_chunks(table, version, ts_ms, list(types))
        else:
            rows = self._clickhouse_chunks(table, version, ts_ms, list(types))
        if rows is not None:
            self._sweep(version, ts_ms, list(types))
        return rows

    # -- readers ----------------------------------------------------------------------------------
    def _spark_chunks(self, table: DataFrame, version: int, ts_ms: int, columns: list[str]) -> int | None:
        cfg = self.cfg
        total = table.count()
        user = variants_as_json(table)
        # Spark reads the table's own columns; the metadata, constants here, are added in Arrow with the
        # fields Spark would give them.
        meta = arrow_schema(contract.spark_snapshot_rows(user, version, ts_ms))
        frame = ChunkedFrame(user, total, cfg.max_rows_per_read)
        plan = "spark:" + frame.fingerprint()
        done = self.chunks.done(cfg.pipeline, version, plan)
        progress = Progress(f"snapshot v{version}", total, frame.count, len(frame.files))
        self._advance(progress, sum(done.values()), len(done))
        todo = [chunk for chunk in range(frame.count) if chunk not in done]
        # The next chunk is read while this one is written (the JVM reads while the engine inserts) when
        # the row budget has room for both. Leaving the block waits for a read under way, so no Spark job
        # outlives the snapshot.
        rows = -(-total // max(frame.count, 1))  # a chunk's rows (the files are split evenly)
        with (
            Leases(self.budget, self.stop) as leases,
            ThreadPoolExecutor(1, thread_name_prefix="cdc2ch-snapshot-read") as pool,
        ):
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
                    n, _, _ = insert_rows(
                        InsertInto(self.sink, self.table_sql, self.log),
                        contract.arrow_snapshot_rows(data, version, ts_ms, meta),
                        cfg,
                        f"version {version} of {self.source.uri}",
                        functools.partial(contract.snapshot_batch_token, cfg.pipeline, version, plan, chunk),
                        chunk=chunk,
                    )
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
            f"{self.source.uri}. A chunk is read whole into memory, and Parquet files are split only between "
            f"row groups: the files of this version hold {rows_per_file:,} rows each on average. Give Spark "
            f"more memory (--spark-conf spark.driver.memory=4g), or load with --reader clickhouse, which "
            f"streams the files. Chunks already loaded are recorded: the same command resumes after them."
        )

    def _clickhouse_chunks(self, table: _Table, version: int, ts_ms: int, columns: list[str]) -> int | None:
        """Push-down: ClickHouse reads the Delta table itself, a group of files per INSERT ... SELECT."""
        cfg = self.cfg
        files, total = _lake_files(self.source, table, version)
        count = max(1, min(len(files), math.ceil(total / cfg.max_rows_per_read)))
        groups = [files[i::count] for i in range(count)]
        plan = "clickhouse:" + hashlib.sha1("\0".join([str(count), *files]).encode()).hexdigest()[:16]
        done = self.chunks.done(cfg.pipeline, version, plan)
        progress = Progress(f"snapshot v{version}", total, count, len(files))
        self._advance(progress, sum(done.values()), len(done))
        meta = contract.sql_fixed_meta(version, ts_ms, contract.SNAPSHOT)
        for chunk, group in enumerate(groups):
            if chunk in done or not group:
                continue
            if self.stop.is_set():
                return None
            paths = ", ".join(schema.literal(p) for p in group)
            before = self.sink.row_count(self.table_sql)
            with self.sink.reads_files():
                self.sink.command(
                    insert_from_lake(
                        self.table_sql,
                        self.source.location,
                        columns,
                        meta,
                        f" WHERE _path IN ({paths})",
                        cfg.design,
                        lake_access(cfg),
                    ),
                    what=f"load snapshot chunk {chunk}",
                    settings={
                        "delta_lake_snapshot_version": version,
                        **insert_settings(contract.snapshot_chunk_token(cfg.pipeline, version, plan, chunk)),
                    },
                )
            n = max(self.sink.row_count(self.table_sql) - before, 0)
            self.chunks.record(cfg.pipeline, version, plan, chunk, n)
            self.log.info("chunk", version=version, chunk=chunk, of=count, rows=n, files=len(group))
            self._advance(progress, n, 1)
        progress.done()
        return sum(self.chunks.done(cfg.pipeline, version, plan).values())

    # -- finish -----------------------------------------------------------------------------------
    def _sweep(self, version: int, ts_ms: int, columns: list[str]) -> None:
        """Tombstone keys alive from before `version` that the snapshot did not write (gone by then)."""
        cols = ", ".join(schema.quote(c) for c in columns)
        meta = contract.sql_fixed_meta(version, ts_ms, "delete")
        self.sink.command(
            f"INSERT INTO {self.table_sql} ({cols}, {', '.join(contract.WRITTEN_META)}) SELECT {cols}, "
            f"{', '.join(meta)} FROM {self.table_sql} FINAL WHERE {contract.sql_before(version)}",
            what="tombstone keys missing from the snapshot",
            settings=contract.target_insert(contract.sweep_token(self.cfg.pipeline, version)),
        )

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
