"""Which reader reads a table's rows: what `--reader auto` chooses, and what ClickHouse's own reader refuses.

`auto` has ClickHouse read a table itself (one `INSERT ... SELECT` per range, no JVM) where that is known to
give exactly Spark's rows, and Spark everywhere else: the embedded engine reading a local table, whose files
it sees as this process does, with no feature or type its Delta reader reads differently. A ClickHouse
server reads the lake with its own paths and credentials, which this process cannot check, so a server
target keeps Spark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cdc2ch.base.errors import SourceError
from cdc2ch.base.log import Logger
from cdc2ch.model import schema
from cdc2ch.model.changeset import Changes
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.model.tableref import is_local
from cdc2ch.replication import plan
from cdc2ch.replication.ports import ChangeSource, LakeReader


def place_needs_spark(location: str, remote_target: bool) -> str | None:
    """Why `auto` leaves a table to Spark for where it is and where it goes (None: ClickHouse may read it)."""
    if remote_target:
        return "the target is a ClickHouse server, which reads the lake with its own paths and credentials"
    if not is_local(location):
        return "the table is not on a local path"
    return None


def table_needs_spark(
    schema_json: dict[str, Any], protocol: Mapping[str, Any], properties: Mapping[str, str]
) -> str | None:
    """Why `auto` leaves a table to Spark for what it holds (None: ClickHouse reads it as Spark does)."""
    found = plan.unsupported_by_clickhouse_reader(protocol, properties, schema_json)
    if found:
        return f"ClickHouse's Delta reader cannot read its {' and '.join(found)}"
    zoned = [
        f["name"] for f in schema.user_fields(schema_json) if schema.contains_type(f["type"], "timestamp")
    ]
    if (
        zoned
    ):  # Spark writes them as INT96, which ClickHouse reads wrong after 2262 (docs/guides/run.md: limits)
        return f"it has TIMESTAMP columns ({', '.join(zoned)}), which ClickHouse reads wrong beyond 2262"
    return None


def resolved(
    cfg: RunConfig,
    source: ChangeSource,
    remote_target: bool,
    lake: LakeReader,
    log: Logger | None = None,
    version: int | None = None,
) -> RunConfig:
    """`cfg` with `auto` replaced by the reader chosen for `source` (the schema of `version`, default the
    latest, and the latest protocol); any other reader as given. Logs the choice and its reason."""
    if cfg.reader != "auto":
        return cfg
    why = place_needs_spark(source.location, remote_target)
    if why is None:  # the log read without a JVM (a local table), then one query
        schema_json = source.schema_at(source.latest().version if version is None else version)
        why = table_needs_spark(schema_json, source.protocol(), source.properties())
    lacks = lake.lacks() if why is None else None
    if lacks is not None:
        why = f"this ClickHouse lacks {lacks}"
    reader = "spark" if why else "clickhouse"
    if log is not None:
        log.info("reader_chosen", reader=reader, reason=why or "ClickHouse reads this local table itself")
    return dataclasses.replace(cfg, reader=reader)


def check_clickhouse_reads(
    source: ChangeSource,
    lake: LakeReader,
    schema_json: dict[str, Any],
    protocol: Mapping[str, Any] | None = None,
    properties: Mapping[str, str] | None = None,
    feed: bool = False,
    outcome: str = "nothing was written",
) -> None:
    """Refuse, before anything is written, a table `--reader clickhouse` cannot read: storage ClickHouse
    does not reach, features of `protocol`, `properties` or `schema_json` its reader reads wrong, and, for
    a change `feed`, a ClickHouse that cannot read one. `outcome`: what the refusal left."""
    lake.check(source.location, feed)
    found = plan.unsupported_by_clickhouse_reader(protocol or {}, properties or {}, schema_json)
    if found:
        raise plan.clickhouse_reader_error(source.uri, found, outcome)


def check_range(uri: str, changes: Changes, state: PipelineState, chosen: bool) -> None:
    """Stop before writing a range ClickHouse cannot read (a VARIANT column added since the start) or, when
    `auto` `chosen` ClickHouse, one it would read differently from Spark (a TIMESTAMP column added): the next
    attempt chooses again, from the table as it is now."""
    stopped = f"replication stopped before versions {changes.start}..{changes.end}, with version "
    stopped += f"{state.committed_version} committed"
    why = table_needs_spark(changes.schema, {}, {}) if chosen else None
    found = plan.unsupported_by_clickhouse_reader({}, {}, changes.schema)
    if found and not why:
        raise plan.clickhouse_reader_error(uri, found, stopped)
    if why:
        raise SourceError(
            f"{uri} changed since --reader auto chose ClickHouse's reader for it: {why}. So {stopped}; the "
            f"next attempt (a service retries it; rerun a --once run) chooses again and reads it through Spark."
        )
