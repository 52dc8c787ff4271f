"""Rows in the target layout (contract.py), as Arrow, on their way into insert batches: a deterministic
replay order, batches cut from it, and the keys one commit wrote twice."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def replay_order(rows: pa.Table, primary_key: tuple[str, ...]) -> pa.Array:
    """Row indices in a deterministic order, so a replayed range produces the same batches (and dedup
    tokens match). Indices, not a sorted copy: batches are taken from them one at a time."""
    return pc.sort_indices(
        rows, sort_keys=[("_version", "ascending")] + [(k, "ascending") for k in primary_key]
    )


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


def repeated_across_commits(rows: pa.Table, primary_key: tuple[str, ...]) -> dict | None:
    """Keys written live by one commit and live again by a later one with no delete or update pre-image in
    between: an insert never replaces a row in Delta, so each such repeat is one more row with that key in
    the table, and ClickHouse will keep one per key. Found within `rows` (one read range); None if none.

    Needs the rows' update pre-images (tombstones): without them (--immutable-keys) an update looks the same,
    so callers do not ask then. Costs one sort of the key columns, and only when the rows span commits.
    """
    versions = rows.column("_commit_version")
    if rows.num_rows < 2 or pc.min(versions).as_py() == pc.max(versions).as_py():
        return None
    cols = rows.select([*primary_key, "_version", "_is_deleted", "_commit_version"])
    cols = cols.take(
        pc.sort_indices(cols, sort_keys=[(k, "ascending") for k in primary_key] + [("_version", "ascending")])
    )
    head, tail = cols.slice(0, cols.num_rows - 1), cols.slice(1)
    repeat = pc.and_(
        pc.and_(pc.equal(head.column("_is_deleted"), 0), pc.equal(tail.column("_is_deleted"), 0)),
        pc.not_equal(head.column("_commit_version"), tail.column("_commit_version")),
    )
    for key in primary_key:
        repeat = pc.and_(repeat, pc.equal(head.column(key), tail.column(key)))
    if not pc.any(repeat).as_py():
        return None
    extra = tail.filter(repeat)
    keys = extra.group_by(list(primary_key)).aggregate([])
    return {
        "duplicate_keys": keys.num_rows,
        "extra_rows": extra.num_rows,
        "first_version": pc.min(extra.column("_commit_version")).as_py(),
        "last_version": pc.max(extra.column("_commit_version")).as_py(),
        "example_key": {k: str(extra.column(k)[0].as_py()) for k in primary_key},
    }
