"""Change Data Feed rows -> ClickHouse rows (design.md section 3).

Each CDF row becomes one target row versioned `_commit_version * 4 + rank`:

    insert, update_postimage, snapshot row  -> live row   (_is_deleted = 0), rank 3
    delete                                  -> tombstone  (_is_deleted = 1), rank 2
    update_preimage                         -> tombstone  (_is_deleted = 1), rank 1

ReplacingMergeTree(_version, _is_deleted) then keeps, per key, the state after the last commit that
touched it: a key deleted and re-inserted in one commit is alive, the old key of a key-changing UPDATE
is gone, an ordinary UPDATE's pre-image is outranked by its post-image. No per-key work in Spark.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from cdc2ch.errors import SourceError

RANK = {"insert": 3, "update_postimage": 3, "snapshot": 3, "delete": 2, "update_preimage": 1}
DELETED = ("delete", "update_preimage")


def spark_col(name: str):
    """A top-level column by its exact name, even with dots or backticks in it."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def to_table_rows(cdf, immutable_keys: bool = False):
    """Spark DataFrame of CDF rows -> DataFrame in the target table's layout (user columns + metadata)."""
    from pyspark.sql import functions as F

    change = F.col("_change_type")
    if immutable_keys:  # the caller promises updates never change key columns: pre-images are redundant
        cdf = cdf.where(change != F.lit("update_preimage"))
    rank = F.when(change == "update_preimage", 1).when(change == "delete", 2).otherwise(3)
    user = [
        spark_col(c) for c in cdf.columns if c not in ("_change_type", "_commit_version", "_commit_timestamp")
    ]
    return cdf.select(
        *user,
        F.col("_commit_version").cast("long").alias("_commit_version"),
        F.col("_commit_timestamp"),
        change.alias("_change_type"),
        change.isin(*DELETED).cast("byte").alias("_is_deleted"),
        (F.col("_commit_version").cast("long") * 4 + rank).alias("_version"),
    )


def snapshot_rows(snapshot, version: int, timestamp_ms: int):
    """Spark DataFrame of a table at `version` -> target layout: live rows at that version."""
    from pyspark.sql import functions as F

    return snapshot.select(
        *[spark_col(c) for c in snapshot.columns],
        F.lit(int(version)).cast("long").alias("_commit_version"),
        F.timestamp_millis(F.lit(int(timestamp_ms))).alias("_commit_timestamp"),
        F.lit("snapshot").alias("_change_type"),
        F.lit(0).cast("byte").alias("_is_deleted"),
        F.lit(int(version) * 4 + RANK["snapshot"]).cast("long").alias("_version"),
    )


def replay_order(rows: pa.Table, primary_key: tuple[str, ...]) -> pa.Array:
    """Row indices in a deterministic order, so a replayed range produces the same batches (and dedup
    tokens match). Indices, not a sorted copy: batches are taken from them one at a time."""
    return pc.sort_indices(
        rows, sort_keys=[("_version", "ascending")] + [(k, "ascending") for k in primary_key]
    )


def check_keys(rows: pa.Table, primary_key: tuple[str, ...], where: str) -> None:
    """ClickHouse would silently turn a null key into 0 or '' and merge unrelated rows: refuse instead."""
    for key in primary_key:
        nulls = rows.column(key).null_count
        if nulls:
            sample = rows.filter(pc.is_null(rows.column(key))).slice(0, 1)
            version = (
                sample.column("_commit_version")[0].as_py() if "_commit_version" in rows.column_names else "?"
            )
            raise null_key_error(nulls, key, version, where)


def null_key_error(nulls: int, key: str, version, where: str) -> SourceError:
    return SourceError(
        f"{nulls} row(s) in {where} have a null in primary-key column {key!r} (first at version "
        f"{version}). A key must identify a row: choose non-null key columns for --primary-key, or fix "
        f"the rows in Delta and replicate from after that version."
    )


def batch_token(prefix: str, batch: pa.Table) -> str:
    """Insert deduplication token: the batch's place plus a digest of its content, so a replay of the
    same rows is dropped while different rows (another --batch-size, --immutable-keys) never are."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_table(batch)
    return f"{prefix}:{hashlib.sha1(sink.getvalue()).hexdigest()[:20]}"


def batches(rows: pa.Table, batch_size: int, order: pa.Array | None = None):
    """Insert batches of at most batch_size rows: zero-copy slices, or taken in `order` one batch at a time."""
    for offset in range(0, rows.num_rows, batch_size):
        yield rows.slice(offset, batch_size) if order is None else rows.take(order.slice(offset, batch_size))


def duplicate_keys(
    rows: pa.Table, primary_key: tuple[str, ...], order: pa.Array, limit: int = 10
) -> list[dict]:
    """Keys written live more than once by one commit: the Delta table holds duplicate keys, and
    ClickHouse will keep only one of those rows. One summary per version (at most `limit`).

    In replay `order` such rows sit next to each other: one vectorised comparison of each row with the
    next finds them, and only the rare tables that have some pay for the summary.
    """
    rows = rows.select(["_commit_version", "_version", "_is_deleted", *primary_key]).take(order)
    n = rows.num_rows
    if n < 2:
        return []
    head, tail = rows.slice(0, n - 1), rows.slice(1)
    repeat = pc.and_(
        pc.equal(head.column("_version"), tail.column("_version")), pc.equal(tail.column("_is_deleted"), 0)
    )
    for key in primary_key:
        repeat = pc.and_(repeat, pc.equal(head.column(key), tail.column(key)))
    if not pc.any(repeat).as_py():
        return []
    extra = tail.filter(repeat).select(["_commit_version", *primary_key])  # one row per surplus copy
    counts = extra.group_by(["_commit_version", *primary_key]).aggregate([([], "count_all")])
    out = []
    for version in sorted(pc.unique(counts.column("_commit_version")).to_pylist())[:limit]:
        group = counts.filter(pc.equal(counts.column("_commit_version"), version))
        out.append(
            {
                "version": version,
                "duplicate_keys": group.num_rows,
                "extra_rows": int(pc.sum(group.column("count_all")).as_py()),
                "example_key": {k: str(group.column(k)[0].as_py()) for k in primary_key},
            }
        )
    return out
