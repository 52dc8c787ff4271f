"""The Delta log read directly, without Spark jobs: latest version, commits, their file statistics.

A Spark job per log lookup costs a few hundred milliseconds on a small machine, paid on every poll. The
commit files are small JSON files, so they are read through the Hadoop FileSystem of the Spark session
(the same storage credentials and connectors as Spark's own reads) with a handful of calls each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

# Bytes per row assumed for change files when a commit carries no statistics to learn it from. Small on
# purpose: an over-estimate only makes read ranges smaller.
DEFAULT_BYTES_PER_ROW = 8


@dataclass(frozen=True)
class Commit:
    """One commit as its log file records it."""

    version: int
    timestamp: datetime
    operation: str
    estimated_rows: int  # change rows it yields, from file statistics (an upper bound)
    parameters: dict = field(default_factory=dict, compare=False)
    metadata: bool = False  # carries a metaData action: a new schema or new table properties
    properties: dict | None = None  # the table properties of that metaData action


def parse_commit(version: int, text: str, modified_ms: int) -> Commit:
    """A commit file -> what replication needs from it. The timestamp is the in-commit timestamp when the
    table records one, else the file's modification time (what DESCRIBE HISTORY shows)."""
    info: dict = {}
    meta: dict | None = None
    adds, removes, cdcs = [], [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"] or {}
        elif "add" in action:
            adds.append(action["add"])
        elif "remove" in action:
            removes.append(action["remove"])
        elif "cdc" in action:
            cdcs.append(action["cdc"])
        elif "metaData" in action:
            meta = action["metaData"] or {}
    ts_ms = info.get("inCommitTimestamp") or modified_ms
    return Commit(
        version=version,
        timestamp=datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc),
        operation=str(info.get("operation", "")),
        estimated_rows=estimate_rows(adds, removes, cdcs),
        parameters=dict(info.get("operationParameters") or {}),
        metadata=meta is not None,
        properties=dict(meta.get("configuration") or {}) if meta is not None else None,
    )


def _records(action: dict) -> int | None:
    try:
        return int(json.loads(action.get("stats") or "{}")["numRecords"])
    except (KeyError, TypeError, ValueError):
        return None


def estimate_rows(adds: list[dict], removes: list[dict], cdcs: list[dict]) -> int:
    """Change rows a commit yields, from its file statistics (an upper bound; it only sizes reads).

    With change files, the feed is exactly their rows: their size over the bytes per row of the data files
    in the same commit. Without, added files are inserts and removed files deletes. A file that only got a
    deletion vector yields the rows the vector newly deletes.
    """
    sized = [(a["size"], n) for a in adds + removes if (n := _records(a)) and a.get("size")]
    per_row = min((s / n for s, n in sized), default=DEFAULT_BYTES_PER_ROW)
    if cdcs:  # change files pack pre- and post-images side by side: they compress about twice as well
        return sum(int(2 * c.get("size", 0) / per_row) + 1 for c in cdcs)

    def rows(action: dict) -> int:
        n = _records(action)
        return n if n is not None else int(action.get("size", 0) / per_row) + 1

    removed = {r["path"]: r for r in removes if r.get("dataChange", True)}
    total = 0
    for add in adds:
        if not add.get("dataChange", True):
            continue
        old = removed.pop(add["path"], None)
        if old is not None:  # the same file with a new deletion vector
            before = (old.get("deletionVector") or {}).get("cardinality", 0)
            after = (add.get("deletionVector") or {}).get("cardinality", 0)
            total += max(after - before, 0)
        else:
            total += rows(add)
    return total + sum(rows(r) for r in removed.values())


class DeltaLog:
    """The `_delta_log` directory of one table, through the Spark session's Hadoop FileSystem."""

    def __init__(self, spark, uri: str):
        jvm = spark._jvm
        # Every dotted lookup through the py4j gateway is a round trip: resolve the classes once.
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._IOUtils = jvm.org.apache.commons.io.IOUtils
        self._dir = uri.rstrip("/") + "/_delta_log/"
        conf = spark._jsparkSession.sessionState().newHadoopConf()  # includes session-level fs.* settings
        self._fs = self._Path(self._dir).getFileSystem(conf)
        self._known = -1  # a version known to exist: the search for the latest starts there

    def _path(self, name: str):
        return self._Path(self._dir + name)

    def _modified(self, name: str) -> int | None:
        """Modification time of a log file in ms, or None when it does not exist."""
        try:
            return self._fs.getFileStatus(self._path(name)).getModificationTime()
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                return None
            raise

    def _read(self, name: str) -> str:
        stream = self._fs.open(self._path(name))
        try:
            return self._IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def commit(self, version: int) -> Commit | None:
        """The commit of `version`, or None when the log no longer (or not yet) holds it."""
        name = f"{version:020d}.json"
        modified = self._modified(name)
        if modified is None:
            return None
        try:
            text = self._read(name)
        except Exception as exc:  # removed between the two calls
            if "FileNotFoundException" in str(exc):
                return None
            raise
        self._known = max(self._known, version)
        return parse_commit(version, text, modified)

    def versions(self) -> list[int]:
        """Every commit version in the log, by listing it (for when a search has no starting point)."""
        out = []
        for status in self._fs.listStatus(self._path("")):
            name = status.getPath().getName()
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(out)

    def _exists(self, version: int) -> bool:
        return self._modified(f"{version:020d}.json") is not None

    def latest_version(self) -> int:
        """The newest commit version: versions are contiguous, so search upwards from one known to exist
        (the last one seen, or the last checkpoint) in O(log n) existence checks."""
        low = self._known
        if low < 0 or not self._exists(low):
            low = self._last_checkpoint()
            if low is None or not self._exists(low):
                low = 0 if self._exists(0) else None
        if low is None:
            found = self.versions()
            if not found:
                raise FileNotFoundError(f"no commit files in {self._dir}")
            low = found[-1]
        step = 1
        while self._exists(low + step):  # gallop to a version past the end...
            low, step = low + step, step * 2
        high = low + step  # ...then narrow: low exists, high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self._exists(mid) else (low, mid)
        self._known = low
        return low

    def _last_checkpoint(self) -> int | None:
        if self._modified("_last_checkpoint") is None:
            return None
        try:
            return int(json.loads(self._read("_last_checkpoint"))["version"])
        except (KeyError, ValueError):
            return None
