"""A table someone shares with you through Delta Sharing, as a ChangeSource (ports.py).

Versions come from `/version`, commits and changes from one `/changes` call over a whole range (versions
are never split), the schema and properties from `/metadata`, a snapshot from `/query` at a version. Where
the feed does not record a range, a table shared with history is read from a `/query` since its first
version: each version's added and removed files, their rows inserts and deletes (LOG, as Delta derives them).
The rows are read through Spark: the file actions become a small DataFrame (one row per file) whose tasks
download their files and hand Arrow on (sharefiles.py), then the same row contract as Delta's CDF
(contract.spark_rows). Reading needs no JVM until rows are read: `status` asks only `/version`.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from datetime import datetime, timezone

import pyarrow as pa

from cdc2ch.base import phases
from cdc2ch.base.errors import SourceError, error_text, range_out_of_memory, summarise
from cdc2ch.model import contract
from cdc2ch.model.changeset import FEED, LOG, Commit, records_feed
from cdc2ch.model.tableref import parse_table
from cdc2ch.source.deltalog.commitlog import estimate_rows
from cdc2ch.source.sharing import sharefiles
from cdc2ch.source.sharing.ranges import URL_MARGIN_MS, RangeAnswers, read_of
from cdc2ch.source.sharing.restclient import SharingClient, SharingRefused, load_profile
from cdc2ch.source.sharing.shareanswer import (
    NoHistory,
    check_served,
    metadata_of,
    properties_of,
    schema_of,
    version_of,
)
from cdc2ch.source.spark.threads import to_arrow

READ_ATTEMPTS = 3  # reads of one range when its file URLs expire meanwhile
CDF_FIELDS = [
    {"name": "_change_type", "type": "string", "nullable": True, "metadata": {}},
    {"name": "_commit_version", "type": "long", "nullable": True, "metadata": {}},
    {"name": "_commit_timestamp", "type": "timestamp", "nullable": True, "metadata": {}},
]


def _ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


class SharedSource:
    """One shared table. `spark`: a session, a function returning one (called on the first read), or None
    where nothing is read (status)."""

    streams = False  # a range is read whole: its files' URLs may expire and be asked for again

    def __init__(self, spark, table: str, log=None):
        ref = parse_table(table)
        assert ref.profile is not None and ref.shared is not None  # a shared table's (tableref.is_shared)
        self.profile = load_profile(ref.profile)
        self.client = SharingClient(self.profile, *ref.shared, log=log)
        self.uri, self.location, self.name = ref.uri, self.client.table_url, None
        self._spark = spark
        self._answers = RangeAnswers(self.client, self._check, self.translate)
        self._derives: bool | None = None

    def snapshot_files(self, version: int) -> None:
        return None  # a share's files are read through Spark

    def spark_is_local(self) -> bool:
        """Whether Spark runs (or will run) in this process; starts no JVM."""
        from cdc2ch.source.spark.lazysession import local_master

        return local_master(self._spark)

    @property
    def spark(self):
        if self._spark is not None and not hasattr(self._spark, "sparkContext"):
            from cdc2ch.source.spark.lazysession import session_of

            self._spark = session_of(self._spark, f"reading the rows of {self.uri} through Spark")
        if self._spark is None:
            raise SourceError(f"Reading the rows of {self.uri} needs a Spark session.")
        return self._spark

    # -- versions -------------------------------------------------------------------------------------
    def _lines(self, start: int, end: int, origin: str = FEED, fresh: bool = False) -> list[dict]:
        return self._answers.lines(start, end, origin, fresh)

    @property
    def derives(self) -> bool:
        """Whether the server serves this table's history, from which the changes no feed records are
        derived (LOG): a table served with its feed is; else a query since the latest version tells. Asked
        once."""
        if self._derives is None:
            derives = records_feed(self.properties())
            if not derives:
                latest = self.client.version()
                try:
                    self._lines(latest, latest, LOG)
                    derives = True
                except NoHistory:
                    pass
            self._derives = derives
        return self._derives

    def latest(self) -> Commit:
        version = self.client.version()
        commit = self._commit_or_none(version)
        return commit or Commit(version, datetime.now(timezone.utc), "", 0)

    def _commit_or_none(self, version: int) -> Commit | None:
        found = self.commits(version, version)
        return found[0] if found else None

    def commits(self, start: int = 0, end: int | None = None) -> list[Commit]:
        """Every version in [start, end] from one /changes call: timestamps from the file actions (a
        version without data files takes its neighbour's), row estimates from their statistics and sizes,
        `metadata` where the answer holds a historical metaData action of that version."""
        end = self.client.version() if end is None else end
        if start > end:
            return []
        try:
            lines = self._answers.listing(start, end)
        except NoHistory:
            if start != end:
                raise
            # One version of a share without history (what `snapshot` asks): it exists, its time is unknown.
            return [Commit(start, datetime.now(timezone.utc), "", 0)]
        by_version: dict[int, dict] = {v: {"ts": None, "add": [], "remove": [], "cdf": [], "meta": None}
                                       for v in range(start, end + 1)}  # fmt: skip
        for kind, a in sharefiles.file_actions(lines):
            slot = by_version.get(int(a.get("version", -1)))
            if slot is None:
                continue
            slot[kind].append({**a, "path": a.get("id") or a.get("url")})
            slot["ts"] = max(slot["ts"] or 0, int(a.get("timestamp") or 0)) or None
        for line in lines:
            v = version_of(line)
            if "metaData" in line and v in by_version:
                by_version[v]["meta"] = line["metaData"]
        commits, last = [], None
        known = [s["ts"] for s in by_version.values() if s["ts"]]
        for v, s in by_version.items():
            last = s["ts"] or last or (known[0] if known else None)
            meta = s["meta"]
            commits.append(
                Commit(
                    version=v,
                    timestamp=_ms(last) if last else datetime.now(timezone.utc),
                    operation="",
                    estimated_rows=estimate_rows(s["add"], s["remove"], s["cdf"]),
                    metadata=meta is not None,
                    properties=properties_of(meta) if meta is not None else None,
                )
            )
        return commits

    def commit(self, version: int) -> Commit | None:
        try:
            return self._commit_or_none(version)
        except SourceError as exc:
            if "no longer" in str(exc):
                return None
            raise

    def file_exists(self, path: str) -> bool | None:
        """Unknown: a share's versions are served by its server, whose /changes says when it has them no more."""
        return None

    def lag(self, committed: int, latest: Commit) -> tuple[int, float | None]:
        if committed >= latest.version:
            return 0, 0.0
        base = self._commit_or_none(max(committed, 0))
        seconds = (latest.timestamp - base.timestamp).total_seconds() if base is not None else None
        return latest.version - committed, seconds

    def version_at(self, ts: datetime) -> int:
        text = ts.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        try:
            return self.client.version(starting_timestamp=text)
        except SharingRefused as exc:
            raise SourceError(
                f"{self.uri} has no version committed at or after {ts.isoformat()} that the server can tell "
                f"({summarise(exc.message, 200)}). Pass an earlier --from-timestamp or use --from-version."
            ) from None

    # -- metadata -------------------------------------------------------------------------------------
    def _metadata(self) -> tuple[dict, dict]:
        try:
            protocol, meta = self.client.metadata()
        except SharingRefused as exc:
            raise self.translate(exc, "the metadata", None, None) from None
        self._check([{"protocol": protocol}, {"metaData": meta}])
        return protocol, meta

    def table_id(self) -> str:
        return str(self._metadata()[1].get("id") or "")

    def properties(self, version: int | None = None) -> dict[str, str]:
        """As the share serves them: the metaData of the latest version, or that in force at `version` from
        a query since it (/metadata takes no version)."""
        if version is None:
            return properties_of(self._metadata()[1])
        try:
            lines = self.client.query_since(version, version)
        except SharingRefused as exc:
            raise self.translate(exc, "the metadata", version, None) from None
        return properties_of(metadata_of(lines, version))

    def protocol(self) -> dict:
        proto = self._metadata()[0]
        return {"minReaderVersion": int(proto.get("minReaderVersion", 1)), "minWriterVersion": 0,
                "readerFeatures": [], "writerFeatures": []}  # fmt: skip

    def cdf_enabled(self) -> bool:
        """True, or the share's own paragraph: what the provider must enable, and `snapshot` meanwhile
        (more to the point for a recipient than Delta's advice to set the property)."""
        if not records_feed(self.properties()):
            raise NoHistory(no_history_advice(self.uri, "the latest version", "the table's metadata shows no "
                                              "delta.enableChangeDataFeed = true"))  # fmt: skip
        return True

    def schema_at(self, version: int) -> dict:
        meta = self._metadata()[1]
        if meta.get("version") is not None and int(meta["version"]) != version:
            meta = metadata_of(self._query(version))
        return schema_of(meta)

    def mapped_schema(self, version: int) -> dict | None:
        """The shared schema as served: column mapping metadata included where the server keeps it."""
        return self.schema_at(version)

    def _check(self, lines: list[dict]) -> None:
        check_served(self.uri, lines)

    # -- rows -----------------------------------------------------------------------------------------
    def changes(self, start: int, end: int, key: tuple[str, ...] = (), origin: str = FEED) -> SharedChanges:
        return SharedChanges(self, start, end, origin)  # every pre-image: the writers drop the outranked

    def warm_up(self, immutable_keys: bool) -> float | None:
        return None  # nothing to compile ahead: the tasks are plain Python

    def _query(self, version: int) -> list[dict]:
        """The table at `version`; without history shared, only the latest version can be asked for (a
        query without a version), which is how `snapshot` loads such a share."""
        try:
            lines = self.client.query(version)
        except SharingRefused as exc:
            if "history" not in exc.message.lower() or version != self.client.version():
                raise self.translate(exc, "the table", version, None) from None
            lines = self.client.query(None)
        self._check(lines)
        return lines

    def snapshot(self, version: int):
        lines = self._query(version)
        return self.frame(sharefiles.plan_files(lines, snapshot=True), schema_of(metadata_of(lines)), True)

    def frame(self, files: list[dict], schema_json: dict, snapshot: bool):
        """The DataFrame of these files' rows: `schema_json`'s columns, then the CDF columns unless
        `snapshot`. Files go to ceil(bytes / 64 MiB) tasks, in their planned order (the same files in the
        same partitions on a replay)."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        from cdc2ch.source.spark.session import shipped_by_value

        spark = self.spark
        fields = list(schema_json["fields"]) + ([] if snapshot else CDF_FIELDS)
        struct = StructType.fromJson({"type": "struct", "fields": fields})
        columns = [f["name"] for f in schema_json["fields"]]
        names = [n.split()[0] for n in sharefiles.FILE_SCHEMA.split(", ")]
        rdd = spark.sparkContext.parallelize(
            [tuple(r[n] for n in names) for r in files], sharefiles.tasks_for(files, _bytes_per_task(spark))
        )
        listing = spark.createDataFrame(rdd, sharefiles.FILE_SCHEMA)
        target = to_arrow_schema(struct, timestamp_utc=True)
        with shipped_by_value(sharefiles):
            return listing.mapInArrow(sharefiles.reader(target, columns, snapshot), struct)

    def duplicate_keys(self, primary_key: tuple[str, ...], version: int) -> tuple[int, int, dict] | None:
        from cdc2ch.source.sparkread.deltasource import _duplicate_keys

        return _duplicate_keys(self, primary_key, version)  # as DeltaSource.duplicate_keys

    def translate(self, exc: Exception, what: str, start: int | None, end: int | None) -> Exception:
        return advice(self.uri, self.client, exc, what, start, end)


class SharedChanges:
    """Versions [start, end] of a share (the Changes port): its change data feed, or (LOG) the files a query
    since `start` answers, the rows of each added file inserts and of each removed one deletes at its
    version (sharefiles.plan_files)."""

    def __init__(self, source: SharedSource, start: int, end: int, origin: str = FEED):
        self.source, self.start, self.end, self.origin = source, start, end, origin
        self.uri, self.location = source.uri, source.location
        self._lines = source._lines(start, end, origin)
        self.schema = {
            "type": "struct",
            "fields": schema_of(metadata_of(self._lines, end))["fields"] + CDF_FIELDS,
        }
        self._frame = None

    def _cdf(self, fresh: bool = False):
        if fresh:
            self._lines, self._frame = self.source._lines(self.start, self.end, self.origin, fresh=True), None
        if self._frame is None:
            table_schema = {"type": "struct", "fields": self.schema["fields"][: -len(CDF_FIELDS)]}
            self._frame = self.source.frame(sharefiles.plan_files(self._lines), table_schema, False)
        return self._frame

    def spark_rows(self, immutable_keys: bool):
        now_ms = time.time() * 1000
        soon = any(
            (a.get("expirationTimestamp") or now_ms * 2) < now_ms + URL_MARGIN_MS
            for _, a in sharefiles.file_actions(self._lines)
        )
        return contract.spark_rows(self._cdf(fresh=soon), immutable_keys)

    def arrow_chunks(self, immutable_keys: bool, held_rows: int) -> Generator[pa.Table, None, None]:
        yield self.arrow_rows(immutable_keys)  # a share's files are read whole (SharedSource.streams)

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        """The rows, read again with fresh URLs from the server when the storage refuses the old ones."""
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                # Spark only reads the feed; the metadata columns are computed in Arrow, as for Delta tables.
                feed = contract.spark_changes(self._cdf(fresh=attempt > 1), immutable_keys)
                rows = to_arrow(feed)
                with phases.timed("arrow"):
                    return contract.arrow_rows(rows)
            except Exception as exc:
                if sharefiles.EXPIRED not in error_text(exc) or attempt == READ_ATTEMPTS:
                    raise self.read_error(exc) from exc
        raise AssertionError("unreachable")

    def read_error(self, exc: Exception) -> Exception:
        return self.source.translate(exc, read_of(self.origin), self.start, self.end)

    def commits(self) -> list[Commit]:
        return self.source.commits(self.start, self.end)

    def properties(self) -> dict[str, str]:
        return {}  # (a share's commits do not name their files: nothing reads them as they are)


def no_history_advice(uri: str, span: str, why: str) -> str:
    return (
        f"The Delta Sharing server does not serve the changes of {uri} for {span} ({why}). Replication reads "
        f"a share's history: the data provider must share the table WITH HISTORY; its changes then come from "
        f"its change data feed where delta.enableChangeDataFeed = true (what --changes-from cdf needs), else "
        f"from the files each version adds and removes. Until then `cdc2ch snapshot` loads the table as it is "
        f"now (the way in without history); once the changes are shared, `cdc2ch run` continues from that "
        f"snapshot."
    )


def advice(uri: str, client, exc: Exception, what: str, start: int | None, end: int | None) -> Exception:
    """A refusal or a failed read as advice (the history and CDF cases, versions gone, expired URLs)."""
    span = "the latest version" if start is None else (
        f"versions {start}..{end}" if end is not None else f"version {start}")  # fmt: skip
    text = (getattr(exc, "message", "") or error_text(exc)).lower()
    if isinstance(exc, SourceError) and not isinstance(exc, SharingRefused):
        return exc
    if sharefiles.EXPIRED.lower() in text:
        return SourceError(
            f"The storage refused the file URLs the Delta Sharing server gave for {span} of {uri} "
            f"{READ_ATTEMPTS} times (expired or revoked). Nothing of this range was committed; run "
            f"again, and if it persists ask the data provider to check the share's storage access."
        )
    if isinstance(exc, SharingRefused):
        features = (
            "deletion vector",
            "deletionvector",
            "column mapping",
            "columnmapping",
            "table properties",
        )
        if any(w in text for w in features):
            return SourceError(
                f"The Delta Sharing server cannot serve {uri} in the parquet response format "
                f"({summarise(exc.message, 200)}): the table uses deletion vectors or column mapping, "
                f"which cdc2ch does not read through a share. Nothing was written. Ask the data provider "
                f"to share a table without them."
            )
        if any(w in text for w in ("history", "cdf", "change data", "changedatafeed", "change feed")):
            return NoHistory(no_history_advice(uri, span, summarise(exc.message, 200)))
        if any(w in text for w in ("earliest", "no longer", "vacuum", "retention", "not found", "not exist")):
            return SourceError(
                f"The Delta Sharing server no longer holds {span} of {uri} "
                f"({summarise(exc.message, 200)}). These changes can no longer be replayed: resync with "
                f"`cdc2ch snapshot` at the latest version, then `cdc2ch run` continues from there."
            )
        return exc
    whole = error_text(exc)
    too_large = range_out_of_memory(what, whole, uri, span)
    if too_large is not None:
        return too_large
    first = next((ln for ln in whole.splitlines() if ln.strip()), whole)
    return SourceError(f"Reading {what} for {span} of {uri} failed: {summarise(client.redact(first), 500)}")


def _bytes_per_task(spark) -> int:
    """Spark's own split size for file scans (spark.sql.files.maxPartitionBytes) sizes the tasks too."""
    try:
        return int(spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes())
    except Exception:
        return 128 << 20
