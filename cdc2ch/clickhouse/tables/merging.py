"""Merges of a target's parts, for a running service's upkeep (fleet/merges.py): what each partition holds
now, and `OPTIMIZE TABLE ... PARTITION ID ... FINAL` of one.

`SELECT ... FINAL` (and the current-state view) collapses each key's versions at query time across the parts
that hold them; a partition merged into one part has nothing left to collapse, and ClickHouse reads it as it
reads a plain table. A merge never changes what FINAL returns: it keeps each key's newest row, as FINAL does,
and keeps tombstones (only `cdc2ch compact`'s CLEANUP drops those, clickhouse/tables/compaction.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName


@dataclass(frozen=True)
class PartitionParts:
    partition_id: str
    parts: int  # active parts
    rows: int
    quiet_seconds: float  # since its newest part was written


def partitions(sink: Sink, target: TargetName) -> list[PartitionParts]:
    """The target's partitions with their active parts (none for a table that is not there). Read-only."""
    rows = sink.query_rows(
        "SELECT partition_id, count(), sum(rows), dateDiff('second', max(modification_time), now()) "
        "FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active "
        "GROUP BY partition_id ORDER BY partition_id",
        {"db": target.database, "t": target.table},
        what="list the target's parts",
    )
    return [PartitionParts(str(p), int(n), int(r), float(q)) for p, n, r, q in rows]


def merge(sink: Sink, target: TargetName, partition_id: str) -> float:
    """Merge one partition of the target into one part; returns its seconds."""
    t0 = time.monotonic()
    sink.command(
        f"OPTIMIZE TABLE {schema.qualified(target)} PARTITION ID {schema.literal(partition_id)} FINAL",
        what=f"merge partition {partition_id} of the target",
    )
    return time.monotonic() - t0
