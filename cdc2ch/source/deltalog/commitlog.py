"""The Delta log read directly, without Spark jobs: latest version, commits, their file statistics.

A Spark job per log lookup costs a few hundred milliseconds on a small machine, paid on every poll. The
commit files are small JSON files, so they are read with a handful of file-system calls each: through the
Hadoop FileSystem of the Spark session while replicating (the same storage credentials and connectors as
Spark's own reads), or through pyarrow's file systems where no JVM is wanted (`status`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from itertools import chain, count

from cdc2ch.base import phases
from cdc2ch.base.errors import SourceError
from cdc2ch.model.changeset import Commit, Files

# Bytes per row assumed for change files when a commit carries no statistics to learn it from. Small on
# purpose: an over-estimate only makes read ranges smaller.
DEFAULT_BYTES_PER_ROW = 8
KEPT_COMMITS = 16  # the newest commits a log keeps parsed (DeltaLog)
ROWS_PRESERVED = (
    "delta.rowTracking.preserved"  # the commitInfo tag of a writer that kept row tracking's values
)


def parse_commit(version: int, text: str, modified_ms: int) -> Commit:
    """A commit file -> what replication needs from it. The timestamp is the in-commit timestamp when the
    table records one, else the file's modification time (what DESCRIBE HISTORY shows)."""
    info: dict = {}
    meta: dict | None = None
    protocol = False
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
        elif "protocol" in action:
            protocol = True
    ts_ms = info.get("inCommitTimestamp") or modified_ms
    preserved = str((info.get("tags") or {}).get(ROWS_PRESERVED, "")).lower() == "true"
    tracked = all(
        a.get("baseRowId") is not None and a.get("defaultRowCommitVersion") == version for a in adds
    )
    vectors = any(a.get("deletionVector") for a in adds + removes)
    per_row = _bytes_per_row(
        adds + removes
    )  # (sizes a removed file without statistics: delta-rs writes none)
    return Commit(
        version=version,
        timestamp=datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc),
        operation=str(info.get("operation", "")),
        estimated_rows=estimate_rows(
            adds,
            removes,
            cdcs,
            _row_level_metrics(info),
            copies_left_out=preserved and tracked and not vectors,
        ),
        parameters=dict(info.get("operationParameters") or {}),
        metadata=meta is not None,
        properties=dict(meta.get("configuration") or {}) if meta is not None else None,
        files=Files(
            tuple((a["path"], _live(a), a.get("dataChange", True)) for a in adds),
            tuple((r["path"], _rows(r, per_row), r.get("dataChange", True)) for r in removes),
            tuple(c["path"] for c in cdcs),
            vectors=vectors,
            partitioned=any(a.get("partitionValues") for a in adds),
            tracked=tracked,
        ),
        protocol=protocol,
        rows_preserved=preserved,
        file_rows=file_rows(adds, removes),
    )


def file_rows(adds: list[dict], removes: list[dict]) -> int:
    """Every row of the data files a commit adds and removes with a data change, a file it re-adds with
    another deletion vector counted once (deriving the commit's changes reads it whole once; estimate_rows
    counts only the rows the vectors differ by). A file without statistics counts by its size."""
    per_row = _bytes_per_row(adds + removes)
    changed = {a["path"]: a for a in adds + removes if a.get("dataChange", True)}
    return sum(_rows(a, per_row) for a in changed.values())


def _bytes_per_row(files: list[dict]) -> float:
    """The fewest bytes per row among `files` with statistics: sizes a file without them (an upper bound)."""
    sized = [(a["size"], n) for a in files if (n := file_records(a)) and a.get("size")]
    return min((s / n for s, n in sized), default=DEFAULT_BYTES_PER_ROW)


def _rows(action: dict, per_row: float) -> int:
    """The rows of a file action: its numRecords, else its size over `per_row`."""
    n = file_records(action)
    return n if n is not None else int(action.get("size", 0) / per_row) + 1


def _live(add: dict) -> int | None:
    """The rows of an added file that are live: its numRecords less those its deletion vector deletes."""
    n = file_records(add)
    return None if n is None else n - int((add.get("deletionVector") or {}).get("cardinality", 0))


# numRecords parsed from an action's stats, kept on the action (a key no Delta writer uses): a commit's sizes
# (estimate_rows, file_rows, _live) ask for it up to four times, and parsing the stats is most of their cost
_RECORDS = "cdc2ch.numRecords"


def file_records(action: dict) -> int | None:
    """The rows of a file action (an add or remove's fields) where its statistics say: their numRecords."""
    if _RECORDS not in action:
        try:
            action[_RECORDS] = int(json.loads(action.get("stats") or "{}")["numRecords"])
        except (KeyError, TypeError, ValueError):
            action[_RECORDS] = None
    return action[_RECORDS]


def estimate_rows(
    adds: list[dict],
    removes: list[dict],
    cdcs: list[dict],
    metrics: dict | None = None,
    copies_left_out: bool = False,
) -> int:
    """Change rows a commit yields, from its log entry (an upper bound; it only sizes reads).

    With change files, the feed is exactly their rows: the count the commit's operation metrics give when
    it records them, else their size over the bytes per row of the data files in the same commit. Without,
    added files are inserts and removed files deletes. A file that only got a deletion vector yields the
    rows the vector newly deletes. `copies_left_out`: row tracking tells the rows the commit copied into the
    files it rewrote, which both readers leave out (sparkread/rowcopies.py, clickhouse/writers/commitreads.py):
    at most what the operation metrics count.
    """
    per_row = _bytes_per_row(adds + removes)
    if cdcs:  # change files pack pre- and post-images side by side: they compress about twice as well
        by_size = sum(int(2 * c.get("size", 0) / per_row) + 1 for c in cdcs)
        counted = _metric_rows(metrics or {})
        return by_size if counted is None else min(counted, by_size)
    counted = _metric_rows(metrics or {}) if copies_left_out else None
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
            total += _rows(add, per_row)
    total += sum(_rows(r, per_row) for r in removed.values())
    return total if counted is None else min(counted, total)


# The change rows of a row-level operation, from the counts in its commit's operationMetrics: an updated row
# is a pre- and a post-image. Spark's Delta names them in camel case, delta-rs in snake case.
_CHANGE_METRICS = (
    (2, ("numTargetRowsUpdated", "num_target_rows_updated", "numUpdatedRows", "num_updated_rows")),
    (1, ("numTargetRowsInserted", "num_target_rows_inserted")),
    (1, ("numTargetRowsDeleted", "num_target_rows_deleted", "numDeletedRows", "num_deleted_rows")),
)


def _row_level_metrics(info: dict) -> dict | None:
    """The operation metrics of a MERGE, UPDATE or DELETE, whose counts are exactly its change rows (an
    overwrite's may count only the rows it replaced, not those its change files also hold)."""
    return info.get("operationMetrics") if info.get("operation") in ("MERGE", "UPDATE", "DELETE") else None


def _metric_rows(metrics: dict) -> int | None:
    """The change rows the operation metrics count, or None when they count none of them."""
    total, found = 0, False
    for weight, names in _CHANGE_METRICS:
        for name in names:
            try:
                total += weight * int(metrics[name])
                found = True
            except (KeyError, TypeError, ValueError):
                continue
    return total if found else None


def missing_table(uri: str, name: str | None = None) -> SourceError:
    if name:
        return SourceError(
            f"The catalog places table {name} at {uri}, which does not exist: the table's files were removed "
            f"or the catalog entry is stale. Check the table in its catalog."
        )
    return SourceError(
        f"The Delta table path {uri} does not exist. Check --table (a local path or a "
        f"URI such as s3a://bucket/path)."
    )


def not_a_delta_table(uri: str, name: str | None = None) -> SourceError:
    if name:
        return SourceError(
            f"The catalog places table {name} at {uri}, which holds no Delta table (no readable _delta_log). "
            f"Check the table in its catalog."
        )
    return SourceError(
        f"{uri} is not a Delta table (it has no readable _delta_log). Point --table at the "
        f"directory that contains _delta_log."
    )


class LogChanged(Exception):
    """The newest commit vanished each time it was about to be read."""


class DeltaLog:
    """The `_delta_log` directory of one table, read through `files` (HadoopLogFiles or ArrowLogFiles)."""

    def __init__(self, files):
        self._files = phases.Timed(files)  # the log's reads are the "log" phase of a poll
        self._dir = files.dir
        self._known = -1  # a version known to exist: the search for the latest starts there
        # The newest commits read, by version, each with its file's modification time: a poll asks for the
        # newest commit again and again, and a range's planning for each of its commits several times. A
        # commit file never changes once written; a table made again at the same place writes new files,
        # whose times differ.
        self._kept: dict[int, tuple[int, Commit]] = {}
        # The modification times of commit files looked at since the last search for the latest version: a
        # poll's turn asks for the same commits several times (its lag, its range, the range's reads), and
        # one look each serves the turn. The next search looks again.
        self._seen: dict[int, int] = {}
        self._found: int | None = None  # the latest version the last search found

    def commit(self, version: int) -> Commit | None:
        """The commit of `version`, or None when the log no longer (or not yet) holds it."""
        modified = self._seen.get(version)
        if modified is None:
            modified = self._files.modified(f"{version:020d}.json")
        return None if modified is None else self._commit_at(version, modified)

    def _commit_at(self, version: int, modified: int) -> Commit | None:
        """The commit of `version`, whose file was modified at `modified`: the one kept if that file was read
        before, else read (None when it was removed meanwhile)."""
        kept = self._kept.get(version)
        if kept is not None and kept[0] == modified:
            commit = kept[1]
        else:
            text = self._files.read(f"{version:020d}.json")
            if text is None:  # removed between the two calls
                return None
            commit = parse_commit(version, text, modified)
            self._kept[version] = (modified, commit)
            if len(self._kept) > KEPT_COMMITS:
                del self._kept[min(self._kept)]
        self._seen[version] = modified
        self._known = max(self._known, version)
        return commit

    def unchanged(self, first: int, last: int) -> bool:
        """Whether every commit of first..last is kept and none carries a metaData or protocol action."""
        kept = (self._kept.get(v) for v in range(first, last + 1))  # (a long span stops at its first gap)
        return all(k is not None and not k[1].metadata and not k[1].protocol for k in kept)

    def file_exists(self, path: str) -> bool | None:
        """Whether the table's file `path`, as the log names it, is still in storage (None: cannot tell)."""
        return self._files.table_file_exists(path)

    def versions(self) -> list[int]:
        """Every commit version in the log, by listing it (for when a search has no starting point)."""
        return sorted(int(n[:-5]) for n in self._files.names() if n.endswith(".json") and n[:-5].isdigit())

    def _exists(self, version: int) -> bool:
        return self._files.exists(f"{version:020d}.json")

    def latest_version(self) -> int:
        """The newest commit version: versions are contiguous, so search upwards from one known to exist
        (the last one seen, or the last checkpoint) in O(log n) existence checks."""
        low: int | None
        low = self._known
        self._seen = {}
        # (the known version's time, where it is there, lets latest() take the commit it kept without a read)
        modified = self._files.modified(f"{low:020d}.json") if low >= 0 else None
        if modified is not None:
            self._seen[low] = modified
        else:
            low = self._last_checkpoint()
            if low is None or not self._exists(low):
                low = 0 if self._exists(0) else None
        if low is None:
            found = self.versions()
            if not found:
                raise FileNotFoundError(f"no commit files in {self._dir}")
            low = found[-1]
        # Gallop to a version past the end: one step, then one again (a poll most often finds one new
        # commit), then doubling...
        steps = chain([1], (1 << i for i in count()))
        step = next(steps)
        while self._exists(low + step):
            low, step = low + step, next(steps)
        high = low + step  # ...then narrow: low exists, high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self._exists(mid) else (low, mid)
        self._known = self._found = low
        return low

    def newest(self) -> int:
        """The latest version as the last search found it (the first time, a search): a turn reads the table
        as of the version its poll found, not one committed since, and asks the storage nothing more."""
        return self._found if self._found is not None else self.latest_version()

    def latest(self) -> Commit:
        """The newest commit (looked for again if it vanished between the two reads). With nothing new since
        the last poll, the search's two existence checks are all it asks of the storage."""
        for _ in range(3):
            commit = self.commit(self.latest_version())
            if commit is not None:
                return commit
        raise LogChanged(self._dir)

    def lag(self, committed: int, latest: Commit) -> tuple[int, float | None]:
        """(versions, seconds) from `committed` to `latest`: seconds between their commit timestamps. With
        nothing committed yet, from version 0; None when the log no longer holds that commit."""
        if committed >= latest.version:
            return 0, 0.0
        base = self.commit(max(committed, 0))
        seconds = (latest.timestamp - base.timestamp).total_seconds() if base is not None else None
        return latest.version - committed, seconds

    def commit_time(self, version: int) -> datetime | None:
        """When `version` was committed, as parse_commit dates it, from the commit's first line only: a
        commit with an in-commit timestamp has its commitInfo first (the protocol requires it), any other is
        dated by its file's modification time. None when the log does not hold that commit."""
        name = f"{version:020d}.json"
        modified = self._files.modified(name)
        line = self._files.first_line(name) if modified is not None else None
        if line is None:
            return None
        action = json.loads(line) if line.strip() else {}
        info = action.get("commitInfo") if isinstance(action, dict) else None
        ts_ms = (info.get("inCommitTimestamp") if isinstance(info, dict) else None) or modified
        self._known = max(self._known, version)
        return datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc)

    def behind(self, committed: int) -> tuple[int, int, float | None]:
        """(latest version, versions, seconds) from `committed` (-1: nothing yet) to the newest commit, as
        latest() and lag() give them but reading two commits' first lines only: what `status` needs."""
        for _ in range(3):
            latest = self.latest_version()
            if committed >= latest:
                return latest, 0, 0.0
            newest = self.commit_time(latest)
            if newest is not None:
                break
        else:
            raise LogChanged(self._dir)
        base = self.commit_time(max(committed, 0))
        return latest, latest - committed, (newest - base).total_seconds() if base is not None else None

    def _last_checkpoint(self) -> int | None:
        text = self._files.read("_last_checkpoint")
        if text is None:
            return None
        try:
            return int(json.loads(text)["version"])
        except (KeyError, ValueError):
            return None
