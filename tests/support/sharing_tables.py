"""One shared table's Delta Sharing responses (parquet response format), built from its Delta log.

Follows delta-io/delta-sharing PROTOCOL.md ("Query Table Version", "Query Table Metadata", "Read Data from a
Table", "Read Change Data Feed from a Table", "API Response Actions in Parquet Format") and the reference
server's choices where the document leaves them open: DeltaSharingService.scala (parameter checks),
DeltaSharedTableKernel.scala (snapshots), DeltaSharedTable.scala (startingVersion queries) and
DeltaSharingCDCReader.scala (which actions a change query returns).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.sharing_log import (
    DeltaLog,
    SharingError,
    Snapshot,
    invalid,
    parse_timestamp,
    table_properties_error,
    unsupported,
)


@dataclass(frozen=True)
class Signer:
    """Issues a URL for a data file (path relative to the table) -> (url, expiration ms); file ids follow
    `file_id_scheme` (the `fileidhash` header: md5 of the path for parquet, sha256 for delta)."""

    sign: Callable[[str], tuple[str, int]]
    file_id_scheme: str = "parquet"


def _parquet_only(capabilities: dict[str, str]) -> None:
    formats = set(capabilities.get("responseformat", "parquet").split(","))
    if "parquet" not in formats:
        raise unsupported(
            f"responseformat={capabilities['responseformat']} is not served here: this server answers only "
            "responseformat=parquet"
        )


def _clean_schema(schema_string: str) -> str:
    """Top-level field metadata reduced to the column comment (cleanUpTableSchema in the reference)."""
    schema = json.loads(schema_string)
    for f in schema["fields"]:
        f["metadata"] = {"comment": f["metadata"]["comment"]} if "comment" in f.get("metadata", {}) else {}
    return json.dumps(schema, separators=(",", ":"))


def _multiple(*names: str) -> SharingError:
    return invalid(f"Please only provide one of: {','.join(names)}")


def _start_after_latest(start: int, latest: int) -> SharingError:
    return invalid(
        f"Provided Start version({start}) for reading change data is invalid. Start version cannot be greater "
        f"than the latest version of the table({latest})."
    )


@dataclass
class SharedTable:
    share: str
    schema: str
    name: str
    path: str
    history: bool = True
    id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def __post_init__(self):
        self.log = DeltaLog(self.path)

    @property
    def full_name(self) -> str:
        return f"{self.share}.{self.schema}.{self.name}"

    def item(self) -> dict:
        return {"name": self.name, "schema": self.schema, "share": self.share, "id": self.id}

    def _no_history(self) -> SharingError:
        return invalid(
            "Reading table by version or timestamp is not supported because history sharing is not enabled "
            f"on table: {self.full_name}"
        )

    # -- response pieces -----------------------------------------------------------------------------
    def _metadata_line(self, snap: Snapshot, version: int | None = None) -> dict:
        m = snap.metadata
        conf = m.get("configuration", {})
        out = {
            "id": m["id"],
            "format": {"provider": "parquet"},
            "schemaString": _clean_schema(m["schemaString"]),
            "partitionColumns": m.get("partitionColumns", []),
            "configuration": {"enableChangeDataFeed": "true"}
            if self.history and conf.get("delta.enableChangeDataFeed") == "true"
            else {},
        }
        out.update({k: m[k] for k in ("name", "description") if m.get(k)})
        if version is not None:
            out["version"] = version
        return {"metaData": out}

    def _head(self, snap: Snapshot, version: int | None = None) -> list[dict]:
        if error := table_properties_error(snap.metadata.get("configuration", {})):
            raise error
        return [{"protocol": {"minReaderVersion": 1}}, self._metadata_line(snap, version)]

    def _file(self, action: dict, sign: Signer, removed: bool = False, **extra) -> dict:
        url, expires = sign.sign(action["path"])
        digest = hashlib.sha256 if sign.file_id_scheme == "delta" else hashlib.md5
        out = {
            "url": url,
            "id": digest(action["path"].encode()).hexdigest(),
            "partitionValues": action.get("partitionValues", {}),
            "size": action.get("size", 0),
        }
        if action.get("stats") and not removed:  # (the reference's RemoveFile carries no statistics)
            out["stats"] = action["stats"]
        out.update({k: v for k, v in extra.items() if v is not None})
        out["expirationTimestamp"] = expires
        return out

    def _resolve(self, version: int | None, timestamp: str | None, param: str) -> int | None:
        if timestamp is None:
            return version
        ms = parse_timestamp(timestamp, param)
        return self.log.version_at(ms, at_or_after=False, label=timestamp)

    # -- endpoints -----------------------------------------------------------------------------------
    def version(self, starting_timestamp: str | None) -> int:
        if starting_timestamp is None:
            return self.log.latest()
        if not self.history:
            raise self._no_history()
        ms = parse_timestamp(starting_timestamp, "startingTimestamp")
        return self.log.version_at(ms, at_or_after=True, label=starting_timestamp)

    def metadata(self, params: dict[str, str], capabilities: dict[str, str]) -> tuple[int, list[dict]]:
        _parquet_only(capabilities)
        if "version" in params and "timestamp" in params:
            raise _multiple("version", "timestamp")
        version = int(params["version"]) if "version" in params else None
        if version is not None and version < 0:
            raise invalid("version cannot be negative.")
        if (version is not None or "timestamp" in params) and not self.history:
            raise self._no_history()
        snap = self.log.snapshot(self._resolve(version, params.get("timestamp"), "timestamp"))
        return snap.version, self._head(snap)

    def query(self, body: dict, capabilities: dict[str, str], sign: Signer) -> tuple[int, list[dict]]:
        _parquet_only(capabilities)
        version, timestamp, starting = body.get("version"), body.get("timestamp"), body.get("startingVersion")
        ending = body.get("endingVersion")
        if sum(x is not None for x in (version, timestamp, starting)) > 1:
            raise _multiple("version", "timestamp", "startingVersion")
        if version is not None and version < 0:
            raise invalid("table version cannot be negative.")
        if starting is not None and starting < 0:
            raise invalid("startingVersion cannot be negative.")
        if (version, timestamp, starting) != (None, None, None):
            if not self.history:
                raise self._no_history()
            if starting is not None and ending is not None and starting > ending:
                raise invalid(
                    f"startingVersion({starting}) must be smaller than or equal to endingVersion({ending})."
                )
        if starting is not None:
            return starting, self._changes_since(starting, ending, sign)
        snap = self.log.snapshot(self._resolve(version, timestamp, "timestamp"))
        lines = self._head(snap)
        travel = version is not None or timestamp is not None
        ts = self.log.timestamps(snap.version, snap.version)[snap.version] if travel else None
        limit, records = body.get("limitHint"), 0
        for add in snap.files:
            if limit is not None and records >= limit:
                break  # best effort, as the kernel path's globalLimitHint: stop once enough rows are served
            records += json.loads(add.get("stats") or "{}").get("numRecords", limit or 0)
            extra = {"version": snap.version, "timestamp": ts} if travel else {}
            lines.append({"file": self._file(add, sign, **extra)})
        return snap.version, lines

    def _changes_since(self, start: int, end: int | None, sign: Signer) -> list[dict]:
        """A streaming query (startingVersion): every data-changing add/remove with its version, plus later
        metaData (queryDataChangeSinceStartVersion in DeltaSharedTable.scala)."""
        latest = self.log.latest()
        if start > latest:
            raise _start_after_latest(start, latest)
        if end is not None and end > latest:
            raise invalid(
                f"Provided end version({end}) is invalid. End version cannot be greater than the latest "
                f"version of the table({latest})."
            )
        end = latest if end is None else end
        lines = self._head(self.log.snapshot(start), start)
        stamps = self.log.timestamps(start, end)
        for v in range(start, end + 1):
            for action in self.log.commit(v):
                kind = next(iter(action))
                if kind in ("add", "remove") and action[kind].get("dataChange", True):
                    file = self._file(action[kind], sign, kind == "remove", version=v, timestamp=stamps[v])
                    lines.append({kind: file})
                elif kind == "metaData" and v > start:
                    lines.append(self._metadata_line(Snapshot(v, {}, action["metaData"]), v))
        return lines

    def changes(
        self, params: dict[str, str], capabilities: dict[str, str], sign: Signer
    ) -> tuple[int, list[dict]]:
        """The change data feed (GET .../changes), as DeltaSharingCDCReader.queryCDF selects it."""
        if not self.history:
            raise invalid(f"cdf is not enabled on table {self.full_name}")
        _parquet_only(capabilities)
        for position in ("starting", "ending"):
            if f"{position}Version" in params and f"{position}Timestamp" in params:
                raise invalid(
                    f"Multiple {position} arguments provided for CDF read. Please provide one of either "
                    f"{position}Timestamp or {position}Version."
                )
        if "startingVersion" not in params and "startingTimestamp" not in params:
            raise invalid("No startingVersion or startingTimestamp provided for CDF read.")
        bounds = {}
        for key in ("startingVersion", "endingVersion"):
            if key in params:
                try:
                    bounds[key] = int(params[key])
                except ValueError:
                    raise invalid(f"{key} is not a valid number.") from None
        latest = self.log.latest()
        if "startingTimestamp" in params:
            ms = parse_timestamp(params["startingTimestamp"], "startingTimestamp")
            bounds["startingVersion"] = self.log.version_at(
                ms, at_or_after=True, label=params["startingTimestamp"]
            )
        if "endingTimestamp" in params:
            ms = parse_timestamp(params["endingTimestamp"], "endingTimestamp")
            bounds["endingVersion"] = self.log.version_at(
                ms, at_or_after=False, label=params["endingTimestamp"]
            )
        start = bounds["startingVersion"]
        if start > latest:
            raise _start_after_latest(start, latest)
        end = bounds.get("endingVersion", latest)
        if end < start:
            raise invalid(
                f"CDF range from start {start} to end {end} was invalid. End cannot be before start."
            )
        end = min(end, latest)
        historical = params.get("includeHistoricalMetadata", "").lower() == "true"
        first = self.log.snapshot(start)
        if first.metadata.get("configuration", {}).get("delta.enableChangeDataFeed") != "true":
            raise self._not_recorded(start, start, end)
        lines = self._head(
            first if historical else self.log.snapshot(latest), first.version if historical else latest
        )
        stamps = self.log.timestamps(start, end)
        for v in range(start, end + 1):
            lines += self._version_changes(v, start, end, stamps[v], historical, sign)
        return start, lines

    @staticmethod
    def _not_recorded(version: int, start: int, end: int) -> SharingError:
        return invalid(
            f"Error getting change data for range [{start}, {end}] as change data was not recorded for version "
            f"[{version}]"
        )

    def _version_changes(
        self, v: int, start: int, end: int, ts: int, historical: bool, sign: Signer
    ) -> list[dict]:
        actions = self.log.commit(v)
        metas = [a["metaData"] for a in actions if "metaData" in a]
        if any(m.get("configuration", {}).get("delta.enableChangeDataFeed") != "true" for m in metas):
            raise self._not_recorded(v, start, end)
        out = [self._metadata_line(Snapshot(v, {}, m), v) for m in metas if historical and v > start]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if any("cdc" in a for a in actions):  # change files, when written, are the whole truth of the version
            chosen = [("cdf", a["cdc"]) for a in actions if "cdc" in a]
        elif _noop_merge(info):
            chosen = []
        else:
            chosen = [
                (kind, a[kind])
                for a in actions
                for kind in ("add", "remove")
                if a.get(kind, {}).get("dataChange")
            ]
        return out + [
            {kind: self._file(f, sign, kind == "remove", version=v, timestamp=ts)} for kind, f in chosen
        ]


def _noop_merge(info: dict) -> bool:
    """A MERGE that rewrote files but changed no row yields no change rows (shouldSkipFileActionsInCommit)."""
    metrics = info.get("operationMetrics") or {}
    keys = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
    return info.get("operation") == "MERGE" and all(metrics.get(k) == "0" for k in keys)
