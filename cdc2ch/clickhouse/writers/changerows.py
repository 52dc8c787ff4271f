"""Rows in the target layout (contract.py), as Arrow, on their way into insert batches: the rows a later one
of the same key outranks left out, a deterministic replay order, batches cut from it, and the keys one
commit wrote twice.

`key` is always the columns of the row's identity (identity.Identity.columns): the sorting key and the
partition columns, not the primary key alone. A null in a sorting column never makes two rows the same here
(so nothing is left out on its account: the safe side)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import pyarrow as pa
import pyarrow.compute as pc

from cdc2ch.model.contract import POSTIMAGE


@dataclass(frozen=True)
class Prepared:
    """A range's rows ready to insert, and what was found on the way."""

    rows: pa.Table  # without the rows another row of their key outranks
    order: pa.UInt64Array  # replay order of `rows`
    duplicates: list[dict[str, Any]]  # duplicate_keys()
    across: dict[str, Any] | None  # repeated_across_commits(), when asked for


def prepare(rows: pa.Table, key: tuple[str, ...], across_commits: bool) -> Prepared:
    """One sort by key serves the duplicate checks and finds the outranked rows, all three from the same
    neighbouring rows; a second sort orders what is left for replay (one sort in all when the rows share one
    `_version`, as a snapshot's do)."""
    by_key = key_order(rows, key)
    pairs = _neighbours(rows, key, by_key, updates=across_commits)
    duplicates = _duplicates(pairs, key)
    span = pc.min_max(rows.column("_version"))
    if span["min"].as_py() == span["max"].as_py():  # nothing outranked; key order is replay order
        return Prepared(rows, by_key, duplicates, None)
    across = _repeats(pairs, key) if across_commits else None
    kept = _latest(by_key, pairs)
    if kept is None:
        return Prepared(rows, _by_version(rows, by_key), duplicates, across)
    rows = rows.take(kept)  # in key order
    return Prepared(rows, _by_version(rows), duplicates, across)


def key_order(rows: pa.Table, key: tuple[str, ...]) -> pa.UInt64Array:
    """Row indices by key, then `_version`: each key's rows next to each other, oldest first (stable)."""
    return pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in key] + [("_version", "ascending")])


Pairs: TypeAlias = "tuple[pa.Table, pa.Table, pa.ChunkedArray[pa.BooleanScalar]] | None"


def _neighbours(rows: pa.Table, key: tuple[str, ...], order: pa.UInt64Array, updates: bool = False) -> Pairs:
    """Each row beside the next one in `order`: (head, tail, whether their keys are equal), over the key and
    metadata columns, and with `updates` whether each row is an update's post-image (`_update`, for
    _repeats); None for fewer than two rows. The checks below compare neighbours this way."""
    cols = rows.select([*key, "_commit_version", "_version", "_is_deleted"])
    if updates:
        cols = cols.append_column("_update", pc.equal(rows.column("_change_type"), pa.scalar(POSTIMAGE)))
    cols = cols.take(order)
    n = cols.num_rows
    if n < 2:
        return None
    head, tail = cols.slice(0, n - 1), cols.slice(1)
    same = pc.equal(head.column(key[0]), tail.column(key[0]))
    for column in key[1:]:
        same = pc.and_(same, pc.equal(head.column(column), tail.column(column)))
    return head, tail, same  # type: ignore[return-value]  # pyarrow-stubs: on ChunkedArrays, a ChunkedArray


def _latest(by_key: pa.UInt64Array, pairs: Pairs) -> pa.UInt64Array | None:
    """Which rows to write: those no row of the same key and a higher `_version` outranks (docs/design.md,
    "The row contract"), as indices in `by_key` order; None when that is all of them. FINAL would never show
    an outranked row, so it need not be written. An ordinary update's pre-image goes (its post-image outranks
    it), a key-changing update's stays (no row of its key outranks it), and so does every row of a key's newest
    `_version`, repeats included, in their order. Primary keys are not null here; `pairs` are the rows' neighbours in
    `by_key` order."""
    if pairs is None:
        return None
    head, tail, same = pairs
    older = pc.less(head.column("_version"), tail.column("_version"))
    outranked: pa.ChunkedArray[pa.BooleanScalar]
    outranked = pc.fill_null(pc.and_(same, older), False)  # type: ignore[arg-type]  # stubs lack ChunkedArrays
    if not pc.any(outranked).as_py():
        return None
    return by_key.filter(pc.invert(pa.concat_arrays([outranked.combine_chunks(), pa.array([False])])))


def latest_in_place(rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """`rows` without the outranked ones (`_latest`), the rest in the order they came in: an executor task's
    partition, which holds every row of its keys, already in replay order."""
    by_key = key_order(rows, key)
    kept = _latest(by_key, _neighbours(rows, key, by_key))
    return rows if kept is None else rows.take(pc.take(kept, pc.sort_indices(kept)))


def _by_version(rows: pa.Table, by_key: pa.UInt64Array | None = None) -> pa.UInt64Array:
    """replay_order of `rows`, which `by_key` puts in key order (None: they are in it): a stable sort by
    `_version` alone keeps that order among equal versions, the same indices as sorting by `_version` and the
    key, at a tenth of the cost."""
    if by_key is None:
        return pc.sort_indices(rows.column("_version"))
    return pc.take(by_key, pc.sort_indices(pc.take(rows.column("_version"), by_key)))


def replay_order(rows: pa.Table, key: tuple[str, ...]) -> pa.UInt64Array:
    """Row indices in a deterministic order, so a replayed range produces the same batches (and dedup
    tokens match). Indices, not a sorted copy: batches are taken from them one at a time."""
    return pc.sort_indices(rows, sort_keys=[("_version", "ascending"), *[(k, "ascending") for k in key]])


def batches(rows: pa.Table, batch_size: int, order: pa.UInt64Array | None = None) -> Iterator[pa.Table]:
    """Insert batches of about batch_size rows: the rows cut into round(rows / batch_size) batches of equal
    size (one when fewer), from half to one and a half times batch_size each, so that no insert carries a
    remainder alone (a streamed range comes a Spark task's rows at a time: 100,000 rows were an insert of
    80,000 and one of 20,000, each a part to write and merge). Zero-copy slices, or taken in `order` one
    batch at a time."""
    n = rows.num_rows
    count = max(1, round(n / batch_size))
    cuts = [n * i // count for i in range(count + 1)] if n else []
    for first, end in zip(cuts, cuts[1:]):
        yield rows.slice(first, end - first) if order is None else rows.take(order.slice(first, end - first))


def duplicate_keys(
    rows: pa.Table, key: tuple[str, ...], order: pa.UInt64Array, limit: int = 10
) -> list[dict[str, Any]]:
    """Keys written live more than once by one commit: the Delta table holds duplicate keys, and
    ClickHouse will keep only one of those rows. One summary per version (at most `limit`).

    In key or replay `order` such rows sit next to each other: one vectorised comparison of each row with the
    next finds them, and only the rare tables that have some pay for the summary.
    """
    return _duplicates(_neighbours(rows, key, order), key, limit)


def _duplicates(pairs: Pairs, key: tuple[str, ...], limit: int = 10) -> list[dict[str, Any]]:
    if pairs is None:
        return []
    head, tail, same = pairs
    repeat = pc.and_(
        pc.and_(same, pc.equal(head.column("_version"), tail.column("_version"))),
        pc.equal(tail.column("_is_deleted"), pa.scalar(0)),
    )
    if not pc.any(repeat).as_py():
        return []
    extra = tail.filter(repeat).select(["_commit_version", *key])  # one row per surplus copy
    counts = extra.group_by(["_commit_version", *key]).aggregate([([], "count_all")])
    out = []
    versions = cast("list[int]", pc.unique(counts.column("_commit_version")).to_pylist())  # never null
    for version in sorted(versions)[:limit]:
        group = counts.filter(pc.equal(counts.column("_commit_version"), pa.scalar(version)))
        out.append(
            {
                "version": version,
                "duplicate_keys": group.num_rows,
                "extra_rows": int(pc.sum(group.column("count_all")).as_py()),
                "example_key": {k: str(group.column(k)[0].as_py()) for k in key},
            }
        )
    return out


def repeated_across_commits(rows: pa.Table, key: tuple[str, ...]) -> dict[str, Any] | None:
    """Keys written live by one commit and live again by a later one with no delete or update pre-image in
    between: an insert never replaces a row in Delta, so each such repeat is one more row with that key in
    the table, and ClickHouse will keep one per key. Found within `rows` (one read range); None if none.

    An update's post-image is never counted: its pre-image, the tombstone in between, may have been left out
    of the read (source/deltalog/preimages.py). Costs one sort of the key columns, and only when the rows span commits.
    """
    versions = rows.column("_commit_version")
    if rows.num_rows < 2 or pc.min(versions).as_py() == pc.max(versions).as_py():
        return None
    return _repeats(_neighbours(rows, key, key_order(rows, key), updates=True), key)


def _repeats(pairs: Pairs, key: tuple[str, ...]) -> dict[str, Any] | None:
    """repeated_across_commits over neighbours paired with `updates`."""
    if pairs is None:
        return None
    head, tail, same = pairs
    repeat = pc.and_(
        pc.and_(same, pc.equal(head.column("_is_deleted"), pa.scalar(0))),
        pc.and_(
            pc.and_(pc.equal(tail.column("_is_deleted"), pa.scalar(0)), pc.invert(tail.column("_update"))),
            pc.not_equal(head.column("_commit_version"), tail.column("_commit_version")),
        ),
    )
    if not pc.any(repeat).as_py():
        return None
    extra = tail.filter(repeat)
    keys = extra.group_by(list(key)).aggregate([])
    return {
        "duplicate_keys": keys.num_rows,
        "extra_rows": extra.num_rows,
        "first_version": pc.min(extra.column("_commit_version")).as_py(),
        "last_version": pc.max(extra.column("_commit_version")).as_py(),
        "example_key": {k: str(extra.column(k)[0].as_py()) for k in key},
    }
