"""Compaction: physically remove old tombstones from a target table (`cdc2ch compact`, and a service's
`--compact-every` through fleet/upkeep.py). Each compaction is recorded for `status` (state/compactlog.py).

A deleted key stays in the target as a tombstone (its latest row has `_is_deleted = 1`) so that consumers
reading new rows incrementally see the delete; FINAL already hides it. Compaction drops the tombstones
whose `_commit_timestamp` is older than a cutoff, together with every older version of their keys, and
keeps the younger ones. What `SELECT ... FINAL` returns is the same before, during and after.

ClickHouse's `OPTIMIZE TABLE ... FINAL CLEANUP` merges each partition into one part and drops every key
whose latest row is a tombstone, young or old. So, around it:

1. A side table `<table>__cdc2ch_compact` receives the young tombstones (each key's latest row, when it is
   a tombstone committed at or after the cutoff), and a materialized view `<table>__cdc2ch_compact_mv`
   copies into it every young tombstone inserted while the compaction runs (a replicator does not have to
   stop), so none of them can fall in the gap between the copy and the merge.
2. `OPTIMIZE TABLE ... FINAL CLEANUP` (the table setting allow_experimental_replacing_merge_with_cleanup
   is switched on first, once).
3. The view is dropped, the side table's rows that are not in the table (same key and version) go back in,
   with their original `_synced_at`, and the side table is dropped.

Between 2 and 3 a young tombstone is missing, with all its key's older versions: FINAL shows the key as
absent either way; only a reader of raw rows sees the tombstone disappear for a moment, and come back.

Crash safety: a run that finds the view or the side table first finishes the interrupted run's step 3.
Putting back a tombstone that is still in the table, or one that a newer row of its key has since
superseded, changes nothing under FINAL: the newest `_version` of a key wins.

Concurrent replication cannot resurrect a deleted key. The cleanup merge takes the parts that exist when
it starts and drops a key only when the newest row of that key among those parts is a tombstone; rows
inserted later sit in new parts the merge does not touch. A deleted key would come back only if a row
of it OLDER than its dropped tombstone landed in such a new part. The replicator never writes one: it
inserts rows of versions after its committed offset, which are newer than every tombstone already
written for a committed version, or it replays an uncommitted range exactly, and a replay that
re-inserts an old row of the key re-inserts the tombstone that followed it in the same range as well,
before that range is committed. (Out-of-order writers that insert old versions later are what makes
CLEANUP unsafe in general; cdc2ch's versions only grow.)
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone

from cdc2ch.base.errors import ConfigError, LockedError, SinkError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.compactlog import CompactStore
from cdc2ch.clickhouse.state.lock import PipelineLock
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName

log = get_logger("cdc2ch.compact")

SIDE_SUFFIX = "__cdc2ch_compact"
VIEW_SUFFIX = "__cdc2ch_compact_mv"
CLEANUP_SETTING = "allow_experimental_replacing_merge_with_cleanup"
REQUIRED_COLUMNS = ("_commit_timestamp", "_is_deleted", "_version")

_ENGINE = re.compile(r"ReplacingMergeTree\([^)]*?`?_version`?\s*,\s*`?_is_deleted`?\s*\)")
_SETTING_ON = re.compile(rf"\b{CLEANUP_SETTING}\s*=\s*(?:1|true)\b", re.IGNORECASE)


@dataclass(frozen=True)
class CompactResult:
    target: str
    cutoff: datetime | None  # tombstones committed before this are dropped; None: all of them
    tombstones_before: int  # deleted keys: keys whose latest row is a tombstone
    dropped: int  # of those, committed before the cutoff: removed with all their versions
    kept: int  # committed at or after the cutoff: still there
    rows_before: int  # physical rows (count() without FINAL)
    rows_after: int
    recovered: int  # tombstones put back from an interrupted earlier run
    optimized: bool  # False when there was nothing to drop (the table was not rewritten)
    seconds: float

    def as_dict(self) -> dict:
        out = asdict(self)
        out["cutoff"] = self.cutoff.isoformat(timespec="milliseconds") if self.cutoff else None
        return out

    def summary(self) -> str:
        age = f"those committed before {self.cutoff:%Y-%m-%d %H:%M:%S} UTC" if self.cutoff else "all ages"
        text = (
            f"{self.target}: dropped {self.dropped} of {self.tombstones_before} tombstones ({age}), "
            f"kept {self.kept}; rows {self.rows_before} -> {self.rows_after}"
        )
        if self.recovered:
            text += f"; {self.recovered} tombstones restored from an interrupted run"
        if not self.optimized:
            text += "; nothing to drop, table not rewritten"
        return f"{text}; {self.seconds:.1f} s"


def compact(
    sink: Sink, target: TargetName, older_than: timedelta | None, now: datetime | None = None
) -> CompactResult:
    """Drop the tombstones of `target` committed more than `older_than` before `now` (None or 0: all)."""
    t0 = time.monotonic()
    if older_than is not None and older_than < timedelta(0):
        raise ConfigError(f"--older-than must not be negative (got {older_than}).")
    now = now or datetime.now(timezone.utc)
    now = now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)
    cutoff = now - older_than if older_than else None
    if cutoff is not None:
        cutoff = cutoff.replace(microsecond=cutoff.microsecond // 1000 * 1000)  # _commit_timestamp: ms
    keys, cleanup_on = _check_target(sink, target)
    job = _Compaction(sink, target, keys, cutoff, cleanup_on)
    lock = PipelineLock(sink, target.database, f"compact:{target}")
    try:
        lock.acquire()
    except LockedError as exc:
        raise LockedError(
            f"Another compaction (`cdc2ch compact`, or a service's --compact-every) is working on {target}. {exc}"
        ) from exc
    try:
        return job.run(t0)
    finally:
        lock.release()


class _Compaction:
    def __init__(
        self, sink: Sink, target: TargetName, keys: list[str], cutoff: datetime | None, cleanup_on: bool
    ):
        self.sink = sink
        self.target = target
        self.table = schema.qualified(target)
        self.side = TargetName(target.database, target.table + SIDE_SUFFIX)
        self.view = TargetName(target.database, target.table + VIEW_SUFFIX)
        self.key_names = keys
        self.keys = ", ".join(schema.quote(k) for k in keys)
        self.cutoff = cutoff
        self.cleanup_on = cleanup_on  # the table setting CLEANUP needs is already set
        self.log = log.bind(target=str(target))

    def young(self) -> str:
        """SQL condition: a tombstone committed at or after the cutoff (any tombstone when there is none)."""
        if self.cutoff is None:
            return "`_is_deleted` = 1"
        stamp = self.cutoff.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        return f"`_is_deleted` = 1 AND `_commit_timestamp` >= toDateTime64({schema.literal(stamp)}, 3, 'UTC')"

    def run(self, t0: float) -> CompactResult:
        self.log.info(
            "compact_start", cutoff=self.cutoff.isoformat(timespec="milliseconds") if self.cutoff else None
        )
        try:
            result = self._run(t0)
            CompactStore(self.sink, self.target.database).record(result)
        except SinkError as exc:
            detail = summarise(str(exc.__cause__ or exc), 400).rstrip(".")
            raise SinkError(
                f"Compacting {self.target} in ClickHouse at {self.sink.display} stopped: {detail}. What "
                f"SELECT ... FINAL returns is unaffected; run `cdc2ch compact` again once the cause is fixed: "
                f"it first puts back any tombstone it had set aside."
            ) from exc
        self.log.info("compact_done", **{k: v for k, v in result.as_dict().items() if k != "target"})
        return result

    def _run(self, t0: float) -> CompactResult:
        recovered = self.recover()
        rows_before = self.sink.row_count(self.table)
        deleted, young = self.count_tombstones()
        dropped = deleted - (young if self.cutoff is not None else 0)
        optimized = dropped > 0
        if optimized:
            self.enable_cleanup()
            if self.cutoff is not None:
                self.keep_young()
            self.cleanup()
            if self.cutoff is not None:
                self.restore()
        else:
            self.log.info("compact_nothing_to_drop", tombstones=deleted)
        return CompactResult(
            target=str(self.target),
            cutoff=self.cutoff,
            tombstones_before=deleted,
            dropped=dropped,
            kept=deleted - dropped,
            rows_before=rows_before,
            rows_after=self.sink.row_count(self.table),
            recovered=recovered,
            optimized=optimized,
            seconds=round(time.monotonic() - t0, 3),
        )

    # -- steps ----------------------------------------------------------------------------------------
    def count_tombstones(self) -> tuple[int, int]:
        """(keys whose latest row is a tombstone, those of them committed at or after the cutoff)."""
        young = f"countIf({self.young()})" if self.cutoff is not None else "0"
        columns = f"{self.keys}, `_version`, `_is_deleted`, `_commit_timestamp`"
        rows = self.sink.query_rows(
            f"SELECT count(), {young} FROM ({self._latest_rows('`_is_deleted` = 1', columns)}) "
            f"WHERE `_is_deleted` = 1",
            what="count tombstones",
        )
        return int(rows[0][0]), int(rows[0][1])

    def _latest_rows(self, having: str, columns: str = "*") -> str:
        """Each key's latest row, among the keys with a row matching `having` (not FINAL: it hides
        tombstones)."""
        return (
            f"SELECT {columns} FROM {self.table} WHERE ({self.keys}) IN "
            f"(SELECT {self.keys} FROM {self.table} WHERE {having}) "
            f"ORDER BY {self.keys}, `_version` DESC LIMIT 1 BY {self.keys}"
        )

    def enable_cleanup(self) -> None:
        if self.cleanup_on:
            return
        self.sink.command(
            f"ALTER TABLE {self.table} MODIFY SETTING {CLEANUP_SETTING} = 1",
            what="allow cleanup merges on the table",
        )
        self.log.info("cleanup_enabled", setting=CLEANUP_SETTING)

    def keep_young(self) -> None:
        """Side table + view catching young tombstones inserted from now on, then a copy of those there."""
        side, view = schema.qualified(self.side), schema.qualified(self.view)
        self.sink.command(
            f"CREATE TABLE IF NOT EXISTS {side} AS {self.table} ENGINE = MergeTree ORDER BY tuple()",
            what="create the compaction side table",
        )
        columns = ", ".join(schema.quote(c) for c in self.sink.table_columns(self.side) or {})
        self.sink.command(
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view} TO {side} AS "
            f"SELECT {columns} FROM {self.table} WHERE {self.young()}",
            what="create the compaction view",
        )
        self.sink.command(
            f"INSERT INTO {side} ({columns}) SELECT {columns} FROM "
            f"({self._latest_rows(self.young(), columns)}) WHERE {self.young()}",
            what="copy the young tombstones aside",
            settings={"insert_deduplicate": 0},
        )

    def cleanup(self) -> None:
        t1 = time.monotonic()
        # optimize_throw_if_noop: a merge that could not run is an error, not a silent no-op.
        self.sink.command(
            f"OPTIMIZE TABLE {self.table} FINAL CLEANUP",
            what="merge the table with CLEANUP",
            settings={"optimize_throw_if_noop": 1},
        )
        self.log.info("cleanup_merged", seconds=round(time.monotonic() - t1, 3))

    def restore(self) -> int:
        """Drop the view, put the side table's rows back where missing, drop the side table."""
        self.sink.command(
            f"DROP VIEW IF EXISTS {schema.qualified(self.view)}", what="drop the compaction view"
        )
        side_columns = self.sink.table_columns(self.side)
        if side_columns is None:
            return 0
        table_columns = self.sink.table_columns(self.target) or {}
        strange = [c for c in side_columns if c not in table_columns]
        if strange or any(k not in side_columns for k in (*REQUIRED_COLUMNS, *self.key_names)):
            raise ConfigError(
                f"Table {self.side} exists but does not hold tombstones of {self.target} set aside by "
                f"`cdc2ch compact` (its columns are {', '.join(side_columns)}). Rename or drop it, then run "
                f"again."
            )
        side = schema.qualified(self.side)
        columns = ", ".join(schema.quote(c) for c in side_columns)
        # Rows still in the table (same key and version) stay as they are: putting back is idempotent.
        missing = (
            f"SELECT {columns} FROM {side} "
            f"WHERE ({self.keys}, `_version`) NOT IN (SELECT {self.keys}, `_version` FROM {self.table} "
            f"WHERE ({self.keys}) IN (SELECT {self.keys} FROM {side})) "
            f"ORDER BY {self.keys}, `_version` LIMIT 1 BY {self.keys}, `_version`"
        )
        restored = int(
            self.sink.query_rows(f"SELECT count() FROM ({missing})", what="count tombstones to put back")[0][
                0
            ]
        )
        if restored:
            self.sink.command(
                f"INSERT INTO {self.table} ({columns}) {missing}",
                what="put the young tombstones back",
                settings={"insert_deduplicate": 0},
            )
        self.sink.command(f"DROP TABLE IF EXISTS {side}", what="drop the compaction side table")
        self.log.info("tombstones_restored", rows=restored)
        return restored

    def recover(self) -> int:
        """Finish a run that stopped between copying tombstones aside and putting them back."""
        if not (self.sink.table_exists(self.view) or self.sink.table_exists(self.side)):
            return 0
        self.log.warning("compact_recovering", side_table=str(self.side))
        restored = self.restore()
        self.log.warning("compact_recovered", rows=restored)
        return restored


def _check_target(sink: Sink, target: TargetName) -> tuple[list[str], bool]:
    """The table's row identity (its sorting-key and partition-key columns, identity.py) and whether CLEANUP
    merges are already allowed on it (engine_full lists the table's settings), after checking it is a cdc2ch
    target table."""
    rows = sink.query_rows(
        "SELECT engine, engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        {"db": target.database, "t": target.table},
        what="look up the target table",
    )
    if not rows:
        raise ConfigError(
            f"Table {target} does not exist in ClickHouse at {sink.display}. Check --target (database.table) "
            f"and --clickhouse; `cdc2ch status` lists the pipelines and the tables they write to."
        )
    engine, engine_full = rows[0]
    if engine == "Distributed":
        raise ConfigError(
            f"Table {target} is a Distributed table over a cluster's shard tables, and `cdc2ch compact` does "
            f"not compact a cluster's target yet: its young tombstones would have to be set aside on every "
            f"shard. Nothing was changed. To drop every tombstone (young ones included), run OPTIMIZE TABLE "
            f"on its `_local` table ON CLUSTER with FINAL CLEANUP yourself."
        )
    columns = sink.query_rows(
        "SELECT name, is_in_sorting_key OR is_in_partition_key FROM system.columns "
        "WHERE database = {db:String} AND table = {t:String} ORDER BY position",
        {"db": target.database, "t": target.table},
        what="describe the target table",
    )
    names = [name for name, _ in columns]
    keys = [name for name, in_key in columns if in_key]
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing or not _ENGINE.search(engine_full or "") or not keys:
        problems = []
        if missing:
            problems.append(f"has no column {', '.join(missing)}")
        if not _ENGINE.search(engine_full or ""):
            problems.append(f"its engine is {engine}, not ReplacingMergeTree(_version, _is_deleted)")
        if not keys:
            problems.append("its sorting key names no column")
        raise ConfigError(
            f"Table {target} is not a table cdc2ch replicates into: it {' and '.join(problems)}. `cdc2ch "
            f"compact` only removes the tombstones cdc2ch writes to its target tables; `cdc2ch status` lists "
            f"the pipelines and their targets."
        )
    return keys, bool(_SETTING_ON.search(engine_full))
