"""The files of a Delta Sharing answer, planned on the driver and read in Spark tasks.

`plan_files` turns the file actions of a `/changes` or `/query` answer into one row per file (pure, no
JVM); `reader` builds the function `mapInArrow` runs: each task downloads its files from their pre-signed
URLs (no Authorization header: the URL is the credential) and yields Arrow batches in the table's schema,
partition columns and, for changes, `_change_type`, `_commit_version` and `_commit_timestamp`. No per-row
Python: whole columns are cast, constants repeated.

The change rule is Delta's (and the protocol's): a version with `cdf` files is exactly those files' rows
(each carries `_change_type`); a version without is its `add` files as inserts and `remove` files as
deletes.

Standard library and pyarrow only: Spark ships this module by value to executors where cdc2ch is not
installed. Its downloads retry in a plain loop, not through cdc2ch.base.retry: tenacity shipped by value into a
Python worker that Spark reuses can meet a copy imported there by reference, and one copy's retry loop then
fails to recognise the other's attempt objects.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request

import pyarrow as pa

# What a task raises for a file URL the storage refuses (expired or revoked): the driver asks the server
# for fresh URLs and reads the range again.
EXPIRED = "CDC2CH_SHARING_URL_EXPIRED"
FILE_ATTEMPTS = 5
MAX_WAIT = 30.0  # seconds between two downloads of a file at most, whatever Retry-After asks
FILE_SCHEMA = (
    "url string, id string, version long, timestamp long, change string, partition string, size long"
)


def file_actions(lines: list[dict]) -> list[tuple[str, dict]]:
    """(kind, action) of every add/remove/cdf/file line."""
    return [(k, line[k]) for line in lines for k in ("add", "remove", "cdf", "file") if k in line]


def plan_files(lines: list[dict], snapshot: bool = False) -> list[dict]:
    """One row per file to read, in a stable order (version, then file id): the same answer, whatever the
    order of its lines or the URLs of its files, plans the same rows and the same partitions."""
    actions = file_actions(lines)
    with_cdf = {a.get("version") for kind, a in actions if kind == "cdf"}
    rows = []
    for kind, a in actions:
        if snapshot:
            if kind != "file":
                continue
            change = None
        elif kind == "cdf":
            change = None  # the file's own _change_type column
        elif kind in ("add", "remove") and a.get("version") not in with_cdf:
            change = "insert" if kind == "add" else "delete"
        else:
            continue
        rows.append(
            {
                "url": a["url"],
                "id": str(a.get("id") or a["url"].split("?")[0]),
                "version": int(a.get("version") or 0),
                "timestamp": int(a.get("timestamp") or 0),
                "change": change,
                "partition": json.dumps(a.get("partitionValues") or {}, sort_keys=True),
                "size": int(a.get("size") or 0),
            }
        )
    return sorted(rows, key=lambda r: (r["version"], r["change"] or "", r["id"]))


def tasks_for(rows: list[dict], bytes_per_task: int = 64 << 20, max_tasks: int = 1024) -> int:
    """Spark partitions for these files: a few files (about `bytes_per_task`) per task."""
    total = sum(r["size"] for r in rows)
    return max(1, min(len(rows), max_tasks, -(-total // bytes_per_task)))


def records(action: dict) -> int | None:
    try:
        return int(json.loads(action.get("stats") or "{}")["numRecords"])
    except (KeyError, TypeError, ValueError):
        return None


def partition_array(value: str | None, target: pa.DataType, n: int) -> pa.Array:
    """A partition value (serialized as the protocol says: text, empty for null) as `n` values."""
    if value is None or value == "":
        return pa.nulls(n, target)  # type: ignore[call-overload]  # pyarrow-stubs: any DataType is taken
    base = pa.array([value] * n, pa.string())
    if pa.types.is_timestamp(target):
        return base.cast(pa.timestamp("us")).cast(target)
    if pa.types.is_boolean(target):
        return pa.array([value.lower() == "true"] * n, pa.bool_())
    return base.cast(target)


class Transient(Exception):
    """A download worth another attempt: throttled, a server error, or no answer; `retry_after`: the seconds
    the storage asked to wait (or None)."""

    def __init__(self, what: str, retry_after: float | None = None):
        super().__init__(what)
        self.retry_after = retry_after


def fetch(url: str, attempts: int = FILE_ATTEMPTS, sleep=time.sleep, base: float = 0.5) -> bytes:
    """The bytes at a pre-signed URL, in up to `attempts` downloads: after failed download n, a pause of half
    the capped backoff min(base * 2**(n-1), MAX_WAIT) plus a random share of the other half, or the storage's
    Retry-After when longer (up to MAX_WAIT). A refused URL (401, 403, 404, 410: expired or revoked) raises
    EXPIRED at once, for the driver to ask the server for fresh ones."""
    for attempt in range(1, max(1, attempts) + 1):
        try:
            return _download(url)
        except Transient as exc:
            if attempt >= attempts:
                raise
            backoff = min(base * 2 ** (attempt - 1), MAX_WAIT)
            wait = backoff / 2 + random.uniform(0, backoff / 2)
            if exc.retry_after is not None:
                wait = min(max(wait, exc.retry_after), MAX_WAIT)
            sleep(wait)
    raise AssertionError("unreachable")


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=120) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403, 404, 410):
            raise RuntimeError(f"{EXPIRED}: HTTP {exc.code} on a shared file") from None
        wait = exc.headers.get("Retry-After") if exc.headers is not None else None
        raise Transient(f"HTTP {exc.code}", float(wait) if wait and wait.isdigit() else None) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise Transient(str(getattr(exc, "reason", exc))) from None


def reader(target: pa.Schema, columns: list[str], snapshot: bool):
    """The function for `mapInArrow`: batches of file rows (FILE_SCHEMA) -> batches of `target`, whose
    first `columns` are the table's columns (then the CDF columns unless `snapshot`)."""
    to_partition, download = partition_array, fetch

    def convert(batch: pa.RecordBatch, row: dict) -> pa.RecordBatch:
        n = batch.num_rows
        by_name = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        parts = json.loads(row["partition"])
        arrays = []
        for name in columns:
            field = target.field(name)
            if name.lower() in by_name:
                arrays.append(batch.column(by_name[name.lower()]).cast(field.type, safe=False))
            elif name in parts:
                arrays.append(to_partition(parts[name], field.type, n))
            else:  # a column added after this file was written
                arrays.append(pa.nulls(n, field.type))
        if not snapshot:
            if row["change"] is None:
                arrays.append(batch.column(by_name["_change_type"]).cast(pa.string()))
            else:
                arrays.append(pa.array([row["change"]] * n, pa.string()))
            arrays.append(pa.array([row["version"]] * n, pa.int64()))
            ts = pa.array([row["timestamp"] * 1000] * n, pa.int64()).cast(pa.timestamp("us"))
            arrays.append(ts.cast(target.field("_commit_timestamp").type))
        return pa.RecordBatch.from_arrays(arrays, schema=target)

    def read(batches):
        import pyarrow.parquet as pq

        for files in batches:
            for row in files.to_pylist():
                data = pq.ParquetFile(pa.BufferReader(download(row["url"])))
                for batch in data.iter_batches(batch_size=65536):
                    yield convert(batch, row)

    return read
