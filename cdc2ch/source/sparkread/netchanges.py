"""A range's changes derived at once: the files it found against those it leaves.

Derived commit by commit (cdfscan.scanned_changes, coarse), a range of copy-on-write MERGEs reads every file
each of them rewrites and compares each one's removed rows with its added ones: where every MERGE rewrites
every file, the table is read and compared once per commit. FINAL needs only the range's net effect, which
its files tell (FileSpan):
- `before`: the files it removes that were there before it. Their rows are what the target holds of them.
- `between`: the files it adds and removes again.
- `after`: the files it adds that are still there at its end.
A row of `after` is the last state of its key: an insert at the version that added its file. Where row
tracking keeps each row's last commit version through the copies, only the rows whose version falls in the
range changed, each at that version (an older one marks a row copied unchanged, which the target holds). A
row of `before` whose identity no row of `after` holds is gone: a tombstone with the values the target holds,
at the last commit that removed a file holding that identity (its delete; a key-changing update's old key
goes at the update): its own file's removal, or a later one of a file of `between`, whose identities alone
are read and matched with the gone ones. A key deleted and inserted again within the range is held at the
end, and its insert outranks what the target held; rows inserted and deleted within the range are not
written at all.

Only where no file of the range carries a deletion vector (a file's rows are then all it holds) and that
pays, which rowcopies.rewrites decides from the log (FileSpan); row versions are read only where every file
the range adds was first added by its commit (RESTORE re-adds old ones) and row tracking is on at its end (a
range never spans a metaData commit). Every removed file must give its partition values (checked here).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cdc2ch.model.contract import CDF_COLUMNS, spark_col
from cdc2ch.source.spark.scalaseqs import scala_seq
from cdc2ch.source.sparkread.rowcopies import Copies, file_actions

_ADD_FIELDS = ("path", "partitionValues", "size", "tags", "baseRowId", "defaultRowCommitVersion", "stats")
# The rows of `before` up to which the gone identities are sent whole to every task that reads `between`:
# they are at most as many (a bound known from the log, where a sort-merge join would shuffle all of between)
BROADCAST_GONE_UP_TO = 2_000_000


@dataclass(frozen=True)
class RangeFiles:
    """A range's files as AddFile actions (JVM objects): those removed that were there before it, those it
    added and removed, those it added that are there at its end; the version that removed each file of
    before and between, and that added each of after (by path, as the log names it)."""

    before: list
    between: list
    after: list
    removed_at: dict[str, int]
    added_at: dict[str, int]


def net_changes(spark, log, snapshot, frame, copies: Copies):
    """The net changes of `frame`'s range (Delta's coarse derivation over `log`, `snapshot` its end): its
    inserts and tombstones as above, in `frame`'s columns. None where a removed file does not say its
    partition values: the range is then derived commit by commit."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    jvm = spark._jvm
    first, last = min(copies.times), max(copies.times)
    files = _range_files(spark, log, first, last)
    if files is None:
        return None
    none = jvm.scala.Option.empty()

    def scan(found):
        return DataFrame(log.createDataFrame(snapshot, scala_seq(jvm, found), False, none), spark)

    # Each file's version looked up by its path, as the scan names it (one scan of all files: a union of
    # scans would have each joined alone)
    ops, root = jvm.org.apache.spark.sql.delta.util.DeltaFileOperations, log.dataPath().toString()

    def by_file(versions: dict[str, int], file: str = "_metadata.file_path"):
        pairs = [(ops.absolutePath(root, path).toUri().toString(), v) for path, v in versions.items()]
        return F.create_map(*[F.lit(x) for pair in pairs for x in pair])[F.col(file)]

    def removed(found):
        """The rows of removed files, with their file (`_gone_file`): `gone_at` tells the version that removed it,
        looked up once the joins have kept the few rows that need it (a lookup scans the map's keys)."""
        return scan(found).withColumn("_gone_file", F.col("_metadata.file_path"))

    gone_at = by_file(files.removed_at, "_gone_file")

    columns = [c for c in frame.columns if c not in CDF_COLUMNS]
    times = F.create_map(*[x for v, ts in copies.times.items() for x in (F.lit(v), F.lit(ts))])
    held = [f"_held_{i}" for i in range(len(copies.key))]
    as_held = [spark_col(c).alias(h) for c, h in zip(copies.key, held)]  # a row's identity, named `held`
    parts = []
    if files.after:
        ends = scan(files.after)
        rows_tracked = jvm.org.apache.spark.sql.delta.RowTracking.isEnabled(
            snapshot.protocol(), snapshot.metadata()
        )
        if copies.tracked and rows_tracked:
            version = F.col("_metadata.row_commit_version")
            changed = ends.where(version.between(first, last))
        else:
            version, changed = by_file(files.added_at), ends
        parts.append(
            changed.select(
                *[spark_col(c) for c in columns],
                F.lit("insert").alias("_change_type"),
                version.alias("_commit_version"),
                times[version].cast("timestamp").alias("_commit_timestamp"),
            )
        )
    if files.before:
        gone = removed(files.before)
        if files.after:
            kept = ends.select(*as_held)
            gone = gone.join(kept, _same(copies.key, held), "left_anti")
        gone = gone.withColumn("_gone_at", gone_at)
        if files.between:
            gone_keys = gone.select(*[spark_col(c) for c in copies.key])
            if copies.found_rows <= BROADCAST_GONE_UP_TO:
                gone_keys = F.broadcast(gone_keys)
            later = (
                removed(files.between)
                .select(*as_held, F.col("_gone_file"))
                .join(gone_keys, _same(copies.key, held), "left_semi")
                .groupBy(*held)
                .agg(F.max(gone_at).alias("_later"))
            )
            gone = gone.join(later, _same(copies.key, held), "left").withColumn(
                "_gone_at", F.coalesce(F.col("_later"), F.col("_gone_at"))
            )
        parts.append(
            gone.select(
                *[spark_col(c) for c in columns],
                F.lit("delete").alias("_change_type"),
                F.col("_gone_at").alias("_commit_version"),
                times[F.col("_gone_at")].cast("timestamp").alias("_commit_timestamp"),
            )
        )
    if not parts:  # every file it added it removed again: no row of it reached its end
        return frame.where(F.lit(False))
    return _union(parts).select(*[spark_col(c) for c in frame.columns])


def _union(frames):
    """The rows of every frame of `frames` (the same columns), one after another."""
    from functools import reduce

    return reduce(lambda a, b: a.unionByName(b), frames)


def _same(key, held):
    """Each identity column equal, null-safe, to its held copy (a sorting key's columns beyond the primary
    key may be null)."""
    from functools import reduce

    return reduce(lambda a, b: a & b, [spark_col(c).eqNullSafe(spark_col(h)) for c, h in zip(key, held)])


def _range_files(spark, log, start: int, end: int) -> RangeFiles | None:
    """The files of versions [start, end] (RangeFiles). None where a removed file does not say its partition
    values (written before removes kept them)."""
    added: dict = {}
    before: list = []
    between: list = []
    removed_at: dict[str, int] = {}
    added_at: dict[str, int] = {}
    for version, kind, action in file_actions(spark, log, start, end):
        if kind == "AddFile":
            added[action.path()], added_at[action.path()] = action, version
        elif kind == "RemoveFile":
            fields = json.loads(action.json())["remove"]
            if not fields.get("extendedFileMetadata"):
                return None
            removed_at[action.path()] = version
            (before if added.pop(action.path(), None) is None else between).append(_as_add(spark, fields))
    kept = {path: added_at[path] for path in added}
    return RangeFiles(before, between, list(added.values()), removed_at, kept)


def _as_add(spark, fields: dict):
    """A removed file (its RemoveFile's fields) as the AddFile that added it (its path, partition values,
    size and row ids), to be scanned: a RemoveFile cannot be."""
    add = {k: fields[k] for k in _ADD_FIELDS if k in fields} | {"modificationTime": 0, "dataChange": True}
    return spark._jvm.org.apache.spark.sql.delta.actions.Action.fromJson(json.dumps({"add": add}))
