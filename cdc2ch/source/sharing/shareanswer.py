"""What a Delta Sharing answer's lines say: the version of each, the lines of a narrower range, the metadata,
properties and schema in force at a version, and what the parquet response format cannot serve."""

from __future__ import annotations

import json
from typing import Any

from cdc2ch.base.errors import SourceError


class NoHistory(SourceError):
    """The server does not serve this table's changes (not shared with history, or no CDF where the feed is
    asked for)."""


def check_served(uri: str, lines: list[dict]) -> None:
    """Refuse what the parquet response format cannot serve right, naming the feature."""
    protocol: dict[str, Any] = next((ln["protocol"] for ln in lines if "protocol" in ln), {}) or {}
    metas = [ln["metaData"] for ln in lines if "metaData" in ln]
    conf: dict = {}
    for m in metas:
        conf.update(m.get("configuration") or {})
    feature = None
    if "deltaProtocol" in protocol:
        feature = "the delta response format (the server answered a parquet-format request in it)"
    elif str(conf.get("delta.enableDeletionVectors", "")).lower() == "true":
        feature = "deletion vectors (delta.enableDeletionVectors)"
    elif str(conf.get("delta.columnMapping.mode", "none")).lower() != "none":
        feature = f"column mapping (delta.columnMapping.mode = {conf['delta.columnMapping.mode']})"
    elif int(protocol.get("minReaderVersion", 1)) > 1:
        feature = f"reader protocol version {protocol['minReaderVersion']}"
    elif any((m.get("format") or {}).get("provider", "parquet") != "parquet" for m in metas):
        feature = "a file format other than parquet"
    if feature:
        raise SourceError(
            f"{uri} uses {feature}, which cdc2ch cannot read through Delta Sharing's parquet "
            f"response format: files would be read without the rows they no longer hold or under the "
            f"wrong column names. Nothing was written. Ask the data provider to share a table without "
            f"it, or replicate the Delta table itself with cdc2ch where you can reach its storage."
        )


def version_of(line: dict) -> int | None:
    for key in ("add", "remove", "cdf", "metaData"):
        if key in line and line[key].get("version") is not None:
            return int(line[key]["version"])
    return None


def sliced(lines: list[dict], start: int, end: int) -> list[dict]:
    """The lines of a wider /changes answer that answer [start, end] alone: the undated ones, those of
    versions in the range, and the metaData in force at `start` (a range that changes no schema still
    needs the one it is read under)."""
    dated = [(v, m) for m in lines if "metaData" in m and (v := version_of(m)) is not None]
    in_force = max(((v, m) for v, m in dated if v < start), key=lambda p: p[0], default=(None, None))[1]
    return [
        ln for ln in lines
        if ln is in_force or (v := version_of(ln)) is None or start <= v <= end
    ]  # fmt: skip


def metadata_of(lines: list[dict], version: int | None = None) -> dict:
    """The metaData in force at `version` (default: the answer's own): the newest historical one at or
    before it, else the answer's table metaData."""
    metas = [ln["metaData"] for ln in lines if "metaData" in ln]
    dated = [
        m for m in metas if m.get("version") is not None and (version is None or int(m["version"]) <= version)
    ]
    if version is not None and dated:
        return max(dated, key=lambda m: int(m["version"]))
    return metas[0] if metas else {}


def properties_of(meta: dict) -> dict[str, str]:
    """A shared metaData's configuration as table properties: a share names Delta's
    delta.enableChangeDataFeed `enableChangeDataFeed` (and shows it only where history is shared)."""
    conf = {str(k): str(v) for k, v in (meta.get("configuration") or {}).items()}
    if "enableChangeDataFeed" in conf:
        conf.setdefault("delta.enableChangeDataFeed", conf["enableChangeDataFeed"])
    return conf


def schema_of(meta: dict) -> dict:
    if not meta.get("schemaString"):
        raise SourceError(
            "The Delta Sharing server answered without the table's schema (metaData.schemaString)."
        )
    return json.loads(meta["schemaString"])
