"""A range's changes derived from its Delta log, each commit read on its own (`--reader clickhouse`, a range
from the log).

A MERGE, UPDATE or DELETE that rewrites a file writes again every row it did not touch; one with deletion
vectors re-adds the file with a larger vector. logreads.py reads all of them, as inserts of the files added
and deletes of the files removed, and lets the rank sort them out: a MERGE changing 1% of a table's rows
writes its rewritten files' rows twice. Read per commit instead:
- inserts: the rows of the files it adds, less a file it re-adds (its rows are those it had, less the ones
  its new deletion vector deletes). Where the table tracks rows and the commit kept their values (the
  `delta.rowTracking.preserved` tag, every added file first added by it), a copied row keeps its commit
  version in the file (row tracking's materialized column) and a row the commit wrote has none (the file's
  default, the commit's own version): only the latter are read. Elsewhere the copies are written again, at
  the commit's version with the values they had, which changes nothing FINAL shows;
- deletes: the rows of the files it removes, as they were before it, whose key none of the rows it adds
  holds (a copied key is not touched; an updated one is written by its insert; a key-changing update leaves
  its old key here; a row a deletion vector deleted is held by no row).

Where the files alone tell (no deletion vector, partition values or column mapping, columns of plain types,
plain names at the table's root), each file is read as it is; elsewhere through the table at the commit's
version and the one before (ClickHouse's Delta reader applies vectors, partition values and names). A range
with change files (a feed) or a schema or feature change is left to logreads.py. Commits without a data
change (OPTIMIZE) read nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc2ch.clickhouse.writers.logreads import DELETE, INSERT, PLAIN_FILE, PLAIN_TYPES, plain_columns
from cdc2ch.model.changeset import Commit

# Where the table's files keep the commit versions of the rows a writer copied (Delta's row tracking)
VERSIONS_PROPERTY = "delta.rowTracking.materializedRowCommitVersionColumnName"
READ_TYPES = PLAIN_TYPES | {"timestamp", "timestamp_ntz"}  # read with the table's types, as deltaLake() does


@dataclass(frozen=True)
class CommitReads:
    """A range's reads, and whether its files can be read as they are (else at versions of the table)."""

    reads: list[CommitRead]
    as_files: bool


@dataclass(frozen=True)
class CommitRead:
    """One statement: the `change_type` rows of `files` (paths as the log names them), written by the commit
    at `version` (time `ts_ms`). Inserts: `own_rows`, only the rows of the commit's own version (row
    tracking's column tells, where the files are read as they are). Deletes: `against` names the files whose
    keys are left out (the commit's adds)."""

    version: int
    ts_ms: int
    change_type: str
    files: tuple[str, ...]
    against: tuple[str, ...] = ()
    own_rows: bool = False


def commit_reads(
    start: int, end: int, commits: list[Commit], fields: list[dict[str, Any]], properties: dict[str, str]
) -> CommitReads | None:
    """The reads of versions [start, end], or None where the range cannot be read so (see the module).
    `fields`: the table's columns (Spark's JSON schema's); `properties`: its table properties."""
    as_files = plain_columns(fields, READ_TYPES)
    versions_kept = bool(properties.get(VERSIONS_PROPERTY))
    known = {c.version: c for c in commits}
    reads: list[CommitRead] = []
    for v in range(start, end + 1):
        commit = known.get(v)
        files = commit.files if commit is not None else None
        if commit is None or files is None or commit.metadata or commit.protocol or files.change_files:
            return None
        removed = tuple(path for path, _, data_change in files.removed if data_change)
        added = tuple(path for path, _, data_change in files.added if data_change)
        new = tuple(path for path in added if path not in removed)
        as_files = as_files and not files.vectors and not files.partitioned
        as_files = as_files and all(PLAIN_FILE.fullmatch(p) for p in added + removed)
        ts_ms = commit.timestamp_ms
        if new:
            own = versions_kept and bool(removed) and commit.rows_preserved and files.tracked
            reads.append(CommitRead(v, ts_ms, INSERT, new, own_rows=own))
        if removed:
            reads.append(CommitRead(v, ts_ms, DELETE, removed, added))
    return CommitReads(reads, as_files)
