"""The Delta log as the test sharing server reads it: JSON commits, classic checkpoints, commit timestamps.

Deliberately independent of cdc2ch/source/deltalog/commitlog.py, so the sharing server and the change source
it tests are two readings of the protocol, not one. Errors are `SharingError`s carrying the reference server's
HTTP status, error code and words (delta-sharing server/.../DeltaSharingService.scala, DeltaCDFErrors.scala).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq

COMMIT = re.compile(r"^(\d{20})\.json$")
CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d{10}\.\d{10})?\.parquet$")
# DeltaSharingHistoryManager.POTENTIALLY_UNMONOTONIZED_TIMESTAMPS: how far back timestamps are monotonized.
MONOTONIZE_WINDOW = 100


class SharingError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def invalid(message: str) -> SharingError:
    return SharingError(400, "INVALID_PARAMETER_VALUE", message)


def unsupported(message: str) -> SharingError:
    return SharingError(400, "UNSUPPORTED_OPERATION", message)


def malformed(message: str) -> SharingError:
    return SharingError(400, "MALFORMED_REQUEST", message)


@dataclass
class Snapshot:
    version: int
    protocol: dict
    metadata: dict
    files: list[dict] = field(default_factory=list)  # `add` actions, log order


def _plain(action: dict) -> dict:
    """A checkpoint row's action as the JSON commit would have it (maps come back from Arrow as pairs)."""
    out = {}
    for key, value in action.items():
        if value is None:
            continue
        if key in ("partitionValues", "configuration", "tags") and isinstance(value, list):
            value = dict(value)
        out[key] = value
    return out


class DeltaLog:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.log = self.root / "_delta_log"

    # -- listing -------------------------------------------------------------------------------------
    def _listing(self) -> tuple[dict[int, Path], dict[int, list[Path]]]:
        commits, checkpoints = {}, {}
        for entry in os.scandir(self.log) if self.log.is_dir() else ():
            if m := COMMIT.match(entry.name):
                commits[int(m.group(1))] = Path(entry.path)
            elif m := CHECKPOINT.match(entry.name):
                checkpoints.setdefault(int(m.group(1)), []).append(Path(entry.path))
        if not commits and not checkpoints:
            raise SharingError(500, "INTERNAL_ERROR", "")  # not a Delta table: the reference hides why
        return commits, checkpoints

    def latest(self) -> int:
        commits, checkpoints = self._listing()
        return max([*commits, *checkpoints])

    def earliest(self) -> int:
        """The first version a snapshot can be built for (a checkpoint, or commit 0)."""
        commits, checkpoints = self._listing()
        return min([v for v in checkpoints] + ([0] if 0 in commits else []) or [min(commits)])

    def commit(self, version: int) -> list[dict]:
        path = self.log / f"{version:020d}.json"
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise self._truncated(version) from None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _truncated(self, version: int) -> SharingError:
        # Delta Kernel's words (DeltaErrors.versionBeforeFirstAvailableCommit), a KernelException: 400.
        return malformed(
            f"Cannot load table version {version} as the transaction log has been truncated due to manual "
            f"deletion or the log/checkpoint retention policy. The earliest available version is "
            f"{self.earliest()}."
        )

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self, version: int | None = None) -> Snapshot:
        commits, checkpoints = self._listing()
        latest = max([*commits, *checkpoints])
        version = latest if version is None else version
        if version > latest:
            raise malformed(
                f"Cannot load table version {version} as it does not exist. "
                f"The latest available version is {latest}."
            )
        base = max((v for v in checkpoints if v <= version), default=-1)
        if base < 0 and 0 not in commits:
            raise self._truncated(version)
        protocol, metadata, files = {}, {}, {}
        if base >= 0:
            for part in sorted(checkpoints[base]):
                for row in pq.read_table(part).to_pylist():
                    protocol, metadata = self._apply(row, protocol, metadata, files)
        for v in range(base + 1, version + 1):
            for action in self.commit(v):
                protocol, metadata = self._apply(action, protocol, metadata, files)
        return Snapshot(version, protocol, metadata, list(files.values()))

    @staticmethod
    def _apply(action: dict, protocol: dict, metadata: dict, files: dict) -> tuple[dict, dict]:
        if action.get("add"):
            add = _plain(action["add"])
            files[add["path"]] = add
        elif action.get("remove"):
            files.pop(action["remove"]["path"], None)
        elif action.get("metaData"):
            metadata = _plain(action["metaData"])
        elif action.get("protocol"):
            protocol = _plain(action["protocol"])
        return protocol, metadata

    # -- time ----------------------------------------------------------------------------------------
    def timestamps(self, start: int, end: int) -> dict[int, int]:
        """Commit timestamps (ms) of versions [start, end]: the in-commit timestamp where the table records
        one, else the commit file's modification time made strictly increasing over the preceding
        MONOTONIZE_WINDOW commits, as the reference server and Delta do."""
        commits, _ = self._listing()
        out, prev = {}, None
        for v in sorted(c for c in commits if max(0, start - MONOTONIZE_WINDOW) <= c <= end):
            ts = self._in_commit_timestamp(v) or commits[v].stat().st_mtime_ns // 1_000_000
            if prev is not None and ts <= prev:
                ts = prev + 1
            out[v] = prev = ts
        return {v: t for v, t in out.items() if v >= start}

    def _in_commit_timestamp(self, version: int) -> int | None:
        with open(self.log / f"{version:020d}.json") as f:
            first = json.loads(f.readline() or "{}")
        return (first.get("commitInfo") or {}).get("inCommitTimestamp")

    def version_at(self, ms: int, *, at_or_after: bool, label: str) -> int:
        """The last version committed at or before `ms`, or with `at_or_after` the first at or after it."""
        latest = self.latest()
        stamps = self.timestamps(0, latest)
        if at_or_after:
            later = [v for v, t in stamps.items() if t >= ms]
            if not later:
                raise invalid("Not a valid starting timestamp")
            return min(later)
        earlier = [v for v, t in stamps.items() if t <= ms]
        if ms > stamps[latest]:
            raise malformed(
                f"The provided timestamp {ms} ms ({label}) is after the latest available version {latest}. "
                f"Please use a timestamp less than or equal to {stamps[latest]} ms"
            )
        if not earlier:
            first = min(stamps)
            raise malformed(
                f"The provided timestamp {ms} ms ({label}) is before the earliest available version {first}. "
                f"Please use a timestamp greater than or equal to {stamps[first]} ms"
            )
        return max(earlier)


def parse_timestamp(value: str, param: str) -> int:
    """ISO 8601 with an offset ("2022-01-01T00:00:00Z"), the protocol's Timestamp Format, to ms."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise invalid(f"Invalid {param}: {e}.") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp() * 1000)


def table_properties_error(configuration: dict) -> SharingError | None:
    """Parquet responses cannot carry deletion vectors or column mapping (SnapshotChecker.scala)."""
    found = [
        f"{key}={configuration[key]}"
        for key, allowed in (("delta.columnMapping.mode", "none"), ("delta.enableDeletionVectors", "false"))
        if configuration.get(key, allowed) != allowed
    ]
    if found:
        return unsupported(
            f"Unsupported Delta Table Properties ({', '.join(found)}): reading them needs responseformat=delta, "
            "which this server does not serve"
        )
    return None
