"""Push-down writes: ClickHouse reads the Delta table itself; no row passes through Spark or Python.

`run --reader clickhouse` turns a version range into one `INSERT ... SELECT` over ClickHouse's Delta table
function with `delta_lake_snapshot_start_version/end_version` (its change data feed), with the row
contract's SQL form; `snapshot --reader clickhouse` reads a version's files the same way. Spark still
plans: versions, schema, ranges and every check come from the Delta log as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from cdc2ch.base import phases
from cdc2ch.base.errors import SinkError, SourceError
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection import compatibility
from cdc2ch.clickhouse.writers import Destination
from cdc2ch.model import contract, schema
from cdc2ch.model.changeset import Changes, RangeResult
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
        f"(credentials from the server's own S3 settings). Use the default --reader spark for this table."
    )


def insert_from_lake(
    table_sql: str,
    uri: str,
    columns: list[str],
    meta: list[str],
    where: str = "",
    design: TableDesign | None = None,
    access: LakeAccess | None = None,
) -> str:
    """INSERT ... SELECT of the user columns (target names) read from the lake (by their Delta names, which
    `design` knows), followed by the expressions of `meta` for contract.WRITTEN_META."""
    cols = ", ".join(schema.quote(c) for c in columns)
    read = ", ".join(schema.quote(design.source_name(c) if design else c) for c in columns)
    return (
        f"INSERT INTO {table_sql} ({cols}, {', '.join(contract.WRITTEN_META)}) "
        f"SELECT {read}, {', '.join(meta)} FROM {lake_function(uri, access)}{where}"
    )


CDF_SETTING = "delta_lake_snapshot_start_version"  # a server without it cannot read a change data feed


def cdf_settings(start: int, end: int) -> dict[str, int]:
    """Settings that make the lake function read the change data feed of versions start..end."""
    return {CDF_SETTING: start, "delta_lake_snapshot_end_version": end}


class LakeFunctionReader:
    """What this target's own Delta reader can read (the loop's LakeReader port): the storage it reaches, and
    whether the engine is new enough to read a change data feed."""

    def __init__(self, has_setting: Callable[[str], bool]):
        self.has_setting = has_setting

    def lacks(self) -> str | None:
        return None if self.has_setting(CDF_SETTING) else f"the setting {CDF_SETTING}"

    def check(self, location: str, feed: bool) -> None:
        lake_function(location)
        if feed and not self.has_setting(CDF_SETTING):
            raise compatibility.missing_setting("--reader clickhouse", CDF_SETTING)


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
        found = self._null_keys_in_lake(rng)
        if found is not None:
            raise found

    def write(self, rng: Changes, state: PipelineState, estimate: int) -> RangeResult:
        """One INSERT ... SELECT in which ClickHouse reads the range's change data feed itself.

        A replay sends the same statement with the same deduplication token; rows ClickHouse stores again
        anyway (its blocks need not repeat exactly) carry the same keys and versions, so FINAL is unchanged.
        """
        cfg, start, end = self.cfg, rng.start, rng.end
        t0 = time.monotonic()
        columns = [f["name"] for f in schema.user_fields(rng.schema)]
        before = self.to.sink.row_count(self.to.table_sql)
        sql = insert_from_lake(
            self.to.table_sql,
            rng.location,
            columns,
            contract.sql_change_meta(),
            contract.sql_change_filter(cfg.immutable_keys),
            cfg.design,
            lake_access(cfg),
        )
        token = contract.pushdown_range_token(cfg.pipeline, start, end)
        try:
            with self.to.sink.reads_files():
                summary = self.to.sink.command(
                    sql,
                    what=f"read versions {start}..{end} of {rng.uri} into {self.to.table_sql}",
                    settings={**cdf_settings(start, end), **insert_settings(token)},
                )
        except SinkError as exc:
            refused = self.to.storage_refusal(
                str(exc), rng.location, f"versions {start}..{end} (by ClickHouse)"
            )
            if refused is not None:
                raise refused from exc
            refused_null = (
                exc.code == codes.CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
            )  # in a key: others are Nullable
            found = self._null_keys_in_lake(rng) if refused_null else None
            if found is not None:
                raise found from exc
            raise
        # A server reports the rows written; the embedded engine does not, so count (a background merge
        # at the same moment can make this a little low; it only feeds the rows_written figure).
        rows = int(getattr(summary, "written_rows", 0) or 0) or max(
            self.to.sink.row_count(self.to.table_sql) - before, 0
        )
        seconds = time.monotonic() - t0
        phases.add("insert", seconds)  # ClickHouse's scan of the lake and its insert, in one statement
        nbytes = summary.written_bytes() if hasattr(summary, "written_bytes") else 0
        self.to.metrics.batch(rows, int(nbytes or 0), seconds)
        self.to.log.info(
            "batch", start=start, end=end, batch=0, rows=rows, reader="clickhouse", seconds=round(seconds, 3)
        )
        return RangeResult(start, end, rows, True)

    def _null_keys_in_lake(self, rng: Changes) -> SourceError | None:
        """The insert failed on a null: count the null keys (on this error path only) to say where."""
        lake = lake_function(rng.location, lake_access(self.cfg))
        for key in self.cfg.primary_key:  # Delta's names: ClickHouse reads the lake
            with self.to.sink.reads_files():
                nulls, version = self.to.sink.query_rows(
                    f"SELECT count(), min(_commit_version) FROM {lake} WHERE {schema.quote(key)} IS NULL",
                    what="count null keys",
                    settings=cdf_settings(rng.start, rng.end),
                )[0]
            if nulls:
                return contract.null_key_error(
                    nulls, key, version, f"versions {rng.start}..{rng.end} of {rng.uri}"
                )
        return None
