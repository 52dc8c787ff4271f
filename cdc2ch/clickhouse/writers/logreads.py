"""A range's changes derived from its Delta log as ClickHouse reads of the table's files (`--reader clickhouse`
for a range from the log, model/changeset.py LOG), Delta's own derivation: the rows of each data file a commit
adds with a data change are inserts at that commit, the rows of each file it removes with one are deletes at
it, each file read as it was then (its deletion vector applied). A file re-added with a new deletion vector is
read twice, its rows before as deletes and after as inserts; the insert outranks the delete within a commit
(model/contract.py), so exactly the rows of the difference end deleted.

Each read of a file holds over a span of versions: an added file from its commit to the one before the commit
that removes it (or the range's end), a removed file from its add (or the version before the range) to the one
before its removal. A statement reads, at one version, files of one change type whose spans hold there; the
fewest such versions (the stabbing points of the spans, each the end of one) make the fewest statements: a
range of appends is one read at its end, and only versions the per-commit reads would read are read. A
statement names its files four times (which to read, each one's commit version, time and rank), and ClickHouse
parses at most `max_query_size` (256 KiB by default) of it: a read of more files is cut into parts.

Where deriving a range at once pays (model/changeset.FileSpan), net_reads tells the reads of its net effect
instead: the files there at its end, those it found, and those it added and removed again. Deletion vectors
need nothing more: each read of a file is at a version, as it was then, and a file re-added with a larger
vector is found (its rows before) and there at the end (its rows after); the rows it deleted are the found
ones whose key the end does not hold.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cdc2ch.base.errors import SourceError
from cdc2ch.model.changeset import Commit, FileSpan, table_file

INSERT, DELETE = "insert", "delete"
# A data file at the table's root whose name needs no escaping in a URL, a path or a glob
PLAIN_FILE = re.compile(r"[A-Za-z0-9._=-]+")
# A statement's files: each name counts its length and FILE_BYTES (quotes, its commit version and time); four
# times that (the names are in its WHERE and in its metadata) stays within max_query_size with room to spare.
PART_BYTES, FILE_BYTES = 50_000, 12


@dataclass(frozen=True)
class FileRead:
    """One statement: the rows of `files` read at `version` as `change_type`; each file as (its `_path`, the
    version of the commit whose change it is, that commit's time in milliseconds)."""

    version: int
    change_type: str
    files: tuple[tuple[str, int, int], ...]
    part: int = 0  # of the reads at `version` of `change_type` (a long list of files cut into parts)


@dataclass(frozen=True)
class _Span:
    first: int  # the first version at which the file is as the read needs it
    last: int  # the last one
    path: str
    commit: int
    ts_ms: int


def file_reads(location: str, start: int, end: int, commits: list[Commit], uri: str) -> list[FileRead]:
    """The reads that derive the changes of versions [start, end] from `commits` (their file actions), for the
    table at `location` (`uri` names it in messages). SourceError where a commit of the range is missing or its
    file actions unknown."""
    known = {c.version: c for c in commits if start <= c.version <= end}
    unknown = [v for v in range(start, end + 1) if v not in known or known[v].files is None]
    if unknown:
        raise SourceError(
            f"The changes of versions {start}..{end} of {uri} cannot be derived from its Delta log by "
            f"ClickHouse: the file actions of version {unknown[0]} are not known (its commit is no longer in "
            f"the log, or the source does not name its files). Replicate this table with --reader spark, or "
            f"resync it with `cdc2ch snapshot --reset` and continue from there."
        )
    spans: dict[str, list[_Span]] = {INSERT: [], DELETE: []}
    added: dict[str, tuple[int, int, bool]] = {}  # path -> (version, ts_ms, data change) of its live add
    for v in range(start, end + 1):
        commit, ts_ms = known[v], known[v].timestamp_ms
        files = commit.files
        assert files is not None  # (checked above)
        for path, _, data_change in files.removed:  # the state before this commit: before its adds
            at = added.pop(path, None)
            if at is not None and at[2]:
                spans[INSERT].append(_Span(at[0], v - 1, path, at[0], at[1]))
            if data_change:
                spans[DELETE].append(_Span(start - 1 if at is None else at[0], v - 1, path, v, ts_ms))
        for path, _, data_change in files.added:
            added[path] = (v, ts_ms, data_change)
    for path, (v, ts_ms, data_change) in added.items():
        if data_change:
            spans[INSERT].append(_Span(v, end, path, v, ts_ms))
    return [
        read
        for change_type in (INSERT, DELETE)
        for read in _grouped(spans[change_type], change_type, location)
    ]


@dataclass(frozen=True)
class NetReads:
    """A range's files as deriving its changes at once reads them (source/sparkread/netchanges.py tells how),
    each file with the version whose change it is: `after`, the files there at its end, read at its end, each
    at the version that added it; `before`, those it removed that were there before it, read at the version
    before it, each at the version that removed it; `between`, the reads (at versions where they are there) of
    those it added and removed again, each at the version that removed it."""

    after: FileRead | None
    before: FileRead | None
    between: list[FileRead]


def net_reads(location: str, start: int, end: int, commits: list[Commit]) -> NetReads | None:
    """The reads that derive versions [start, end] at once, from `commits` (their file actions); None where
    deriving them so does not pay or cannot be done (FileSpan: files or their rows not known), the range
    begins with a schema change and removes files from before it (they have other columns), or its files are
    too many to name in one statement."""
    known = {c.version: c for c in commits if start <= c.version <= end}
    chosen = [known[v] for v in range(start, end + 1) if v in known]
    if len(chosen) != end - start + 1 or not FileSpan.of(chosen).pays():
        return None
    spans: dict[str, list[_Span]] = {"before": [], "between": [], "after": []}
    added: dict[str, tuple[int, int]] = {}  # path -> (version, ts_ms) of its add
    for commit in chosen:
        v, ts_ms = commit.version, commit.timestamp_ms
        assert commit.files is not None  # (FileSpan.derivable)
        for path, _, _ in commit.files.removed:  # (data change or not: what is there is what counts)
            at = added.pop(path, None)
            kind, first = ("before", start - 1) if at is None else ("between", at[0])
            spans[kind].append(_Span(first, v - 1, path, v, ts_ms))
        for path, _, _ in commit.files.added:
            added[path] = (v, ts_ms)
    spans["after"] = [_Span(v, end, path, v, ts_ms) for path, (v, ts_ms) in added.items()]
    if spans["before"] and chosen[0].metadata:
        return None  # (the files before a schema change have other columns)
    if sum(len(s.path.encode()) + FILE_BYTES for found in spans.values() for s in found) > PART_BYTES:
        return None
    reads = {
        kind: _grouped(found, INSERT if kind == "after" else DELETE, location)
        for kind, found in spans.items()
    }
    # (`before` all there before the range, `after` all at its end: one read each)
    return NetReads(next(iter(reads["after"]), None), next(iter(reads["before"]), None), reads["between"])


def _grouped(spans: list[_Span], change_type: str, location: str) -> list[FileRead]:
    """The fewest versions at which every span holds at one of them (the greedy by earliest end is optimal
    for intervals), each with the files read there. A file's spans of one change type never overlap, so no
    read names a file twice."""
    groups: list[tuple[int, list[_Span]]] = []
    for span in sorted(spans, key=lambda s: (s.last, s.first, s.path)):
        if not groups or span.first > groups[-1][0]:
            groups.append((span.last, []))
        groups[-1][1].append(span)
    return [
        FileRead(at, change_type, files, part)
        for at, group in groups
        for part, files in enumerate(
            _parts([(table_file(location, s.path), s.commit, s.ts_ms) for s in group])
        )
    ]


def _parts(files: list[tuple[str, int, int]]) -> list[tuple[tuple[str, int, int], ...]]:
    """`files` in consecutive parts of at most PART_BYTES each (a longer name alone)."""
    parts: list[list[tuple[str, int, int]]] = [[]]
    size = 0
    for file in files:
        weight = len(file[0].encode()) + FILE_BYTES
        if parts[-1] and size + weight > PART_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(file)
        size += weight
    return [tuple(p) for p in parts]


def appends_only(start: int, end: int, commits: list[Commit], fields: list[dict[str, Any]]) -> bool:
    """Whether every commit of versions [start, end] only adds files, so that its changes are the rows of
    those files and nothing else, and the files can be read as they are, without the Delta log: no file
    removed or rewritten, no change files, no deletion vectors, no schema or feature change, no partition
    values (which live in the log) and no column mapping (whose physical names do); each file at the table's
    root with a plain name; columns of types a Parquet file holds as Delta reads them (no timestamps, which
    a file may hold as INT96, and no nested types). Either reader's change feed yields exactly these rows as
    inserts. `fields`: the table's columns (Spark's JSON schema's)."""
    known = {c.version: c for c in commits}
    for v in range(start, end + 1):
        commit = known.get(v)
        files = commit.files if commit is not None else None
        if commit is None or files is None or commit.metadata or commit.protocol:
            return False
        if files.removed or files.change_files or files.vectors or files.partitioned:
            return False
        if not all(PLAIN_FILE.fullmatch(path) for path, _, _ in files.added):
            return False
    return plain_columns(fields, PLAIN_TYPES)


PLAIN_TYPES = {"string", "long", "integer", "short", "byte", "double", "float", "boolean", "date", "binary"}


def plain_columns(fields: list[dict[str, Any]], types: set[str]) -> bool:
    """Whether a file's columns are the table's as they are: no column mapping (physical names differ), and
    every column of one of `types` or a decimal."""
    if "delta.columnMapping" in json.dumps(fields):
        return False
    kinds = [f.get("type") for f in fields]
    return all(isinstance(k, str) and (k in types or k.startswith("decimal(")) for k in kinds)
