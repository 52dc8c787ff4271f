"""What a local table's log says as of a version (schema, properties, id, protocol, live files), read by
Python: no JVM."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from cdc2ch.model.changeset import table_file
from cdc2ch.source.deltalog.commitlog import _live

# 00000000000000000010.checkpoint.parquet, ...10.checkpoint.0000000001.0000000002.parquet (multi-part),
# ...10.checkpoint.<uuid>.json|parquet (v2: metaData and protocol are in this top-level file)
_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?(?:\.[0-9a-f-]{36})?\.(parquet|json)$"
)
# 00000000000000000010.crc: the version's checksum (Spark's and Databricks' writers add one to each commit),
# JSON holding among other things the metaData and protocol in force at that version.
_CHECKSUM = re.compile(r"^(\d{20})\.crc$")
# Delta's bookkeeping in the log's schema (column mapping, type widening's history), which the schema Spark
# reads a table with leaves out.
_INTERNAL_KEYS = ("delta.columnMapping.id", "delta.columnMapping.physicalName", "delta.typeChanges")


@dataclass(frozen=True)
class TableState:
    """The metaData and protocol actions in force at `version`."""

    version: int
    metadata: dict
    protocol: dict

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})

    @property
    def table_id(self) -> str:
        return str(self.metadata.get("id") or "")

    @property
    def schema(self) -> dict:
        """The Spark JSON schema, as a read of the table sees it."""
        return _without_internal(self.mapped_schema)

    @property
    def mapped_schema(self) -> dict:
        """The schema as the log records it, column mapping metadata (field ids) included."""
        return json.loads(self.metadata["schemaString"])

    def features(self) -> dict:
        """The protocol as DeltaSource.protocol gives it."""
        p = self.protocol
        return {
            "minReaderVersion": int(p.get("minReaderVersion", 1)),
            "minWriterVersion": int(p.get("minWriterVersion", 2)),
            "readerFeatures": sorted(p.get("readerFeatures") or ()),
            "writerFeatures": sorted(p.get("writerFeatures") or ()),
        }


# The columns a CDF read adds to the table's own, as Spark gives them.
CDF_FIELDS = [
    {"name": "_change_type", "type": "string", "nullable": True, "metadata": {}},
    {"name": "_commit_version", "type": "long", "nullable": True, "metadata": {}},
    {"name": "_commit_timestamp", "type": "timestamp", "nullable": True, "metadata": {}},
]


def cdf_schema(table_schema: dict) -> dict:
    """The schema of a CDF read of a table with `table_schema`."""
    return {**table_schema, "fields": list(table_schema["fields"]) + CDF_FIELDS}


def table_state(files, version: int, known: TableState | None = None) -> TableState:
    """The state at `version` from the log `files` (LocalLogFiles): from `known` (an earlier state), or the
    newest checksum file or checkpoint at or before `version`, then each commit after it."""
    meta = proto = None
    first = 0
    if known is not None and known.version <= version:
        meta, proto, first = known.metadata, known.protocol, known.version + 1
    else:
        names = files.names()
        base = _checkpoint(names, version)
        summed = _checksum(files, names, version, base[0] if base is not None else -1)
        if summed is not None:  # nearer than the checkpoint, and JSON: no Parquet reader loaded for it
            at, meta, proto = summed
            first = at + 1
        elif base is not None:
            at, names = base
            meta, proto = _from_checkpoint(files, names)
            first = at + 1
    for kind, action in _commit_actions(files, first, version, ("metaData", "protocol")):
        meta, proto = (action, proto) if kind == "metaData" else (meta, action)
    if meta is None or proto is None:
        raise FileNotFoundError(f"no metaData or protocol action up to version {version} in {files.dir}")
    return TableState(version, meta, proto)


class LogStates:
    """The TableStates of one table's log: the newest one read is kept, and later ones replay only the
    commits after it."""

    def __init__(self):
        self._newest: TableState | None = None

    def at(self, files, version: int, unchanged: Callable[[int, int], bool] | None = None) -> TableState:
        """The state at `version`. `unchanged(first, last)`: whether the commits first..last are known to
        carry no metaData or protocol action (the log's kept commits), so that they need not be read."""
        newest = self._newest
        if newest is not None and newest.version < version and unchanged is not None:
            if unchanged(newest.version + 1, version):
                self._newest = TableState(version, newest.metadata, newest.protocol)
                return self._newest
        state = table_state(
            files, version, newest if newest is not None and newest.version <= version else None
        )
        if newest is None or state.version >= newest.version:
            self._newest = state
        return state


def live_paths(location: str, files, version: int) -> list[tuple[str, int | None]]:
    """live_files with each path absolute, as ClickHouse's `_path` and Spark's inputFiles name it (a
    partition directory keeps its escapes: the log's path is unquoted once)."""
    return sorted((table_file(location, path), rows) for path, rows in live_files(files, version).items())


def live_files(files, version: int) -> dict[str, int | None]:
    """The table's data files at `version` (paths as the log writes them) and the live rows of each (None
    when the log keeps no statistics for it): the newest checkpoint's adds, then each commit's adds and
    removes after it."""
    live: dict[tuple, int | None] = {}  # by (path, deletion vector): a file gets a vector by add and remove
    first = 0
    base = _checkpoint(files.names(), version)
    if base is not None:
        at, names = base
        for name in names:
            for add in _checkpoint_adds(files, name):
                live[_file_id(add)] = _live(add)
        first = at + 1
    for kind, action in _commit_actions(files, first, version, ("add", "remove")):
        if kind == "add":
            live[_file_id(action)] = _live(action)
        else:
            live.pop(_file_id(action), None)
    return {path: rows for (path, _), rows in live.items()}


def _file_id(action: dict) -> tuple:
    """A data file as the log identifies it: its path and its deletion vector (the protocol's uniqueId)."""
    dv = action.get("deletionVector") or {}
    vector = f"{dv.get('storageType')}{dv.get('pathOrInlineDv')}@{dv.get('offset')}" if dv else None
    return action["path"], vector


def _commit_actions(files, first: int, last: int, kinds: tuple[str, ...]):
    """(kind, action) of each action of one of `kinds` in commits first..last, in log order; other lines are
    not parsed (a commit's add actions can be megabytes)."""
    for v in range(first, last + 1):
        text = files.read(f"{v:020d}.json")
        if text is None:
            raise FileNotFoundError(f"commit {v} is missing from {files.dir}")
        for line in text.splitlines():
            if any(f'"{kind}"' in line for kind in kinds):
                action = json.loads(line)
                kind = next((k for k in kinds if action.get(k) is not None), None)
                if kind is not None:
                    yield kind, action[kind]


def _checkpoint_adds(files, name: str) -> list[dict]:
    """The add actions of one checkpoint file, and of the sidecar files a v2 checkpoint names."""
    if name.endswith(".json"):
        rows = [json.loads(line) for line in (files.read(name) or "").splitlines() if line.strip()]
    else:
        rows = files.parquet(name, ["add", "sidecar"]).to_pylist()
    adds = [_plain(r["add"]) for r in rows if r.get("add")]
    for sidecar in [r["sidecar"]["path"] for r in rows if r.get("sidecar")]:
        adds += [
            _plain(r["add"])
            for r in files.parquet(f"_sidecars/{sidecar}", ["add"]).to_pylist()
            if r.get("add")
        ]
    return adds


def _checkpoint(names: list[str], version: int) -> tuple[int, list[str]] | None:
    """The newest complete checkpoint at or before `version`: (its version, its files)."""
    found: dict[int, dict] = {}
    for name in names:
        m = _CHECKPOINT.match(name)
        if m is None or int(m.group(1)) > version:
            continue
        parts = found.setdefault(int(m.group(1)), {"names": [], "of": 1})
        parts["names"].append(name)
        if m.group(3):
            parts["of"] = int(m.group(3))
    for at in sorted(found, reverse=True):
        names, parts = sorted(found[at]["names"]), found[at]["of"]
        if parts == 1:
            return at, names[:1]
        if len(names) == parts:  # a multi-part checkpoint counts only when every part is there
            return at, names
    return None


def _checksum(files, names: list[str], version: int, floor: int) -> tuple[int, dict, dict] | None:
    """(its version, metaData, protocol) from the newest checksum file in [floor, version], as Delta Kernel
    takes them; None when there is none, or it is unreadable or lacks either action (writers before Delta
    2.x left them out): the checkpoint then serves."""
    found = [
        int(m.group(1)) for m in map(_CHECKSUM.match, names) if m and floor <= int(m.group(1)) <= version
    ]
    if not found:
        return None
    at = max(found)
    try:
        summed = json.loads(files.read(f"{at:020d}.crc") or "null")
    except ValueError:  # cut short: a checksum is written after its commit, and never needed
        return None
    if not isinstance(summed, dict) or not summed.get("metadata") or not summed.get("protocol"):
        return None
    return at, summed["metadata"], summed["protocol"]


def _from_checkpoint(files, names: list[str]) -> tuple[dict | None, dict | None]:
    meta = proto = None
    for name in names:
        if name.endswith(".json"):
            rows = [json.loads(line) for line in (files.read(name) or "").splitlines() if line.strip()]
        else:
            rows = files.parquet(name, ["metaData", "protocol"]).to_pylist()
        for row in rows:
            meta = _plain(row.get("metaData")) or meta
            proto = _plain(row.get("protocol")) or proto
    return meta, proto


def _plain(value):
    """An action read from Parquet as JSON would give it: maps as dicts (pyarrow gives key-value pairs)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list) and value and all(isinstance(i, tuple) and len(i) == 2 for i in value):
        return {k: _plain(v) for k, v in value}
    return value


def _without_internal(node):
    if isinstance(node, dict):
        out = {k: _without_internal(v) for k, v in node.items()}
        if isinstance(out.get("metadata"), dict):
            out["metadata"] = {k: v for k, v in out["metadata"].items() if k not in _INTERNAL_KEYS}
        return out
    if isinstance(node, list):
        return [_without_internal(i) for i in node]
    return node
