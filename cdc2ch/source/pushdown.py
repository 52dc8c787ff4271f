"""ClickHouse reading the Delta table itself: no row passes through Spark or Python.

`run --reader clickhouse` turns a version range into one `INSERT ... SELECT` over ClickHouse's Delta table
function with `delta_lake_snapshot_start_version/end_version` (its change data feed), applying the same
row rules as `changes.to_table_rows`; `snapshot --reader clickhouse` reads a version's files the same way.
Spark still plans: versions, schema, ranges and every check come from the Delta log as before.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from cdc2ch import changes, schema
from cdc2ch.errors import SourceError

CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def lake_function(uri: str) -> str:
    """The ClickHouse table function that reads this Delta table itself."""
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return f"deltaLakeLocal({schema.literal(unquote(parts.path))})"
    if parts.scheme in ("s3", "s3a"):
        url = f"https://{parts.netloc}.s3.amazonaws.com{parts.path.rstrip('/')}/"
        return f"deltaLake({schema.literal(url)})"
    if parts.scheme in ("http", "https"):
        return f"deltaLake({schema.literal(uri.rstrip('/') + '/')})"
    raise SourceError(
        f"--reader clickhouse cannot read {uri}: ClickHouse reads local paths and S3/HTTP(S) URLs "
        f"(credentials from the server's own S3 settings). Use the default --reader spark for this table."
    )


def insert_from_lake(table_sql: str, uri: str, columns: list[str], meta: list[str], where: str = "") -> str:
    """INSERT ... SELECT of the user columns read from the lake, followed by the five expressions of `meta`
    for _commit_version, _commit_timestamp, _change_type, _is_deleted and _version."""
    cols = ", ".join(schema.quote(c) for c in columns)
    return (
        f"INSERT INTO {table_sql} ({cols}, _commit_version, _commit_timestamp, _change_type, _is_deleted, "
        f"_version) SELECT {cols}, {', '.join(meta)} FROM {lake_function(uri)}{where}"
    )


def cdf_insert(table_sql: str, uri: str, columns: list[str], immutable_keys: bool) -> str:
    """INSERT ... SELECT of a CDF range (set by the delta_lake_snapshot_*_version settings) in target layout.

    Same rules as changes.to_table_rows: tombstones for deletes and pre-images, _version = version * 4 + rank.
    """
    rank = ", ".join(f"_change_type = {schema.literal(t)}, {r}" for t, r in changes.RANK.items() if r < 3)
    deleted = ", ".join(schema.literal(t) for t in changes.DELETED)
    meta = [
        "toUInt64(_commit_version)",
        "toDateTime64(_commit_timestamp, 3, 'UTC')",
        "_change_type",
        f"toUInt8(_change_type IN ({deleted}))",
        f"toUInt64(_commit_version) * 4 + multiIf({rank}, {changes.RANK['insert']})",
    ]
    where = " WHERE _change_type != 'update_preimage'" if immutable_keys else ""
    return insert_from_lake(table_sql, uri, columns, meta, where)


def cdf_settings(start: int, end: int) -> dict[str, int]:
    """Settings that make the lake function read the change data feed of versions start..end."""
    return {"delta_lake_snapshot_start_version": start, "delta_lake_snapshot_end_version": end}
