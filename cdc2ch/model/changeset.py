"""Delta versions as they cross the layers. A `Commit`: one version as replication needs it (its time,
operation, an upper bound of the change rows it yields, its file actions where the log names them), made by
every source, from which the loop plans its ranges. `Changes`: the change rows of a range of whole versions,
made by a source and read by a writer, from the table's change data feed or derived from its log (`FEED`,
`LOG`). `RangeResult`: what writing a range did."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    import pyarrow as pa


# Where a range's change rows come from: the Change Data Feed the table records (its change files, and its
# data files where a commit wrote none), or derived from the data files each commit adds and removes, with
# their deletion vectors (a table that records no feed). The loop chooses per range (replication/plan.py).
FEED, LOG = "cdf", "log"


def records_feed(properties: Mapping[str, Any]) -> bool:
    """Whether table properties make Delta record a change data feed."""
    return str(properties.get("delta.enableChangeDataFeed", "")).lower() == "true"


@dataclass(frozen=True)
class Files:
    """A commit's file actions, as far as the table's size and the files its change feed reads need them
    (replication/startup/replay.py). Paths as the log writes them: relative to the table, URI-encoded."""

    added: tuple[tuple[str, int | None, bool], ...] = ()  # (path, live rows or None, dataChange)
    removed: tuple[
        tuple[str, int | None, bool], ...
    ] = ()  # (path, rows (by size: no statistics), dataChange)
    change_files: tuple[str, ...] = ()  # its change files (_change_data/...), if it wrote any
    vectors: bool = False  # an added or removed file carries a deletion vector
    partitioned: bool = False  # an added file carries partition values (kept in the log, not in the file)
    # Every added file has row ids and was first added by this commit (row tracking: a row of it whose
    # commit version is not this commit's was copied unchanged)
    tracked: bool = False


# The rows a range adds and removes again from which deriving it at once pays: below, its larger plan costs a
# fresh JVM more to compile than the reads it saves (docs/benchmarks.md, tables without a feed)
AT_ONCE_FROM_ROWS = 1_000_000


@dataclass
class FileSpan:
    """The data files of consecutive commits as deriving their changes at once reads them
    (source/sparkread/netchanges.py), counted in rows: those they remove that were there before them
    (`before`), those they add and remove again (`between`), those they add that are there at their end
    (`after`, by path). `derivable`: every commit named its files and their rows. `vectors`: a file carries a
    deletion vector; Spark's derivation reads each file by its path, as one set of rows, so it derives only
    spans without (ClickHouse reads each file at a version, as it was then)."""

    before: int = 0
    between: int = 0
    after: dict[str, int] = field(default_factory=dict)
    after_rows: int = 0  # (their sum)
    derivable: bool = True
    vectors: bool = False

    @classmethod
    def of(cls, commits: Iterable[Commit]) -> FileSpan:
        span = cls()
        for c in commits:
            span.take(c.files)
        return span

    def take(self, files: Files | None) -> None:
        """One more commit's file actions (None: not known)."""
        if files is None:
            self.derivable = False
            return
        self.vectors = self.vectors or files.vectors
        for path, rows, _ in files.removed:
            self.remove(path, rows)
        for path, rows, _ in files.added:
            self.add(path, rows)

    def remove(self, path: str, rows: int | None) -> None:
        if path in self.after:
            rows = self.after.pop(path)  # (counted as added: a remove may carry no statistics)
            self.between, self.after_rows = self.between + rows, self.after_rows - rows
        elif rows is None:
            self.derivable = False
        else:
            self.before += rows

    def add(self, path: str, rows: int | None) -> None:
        if rows is None or path in self.after:  # (a path added again without its remove)
            self.derivable = False
        else:
            self.after[path], self.after_rows = rows, self.after_rows + rows

    def read_rows(self) -> int:
        """The rows deriving the span at once reads whole: those of `before` and `after` (of `between`, only
        the identities)."""
        return self.before + self.after_rows

    def pays(self) -> bool:
        """Whether deriving the span at once reads less than commit by commit, which reads each file of
        `between` twice, whole (added, then removed), and compares each commit's rows on their own: where
        `between` holds at least as many rows as the files read either way, and enough to outweigh its plan."""
        return self.derivable and self.between >= max(self.read_rows(), AT_ONCE_FROM_ROWS, 1)


def table_file(location: str, path: str) -> str:
    """A table's file as ClickHouse's `_path` names it, from the log's name for it (relative or a `file:` URI):
    the absolute path of a local file, `bucket/key` of an object."""
    if urlsplit(path).scheme == "file":
        return urlsplit(unquote(path)).path
    parts = urlsplit(location)
    root = parts.path if parts.scheme == "file" else parts.netloc + parts.path if parts.scheme else location
    return f"{root.rstrip('/')}/{unquote(path)}"


@dataclass(frozen=True)
class Commit:
    """One commit as its log file records it."""

    version: int
    timestamp: datetime
    operation: str
    estimated_rows: int  # change rows it yields, from file statistics and metrics (an upper bound)
    parameters: dict[str, Any] = field(default_factory=dict, compare=False)
    metadata: bool = False  # carries a metaData action: a new schema or new table properties
    properties: dict[str, Any] | None = None  # the table properties of that metaData action
    files: Files | None = field(default=None, compare=False)  # None: not known (a share's answer)
    protocol: bool = False  # carries a protocol action: new table features
    rows_preserved: bool = False  # its writer kept the row ids and commit versions of rows it copied
    # every row of the data files it adds and removes (a file re-added with a new deletion vector once): what
    # deriving its changes from the log reads; 0 where not known
    file_rows: int = 0

    @property
    def timestamp_ms(self) -> int:
        """Its time in milliseconds since the epoch, as statements write it."""
        return int(self.timestamp.timestamp() * 1000)


class Changes(Protocol):
    """The change rows of whole versions [start, end], not yet read. Reading twice yields the same rows."""

    start: int
    end: int
    uri: str  # the table's identity (for messages)
    location: str  # where its files are (what a reader that reads files itself opens)
    schema: dict[str, Any]  # Spark JSON schema of the rows: user columns and CDF columns
    origin: str  # FEED or LOG

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

    def commits(self) -> list[Commit]:
        """The range's commits, oldest first, with their file actions where the source knows them (what a
        reader that derives the changes from the log's files itself reads)."""

    def properties(self) -> dict[str, str]:
        """The table properties at the range's end (empty where the source does not tell them)."""


@dataclass(frozen=True)
class RangeResult:
    start: int
    end: int
    rows: int
    committed: bool  # False: stopped before the range was complete; the offset must not move
