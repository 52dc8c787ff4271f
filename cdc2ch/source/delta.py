"""Delta table access through Spark: versions and commit metadata from the log, CDF and snapshot reads."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit

import pyarrow as pa

from cdc2ch.errors import SourceError


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp: datetime
    operation: str
    estimated_rows: int
    parameters: dict = field(default_factory=dict, compare=False)


def normalize_uri(table: str) -> str:
    """Local paths become absolute (so the pipeline's identity does not depend on the cwd); URIs stay."""
    if urlsplit(table).scheme in ("", "file"):
        path = table[len("file:") :] if table.startswith("file:") else table
        while path.startswith("//"):
            path = path[1:]
        return os.path.abspath(os.path.expanduser(path))
    return table


def estimate_change_rows(operation: str, parameters: dict, metrics: dict) -> int:
    """Upper-bound estimate of CDF rows a commit produces, from the commit's operation metrics.

    Over-estimates are harmless (smaller reads); the estimate only sizes version ranges.
    """
    m = {k: int(v) for k, v in (metrics or {}).items() if str(v).isdigit()}
    rows = m.get("numOutputRows", 0)
    rows += m.get("numDeletedRows", 0) + 2 * m.get("numUpdatedRows", 0)
    rows += m.get("numTargetRowsDeleted", 0) + 2 * m.get("numTargetRowsUpdated", 0)
    rows += m.get("numTargetRowsInserted", 0)
    overwrite = (parameters or {}).get("mode") == "Overwrite" or "REPLACE" in operation.upper()
    if overwrite or "predicate" in (parameters or {}):
        # Rows of rewritten or removed files are emitted as deletes; scale removed bytes by row width.
        out_rows, out_bytes = m.get("numOutputRows", 0), m.get("numOutputBytes", 0)
        removed = m.get("numRemovedBytes", 0)
        if removed and out_rows and out_bytes:
            rows += removed * out_rows // out_bytes
        elif removed:
            rows += removed // 8
    return rows


CDF_SCHEMA_CONF = {
    "spark.databricks.delta.changeDataFeed.allowTimeTravelOptionsForSchema": "true",
    "spark.databricks.delta.changeDataFeed.defaultSchemaModeForColumnMappingTable": "legacy",
}

_MISSING_CDF = re.compile(r"change data was not recorded for version \[?(\d+)\]?", re.I)


class DeltaSource:
    """One Delta table, read through a Spark session."""

    def __init__(self, spark, table: str):
        self.spark = spark
        self.uri = normalize_uri(table)
        self._checked = False
        # CDF reads use the schema of their end version (versionAsOf), for tables with and without
        # column mapping alike; by default Delta reads old versions with the latest schema and refuses
        # any range older than a schema change, even an added column.
        for key, value in CDF_SCHEMA_CONF.items():
            spark.conf.set(key, value)

    # -- log --------------------------------------------------------------------------------------
    def _delta_table(self):
        from delta.tables import DeltaTable

        if not self._checked:
            scheme = urlsplit(self.uri).scheme
            if scheme == "" and not os.path.exists(self.uri):
                raise SourceError(
                    f"The Delta table path {self.uri} does not exist. Check --table (a local path or a "
                    f"URI such as s3a://bucket/path)."
                )
            if not DeltaTable.isDeltaTable(self.spark, self.uri):
                raise SourceError(
                    f"{self.uri} is not a Delta table (it has no readable _delta_log). Point --table at the "
                    f"directory that contains _delta_log."
                )
            self._checked = True
        return DeltaTable.forPath(self.spark, self.uri)

    def commits(self, start: int = 0, end: int | None = None) -> list[Commit]:
        """Commits in [start, end] (end: latest) that the log still holds, oldest first."""
        hist = self._delta_table().history().where(f"version >= {int(start)}")
        if end is not None:
            hist = hist.where(f"version <= {int(end)}")
        rows = hist.selectExpr(
            "version",
            "unix_millis(timestamp) AS ts_ms",
            "operation",
            "operationParameters",
            "operationMetrics",
        ).collect()
        out = [
            Commit(
                version=r["version"],
                timestamp=_from_ms(r["ts_ms"]),
                operation=r["operation"],
                estimated_rows=estimate_change_rows(
                    r["operation"], r["operationParameters"] or {}, r["operationMetrics"] or {}
                ),
                parameters=dict(r["operationParameters"] or {}),
            )
            for r in rows
        ]
        return sorted(out, key=lambda c: c.version)

    def schema_changes(self, versions: list[int]) -> set[int]:
        """Which of these versions carry a metaData action (a new schema or table properties).

        A batch CDF read must not span such a version (Delta refuses, even for additive changes), so
        read ranges start anew at each. Reads the commit files themselves, in one Spark job.
        """
        if not versions:
            return set()
        from pyspark.sql import functions as F

        log_dir = self.uri.rstrip("/") + "/_delta_log/"
        files = [f"{log_dir}{v:020d}.json" for v in versions]
        try:
            rows = (
                self.spark.read.text(files)
                .where(F.col("value").contains('"metaData"'))
                .select("value", "_metadata.file_name")
                .collect()
            )
        except Exception as exc:
            raise self.translate(exc, "the Delta log", versions[0], versions[-1]) from exc
        return {int(r["file_name"].split(".")[0]) for r in rows if "metaData" in json.loads(r["value"])}

    def schema_at(self, version: int) -> dict:
        """The table's schema (Spark JSON form) as of `version`; reads only the log."""
        return self.snapshot(version).schema.jsonValue()

    def latest(self) -> Commit:
        row = (
            self._delta_table()
            .history(1)
            .selectExpr("version", "unix_millis(timestamp) AS ts_ms", "operation")
            .collect()[0]
        )
        return Commit(row["version"], _from_ms(row["ts_ms"]), row["operation"], 0)

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

    def cdf_enabled_since(self) -> int:
        """The version from which the Change Data Feed is recorded: the last commit that switched
        delta.enableChangeDataFeed on (0 when the table was created with it)."""
        rows = (
            self._delta_table()
            .history()
            .where("operationParameters['properties'] IS NOT NULL")
            .selectExpr("version", "operationParameters['properties'] AS props")
            .collect()
        )
        since = 0
        for r in sorted(rows, key=lambda r: r["version"]):
            props = json.loads(r["props"] or "{}")
            value = str(props.get("delta.enableChangeDataFeed", "")).lower()
            if value == "true":
                since = r["version"]
            elif value == "false":
                since = None
        return since if since is not None else 0

    def properties(self) -> dict[str, str]:
        detail = self._delta_table().detail().select("properties").collect()[0]
        return dict(detail["properties"] or {})

    # -- data -------------------------------------------------------------------------------------
    def changes(self, start: int, end: int):
        """The Change Data Feed for versions [start, end] as a Spark DataFrame (lazy)."""
        self._delta_table()
        try:
            return (
                self.spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", int(start))
                .option("endingVersion", int(end))
                .option("versionAsOf", int(end))
                .load(self.uri)
            )
        except Exception as exc:  # Delta checks the range when the read is planned
            raise self.translate(exc, "the change data feed", start, end) from exc

    def snapshot(self, version: int):
        self._delta_table()
        return self.spark.read.format("delta").option("versionAsOf", int(version)).load(self.uri)

    def collect(self, df, what: str, start: int, end: int | None = None) -> pa.Table:
        """Run a read and bring it to the driver as Arrow, turning Delta's errors into clear ones."""
        try:
            return df.toArrow()
        except Exception as exc:  # py4j / pyspark errors carry the Java message
            raise self.translate(exc, what, start, end) from exc

    def translate(self, exc: Exception, what: str, start: int, end: int | None) -> Exception:
        text = str(exc)
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
        first = next((ln for ln in text.splitlines() if ln.strip()), text)
        return SourceError(f"Reading {what} for {span} of {self.uri} failed: {first[:500]}")


def _from_ms(ms: int) -> datetime:
    # Timestamps go through epoch milliseconds: PySpark would turn them into naive local-time datetimes.
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
