"""Delta table access through Spark: versions and commit metadata from the log, CDF and snapshot reads."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Protocol

import pyarrow as pa

from cdc2ch.base.errors import (
    CHANGE_FEED,
    Cdc2chError,
    SourceError,
    error_text,
    range_out_of_memory,
    summarise,
)
from cdc2ch.model import contract
from cdc2ch.model.changeset import FEED, LOG, Commit
from cdc2ch.model.tableref import is_local, normalize_uri, parse_table
from cdc2ch.source.deltalog.commitlog import DeltaLog, LogChanged
from cdc2ch.source.deltalog.logfiles import TableLog
from cdc2ch.source.deltalog.logstate import TableState
from cdc2ch.source.spark.lazysession import local_master, running, s3_settings, session_of
from cdc2ch.source.spark.sessionconf import session_conf
from cdc2ch.source.spark.threads import to_arrow
from cdc2ch.source.sparkread.cdfscan import StateSnapshots, check_table
from cdc2ch.source.sparkread.cdfscan import scanned_changes as _scanned_changes
from cdc2ch.source.sparkread.feed import SparkChanges
from cdc2ch.source.sparkread.rowcopies import rewrites
from cdc2ch.source.sparkread.tablemeta import JvmMetadata, LogMetadata, TableMetadata
from cdc2ch.source.storefaults import storage_error

__all__ = ["DeltaSource", "normalize_uri", "session_conf"]


# Session settings of cdc2ch's CDF reads, applied only while a read is planned (`session_conf`): CDF reads
# use the schema of their end version (versionAsOf), for tables with and without column mapping alike; by
# default Delta reads old versions with the latest schema and refuses any range older than a schema change,
# even an added column.
CDF_SCHEMA_CONF = {
    "spark.databricks.delta.changeDataFeed.allowTimeTravelOptionsForSchema": "true",
    "spark.databricks.delta.changeDataFeed.defaultSchemaModeForColumnMappingTable": "legacy",
    # Delta refuses to read a version committed longer ago than delta.deletedFileRetentionDuration (CDF
    # reads plan their start version as a time travel), although its change files may well still be there:
    # a table whose commits are all older than that period could not be replicated at all. cdc2ch reads
    # only change and data files: where VACUUM removed them the read fails with file-not-found, which
    # `translate` turns into "resync with `cdc2ch snapshot`", so nothing is read wrong without the check.
    "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration": "false",
}


_MISSING_CDF = re.compile(r"change data was not recorded for version \[?(\d+)\]?", re.I)


class DeltaSource:
    """One Delta table, read through a Spark session. `table` is a path/URI or a catalog name (see
    tableref): a name is resolved through the session's catalog once, here, and the table is then read at
    its location like a path. `uri` is the table's identity (its full name, or its normalized path),
    `name` the full name (None for a path), `location` where its files are.

    `spark` is a session or a LazySpark: a local or S3 table's log, schema, properties and protocol are read
    by Python, so Spark starts only when rows are read (or a name looked up, or storage only Spark reaches)."""

    streams = True  # its change feed reaches this process a Spark task's rows at a time (SparkChanges)
    derives = True  # changes derived from the log's file actions where the table records no feed (LOG)

    def __init__(self, spark, table: str):
        self._spark = spark
        self.name: str | None
        ref = parse_table(table)
        if ref.is_name:
            from cdc2ch.source.sparkread.catalog import resolve

            found = resolve(session_of(spark, f"looking up {table} in Spark's catalog"), ref)
            self.name, self.uri, self.location = found.name, found.name, normalize_uri(found.location)
        else:
            self.name, self.uri = None, normalize_uri(table)
            self.location = self.uri
        self.local = is_local(self.location)
        self._checked = False
        self._table_log = TableLog(self.location, self.name, lambda: self.spark, lambda: s3_settings(spark))
        self._meta: TableMetadata | None = None  # read by Python or through the JVM: chosen on first use
        self._snapshots = StateSnapshots()  # lends ranges the snapshot their schema comes from

    @property
    def spark(self):
        """The Spark session, started now if it is not running yet."""
        return session_of(self._spark, f"reading {self.uri} through Spark")

    def spark_is_local(self) -> bool:
        """Whether Spark runs (or will run) in this process; starts no JVM."""
        return local_master(self._spark)

    # -- log --------------------------------------------------------------------------------------
    def _check(self) -> None:
        if not self._checked:
            if self.logged_by_python():
                self._log()  # refuses a missing or non-Delta location, without a JVM
            else:
                check_table(self.spark, self.location, self.name)
            self._checked = True

    def logged_by_python(self) -> bool:
        """Whether the log and metadata are read by Python, with no JVM (see logfiles.TableLog)."""
        return self._table_log.by_python()

    def _delta_table(self):  # brings Delta's snapshot up to date (often a Spark job): not for every poll
        from delta.tables import DeltaTable

        self._check()
        return DeltaTable.forPath(self.spark, self.location)

    def _log(self) -> DeltaLog:
        return self._table_log.get(self._check)

    def _metadata(self) -> TableMetadata:
        if self._meta is None:
            self._meta = (
                LogMetadata(self.location, self._table_log, self._log, self.translate)
                if self.logged_by_python()
                else JvmMetadata(lambda: self.spark, self.location, self._check, self.snapshot)
            )
        return self._meta

    def snapshot_files(self, version: int) -> list[tuple[str, int | None]] | None:
        """The table's data files at `version` (as ClickHouse's `_path` shows them) and the live rows of
        each (None: unknown), from its log; None where the log is read through Spark."""
        return self._metadata().snapshot_files(version)

    def table_state(self, version: int | None = None) -> TableState:
        """The table's metadata and protocol at `version` (default: the latest), from its log (one Python
        reads: see logged_by_python)."""
        meta = self._metadata()
        assert isinstance(meta, LogMetadata)  # (asked where Python reads the log only)
        return meta.state(version)

    def commits(self, start: int = 0, end: int | None = None) -> list[Commit]:
        """Commits in [start, end] (end: latest) that the log still holds, oldest first. Reads the commit
        files themselves, no Spark job: this runs on every poll that finds new versions."""
        log = self._log()
        try:
            end = log.latest_version() if end is None else end
            if start > end:
                return []
            first = log.commit(start)
            if first is None:  # the log starts later (retention): read only what it still has
                rest: Sequence[int] = [v for v in log.versions() if start < v <= end]
            else:
                rest = range(start + 1, end + 1)
            found = [first] + [log.commit(v) for v in rest]
        except Exception as exc:
            raise self.translate(exc, "the Delta log", start, end) from exc
        kept = [c for c in found if c is not None]
        self._snapshots.seen(kept)
        return kept

    def schema_at(self, version: int) -> dict:
        """The table's schema (Spark JSON form) as of `version`; reads only the log."""
        return self._metadata().schema_at(version)

    def mapped_schema(self, version: int) -> dict | None:
        """The schema as of `version` with its column mapping metadata, from the log."""
        return self._metadata().mapped_schema(version)

    def latest_version(self) -> int:
        try:
            return self._log().latest_version()
        except Exception as exc:
            raise self.translate(exc, "the Delta log", None, None) from exc

    def latest(self) -> Commit:
        """The newest commit: a few existence checks on the log from the last version seen."""
        try:
            return self._log().latest()
        except LogChanged:
            raise SourceError(
                f"The Delta log of {self.uri} changed while it was being read; run again."
            ) from None
        except Exception as exc:
            raise self.translate(exc, "the Delta log", None, None) from exc

    def commit(self, version: int) -> Commit | None:
        """One commit, or None when the log does not hold it (not yet, or removed by log retention)."""
        try:
            return self._log().commit(version)
        except Exception as exc:
            raise self.translate(exc, "the Delta log", version, version) from exc

    def file_exists(self, path: str) -> bool | None:
        """Whether the table's file `path`, as the log names it, is still in storage (None: cannot tell)."""
        try:
            return self._log().file_exists(path)
        except Exception as exc:
            raise self.translate(exc, "the Delta log", None, None) from exc

    def lag(self, committed: int, latest: Commit) -> tuple[int, float | None]:
        """(versions, seconds) from `committed` to `latest` (see DeltaLog.lag)."""
        try:
            return self._log().lag(committed, latest)
        except Exception as exc:
            raise self.translate(exc, "the Delta log", committed, latest.version) from exc

    def version_at(self, ts: datetime) -> int:
        """The first version committed at or after ts."""
        return _version_at(self, ts)

    def cdf_enabled(self) -> bool:
        return self.properties().get("delta.enableChangeDataFeed", "false").lower() == "true"

    def properties(self, version: int | None = None) -> dict[str, str]:
        """The table properties of `version` (default: the latest; where Python reads the log, as the last
        poll found it)."""
        return self._metadata().properties(version)

    def protocol(self) -> dict:
        """The latest version's protocol: minReaderVersion, minWriterVersion, readerFeatures and
        writerFeatures (feature names as the log spells them)."""
        return self._metadata().protocol()

    def table_id(self) -> str:
        """The Delta table's id (metaData.id): it stays for the table's life and a table created again, at
        the same place or elsewhere, gets a new one."""
        return self._metadata().table_id()

    # -- data -------------------------------------------------------------------------------------
    def changes(self, start: int, end: int, key: tuple[str, ...] = (), origin: str = FEED) -> SparkChanges:
        """The changes of versions [start, end] (lazy; the schema is that of version `end`), from the Change
        Data Feed or derived from the log (`origin`). Where Python reads the log, the read is planned only
        when its rows are read: a reader that reads the files itself (--reader clickhouse) starts no JVM.
        `key`: the columns that identify a row, where the caller knows them: a local table's feed read then
        leaves out the pre-images no target row needs (preimages.py)."""
        self._check()
        # (the key serves a local table's feed read, and any read from the log: rowcopies.py)
        changes = SparkChanges(self, start, end, key if self.local or origin == LOG else (), origin)
        if not self.logged_by_python():
            _ = changes.frame  # planned now, as Delta checks the range then
        return changes

    def _plan_changes(self, start: int, end: int, origin: str = FEED, key: tuple[str, ...] = ()):
        spark = session_of(self._spark, f"reading the changes of {self.uri} through Spark")
        if origin == LOG:
            copies = rewrites(self.commits(start, end), key)
            try:
                return _scanned_changes(spark, self.location, start, end, self._snapshots, True, copies)
            except Exception as exc:
                raise self.translate(exc, CHANGE_FEED, start, end) from exc
        frame = _scanned_changes(spark, self.location, start, end, self._snapshots)
        if frame is not None:
            return frame
        try:
            with session_conf(spark, CDF_SCHEMA_CONF):
                return (
                    spark.read.format("delta")
                    .option("readChangeFeed", "true")
                    .option("startingVersion", int(start))
                    .option("endingVersion", int(end))
                    .option("versionAsOf", int(end))
                    .load(self.location)
                )
        except Exception as exc:  # Delta checks the range when the read is planned
            raise self.translate(exc, CHANGE_FEED, start, end) from exc

    def warm_up(self, immutable_keys: bool) -> float | None:
        """A fresh JVM spends seconds loading and compiling the CDF read path on its first read: pay that
        now by reading one row of the newest commit's changes. Returns the seconds spent, or None when the
        read failed (it only means a slower first read; the real reads will say what is wrong). With no JVM
        running yet there is nothing to warm: the first read starts one (an idle service stays JVM-free)."""
        if running(self._spark) is None:
            return None
        t0 = time.monotonic()
        try:
            latest = self.latest_version()
            origin = FEED if self.cdf_enabled() else LOG
            rows = self.changes(latest, latest, origin=origin).feed(immutable_keys)
            contract.arrow_rows(rows.limit(1).toArrow())
        except Exception:
            return None
        return time.monotonic() - t0

    def snapshot(self, version: int):
        self._check()
        spark = session_of(self._spark, f"reading version {version} of {self.uri} through Spark")
        with session_conf(spark, CDF_SCHEMA_CONF):  # a version older than the retention period too
            return spark.read.format("delta").option("versionAsOf", int(version)).load(self.location)

    def duplicate_keys(self, primary_key: tuple[str, ...], version: int) -> tuple[int, int, dict] | None:
        """(keys, rows, an example key) of the keys more than one row of the table holds at `version`, or
        None: one Spark aggregate over the table (what `validate` checks; ClickHouse keeps one row per key)."""
        return _duplicate_keys(self, primary_key, version)

    def collect(self, df, what: str, start: int, end: int | None = None) -> pa.Table:
        """Run a read and bring it to the driver as Arrow, turning Delta's errors into clear ones."""
        try:
            return to_arrow(df)
        except Exception as exc:  # py4j / pyspark errors carry the Java message
            raise self.translate(exc, what, start, end) from exc

    def translate(self, exc: Exception, what: str, start: int | None, end: int | None) -> Exception:
        return translated(self.uri, exc, what, start, end, self.location)


def translated(
    uri: str, exc: Exception, what: str, start: int | None, end: int | None, location: str | None = None
) -> Exception:
    """A failure of Spark or Delta reading `what` of the table `uri` (its files at `location`, by default
    `uri`), as the user's paragraph."""
    if isinstance(exc, Cdc2chError):  # one of ours already (no Java to start Spark with)
        return exc
    text = error_text(exc)
    if start is None:
        span = "the latest version"
    else:
        span = f"versions {start}..{end}" if end is not None else f"version {start}"
    if "DELTA_MISSING_CHANGE_DATA" in text or _MISSING_CDF.search(text):
        m = _MISSING_CDF.search(text)
        at = f" (not recorded for version {m.group(1)})" if m else ""
        return SourceError(
            f"The Change Data Feed of {uri} does not cover {span}{at}. CDF records changes only from "
            f"the version where delta.enableChangeDataFeed was set to true. Load the table once with "
            f"`cdc2ch snapshot --version V` at or after that version, then `cdc2ch run` continues from V + 1."
        )
    refused = storage_error(text, location or uri, f"{what} for {span}")
    if refused is not None:
        return refused
    if (
        "FileNotFoundException" in text
        or "DELTA_CHANGE_DATA_FILE_NOT_FOUND" in text
        or "DELTA_FILE_NOT_FOUND" in text
        or "VersionNotFound" in text
    ):
        return contract.files_gone_error(uri, span)
    too_large = range_out_of_memory(what, text, uri, span)
    if too_large is not None:
        return too_large
    first = next((ln for ln in text.splitlines() if ln.strip()), text)
    return SourceError(f"Reading {what} for {span} of {uri} failed: {summarise(first, 500)}")


class _Snapshots(Protocol):
    """What _duplicate_keys reads: a DeltaSource, or a SharedSource."""

    def snapshot(self, version: int) -> Any: ...

    def translate(self, exc: Exception, what: str, start: int | None, end: int | None) -> Exception: ...


def _duplicate_keys(
    source: _Snapshots, primary_key: tuple[str, ...], version: int
) -> tuple[int, int, dict[str, str]] | None:
    from pyspark.sql import functions as F

    table = source.snapshot(version)  # the session first: columns are built in its JVM
    keys = [contract.spark_col(k) for k in primary_key]
    try:
        groups = table.groupBy(*keys).agg(F.count(F.lit(1)).alias("n")).where("n > 1")
        found = groups.agg(
            F.count(F.lit(1)).alias("keys"),
            F.sum("n").alias("rows"),
            F.first(F.struct(*[contract.spark_col(c) for c in groups.columns[:-1]])).alias("example"),
        ).collect()[0]
    except Exception as exc:
        raise source.translate(exc, "the table's keys", version, None) from exc
    if not found["keys"]:
        return None
    example = dict(zip(primary_key, (str(v) for v in found["example"])))
    return int(found["keys"]), int(found["rows"]), example


def _version_at(source: DeltaSource, ts: datetime) -> int:
    hist = source._delta_table().history().selectExpr("version", "unix_millis(timestamp) AS ts_ms").collect()
    later = sorted(r["version"] for r in hist if _from_ms(r["ts_ms"]) >= ts)
    if not later:
        raise SourceError(
            f"No version of {source.uri} was committed at or after {ts.isoformat()}; the latest is "
            f"{source.latest().version}. Pass an earlier --from-timestamp or use --from-version."
        )
    return later[0]


def _from_ms(ms: int) -> datetime:
    # Timestamps go through epoch milliseconds: PySpark would turn them into naive local-time datetimes.
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
