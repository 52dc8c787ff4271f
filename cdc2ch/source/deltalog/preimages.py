"""Which commits of a range need none of their update pre-images: those where every pre-image has another
row of its key in the same commit, which outranks it (contract.py), so FINAL never shows it.

Told from the key columns and `_change_type` of the commits' change files, read by pyarrow while Spark plans
the range: the JVM then leaves those pre-images out of the scan instead of converting rows (half of an update's)
that the writers would leave out anyway. A key-changing update keeps its pre-image, the tombstone that
removes the old key. Where the files cannot tell (a key in partition values or under column mapping, a file
unreadable), no commit is named and every pre-image is read, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from cdc2ch.model.changeset import Commit, table_file
from cdc2ch.model.contract import PREIMAGE
from cdc2ch.source.deltalog.logstate import TableState

# A commit with more change rows than this is read with its pre-images: telling would hold its keys in this
# process (about 30 bytes a row with the lookup) while Spark reads, where a range's rows are bounded.
MAX_TOLD_ROWS = 5_000_000


def _readable_key(state: TableState, key: tuple[str, ...]) -> bool:
    """Whether the change files hold `key` under its own names: no column mapping (physical names differ),
    no key column among the partition columns (kept in the paths, not the files)."""
    if not key or state.properties.get("delta.columnMapping.mode", "none") != "none":
        return False
    partitions = set(state.metadata.get("partitionColumns") or ())
    fields = {f["name"] for f in state.schema.get("fields", ())}
    return all(k in fields and k not in partitions for k in key)


def needless(
    location: str, state: TableState, commits: Iterable[Commit], key: tuple[str, ...]
) -> frozenset[int]:
    """The versions among `commits` whose every update pre-image another row of its key in the same commit
    outranks (a commit without change files has no pre-images); `state` is the table's at the last of
    them. A commit that cannot be told is left out; all are where the files cannot tell."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not _readable_key(state, key):
        return frozenset()
    found = set()
    for commit in commits:
        if commit.files is None or commit.estimated_rows > MAX_TOLD_ROWS:
            continue
        paths = [table_file(location, p) for p in commit.files.change_files]
        if not paths:
            found.add(commit.version)
            continue
        try:
            rows = pa.concat_tables(
                pq.read_table(p, columns=[*key, "_change_type"], read_dictionary=["_change_type"])
                for p in paths
            )
        except (OSError, pa.ArrowException, KeyError):
            continue
        pre = pc.equal(rows.column("_change_type"), pa.scalar(PREIMAGE))
        images, others = rows.filter(pre).select(list(key)), rows.filter(pc.invert(pre)).select(list(key))
        if _all_met(images, others):
            found.add(commit.version)
    return frozenset(found)


def _all_met(images: pa.Table, others: pa.Table) -> bool:
    """Whether every row of `images` has its key among `others`' (a null key is never met)."""
    import pyarrow.compute as pc

    if images.num_rows == 0:
        return True
    if images.num_columns == 1:  # one column: a hash set, a quarter of a join's time on W2
        met = pc.is_in(images.column(0), value_set=others.column(0).combine_chunks(), skip_nulls=True)
        return pc.all(met).as_py() is True
    names = images.column_names
    return images.join(others.group_by(names).aggregate([]), names, join_type="left anti").num_rows == 0


def left_out(start: int, end: int, needless: frozenset[int]) -> tuple[bool, frozenset[int]]:
    """Which pre-images a read of versions [start, end] leaves out, given the `needless` versions: (True, {})
    for all of them, when no commit of the range needs its own; else (False, the versions whose it leaves
    out). A filter on the change type alone names no version: a service's reads, one per poll, plan the same
    code each time, which Spark compiles once (a filter naming the versions was new code, compiled again on
    every poll), and the scan tests one column per row instead of two (W5 `run --once` 13.98 -> 12.64 s,
    medians of five alternating runs: bench/results.md)."""
    if needless >= frozenset(range(start, end + 1)):
        return True, frozenset()
    return False, needless
