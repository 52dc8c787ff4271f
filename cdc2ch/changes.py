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
