"""The rows a copy-on-write commit copied unchanged, left out of the changes derived from the log.

Derived from the log (cdfscan.scanned_changes, coarse), every row of a file a commit adds is an insert and
every row of a file it removes a delete: a MERGE, UPDATE or DELETE that rewrites a file writes again each row
it did not touch. Two ways to leave those copies out:
- marked: where the table tracks rows and the commit says it kept their row commit versions (the
  `delta.rowTracking.preserved` tag of its commitInfo), a row of an added file whose row commit version is not
  the commit's own was copied, unchanged, from a file the commit removed: only the rows of the commit's own
  version are inserts, and a removed row is a delete only where its key is among none of the rows the commit
  added (a copied key is not touched at all; an updated one is written by its insert). RESTORE, whose
  restored rows keep their old versions, is not marked.
- compared: elsewhere, a row that one commit both deletes and inserts with every column equal (NULL equal to
  NULL and NaN to NaN, as Spark groups) did not change: both are left out, in one aggregation of the derived
  rows. A key's other deletes and inserts stay, and the rank sorts them out as before. Where a column cannot
  be grouped (maps, variants), or the rewrites yield too few rows for the aggregation to pay, the copies
  stay in: written again at the commit's version with the values they had, which changes nothing FINAL
  shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cdc2ch.model import contract, schema
from cdc2ch.model.changeset import Commit, FileSpan
from cdc2ch.source.spark.scalaseqs import scala_seq

REWRITES = ("MERGE", "UPDATE", "DELETE")  # the operations that copy rows when they rewrite a file
# The rows a range's compared rewrites yield (their estimate) from which comparing them pays: below, the
# aggregation costs more than writing the copies again (docs/benchmarks.md, tables without a feed)
COMPARED_FROM_ROWS = 1_000_000


@dataclass(frozen=True)
class Copies:
    """What leaving out copies needs: the versions whose copies row tracking marks (each with its commit
    time), the columns that identify a row, and the other versions that rewrite files, whose copies are
    found by comparing rows."""

    versions: dict[int, datetime]
    key: tuple[str, ...]
    compared: frozenset[int] = frozenset()
    # every commit's time where the range's changes are derived at once (netchanges.py), else empty
    times: dict[int, datetime] = field(default_factory=dict)
    # every file the range adds tells its rows' commit versions (Files.tracked): the rows of those it keeps
    # whose version falls in the range are all it changed
    tracked: bool = False
    found_rows: int = 0  # the rows of the files it removes that were there before it (FileSpan.before)


def rewrites(commits: Sequence[Commit], key: Sequence[str]) -> Copies | None:
    """The commits among `commits` that may copy rows, or None: those that remove a file with a data change
    and add one they did not remove. Row tracking marks the copies of a MERGE, UPDATE or DELETE whose writer
    kept its values, where a key is known; other commits are compared where they removed a file whole (a
    file re-added with a larger deletion vector yields only the rows it newly deletes: no copies) and they
    yield enough rows for comparing to pay. Where deriving the whole range at once pays (FileSpan), it is
    derived so (netchanges.py), and its copies need neither."""
    versions: dict[int, datetime] = {}
    compared: set[int] = set()
    for c in commits:
        if c.files is None:
            continue  # file actions not known
        removed = {path for path, _, data_change in c.files.removed if data_change}
        added = {path for path, _, data_change in c.files.added if data_change}
        if not removed or not added - removed:
            continue
        if c.rows_preserved and c.operation in REWRITES and key:
            versions[c.version] = c.timestamp
        elif removed - added:
            compared.add(c.version)
    if sum(c.estimated_rows for c in commits if c.version in compared) < COMPARED_FROM_ROWS:
        compared.clear()  # few copies: written again
    # The range at once where its files tell its net effect and that pays (FileSpan)
    span = FileSpan.of(commits)
    times = {c.version: c.timestamp for c in commits} if key and span.pays() and not span.vectors else {}
    tracked = all(c.files is not None and c.files.tracked for c in commits)
    found = versions or compared or times
    return Copies(versions, tuple(key), frozenset(compared), times, tracked, span.before) if found else None


def without_copies(spark, log, snapshot, frame, copies: Copies):
    """`frame` (the changes derived from the log, Delta's coarse read over `log` with `snapshot`'s schema)
    with the copies of `copies` left out: those row tracking marks (_without_marked), then those of the other
    rewrites, found by comparing rows (_without_equal_pairs)."""
    if copies.versions:
        frame = _without_marked(spark, log, snapshot, frame, copies)
    return _without_equal_pairs(frame) if copies.compared else frame


def _without_marked(spark, log, snapshot, frame, copies: Copies):
    """`frame` with the copied rows of `copies.versions` left out: their inserts are the rows of the files
    they add whose row commit version is their own (read by Delta with row tracking's metadata column), their
    deletes the removed rows whose key none of those files holds. `frame` as it is when no added file of those
    versions tells its rows' versions (row tracking off)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    jvm = spark._jvm
    if not jvm.org.apache.spark.sql.delta.RowTracking.isEnabled(snapshot.protocol(), snapshot.metadata()):
        return frame  # (a range never spans a metaData commit: its end's properties are every commit's)
    adds = _new_files(spark, log, copies.versions)
    if not adds:
        return frame
    scanned = scala_seq(jvm, adds)
    added = DataFrame(log.createDataFrame(snapshot, scanned, False, jvm.scala.Option.empty()), spark)
    # A file a commit adds (a new path) was first added by it: its default row commit version is that commit's.
    version = F.col("_metadata.default_row_commit_version")
    times = F.create_map(*[x for v, ts in copies.versions.items() for x in (F.lit(v), F.lit(ts))])
    columns = [c for c in frame.columns if c not in contract.CDF_COLUMNS]
    inserts = added.where(F.col("_metadata.row_commit_version") == version).select(
        *[contract.spark_col(c) for c in columns],
        F.lit("insert").alias("_change_type"),
        version.alias("_commit_version"),
        times[version].cast("timestamp").alias("_commit_timestamp"),
    )
    # The keys each commit holds after it, null-safe (a sorting key's columns beyond the primary key may be
    # null), for the anti-join that keeps the removed rows whose key none holds. Not forced to a hash join:
    # one commit's keys cannot be split into smaller ranges, and a hash table that outgrows the driver's
    # memory fails where a sort spills; the session lets Spark hash where the partitions are small.
    held = added.select(
        *[contract.spark_col(c).alias(f"_held_{i}") for i, c in enumerate(copies.key)],
        version.alias("_held_version"),
    )
    same = [F.col("_commit_version") == F.col("_held_version")] + [
        contract.spark_col(c).eqNullSafe(F.col(f"_held_{i}")) for i, c in enumerate(copies.key)
    ]
    # One pass over `frame` (each of its scans plans with a Spark job): the inserts of those versions out,
    # the rest anti-joined with the keys they hold, which match only rows of those versions.
    copied = F.col("_commit_version").isin(list(copies.versions)) & (F.col("_change_type") == "insert")
    kept = frame.where(~copied).join(held, same, "left_anti")
    return kept.select(*[contract.spark_col(c) for c in frame.columns]).unionByName(inserts)


def _without_equal_pairs(frame):
    """`frame` without the rows a commit both deletes and inserts with every column equal: one aggregation
    by the commit and every column, counting each change type. `frame` as it is where a column cannot be
    grouped."""
    from pyspark.sql import functions as F

    if not groupable(frame.schema):
        return frame
    columns = [c for c in frame.columns if c not in contract.CDF_COLUMNS]
    change = F.col("_change_type")
    grouped = frame.groupBy(F.col("_commit_version"), *[contract.spark_col(c) for c in columns]).agg(
        F.max((change == "insert").cast("int")).alias("_inserted"),
        F.max((change == "delete").cast("int")).alias("_deleted"),
        F.first("_commit_timestamp").alias("_commit_timestamp"),
    )
    kept = grouped.where(F.col("_inserted") + F.col("_deleted") == 1)
    changed = F.when(F.col("_inserted") == 1, F.lit("insert")).otherwise(F.lit("delete"))
    return kept.select(
        *[contract.spark_col(c) if c != "_change_type" else changed.alias(c) for c in frame.columns]
    )


def groupable(struct) -> bool:
    """Whether Spark can group rows of `struct` (a StructType) by every column: not where a column holds a
    map or a variant, at any depth."""
    fields = struct.jsonValue()["fields"]
    return not any(schema.contains_type(f["type"], kind) for f in fields for kind in ("map", "variant"))


def _new_files(spark, log, versions: dict[int, datetime]) -> list:
    """The AddFile actions (JVM objects) with a data change of `versions` whose paths the same commit does not
    remove, each first added at its commit (its defaultRowCommitVersion); none at all when one of them has no
    row commit version (row tracking off at that commit)."""
    found = []
    for v in sorted(versions):
        adds, removed = [], set()
        for _, kind, action in file_actions(spark, log, v, v):
            if kind == "AddFile" and action.dataChange():
                adds.append(action)
            elif kind == "RemoveFile" and action.dataChange():
                removed.add(action.path())
        for add in adds:
            if add.path() in removed:
                continue  # re-added with a deletion vector: its rows are all copies
            first = add.defaultRowCommitVersion()
            if first.isEmpty() or first.get() != v or add.deletionVector() is not None:
                return []
            found.append(add)
    return found


def file_actions(spark, log, start: int, end: int) -> Iterator[tuple[int, str, Any]]:
    """The actions of versions [start, end] of `log` (Delta's JVM log), oldest first, each with its version
    and its class's name (AddFile, RemoveFile, ...)."""
    commits = log.getChanges(int(start), int(end), spark._jvm.scala.Option.empty(), False)
    while commits.hasNext():
        version_actions = commits.next()
        version = version_actions._1()
        if version > end:
            return
        actions = version_actions._2().iterator()
        while actions.hasNext():
            action = actions.next()
            yield version, action.getClass().getSimpleName(), action
