"""A version range's change feed planned in the JVM, with the Delta snapshot that gives it schema and protocol.

Delta plans a range's change feed from two snapshots: the end version's (the schema read with) and the
start version's (is the feed enabled there). Building a snapshot replays the log's protocol and metadata in a
Spark job (tables without checksum files, as delta-rs writes them): about a quarter of a second, most of a
one-row turn. Only those two actions of a snapshot are used, so one snapshot serves every version between two
commits that carry a metaData or protocol action, which the log read without Spark (commitlog.py) already tells:
`StateSnapshots` keeps the last one built and lends it while that holds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

from cdc2ch.model.changeset import Commit
from cdc2ch.source.deltalog.commitlog import missing_table, not_a_delta_table
from cdc2ch.source.sparkread.emptyscans import without_empty_scans
from cdc2ch.source.sparkread.netchanges import net_changes
from cdc2ch.source.sparkread.rowcopies import Copies, without_copies


def delta_log(spark, location: str):
    """Delta's own log object of the table at `location` (cached by Delta per location)."""
    return spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location)


class StateSnapshots:
    """One Delta snapshot (a JVM object), and the versions [low, high] that the commits seen show to share
    one protocol and metadata: none in (low, high] carries a metaData or protocol action."""

    def __init__(self):
        self._lock = threading.Lock()
        self._version, self._snapshot = -1, None
        self._low, self._high = -1, -1

    def seen(self, commits: Iterable[Commit]) -> None:
        """Commits read from the log, oldest first: grow [low, high] over those that follow it without a gap
        and change nothing; a change (or a gap) starts the span again at that commit."""
        with self._lock:
            for c in commits:
                changes = c.metadata or c.protocol
                if c.version == self._high + 1 and not changes:
                    self._high = c.version
                elif c.version > self._high or (changes and c.version > self._low):
                    self._low = self._high = c.version  # a new state (or an unknown one) from here

    def lend(self, start: int, end: int):
        """The kept snapshot when its protocol and metadata are those of every version of [start, end]."""
        with self._lock:
            span = self._low <= start and end <= self._high and self._low <= self._version <= self._high
            return self._snapshot if self._snapshot is not None and span else None

    def keep(self, version: int, snapshot) -> None:
        """The snapshot of `version`, built for a range: lent from now on while the span holds it."""
        with self._lock:
            self._version, self._snapshot = version, snapshot
            if not self._low <= version <= self._high:
                self._low = self._high = version


def scanned_changes(
    spark,
    location: str,
    start: int,
    end: int,
    snapshots: StateSnapshots | None = None,
    coarse: bool = False,
    copies: Copies | None = None,
):
    """The same change feed as Delta's documented read, built by the function that read calls
    (CDCReader.changesToBatchDF, with the schema of version `end`), without the relation that read wraps it
    in: that relation hands Spark its rows one Row object at a time, where this frame scans the files
    directly (vectorized Parquet). The snapshot `snapshots` lends serves as both the end's and the start's
    (no Spark job); else the end's is built and kept. None when this Delta has no such function or refuses
    the range: the documented read then plans it, and says what is wrong.

    `coarse`: the changes derived from the log instead (FEED vs LOG, model/changeset.py): Delta's own
    derivation for commits without change files, asked for every commit, whether the table records a feed
    or not — the rows of each data file a commit adds are inserts, those of each it removes deletes, and a
    file re-added with another deletion vector yields exactly the rows the two vectors differ by (the scans
    of vectors that mark no row left out: emptyscans.py). The documented read has no such option, so a
    failure is raised, not answered with None. `copies`: the commits that copy rows, whose copies are left
    out (rowcopies.py)."""
    from pyspark.sql import DataFrame

    jvm, session = spark._jvm, spark._jsparkSession
    try:
        none = jvm.scala.Option.empty()
        log = delta_log(spark, location)
        lent = snapshots.lend(start, end) if snapshots is not None else None
        snapshot = lent if lent is not None else log.getSnapshotAt(int(end), none, none, False)
        at_start = jvm.scala.Some(snapshot) if lent is not None else none
        cdc = jvm.org.apache.spark.sql.delta.commands.cdc.CDCReader
        frame = cdc.changesToBatchDF(
            log, int(start), int(end), session, none, jvm.scala.Some(snapshot), coarse, at_start
        )
        if lent is None and snapshots is not None:
            snapshots.keep(int(end), snapshot)
        changes = DataFrame(frame, spark)
        if not coarse:
            return changes
        net = net_changes(spark, log, snapshot, changes, copies) if copies and copies.times else None
        if net is not None:
            return net
        changes = without_empty_scans(spark, changes)
        return without_copies(spark, log, snapshot, changes, copies) if copies else changes
    except Exception:
        if coarse:
            raise
        return None


def check_table(spark, location: str, name: str | None) -> None:
    """Refuse a location that holds no Delta table."""
    from delta.tables import DeltaTable

    # A bare path only (not `is_local`): os.path reads the text as it is, and a `file:` URI is no path to it.
    if urlsplit(location).scheme == "" and not os.path.exists(location):
        raise missing_table(location, name)
    if not DeltaTable.isDeltaTable(spark, location):
        # Delta keeps one log object per path and answers from it: a look taken while the table was being
        # created (`_delta_log` there, no commit yet) would say "not Delta" for as long as it is kept. Drop
        # it and look once more, so a retry or a later listing sees the table.
        jvm = spark._jvm
        jvm.org.apache.spark.sql.delta.DeltaLog.invalidateCache(
            spark._jsparkSession, jvm.org.apache.hadoop.fs.Path(location)
        )
        if not DeltaTable.isDeltaTable(spark, location):
            raise not_a_delta_table(location, name)
