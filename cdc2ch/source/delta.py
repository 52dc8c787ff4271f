"""Delta table access through Spark: versions and commit metadata from the log, CDF and snapshot reads."""

from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from urllib.parse import urlsplit

import pyarrow as pa

from cdc2ch.base.errors import CHANGE_FEED, SourceError, error_text, range_out_of_memory, summarise
from cdc2ch.model import contract
from cdc2ch.model.tableref import normalize_uri, parse_table
from cdc2ch.source.cdfscan import StateSnapshots
from cdc2ch.source.cdfscan import delta_log as _delta_log
from cdc2ch.source.cdfscan import scanned_changes as _scanned_changes
from cdc2ch.source.log import (
    ArrowLogFiles,
    Commit,
    DeltaLog,
    HadoopLogFiles,
    LogChanged,
    missing_table,
    not_a_delta_table,
)
from cdc2ch.source.variants import variants_as_json

__all__ = ["Commit", "DeltaSource", "normalize_uri"]


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


# (session, key) -> [blocks inside, the value before the first]: threads sharing a session (the Python API
# called from several threads, a verify beside a run) may be inside session_conf at once.
_CONF_HELD: dict[tuple[int, str], list] = {}
_CONF_LOCK = threading.Lock()


@contextmanager
def session_conf(spark, conf: dict[str, str]):
    """`conf` set on the session for the block, then each key back to its previous value (or unset): the
    session may be the caller's (the Python API), which must find it as it was. Delta reads these settings
    when a read is planned (`load`), which builds the relation the later actions run. Blocks on several
    threads overlap safely: the settings stay until the last one leaves, and are then put back as they were
    before the first (leaving one's own block must not unset them under another thread's `load`)."""
    entered, failed = [], True
    try:
        with _CONF_LOCK:
            for key, value in conf.items():
                held = _CONF_HELD.setdefault((id(spark), key), [0, None])
                if held[0] == 0:
                    held[1] = spark.conf.get(key, None)
                held[0] += 1
                entered.append(key)
                spark.conf.set(key, value)
        yield
        failed = False
    finally:
        try:
            _leave(spark, entered)
        except Exception:
            if not failed:  # else the block's own error is what the user must see (the JVM may be gone)
                raise


def _leave(spark, entered: list[str]) -> None:
    """Count each key's blocks down, the last one out putting its value back; the first failure is raised last."""
    failure = None
    with _CONF_LOCK:
        for key in entered:
            held = _CONF_HELD[(id(spark), key)]
            held[0] -= 1
            if held[0] > 0:
                continue
            del _CONF_HELD[(id(spark), key)]
            try:  # put back as it was before the first block
                if held[1] is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, held[1])
            except Exception as exc:
                failure = failure or exc
    if failure is not None:
        raise failure


_MISSING_CDF = re.compile(r"change data was not recorded for version \[?(\d+)\]?", re.I)


class DeltaSource:
    """One Delta table, read through a Spark session. `table` is a path/URI or a catalog name (see
    tableref): a name is resolved through the session's catalog once, here, and the table is then read at
    its location like a path. `uri` is the table's identity (its full name, or its normalized path),
    `name` the full name (None for a path), `location` where its files are."""

    def __init__(self, spark, table: str):
        self.spark = spark
        ref = parse_table(table)
        if ref.is_name:
            from cdc2ch.source.catalog import resolve

            found = resolve(spark, ref)
            self.name, self.uri, self.location = found.name, found.name, normalize_uri(found.location)
        else:
            self.name, self.uri = None, normalize_uri(table)
            self.location = self.uri
        self._checked = False
        self._log_reader: DeltaLog | None = None
        self._snapshots = StateSnapshots()  # lends ranges the snapshot their schema comes from

    # -- log --------------------------------------------------------------------------------------
    def _check(self) -> None:
        if not self._checked:
            check_table(self.spark, self.location, self.name)
            self._checked = True

    def _delta_table(self):  # brings Delta's snapshot up to date (often a Spark job): not for every poll
        from delta.tables import DeltaTable

        self._check()
        return DeltaTable.forPath(self.spark, self.location)

    def _log(self) -> DeltaLog:
        if self._log_reader is None:
            self._check()
            hadoop = HadoopLogFiles(self.spark, self.location)
            local = urlsplit(self.location).scheme in ("", "file")
            self._log_reader = DeltaLog(LocalLogFiles(self.location, hadoop) if local else hadoop)
        return self._log_reader

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
                rest = [v for v in log.versions() if start < v <= end]
            else:
                rest = range(start + 1, end + 1)
            found = [first] + [log.commit(v) for v in rest]
        except Exception as exc:
            raise self.translate(exc, "the Delta log", start, end) from exc
        found = [c for c in found if c is not None]
        self._snapshots.seen(found)
        return found

    def schema_at(self, version: int) -> dict:
        """The table's schema (Spark JSON form) as of `version`; reads only the log."""
        return self.snapshot(version).schema.jsonValue()

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
        hist = (
            self._delta_table().history().selectExpr("version", "unix_millis(timestamp) AS ts_ms").collect()
        )
        later = sorted(r["version"] for r in hist if _from_ms(r["ts_ms"]) >= ts)
        if not later:
            raise SourceError(
                f"No version of {self.uri} was committed at or after {ts.isoformat()}; the latest is "
                f"{self.latest().version}. Pass an earlier --from-timestamp or use --from-version."
            )
        return later[0]

    def cdf_enabled(self) -> bool:
        return self.properties().get("delta.enableChangeDataFeed", "false").lower() == "true"

    def _jvm_snapshot(self):
        """The latest snapshot of Delta's own log object (reads the checksum file or the log); DESCRIBE
        DETAIL would also size every file, 10 s on a cold JVM."""
        self._check()
        none = self.spark._jvm.scala.Option.empty()
        return _delta_log(self.spark, self.location).update(False, none, none)

    def properties(self) -> dict[str, str]:
        """The table properties of the latest version."""
        try:
            conf = self._jvm_snapshot().metadata().configuration()
            return dict(self.spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(conf))
        except Exception:  # another Delta release with another internal signature: the documented way
            detail = self._delta_table().detail().select("properties").collect()[0]
            return dict(detail["properties"] or {})

    def protocol(self) -> dict:
        """The latest version's protocol: minReaderVersion, minWriterVersion, readerFeatures and
        writerFeatures (feature names as the log spells them)."""
        return _protocol(self)

    def table_id(self) -> str:
        """The Delta table's id (metaData.id): it stays for the table's life and a table created again, at
        the same place or elsewhere, gets a new one."""
        try:
            return str(self._jvm_snapshot().metadata().id())
        except Exception:
            return str(self._delta_table().detail().select("id").collect()[0]["id"] or "")

    # -- data -------------------------------------------------------------------------------------
    def changes(self, start: int, end: int) -> "SparkChanges":
        """The Change Data Feed for versions [start, end] (lazy; the schema is that of version `end`)."""
        self._check()
        frame = _scanned_changes(self.spark, self.location, start, end, self._snapshots)
        if frame is None:
            try:
                with session_conf(self.spark, CDF_SCHEMA_CONF):
                    frame = (
                        self.spark.read.format("delta")
                        .option("readChangeFeed", "true")
                        .option("startingVersion", int(start))
                        .option("endingVersion", int(end))
                        .option("versionAsOf", int(end))
                        .load(self.location)
                    )
            except Exception as exc:  # Delta checks the range when the read is planned
                raise self.translate(exc, CHANGE_FEED, start, end) from exc
        return SparkChanges(self, frame, start, end)

    def warm_up(self, immutable_keys: bool) -> float | None:
        """A fresh JVM spends seconds loading and compiling the CDF read path on its first read: pay that
        now by reading one row of the newest commit's changes. Returns the seconds spent, or None when the
        read failed (it only means a slower first read; the real reads will say what is wrong)."""
        t0 = time.monotonic()
        try:
            latest = self.latest_version()
            contract.arrow_rows(self.changes(latest, latest).feed(immutable_keys).limit(1).toArrow())
        except Exception:
            return None
        return time.monotonic() - t0

    def snapshot(self, version: int):
        self._check()
        with session_conf(self.spark, CDF_SCHEMA_CONF):  # a version older than the retention period too
            return self.spark.read.format("delta").option("versionAsOf", int(version)).load(self.location)

    def duplicate_keys(self, primary_key: tuple[str, ...], version: int) -> tuple[int, int, dict] | None:
        """(keys, rows, an example key) of the keys more than one row of the table holds at `version`, or
        None: one Spark aggregate over the table (what `validate` checks; ClickHouse keeps one row per key)."""
        from pyspark.sql import functions as F

        keys = [contract.spark_col(k) for k in primary_key]
        try:
            groups = self.snapshot(version).groupBy(*keys).agg(F.count(F.lit(1)).alias("n")).where("n > 1")
            found = groups.agg(
                F.count(F.lit(1)).alias("keys"),
                F.sum("n").alias("rows"),
                F.first(F.struct(*[contract.spark_col(c) for c in groups.columns[:-1]])).alias("example"),
            ).collect()[0]
        except Exception as exc:
            raise self.translate(exc, "the table's keys", version, None) from exc
        if not found["keys"]:
            return None
        example = dict(zip(primary_key, (str(v) for v in found["example"])))
        return int(found["keys"]), int(found["rows"]), example

    def collect(self, df, what: str, start: int, end: int | None = None) -> pa.Table:
        """Run a read and bring it to the driver as Arrow, turning Delta's errors into clear ones."""
        try:
            return df.toArrow()
        except Exception as exc:  # py4j / pyspark errors carry the Java message
            raise self.translate(exc, what, start, end) from exc

    def translate(self, exc: Exception, what: str, start: int | None, end: int | None) -> Exception:
        text = error_text(exc)
        if start is None:
            span = "the latest version"
        else:
            span = f"versions {start}..{end}" if end is not None else f"version {start}"
        if "DELTA_MISSING_CHANGE_DATA" in text or _MISSING_CDF.search(text):
            m = _MISSING_CDF.search(text)
            at = f" (not recorded for version {m.group(1)})" if m else ""
            return SourceError(
                f"The Change Data Feed of {self.uri} does not cover {span}{at}. CDF records changes only from "
                f"the version where delta.enableChangeDataFeed was set to true. Load the table once with "
                f"`cdc2ch snapshot --version V` at or after that version, then `cdc2ch run` continues from V + 1."
            )
        if (
            "FileNotFoundException" in text
            or "DELTA_CHANGE_DATA_FILE_NOT_FOUND" in text
            or "DELTA_FILE_NOT_FOUND" in text
            or "VersionNotFound" in text
        ):
            return SourceError(
                f"Files needed to read {span} of {self.uri} are gone (removed by VACUUM or log retention). "
                f"These changes can no longer be replayed: resync with `cdc2ch snapshot` at the latest "
                f"version, then `cdc2ch run` continues from there."
            )
        too_large = range_out_of_memory(what, text, self.uri, span)
        if too_large is not None:
            return too_large
        first = next((ln for ln in text.splitlines() if ln.strip()), text)
        return SourceError(f"Reading {what} for {span} of {self.uri} failed: {summarise(first, 500)}")


def _protocol(source: DeltaSource) -> dict:
    try:
        proto = source._jvm_snapshot().protocol()
        as_java = source.spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava
        return {
            "minReaderVersion": int(proto.minReaderVersion()),
            "minWriterVersion": int(proto.minWriterVersion()),
            "readerFeatures": sorted(as_java(proto.readerFeatureNames())),
            "writerFeatures": sorted(as_java(proto.writerFeatureNames())),
        }
    except Exception:  # another Delta release with another internal signature: the documented way
        detail = source._delta_table().detail().collect()[0]
        features = sorted(detail["tableFeatures"] or [])
        return {
            "minReaderVersion": int(detail["minReaderVersion"]),
            "minWriterVersion": int(detail["minWriterVersion"]),
            "readerFeatures": features,  # DESCRIBE DETAIL does not tell reader from writer features
            "writerFeatures": features,
        }


class SparkChanges:
    """A version range of the Change Data Feed, read through Spark (the Changes port)."""

    def __init__(self, source: DeltaSource, frame, start: int, end: int):
        self.source, self.frame, self.start, self.end = source, frame, start, end
        self.uri, self.location = source.uri, source.location
        self.schema = frame.schema.jsonValue()

    def spark_rows(self, immutable_keys: bool):
        return contract.spark_rows(variants_as_json(self.frame), immutable_keys)

    def feed(self, immutable_keys: bool):
        """The Spark frame arrow_rows collects: Spark only scans (and drops pre-images); the metadata
        columns are computed on the Arrow rows, which took a fifth off a warm read of W1's and W2's ranges."""
        return contract.spark_changes(variants_as_json(self.frame), immutable_keys)

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        rows = self.source.collect(self.feed(immutable_keys), CHANGE_FEED, self.start, self.end)
        return contract.arrow_rows(rows)

    def read_error(self, exc: Exception) -> Exception:
        return self.source.translate(exc, CHANGE_FEED, self.start, self.end)


class LocalLogFiles(ArrowLogFiles):
    """A local table's log read by Python: every poll looks at a few log files, each a handful of JVM round
    trips through Hadoop (about 20 ms a poll) and a few system calls here. Table files are still resolved as
    Delta resolves them."""

    def __init__(self, uri: str, hadoop: HadoopLogFiles):
        super().__init__(uri)
        self._hadoop = hadoop

    def table_file_exists(self, path: str) -> bool | None:
        return self._hadoop.table_file_exists(path)


def check_table(spark, location: str, name: str | None) -> None:
    """Refuse a location that holds no Delta table."""
    from delta.tables import DeltaTable

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


def _from_ms(ms: int) -> datetime:
    # Timestamps go through epoch milliseconds: PySpark would turn them into naive local-time datetimes.
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
