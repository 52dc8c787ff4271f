"""Push-down writes: ClickHouse reads the Delta table itself; no row passes through Spark or Python.

`run --reader clickhouse` turns a version range into one `INSERT ... SELECT` over ClickHouse's Delta table
function with `delta_lake_snapshot_start_version/end_version` (its change data feed), with the row
contract's SQL form; a range whose changes come from the log, into the reads of logreads.py, each an
`INSERT ... SELECT` of named files at one version (`delta_lake_snapshot_version`). `snapshot --reader
clickhouse` reads a version's files the same way. Spark still plans: versions, schema, ranges and every
check come from the Delta log as before.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from cdc2ch.base import phases
from cdc2ch.base.errors import SinkError, SourceError
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection import compatibility
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.writers import Destination
from cdc2ch.clickhouse.writers.logreads import INSERT, PLAIN_FILE, appends_only, file_reads
from cdc2ch.clickhouse.writers.trackedreads import VERSIONS_PROPERTY, tracked_reads
from cdc2ch.model import contract, schema
from cdc2ch.model.changeset import LOG, Changes, Commit, RangeResult
from cdc2ch.model.config import RunConfig
from cdc2ch.model.design import TableDesign
from cdc2ch.model.objectstore import S3Settings
from cdc2ch.model.records import PipelineState
from cdc2ch.model.tableref import is_local

# ClickHouse streams its own reads: a range's size only bounds what a crash makes it replay, and fewer,
# larger statements save it re-reading the Delta log for each.
RANGE_FACTOR = 10


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
# A probe decides between readers: where the store throttles or fails, it fails in seconds and `auto` keeps
# Spark, rather than wait through the S3 client's own retries (hundreds, by default) as a read would.
PROBE_SETTINGS = {"s3_retry_attempts": 2, "s3_max_single_read_retries": 2}


def cdf_settings(start: int, end: int) -> dict[str, int]:
    """Settings that make the lake function read the change data feed of versions start..end."""
    return {CDF_SETTING: start, "delta_lake_snapshot_end_version": end}


def files_where(paths: list[str]) -> str:
    """The WHERE clause that reads only the table's files `paths` (as its `_path` names them)."""
    return f" WHERE _path IN ({', '.join(schema.literal(p) for p in paths)})"


@dataclass(frozen=True)
class LakeRead:
    """One `INSERT ... SELECT` of a range: the WRITTEN_META expressions of its rows, what it reads of the lake
    (a WHERE clause, settings) and its deduplication token."""

    meta: list[str]
    where: str
    settings: dict[str, int]
    token: str
    # read at a version before the range whose first commit changes the schema: read the columns it has
    older_schema: bool = False
    # the files read as they are (files_function), else the lake function reads them
    source: str | None = None


def lake_reads(cfg: RunConfig, rng: Changes, local_files: bool = False) -> list[LakeRead]:
    """The statements that write the range: one read of its change data feed, or the reads of the files its
    commits add and remove (logreads.py; none where no commit changes data). A range that only appends is
    read from the files its commits add, as they are, where ClickHouse can read them so: the lake function
    would read the Delta log again (dozens of requests to an object store for one small commit) to find what
    the log already says."""
    commits = rng.commits()
    if appends_only(rng.start, rng.end, commits, schema.user_fields(rng.schema)):
        reads = _file_reads(cfg, rng, commits, local_files)
        if all(read.source for read in reads):
            return reads
    if rng.origin != LOG:
        token = contract.pushdown_range_token(cfg.pipeline, rng.start, rng.end)
        where = contract.sql_change_filter(cfg.immutable_keys)
        return [LakeRead(contract.sql_change_meta(), where, cdf_settings(rng.start, rng.end), token)]
    return _tracked_reads(cfg, rng, commits, local_files) or _file_reads(cfg, rng, commits, None)


def _tracked_reads(cfg: RunConfig, rng: Changes, commits: list[Commit], local_files: bool) -> list[LakeRead]:
    """The reads of trackedreads.py, each of files as they are, with the table's types; none where the range
    cannot be read so, or one of its reads names files ClickHouse cannot read as they are."""
    fields, properties = schema.user_fields(rng.schema), rng.properties()
    planned = tracked_reads(rng.start, rng.end, commits, fields, properties) or []
    if not planned:
        return []
    access = lake_access(cfg)
    structure = ", ".join(
        f"{schema.quote(f['name'])} {schema.clickhouse_type(f['type'], f.get('nullable', True), f['name'])}"
        for f in fields
    )
    versions = schema.quote(properties[VERSIONS_PROPERTY])
    reads = []
    for read in planned:
        if read.change_type == INSERT:
            source = files_function(
                rng.location,
                list(read.files),
                access,
                local_files,
                f"{structure}, {versions} Nullable(Int64)",
            )
            where = f" WHERE coalesce({versions}, {read.version}) = {read.version}"
        else:
            removed = files_function(rng.location, list(read.files), access, local_files, structure)
            added = files_function(rng.location, list(read.against), access, local_files, structure)
            if read.against and added is None:
                return []
            source = None if removed is None else _unheld(cfg, removed, added)
            where = ""
        if source is None:
            return []
        token = contract.pushdown_read_token(
            cfg.pipeline, rng.start, rng.end, f"{read.change_type}-tracked", read.version
        )
        meta = contract.sql_fixed_meta(read.version, read.ts_ms, read.change_type)
        reads.append(LakeRead(meta, where, {}, token, source=source))
    return reads


def _unheld(cfg: RunConfig, removed: str, added: str | None) -> str:
    """The rows of `removed` whose key no row of `added` holds (all of them without `added`): an anti-join,
    which ClickHouse runs in about half the time of a NOT IN over the same keys. A key's columns beyond the
    primary key may be NULL, and NULL matches NULL there, as a row's identity in the target."""
    if added is None:
        return removed
    identity = cfg.identity
    held = ", ".join(
        f"{schema.quote(cfg.design.source_name(c))} AS _held_{i}" for i, c in enumerate(identity.columns)
    )
    same = " AND ".join(
        f"{schema.quote(cfg.design.source_name(c))} = _held_{i}"
        if c in identity.primary_key
        else f"isNotDistinctFrom({schema.quote(cfg.design.source_name(c))}, _held_{i})"
        for i, c in enumerate(identity.columns)
    )
    return f"{removed} AS _removed LEFT ANTI JOIN (SELECT {held} FROM {added}) AS _held ON {same}"


def _file_reads(
    cfg: RunConfig, rng: Changes, commits: list[Commit], local_files: bool | None
) -> list[LakeRead]:
    """The reads of logreads.py, each of files named at a version of the lake function; with `local_files`
    given (a range of appends), each with the function that reads its files as they are, where there is one."""
    access = lake_access(cfg)
    schema_changed = any(c.version == rng.start and c.metadata for c in commits)
    reads = []
    for read in file_reads(rng.location, rng.start, rng.end, commits, rng.uri):
        # (each a plain name at the table's root: its `_path`'s last part)
        names = [p.rsplit("/", 1)[-1] for p, _, _ in read.files]
        source = None if local_files is None else files_function(rng.location, names, access, local_files)
        reads.append(
            LakeRead(
                contract.sql_files_meta("_path", read.files, read.change_type),
                files_where([path for path, _, _ in read.files]),
                {} if source else {VERSION_SETTING: read.version},
                contract.pushdown_read_token(
                    cfg.pipeline, rng.start, rng.end, read.change_type, read.version, read.part
                ),
                schema_changed and read.version < rng.start,
                source,
            )
        )
    return reads


class LakeFunctionReader:
    """What this target's own Delta reader can read (the loop's LakeReader port): the storage it reaches,
    whether the engine is new enough to read a change data feed, and, through `sink` (the target's), what it
    reads of a table (a probe)."""

    def __init__(self, has_setting: Callable[[str], bool], sink: Sink | None = None):
        self.has_setting, self.sink = has_setting, sink

    def lacks(self) -> str | None:
        return None if self.has_setting(CDF_SETTING) else f"the setting {CDF_SETTING}"

    def check(self, location: str, feed: bool) -> None:
        lake_function(location)
        if feed and not self.has_setting(CDF_SETTING):
            raise compatibility.missing_setting("--reader clickhouse", CDF_SETTING)

    def probe(self, cfg: RunConfig, location: str, version: int) -> dict[str, int]:
        if self.sink is None:
            raise SinkError("no ClickHouse target to probe")
        lake = lake_function(location, lake_access(cfg))
        with self.sink.reads_files():
            rows = self.sink.query_rows(
                f"SELECT _path, count() FROM {lake} GROUP BY _path",
                what=f"read {location} at version {version} (a probe of its reader)",
                settings={
                    VERSION_SETTING: version,
                    **{k: v for k, v in PROBE_SETTINGS.items() if self.has_setting(k)},
                },
            )
        return {str(path): int(count) for path, count in rows}

    def credentials(self, cfg: RunConfig) -> str:
        if cfg.lake_collection:
            return f"the credentials of the server's named collection {cfg.lake_collection}"
        if self.sink is not None and self.sink.task_client is not None:
            return "the server's own S3 settings"
        return "this process's S3 endpoint and AWS environment"


# How ClickHouse's Delta reader says a file it was sent to read is not there: the local and object-store
# errors of its Delta kernel and of its own file readers.
FILE_MISSING = ("not found", "No such file", "NoSuchKey", "FILE_DOESNT_EXIST", "does not exist")


def files_gone(text: str, location: str) -> bool:
    """Whether ClickHouse's read failed on a file of the table at `location` that is not there (VACUUM or
    log retention removed it): its error names a path under the table's and says it is missing."""
    prefix = unquote(urlsplit(location).path).strip("/")
    named = re.search(re.escape(prefix) + r"/\S*\.(parquet|json|bin)", text) if prefix else None
    return named is not None and any(missing in text for missing in FILE_MISSING)


def insert_settings(token: str) -> dict[str, int | str]:
    """A lake read inserted as every target insert is (a replay dropped), and a null key fails it instead of
    becoming 0 or ''."""
    return {"insert_null_as_default": 0, **contract.target_insert(token)}


class PushdownWriter:
    kind = "clickhouse"
    range_factor = RANGE_FACTOR
    collects = False  # ClickHouse reads the files

    def __init__(self, to: Destination):
        self.to, self.cfg = to, to.cfg

    def check(self, rng: Changes, estimate: int) -> None:
        """ClickHouse counts the range's null keys (one read of it, on a new pipeline's first range only)."""
        for read in lake_reads(self.cfg, rng, self.to.sink.one_process):
            try:
                found = self._null_keys_in_lake(rng, read)
            except SinkError as exc:
                refused = self._refusal(exc, rng)
                if refused is None:
                    raise
                raise refused from exc
            if found is not None:
                raise found

    def write(self, rng: Changes, state: PipelineState, estimate: int) -> RangeResult:
        """The range's INSERT ... SELECT statements (lake_reads), in which ClickHouse reads the lake itself.

        A replay sends the same statements with the same deduplication tokens; rows ClickHouse stores again
        anyway (its blocks need not repeat exactly) carry the same keys and versions, so FINAL is unchanged.
        """
        start, end = rng.start, rng.end
        t0 = time.monotonic()
        columns = [f["name"] for f in schema.user_fields(rng.schema)]
        before = self.to.sink.row_count(self.to.table_sql)
        reported = nbytes = 0
        for read in lake_reads(self.cfg, rng, self.to.sink.one_process):
            summary = self._insert(rng, columns, read)
            reported += int(getattr(summary, "written_rows", 0) or 0)
            nbytes += int((summary.written_bytes() if hasattr(summary, "written_bytes") else 0) or 0)
        # A server reports the rows written; the embedded engine does not, so count (a background merge
        # at the same moment can make this a little low; it only feeds the rows_written figure).
        rows = reported or max(self.to.sink.row_count(self.to.table_sql) - before, 0)
        seconds = time.monotonic() - t0
        phases.add("insert", seconds)  # ClickHouse's scans of the lake and its inserts
        self.to.metrics.batch(rows, nbytes, seconds)
        self.to.log.info(
            "batch", start=start, end=end, batch=0, rows=rows, reader="clickhouse", seconds=round(seconds, 3)
        )
        return RangeResult(start, end, rows, True)

    def _insert(self, rng: Changes, columns: list[str], read: LakeRead):
        """One statement of the range; its summary."""
        cfg, start, end = self.cfg, rng.start, rng.end
        try:
            absent = self._absent(rng, columns, read) if read.older_schema else set()
            sql = insert_from_lake(
                self.to.table_sql,
                read.source or lake_function(rng.location, lake_access(cfg)),
                columns,
                read.meta,
                read.where,
                cfg.design,
                absent,
            )
            with self.to.sink.reads_files():
                return self.to.sink.command(
                    sql,
                    what=f"read versions {start}..{end} of {rng.uri} into {self.to.table_sql}",
                    settings={**read.settings, **insert_settings(read.token)},
                )
        except SinkError as exc:
            refused = self._refusal(exc, rng)
            if refused is not None:
                raise refused from exc
            refused_null = (
                exc.code == codes.CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
            )  # in a key: others are Nullable
            found = self._null_keys_in_lake(rng, read) if refused_null else None
            if found is not None:
                raise found from exc
            raise

    def _refusal(self, exc: SinkError, rng: Changes) -> Exception | None:
        """What a failed read of `rng` by ClickHouse means to the user, where its error tells: the storage
        refused it, or files it needs are gone (VACUUM, log retention); None: the error as it is."""
        span = f"versions {rng.start}..{rng.end}"
        refused = self.to.storage_refusal(str(exc), rng.location, f"{span} (by ClickHouse)")
        if refused is None and files_gone(str(exc), rng.location):
            refused = contract.files_gone_error(rng.uri, span)
        return refused

    def _absent(self, rng: Changes, columns: list[str], read: LakeRead) -> set[str]:
        """The Delta names of `columns` the table did not have at the version `read` reads (a commit that
        changed the schema and removed files: they are read as they were before it)."""
        with self.to.sink.reads_files():
            described = self.to.sink.query_rows(
                f"DESCRIBE TABLE {lake_function(rng.location, lake_access(self.cfg))}",
                what="read the table's columns before a schema change",
                settings=read.settings,
            )
        had = {str(row[0]) for row in described}
        return {name for name in (self.cfg.design.source_name(c) for c in columns) if name not in had}

    def _null_keys_in_lake(self, rng: Changes, read: LakeRead) -> SourceError | None:
        """The insert failed on a null: count the null keys of `read` (on this error path only) to say where."""
        lake = lake_function(rng.location, lake_access(self.cfg))
        commit = read.meta[0]  # (its first: the commit version, contract.WRITTEN_META)
        for key in self.cfg.primary_key:  # Delta's names: ClickHouse reads the lake
            null = f"{schema.quote(key)} IS NULL"
            where = f"{read.where} AND {null}" if read.where else f" WHERE {null}"
            with self.to.sink.reads_files():
                nulls, version = self.to.sink.query_rows(
                    f"SELECT count(), min({commit}) FROM {lake}{where}",
                    what="count null keys",
                    settings=read.settings,
                )[0]
            if nulls:
                return contract.null_key_error(
                    nulls, key, version, f"versions {rng.start}..{rng.end} of {rng.uri}"
                )
        return None
