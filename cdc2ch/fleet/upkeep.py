"""When a running service compacts each pipeline's target (--compact-every): once due, right after a turn of
its pipeline (its last range committed, the next not begun), one table at a time in the process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from cdc2ch.base.errors import Cdc2chError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.fleet.serviceports import Compaction, CompactionRecords
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import Compacted
from cdc2ch.replication.metrics import PipelineMetrics

log = get_logger("cdc2ch.upkeep")

RETRY_AFTER = 300.0  # seconds at most before a failed compaction is tried again


class Upkeep:
    """The compaction schedule of a service's pipelines. Thread-safe: pipelines' turns end on several
    workers; a compaction due while another runs waits for a later turn."""

    def __init__(
        self,
        records: Callable[[str], CompactionRecords],
        compact: Callable[[TargetName, timedelta | None], Compaction],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.records, self.compact = records, compact
        self.clock = clock
        self.busy = threading.Lock()  # held by the compaction (or merge, merges.py) running, if any
        self._guard = threading.Lock()
        self._due: dict[str, float] = {}  # pipeline -> when its next compaction is due (clock seconds)
        self._recorded: dict[str, dict[str, Compacted]] = {}  # database -> the last compactions there

    def after_turn(self, cfg: RunConfig, metrics: PipelineMetrics) -> bool:
        """Compact the pipeline's target if it is due and no other compaction runs; whether it did."""
        if cfg.compact_every is None or self.clock() < self.due(cfg):
            return False
        if not self.busy.acquire(blocking=False):
            return False
        try:
            return self._compact(cfg, metrics)
        finally:
            self.busy.release()

    def due(self, cfg: RunConfig) -> float:
        """When the pipeline's next compaction is due: `every` after the target's last one recorded (by a
        service before a restart, or by `cdc2ch compact`); at once when none is."""
        with self._guard:
            if cfg.pipeline in self._due:
                return self._due[cfg.pipeline]
        last, due = self._last(cfg), float("-inf")
        if last is not None:
            assert cfg.compact_every is not None  # asked for pipelines that compact only
            since = (datetime.now(timezone.utc) - last.finished_at).total_seconds()
            due = self.clock() + cfg.compact_every.total_seconds() - since
        with self._guard:
            return self._due.setdefault(cfg.pipeline, due)

    def _last(self, cfg: RunConfig) -> Compacted | None:
        database = cfg.target.database
        if database not in self._recorded:
            try:
                self._recorded[database] = self.records(database).load_all()
            except Cdc2chError as exc:
                log.warning("compactions_not_read", database=database, error=summarise(str(exc), 300))
                return None
        return self._recorded[database].get(str(cfg.target))

    def _compact(self, cfg: RunConfig, metrics: PipelineMetrics) -> bool:
        assert cfg.compact_every is not None  # (after_turn checks)
        every = cfg.compact_every.total_seconds()
        try:
            result = self.compact(cfg.target, cfg.compact_older_than)
        except Exception as exc:  # replication goes on: the next compaction finishes this one's work
            metrics.compaction_failed()
            retry = min(every, RETRY_AFTER)
            fields = dict(pipeline=cfg.pipeline, target=str(cfg.target), retry_in_s=retry)
            if isinstance(exc, Cdc2chError):
                log.warning("compaction_failed", error=summarise(str(exc), 500), **fields)
            else:
                log.exception("compaction_failed", **fields)
            with self._guard:
                self._due[cfg.pipeline] = self.clock() + retry
            return False
        metrics.compacted(result.dropped, result.seconds)
        with self._guard:
            self._due[cfg.pipeline] = self.clock() + every
        return True
