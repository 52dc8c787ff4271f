"""The ports the replication loop drives. Each method's contract says whether it is idempotent and whether it
may split a Delta version; the loop's guarantees (docs/design.md, "The commit protocol") rest on exactly
these promises.

    ChangeSource  the table's versions and changes      (source/sparkread/deltasource.py,
                                                         source/sharing/sharedsource.py)
    RangeWriter   one version range into the target     (writers/driver.py, executors.py, pushdown.py)
    TargetTables  the target table's DDL                (clickhouse/tables/ddl.py)
    OffsetStore   the committed offset per pipeline     (clickhouse/state/statestore.py)
    Lock          one runner per pipeline               (clickhouse/state/lock.py)
    Footprint     what a new pipeline's first attempt added (clickhouse/state/footprint.py)

`Ports` bundles what a pipeline writes to; target.py assembles it for a ClickHouse target.

In-memory implementations live in tests/support/fakes.py: the loop's decisions are tested there without a JVM
or a ClickHouse engine.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import pyarrow as pa

from cdc2ch.model.commit import Commit
from cdc2ch.model.config import RunConfig
from cdc2ch.model.design import TableDesign
from cdc2ch.model.offset import PipelineState
from cdc2ch.model.renames import TargetMoves
from cdc2ch.model.schema import SchemaDiff

__all__ = [
    "ChangeSource",
    "Changes",
    "Footprint",
    "Lock",
    "OffsetStore",
    "RangeResult",
    "RangeWriter",
]


class Changes(Protocol):
    """The change rows of whole versions [start, end], not yet read. Reading twice yields the same rows."""

    start: int
    end: int
    uri: str  # the table's identity (for messages)
    location: str  # where its files are (what a reader that reads files itself opens)
    schema: dict[str, Any]  # Spark JSON schema of the rows: user columns and CDF columns

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        """The rows in the target layout (contract.WRITTEN_META after the user columns), read into this
        process. SourceError with advice when they cannot be read."""

    def arrow_chunks(self, immutable_keys: bool, held_rows: int) -> Generator[pa.Table, None, None]:
        """The same rows in chunks. A source that streams (ChangeSource.streams) yields each chunk as its
        read makes it, in an order that may vary from read to read, each chunk's rows not, and holds at most
        `held_rows` rows of chunks not yet taken (at least one chunk); others yield arrow_rows whole.
        Closing the iterator early ends the read."""

    def spark_rows(self, immutable_keys: bool) -> Any:
        """The same rows as a lazy Spark DataFrame, for writers that run in Spark tasks."""

    def read_error(self, exc: Exception) -> Exception:
        """The SourceError to raise for a failure while the rows were being read."""


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
    has_setting: Callable[[str], bool] = lambda name: True  # whether the target knows a setting


@dataclass(frozen=True)
class RangeResult:
    start: int
    end: int
    rows: int
    committed: bool  # False: stopped before the range was complete; the offset must not move


class ChangeSource(Protocol):
    uri: str  # the table's identity, recorded with the offset: its catalog name or its path
    location: str  # where its files are, recorded too (a name's location may change)
    streams: bool  # its Changes' arrow_chunks yields while the read runs, holding at most held_rows in memory

    def table_id(self) -> str:
        """The Delta table's id, recorded with the offset: another table under the same name or path has
        another id. Read-only."""

    def latest(self) -> Commit:
        """The newest commit. Read-only."""

    def commits(self, start: int, end: int | None = None) -> list[Commit]:
        """Commits in [start, end] (end: the latest) that the source still holds, oldest first. Versions the
        source no longer has are absent, never invented: the caller checks contiguity. Read-only."""

    def commit(self, version: int) -> Commit | None:
        """One commit, or None when the source does not (or no longer) hold it. Read-only."""

    def lag(self, committed: int, latest: Commit) -> tuple[int, float | None]:
        """(versions, seconds) from `committed` to `latest`; seconds None when unknown. Read-only."""

    def file_exists(self, path: str) -> bool | None:
        """Whether the table's file `path`, as a commit's file actions name it (Commit.files), is still in
        storage; None when the source cannot tell. Read-only."""

    def version_at(self, ts: datetime) -> int:
        """The first version committed at or after `ts`; SourceError when there is none."""

    def cdf_enabled(self) -> bool:
        """Whether the latest version records changes (for Delta: delta.enableChangeDataFeed)."""

    def properties(self) -> dict[str, str]:
        """The table properties of the latest version. Read-only."""

    def protocol(self) -> dict[str, Any]:
        """The latest version's protocol (minReaderVersion, minWriterVersion, readerFeatures,
        writerFeatures). Read-only."""

    def schema_at(self, version: int) -> dict[str, Any]:
        """The table's Spark JSON schema as of `version`."""

    def mapped_schema(self, version: int) -> dict[str, Any] | None:
        """The schema as of `version` as the log records it, with each field's column mapping metadata (its
        field id: renames.py), or None when the source cannot tell. Read-only."""

    def changes(self, start: int, end: int, key: tuple[str, ...] = ()) -> Changes:
        """The changes of whole versions start..end (a version is never split). Reading the result twice
        yields the same rows, so a replayed range writes the same batches. Raises SourceError with advice
        when the changes are not (or no longer) available. `key`, the columns that identify a row, lets a
        source leave out the update pre-images another row of their key outranks in their commit."""

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
