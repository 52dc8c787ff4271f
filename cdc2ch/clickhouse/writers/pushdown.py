"""Push-down writes: ClickHouse reads the Delta table itself; no row passes through Spark or Python.

`run --reader clickhouse` turns a version range into `INSERT ... SELECT` statements in which ClickHouse reads
the lake (rangereads.py, in the SQL of lakesql.py), with the row contract's SQL form; `snapshot --reader
clickhouse` reads a version's files the same way. Spark still plans: versions, schema, ranges and every
check come from the Delta log as before. Here: what this reader can read (a probe), and the writer that
sends a range's statements.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from cdc2ch.base import phases
from cdc2ch.base.errors import SinkError, SourceError
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection import compatibility
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.writers import Destination
from cdc2ch.clickhouse.writers.lakesql import (
    CDF_SETTING,
    VERSION_SETTING,
    insert_from_lake,
    lake_access,
    lake_function,
)
from cdc2ch.clickhouse.writers.rangereads import LakeRead, lake_reads
from cdc2ch.model import contract, schema
from cdc2ch.model.changeset import Changes, RangeResult
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState

# ClickHouse streams its own reads: a range's size only bounds what a crash makes it replay, and fewer,
# larger statements save it re-reading the Delta log for each.
RANGE_FACTOR = 10

# A probe decides between readers: where the store throttles or fails, it fails in seconds and `auto` keeps
# Spark, rather than wait through the S3 client's own retries (hundreds, by default) as a read would.
PROBE_SETTINGS = {"s3_retry_attempts": 2, "s3_max_single_read_retries": 2}


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
                    settings={**({} if read.source else read.settings), **insert_settings(read.token)},
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
        source = read.source or lake_function(rng.location, lake_access(self.cfg))
        commit = read.meta[0]  # (its first: the commit version, contract.WRITTEN_META)
        for key in self.cfg.primary_key:  # Delta's names: ClickHouse reads the lake
            null = f"{schema.quote(key)} IS NULL"
            where = f"{read.where} AND {null}" if read.where else f" WHERE {null}"
            with self.to.sink.reads_files():
                nulls, version = self.to.sink.query_rows(
                    f"SELECT count(), min({commit}) FROM {source}{where}",
                    what="count null keys",
                    settings={} if read.source else read.settings,
                )[0]
            if nulls:
                return contract.null_key_error(
                    nulls, key, version, f"versions {rng.start}..{rng.end} of {rng.uri}"
                )
        return None
