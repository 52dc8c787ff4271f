"""The ports the replication loop drives. Each method's contract says whether it is idempotent and whether it
may split a Delta version; the loop's guarantees (docs/design.md, "The commit protocol") rest on exactly
these promises.

    ChangeSource    the table, combining VersionHistory,   source/sparkread/deltasource.py,
                    TableDescription and RowReads          source/sharing/sharedsource.py
    RangeWriter     one version range into the target      clickhouse/writers/ (driver, executors, pushdown)
    TargetTables    the target table's DDL                 clickhouse/tables/ddl.py
    OffsetStore     the committed offset per pipeline      clickhouse/state/statestore.py
    Lock            one runner per pipeline                clickhouse/state/lock.py
    Footprint       what a new pipeline's first attempt    clickhouse/state/footprint.py
                    added
    LakeReader      what the target's own reader reads     clickhouse/writers/pushdown.py
    SnapshotTarget  a snapshot's chunks into the target    clickhouse/writers/snapshotload.py
    ChunkRecords    which chunks of a snapshot landed      clickhouse/state/statestore.py
    SnapshotFrame   the table at a version, read by Spark  source/sparkread/snapshotframe.py

`Ports` bundles what a pipeline writes to, `SnapshotPorts` what a snapshot does; target.py assembles both
for a ClickHouse target.

In-memory implementations live in tests/support/fakes.py: the loop's decisions are tested there without a JVM
or a ClickHouse engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from cdc2ch.base import phases
from cdc2ch.model.changeset import FEED, Changes, Commit, RangeResult
from cdc2ch.model.config import RunConfig
from cdc2ch.model.design import TableDesign
from cdc2ch.model.records import PipelineState
from cdc2ch.model.renames import TargetMoves
from cdc2ch.model.schema import SchemaDiff

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ChangeSource",
    "Changes",
    "ChunkRecords",
    "Footprint",
    "LakeReader",
    "Lock",
    "OffsetStore",
    "RangeResult",
    "RangeWriter",
    "SnapshotFrame",
    "SnapshotTarget",
]


@dataclass(frozen=True)
class Ports:
    """What a pipeline reads from and writes to, besides its change source."""

    store: OffsetStore
    lock: Lock
    tables: TargetTables
    writer: Callable[[str], RangeWriter]  # a writer of the kind plan.choose_writer picked
    # for resync: (side config, version, comment)
    load_snapshot: Callable[[RunConfig, int, str | None], int | None]
    remote_target: bool  # Spark tasks can reach the target (a server)
    local_master: bool  # Spark runs in this process
    footprint: Footprint  # what a new pipeline's first attempt added, taken back when it fails
    lake_reader: LakeReader  # the target's own Delta reader (--reader clickhouse)
    # `fn`, to run on another thread as part of this one's reads (its Spark job group: source/spark/threads.py)
    on_other_threads: Callable[[Callable[..., Any]], Callable[..., Any]] = phases.carried


class VersionHistory(Protocol):
    """The table's versions, as its log records them."""

    def latest(self) -> Commit:
        """The newest commit. Read-only."""

    def commits(self, start: int, end: int | None = None) -> list[Commit]:
        """Commits in [start, end] (end: the latest) that the source still holds, oldest first. Versions the
        source no longer has are absent, never invented: the caller checks contiguity. Read-only."""

    def commit(self, version: int) -> Commit | None:
        """One commit, or None when the source does not (or no longer) hold it. Read-only."""

    def lag(self, committed: int, latest: Commit) -> tuple[int, float | None]:
        """(versions, seconds) from `committed` to `latest`; seconds None when unknown. Read-only."""

    def version_at(self, ts: datetime) -> int:
        """The first version committed at or after `ts`; SourceError when there is none."""

    def file_exists(self, path: str) -> bool | None:
        """Whether the table's file `path`, as a commit's file actions name it (Commit.files), is still in
        storage; None when the source cannot tell. Read-only."""


class TableDescription(Protocol):
    """What the table is: its id, schema, properties and protocol."""

    def table_id(self) -> str:
        """The Delta table's id, recorded with the offset: another table under the same name or path has
        another id. Read-only."""

    def cdf_enabled(self) -> bool:
        """Whether the latest version records changes (for Delta: delta.enableChangeDataFeed)."""

    def properties(self, version: int | None = None) -> dict[str, str]:
        """The table properties of `version` (default: the latest; where Python reads the log, as the
        last poll found it). Read-only."""

    def protocol(self) -> dict[str, Any]:
        """The latest version's protocol (minReaderVersion, minWriterVersion, readerFeatures,
        writerFeatures). Read-only."""

    def schema_at(self, version: int) -> dict[str, Any]:
        """The table's Spark JSON schema as of `version`."""

    def mapped_schema(self, version: int) -> dict[str, Any] | None:
        """The schema as of `version` as the log records it, with each field's column mapping metadata (its
        field id: renames.py), or None when the source cannot tell. Read-only."""


class RowReads(Protocol):
    """The table's rows: the changes of a range of versions, or the whole table at one."""

    def changes(self, start: int, end: int, key: tuple[str, ...] = (), origin: str = FEED) -> Changes:
        """The changes of whole versions start..end (a version is never split), from the change data feed or
        derived from the log (`origin`, model/changeset.py; LOG only where `derives`). Reading the result
        twice yields the same rows, so a replayed range writes the same batches. Raises SourceError with
        advice when the changes are not (or no longer) available. `key`, the columns that identify a row,
        lets a source leave out the update pre-images another row of their key outranks in their commit."""

    def warm_up(self, immutable_keys: bool) -> float | None:
        """Pay a first read's start-up cost now; the seconds spent, or None. Best effort, never raises."""

    def snapshot_files(self, version: int) -> list[tuple[str, int | None]] | None:
        """The data files at `version` (absolute paths) and the live rows of each (None: unknown), for a
        reader that reads the files itself; None when the source cannot list them without Spark. Read-only."""

    def snapshot(self, version: int) -> Any:
        """The table as of `version` (a lazy Spark DataFrame for Spark sources)."""

    def duplicate_keys(
        self, primary_key: tuple[str, ...], version: int
    ) -> tuple[int, int, dict[str, str]] | None:
        """(keys, rows, an example key) of the keys more than one row holds at `version`, or None (what
        `validate` checks). Read-only."""


class ChangeSource(VersionHistory, TableDescription, RowReads, Protocol):
    """A Delta table the loop replicates: its history, its description and its rows."""

    uri: str  # the table's identity, recorded with the offset: its catalog name or its path
    location: str  # where its files are, recorded too (a name's location may change)
    streams: bool  # its Changes' arrow_chunks yields while the read runs, holding at most held_rows in memory
    derives: bool  # it derives changes from its log's file actions (origin LOG) where no feed records them


class RangeWriter(Protocol):
    kind: str  # driver | executors | clickhouse: logged and reported by `validate`
    range_factor: int  # how many times --max-rows-per-read one range may hold (streaming writers: more)
    collects: bool  # write() reads the rows in (arrow_rows): the loop may read the next range meanwhile

    def check(self, changes: Changes, estimate: int) -> None:
        """Refuse, before anything is written, rows the target must not take (null keys): run on a new
        pipeline's first range, so that refused input leaves no table and no offset behind. Writes nothing;
        a write() of the same range right after may reuse what was read."""

    def write(self, changes: Changes, state: PipelineState, estimate: int) -> RangeResult:
        """Write the range into the target table. Idempotent: a replay of the same range writes rows with
        the same keys and versions (FINAL unchanged) and, where the writer cuts batches, the same tokens.
        Returns committed=False when asked to stop midway; raises on failure. Never moves the offset."""


class LakeReader(Protocol):
    def lacks(self) -> str | None:
        """What the target lacks to read a change data feed itself (a setting of newer servers), or None.
        Read-only."""

    def check(self, location: str, feed: bool) -> None:
        """Refuse a table the target cannot read itself: storage it does not reach (ConfigError), or, for a
        change `feed`, an engine too old to read one (SinkError). Read-only."""

    def probe(self, cfg: RunConfig, location: str, version: int) -> dict[str, int]:
        """The rows the target reads of each file (by ClickHouse's `_path`) of the table at `location` as of
        `version`, with the pipeline's storage settings and credentials; raises (Cdc2chError) where it cannot
        read it. Read-only; no secret in its errors."""

    def credentials(self, cfg: RunConfig) -> str:
        """Which credentials the target reads object storage with, in user words (no secret)."""


class TargetTables(Protocol):
    table_sql: str  # the target table's quoted name

    def prepare(
        self, types: dict[str, str], comment: str | None = None, moves: TargetMoves | None = None
    ) -> SchemaDiff:
        """Create the target table, or evolve it (rename and drop the columns of `moves`, add columns, widen
        types) to take rows of `types`. Idempotent: a rename or drop already done is not repeated. Returns the
        difference; with breaking changes the table is left as it was."""

    def check(self, types: dict[str, str], new: bool) -> None:
        """Refuse an existing target table that cannot be kept equal to Delta under the pipeline's design
        (engine, bookkeeping columns, sorting and partition keys; with `new`, a pipeline adopting the table,
        its column types too). Read-only: ConfigError naming what is wrong and the CREATE TABLE that works."""

    def comment(self, suffix: str = "") -> str | None:
        """The comment of the table target+suffix, or None when it does not exist. Read-only."""

    def comments(self, *suffixes: str) -> list[str | None]:
        """comment() of each suffix, in one look. Read-only."""

    def drop(self, suffix: str) -> None:
        """Drop the side table target+suffix if it exists. Idempotent."""

    def exchange(self, suffix: str, design: TableDesign | None = None) -> None:
        """Swap the target table and the side table target+suffix (built with `design`, default the
        target's): atomically on one server; on a cluster, the shards' tables atomically, then settle()."""

    def settle(self, design: TableDesign | None = None) -> None:
        """Finish a swap that ran (on a cluster: the Distributed table takes the swapped table's columns).
        Idempotent; nothing to do on one server."""


class OffsetStore(Protocol):
    def ensure(self) -> None:
        """Create the store if missing. Idempotent."""

    def load(self, pipeline: str) -> PipelineState | None:
        """The last saved state of `pipeline`, or None."""

    def load_all(self) -> list[PipelineState]:
        """The last saved state of every pipeline of the store (which pipeline writes which target)."""

    def save(self, state: PipelineState) -> None:
        """Record `state`; the newest save wins. Idempotent."""

    def forget(self, pipeline: str) -> None:
        """Remove a pipeline's offset (a side pipeline whose work is done). Idempotent."""

    def snapshot_begun(self, pipeline: str) -> int | None:
        """The version of the snapshot of `pipeline` whose chunks were recorded last (fullload/snapshot.py), or None.
        For a pipeline without an offset: a snapshot begun and not finished. Read-only."""


class Footprint(Protocol):
    def mark(self) -> None:
        """Note what the target holds now, before a new pipeline's first write. Read-only."""

    def undo(self) -> list[str]:
        """Take back what was added since mark(): the pipeline's offset, the target table and cdc2ch's own
        tables created since (unless another pipeline uses them). Returns the tables dropped; nothing
        without a mark. Raises when the target cannot be reached."""


class Lock(Protocol):
    def check(self) -> None:
        """Raise LockedError if another runner holds the pipeline. Writes nothing."""

    def acquire(self) -> None:
        """Claim the pipeline (LockedError if another runner holds it) and keep the claim alive."""

    def release(self) -> None:
        """Give the claim up. Idempotent."""


class ChunkRecords(Protocol):
    def done(self, pipeline: str, version: int, plan: str) -> dict[int, int]:
        """{chunk: rows} of the chunks of the snapshot (pipeline, version, chunk plan) that landed. Read-only."""

    def record(self, pipeline: str, version: int, plan: str, chunk: int, rows: int) -> None:
        """Chunk `chunk` of the plan landed with `rows` rows. Idempotent."""


class SnapshotChunks(Protocol):
    total: int  # rows
    count: int  # chunks
    files: list[str]

    def fingerprint(self) -> str:
        """Identifies the chunking (the same files split the same way): a resumed snapshot needs a match."""

    def read(self, index: int) -> pa.Table | None:
        """Chunk `index` in the target layout, None when it holds no rows. The same rows on every read."""


class SnapshotFrame(Protocol):
    def schema(self) -> dict[str, Any]:
        """The Spark JSON schema of its rows."""

    def files(self) -> tuple[list[str], int]:
        """The data files (as ClickHouse names them) and the rows they hold. Read-only."""

    def chunks(self, version: int, ts_ms: int, max_rows: int) -> SnapshotChunks:
        """Its rows in chunks of about `max_rows`, written live at `version` committed at `ts_ms`."""


class SnapshotTarget(Protocol):
    def insert(self, rows: pa.Table, cfg: RunConfig, where: str, chunk: tuple[int, str, int]) -> int:
        """Insert the rows of chunk (version, plan, index), without the outranked ones; the rows written.
        Idempotent: a replayed chunk carries the same batch tokens."""

    def load_files(
        self,
        cfg: RunConfig,
        location: str,
        files: list[str],
        columns: tuple[list[str], list[str]],
        chunk: tuple[int, str, int],
    ) -> int:
        """The target reads `files` of the table at `location` itself and inserts them: columns = (user
        columns, the bookkeeping columns' expressions). The rows added. Idempotent by the chunk's token."""

    def sweep(self, pipeline: str, version: int, ts_ms: int, columns: list[str]) -> None:
        """Tombstone, at `version`, keys alive from before it that the snapshot did not write. Idempotent."""


@dataclass(frozen=True)
class SnapshotPorts:
    """What a snapshot reads from and writes to, besides its change source."""

    store: OffsetStore
    chunks: ChunkRecords
    lock: Lock
    tables: TargetTables
    target: SnapshotTarget
    frame: Callable[[Any], SnapshotFrame]  # ChangeSource.snapshot's frame, to read by Spark
    remote_target: bool
    lake_reader: LakeReader
