"""A range's changes derived from its Delta log, each commit read from its own files as they are (`--reader
clickhouse`, a range from the log whose files need nothing from the log to be read).

A MERGE, UPDATE or DELETE that rewrites a file writes again every row it did not touch. logreads.py reads all
of them, as inserts of the files added and deletes of the files removed, and lets the rank sort them out: a
MERGE changing 1% of a table's rows writes its rewritten files' rows twice. Read per commit instead:
- inserts: the rows of the files it adds. Where the table tracks rows and the commit kept their values (the
  `delta.rowTracking.preserved` tag, every added file first added by it), a copied row keeps its commit
  version in the file (row tracking's materialized column) and a row the commit wrote has none (the file's
  default, the commit's own version): only the latter are read. Elsewhere the copies are written again, at
  the commit's version with the values they had, which changes nothing FINAL shows;
- deletes: the rows of the files it removes whose key none of the rows it adds holds (a copied key is not
  touched; an updated one is written by its insert; a key-changing update leaves its old key here).

Only where the files alone tell: no deletion vector (added or removed), no change files, no partition values
or column mapping, no schema or feature change, plain names at the table's root, and columns of plain types.
Commits without a data change (OPTIMIZE) read nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cdc2ch.clickhouse.writers.logreads import DELETE, INSERT, PLAIN_FILE, PLAIN_TYPES
from cdc2ch.model.changeset import Commit

# Where the table's files keep the commit versions of the rows a writer copied (Delta's row tracking)
VERSIONS_PROPERTY = "delta.rowTracking.materializedRowCommitVersionColumnName"
READ_TYPES = PLAIN_TYPES | {"timestamp", "timestamp_ntz"}  # read with the table's types, as deltaLake() does


@dataclass(frozen=True)
class CommitRead:
    """One statement: the `change_type` rows of `files` (names at the table's root), written by the commit at
    `version` (time `ts_ms`). Inserts: `own_rows`, only the rows of the commit's own version (row tracking's
    column tells). Deletes: `against` names the files whose keys are left out (the commit's adds)."""

    version: int
    ts_ms: int
    change_type: str
    files: tuple[str, ...]
    against: tuple[str, ...] = ()
    own_rows: bool = False


def commit_reads(
    start: int, end: int, commits: list[Commit], fields: list[dict[str, Any]], properties: dict[str, str]
) -> list[CommitRead] | None:
    """The reads of versions [start, end], or None where the range cannot be read so (see the module).
    `fields`: the table's columns (Spark's JSON schema's); `properties`: its table properties."""
    if "delta.columnMapping" in json.dumps(fields) or not all(_plain(f.get("type")) for f in fields):
        return None
    versions_kept = bool(properties.get(VERSIONS_PROPERTY))
    known = {c.version: c for c in commits}
    reads: list[CommitRead] = []
    for v in range(start, end + 1):
        commit = known.get(v)
        files = commit.files if commit is not None else None
        if commit is None or files is None or commit.metadata or commit.protocol:
            return None
        if files.change_files or files.vectors or files.partitioned:
            return None
        added = tuple(path for path, _, data_change in files.added if data_change)
        removed = tuple(path for path, data_change in files.removed if data_change)
        if not all(PLAIN_FILE.fullmatch(p) for p in added + removed):
            return None
        ts_ms = int(commit.timestamp.timestamp() * 1000)
        if added:
            own = versions_kept and bool(removed) and commit.rows_preserved and files.tracked
            reads.append(CommitRead(v, ts_ms, INSERT, added, own_rows=own))
        if removed:
            reads.append(CommitRead(v, ts_ms, DELETE, removed, added))
    return reads


def _plain(kind: Any) -> bool:
    return isinstance(kind, str) and (kind in READ_TYPES or kind.startswith("decimal("))
