"""How ClickHouse reads a Delta table itself, as SQL: the table function that reads it through its log
(ClickHouse's Delta reader), the functions that read named data files as they are, the settings that pick a
version or a change data feed, and the `INSERT ... SELECT` that writes what they read into a target."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from cdc2ch.base.errors import SourceError
from cdc2ch.clickhouse.writers.logreads import PLAIN_FILE
from cdc2ch.model import contract, schema
from cdc2ch.model.config import RunConfig
from cdc2ch.model.design import TableDesign
from cdc2ch.model.objectstore import S3Settings
from cdc2ch.model.tableref import is_local


@dataclass(frozen=True)
class LakeAccess:
    """How ClickHouse reaches an object-storage table: the S3 endpoint and addressing the other readers use,
    and a named collection on the server holding the credentials (None: its own S3 settings; the embedded
    engine reads with the process's AWS environment)."""

    s3: S3Settings = field(default_factory=S3Settings)
    collection: str | None = None


def lake_access(cfg: RunConfig) -> LakeAccess:
    """A pipeline's: its Spark conf's S3 settings, then the process environment's, and its collection."""
    return LakeAccess(S3Settings.of(dict(cfg.spark.conf), os.environ), cfg.lake_collection)


def lake_function(uri: str, access: LakeAccess | None = None) -> str:
    """The ClickHouse table function that reads this Delta table itself."""
    parts = urlsplit(uri)
    access = access or LakeAccess()
    if is_local(uri):
        return f"deltaLakeLocal({schema.literal(unquote(parts.path))})"
    if parts.scheme in ("s3", "s3a"):
        url = schema.literal(access.s3.http_url(uri))
        return f"deltaLake({access.collection}, url = {url})" if access.collection else f"deltaLake({url})"
    if parts.scheme in ("http", "https"):
        return f"deltaLake({schema.literal(uri.rstrip('/') + '/')})"
    raise SourceError(
        f"--reader clickhouse cannot read {uri}: ClickHouse reads local paths and S3/HTTP(S) URLs "
        f"(credentials from the server's own S3 settings). Use --reader spark, or auto (the default), for this table."
    )


# Files one statement reads as they are; a read of more goes through the lake function
DIRECT_FILES = 100


def files_function(
    location: str, paths: list[str], access: LakeAccess, local_files: bool, structure: str | None = None
) -> str | None:
    """What reads the table's data files `paths` (plain names at its root) as they are, where ClickHouse can:
    `s3()` of an object store's table, `file()` of a local one on the embedded engine (a server reads only its
    own files directory); None where it cannot. Each file is named alone, never in a glob: a glob skips a file
    that is not there, and a file vacuumed away must fail the read, not leave its rows out. With `structure`
    (ClickHouse's `name type, ...`), each file is read with those columns (one a file lacks reads as NULL),
    else with those the file has."""
    if not paths or len(paths) > DIRECT_FILES or not all(PLAIN_FILE.fullmatch(p) for p in paths):
        return None
    parts = urlsplit(location)
    if is_local(location):
        if not local_files:
            return None
        root = unquote(parts.path).rstrip("/")
        shape = f", {schema.literal(structure)}" if structure else ""
        reads = [f"file({schema.literal(root + '/' + name)}, 'Parquet'{shape})" for name in paths]
    elif parts.scheme in ("s3", "s3a"):
        root = access.s3.http_url(location).rstrip("/")
        urls = [schema.literal(root + "/" + name) for name in paths]
        named = f", structure = {schema.literal(structure)}" if structure else ""
        shape = f", {schema.literal(structure)}" if structure else ""
        reads = [
            f"s3({access.collection}, url = {url}, format = 'Parquet'{named})"
            if access.collection
            else f"s3({url}, 'Parquet'{shape})"
            for url in urls
        ]
    else:
        return None
    if len(reads) == 1:
        return reads[0]
    return "(" + " UNION ALL ".join(f"SELECT *, _path FROM {read}" for read in reads) + ")"


def insert_from_lake(
    table_sql: str,
    source: str,
    columns: list[str],
    meta: list[str],
    where: str = "",
    design: TableDesign | None = None,
    absent: Collection[str] = (),
) -> str:
    """INSERT ... SELECT of the user columns (target names) read from `source`, the table function that reads
    the lake (lake_function, or files_function for files as they are), by their Delta names, which `design`
    knows (NULL for those `absent` from the version read), followed by the expressions of `meta` for
    contract.WRITTEN_META."""
    cols = ", ".join(schema.quote(c) for c in columns)
    names = [design.source_name(c) if design else c for c in columns]
    read = ", ".join("NULL" if name in absent else schema.quote(name) for name in names)
    return (
        f"INSERT INTO {table_sql} ({cols}, {', '.join(contract.WRITTEN_META)}) "
        f"SELECT {read}, {', '.join(meta)} FROM {source}{where}"
    )


CDF_SETTING = "delta_lake_snapshot_start_version"  # a server without it cannot read a change data feed
VERSION_SETTING = "delta_lake_snapshot_version"  # the table as of a version (older servers have it too)


def cdf_settings(start: int, end: int) -> dict[str, int]:
    """Settings that make the lake function read the change data feed of versions start..end."""
    return {CDF_SETTING: start, "delta_lake_snapshot_end_version": end}


def files_where(paths: list[str]) -> str:
    """The WHERE clause that reads only the table's files `paths` (as its `_path` names them)."""
    return f" WHERE _path IN ({', '.join(schema.literal(p) for p in paths)})"
