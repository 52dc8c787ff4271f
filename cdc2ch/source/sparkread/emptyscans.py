"""The scans Delta plans into a derived range that can yield no row, left out of the plan before it runs.

Derived from the log (cdfscan.scanned_changes, coarse), a file a commit re-adds with another deletion vector
is read twice: once for the rows the new vector marks and the old did not (deletes), once for the rows the
old marks and the new does not (inserts, as a RESTORE brings back). Delta plans both for every such file and
version, each keeping only the rows of a vector built for it. Where a vector only grows, as every DELETE,
UPDATE and MERGE through deletion vectors makes it, the second vector marks no row: its scan reads the whole
file to return nothing. Those scans are dropped from the range's union; a scan whose vectors mark any row
stays, so the rows are those Delta's plan gives.
"""

from __future__ import annotations

from cdc2ch.base.log import get_logger
from cdc2ch.source.spark.scalaseqs import python_list, scala_seq

log = get_logger("cdc2ch.source")

_RELATION = "org.apache.spark.sql.execution.datasources.LogicalRelation"
_UNION = "org.apache.spark.sql.catalyst.plans.logical.Union"


def without_empty_scans(spark, frame):
    """`frame` (Delta's coarse read of a range) without the scans whose deletion vectors mark no row to keep;
    `frame` as it is where its plan is not Delta's union of scans, or no scan is empty."""
    from pyspark.sql import DataFrame

    jvm = spark._jvm
    try:
        plan = frame._jdf.queryExecution().logical()
        if plan.getClass().getName() != _UNION:
            return frame
        children = python_list(plan.children())
        kept = [child for child in children if not _empty(child)]
        if len(kept) == len(children):
            return frame
        union = plan.copy(scala_seq(jvm, kept), plan.byName(), plan.allowMissingCol())
        return DataFrame(_dataset(jvm).ofRows(spark._jsparkSession, union), spark)
    except Exception as exc:  # another Delta or Spark plans it otherwise: only a slower read, every scan kept
        log.debug("empty_scans_kept", reason=f"{type(exc).__name__}: {exc}")
        return frame


def _empty(child) -> bool:
    """Whether `child` scans files through row filters (Delta sets them only on the scans of vector
    differences, each keeping the rows its vector marks) and each file's vector marks none. The filters are
    asked first: a scan without them (the files a range adds anew) is not listed file by file."""
    if child.getClass().getName() != _RELATION:
        return False
    index = child.relation().location()
    if index.rowIndexFilters().isEmpty():
        return False
    files = _files(index)
    return bool(files) and all(action.deletionVector().cardinality() == 0 for action in files)


def _files(index) -> list:
    """The file actions a Delta change index scans: the added files of a CdcAddFileIndex, the removed files of
    a TahoeRemoveFileIndex; none for another index."""
    name = index.getClass().getSimpleName()
    if name == "CdcAddFileIndex":
        return python_list(index.addFiles())
    if name == "TahoeRemoveFileIndex":
        return [
            action for spec in python_list(index.filesByVersion()) for action in python_list(spec.actions())
        ]
    return []


def _dataset(jvm):
    """Spark's Dataset class that builds a frame from a logical plan (`classic` from Spark 4 on)."""
    try:
        jvm.java.lang.Class.forName("org.apache.spark.sql.classic.Dataset")
        return jvm.org.apache.spark.sql.classic.Dataset
    except Exception:
        return jvm.org.apache.spark.sql.Dataset
