"""When a running service merges what FINAL would otherwise collapse at each query (--final-merges, on by
default): right after a turn of a pipeline that ended caught up, one partition of its target that holds more
than one part, those that have stopped changing first. Its budget: one merge at a time in the process (a
compaction included, fleet/upkeep.py), each partition at most once per --final-merge-every, and merges at most
SHARE of the pipeline's time. A pipeline that is behind is never held up: its merges wait until it has caught
up; and a merge runs on a thread of its own, so that the pipeline goes on replicating while it runs (a merge
only combines the parts there at its start). The merge itself: clickhouse/tables/merging.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from math import inf

from cdc2ch.base.errors import Cdc2chError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.fleet.serviceports import Partition
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.replication.metrics import PipelineMetrics
from cdc2ch.replication.standing import StepOutcome

log = get_logger("cdc2ch.merges")

SHARE = 0.1  # of a pipeline's time its merges may take: a merge of d seconds holds the next off for 9 d
RETRY_AFTER = 300.0  # seconds at most before a failed merge is tried again


class FinalMerges:
    """The merges of a service's targets. Thread-safe: pipelines' turns end on several workers; a merge due
    while another (or a compaction) runs waits for a later turn."""

    def __init__(
        self,
        partitions: Callable[[TargetName], Sequence[Partition]],
        merge: Callable[[TargetName, str], float],
        busy: threading.Lock,
        clock: Callable[[], float] = time.monotonic,
        start: Callable[[Callable[[], None]], None] | None = None,
    ):
        self.partitions, self.merge = partitions, merge
        self.busy = busy  # held by the merge or compaction running, if any
        self.clock = clock
        self._start = start or self._in_background  # how a chosen merge is run
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self._held: dict[str, float] = {}  # pipeline -> no look at its target before (clock seconds)
        self._merged: dict[tuple[str, str], float] = {}  # (pipeline, partition) -> its last merge

    def after_turn(self, cfg: RunConfig, turn: StepOutcome, metrics: PipelineMetrics) -> bool:
        """Start merging a partition of the pipeline's target if one is due, the pipeline is caught up and
        nothing else merges; whether it started one."""
        if not cfg.merges_final or not turn.caught_up:
            return False
        with self._guard:
            if self.clock() < self._held.get(cfg.pipeline, -inf):
                return False
        if not self.busy.acquire(blocking=False):
            return False
        try:
            pick = self._pick(cfg, metrics)
            if pick is not None:
                self._start(lambda: self._run(cfg, pick, metrics))  # the run lets `busy` go
                return True
        except BaseException:
            self.busy.release()
            raise
        self.busy.release()
        return False

    def close(self) -> None:
        """Wait for the merge running, if any: the engine it runs on must not be closed under it."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            log.info("final_merge_awaited")
            thread.join()

    def _in_background(self, job: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=job, name="cdc2ch-final-merge", daemon=True)
        self._thread.start()

    def _hold(self, cfg: RunConfig, seconds: float) -> None:
        with self._guard:
            self._held[cfg.pipeline] = self.clock() + seconds

    def choose(self, cfg: RunConfig, found: Sequence[Partition]) -> tuple[Partition | None, float]:
        """The partition to merge now, and else in how many seconds one of those there are may be: one with
        more than one part not merged within `every`; those quiet for `every` (stopped changing) first,
        then the most parts."""
        every, now = cfg.final_merge_every.total_seconds(), self.clock()
        with self._guard:
            merged = {p.partition_id: self._merged.get((cfg.pipeline, p.partition_id), -inf) for p in found}
        piled = [p for p in found if p.parts > 1]
        due = [p for p in piled if now - merged[p.partition_id] >= every]
        if not due:
            return None, min([every] + [merged[p.partition_id] + every - now for p in piled])
        return min(due, key=lambda p: (p.quiet_seconds < every, -p.parts, -p.rows, p.partition_id)), 0.0

    def _pick(self, cfg: RunConfig, metrics: PipelineMetrics) -> Partition | None:
        """The partition to merge now, or None (then no look before one may be due)."""
        try:
            pick, wait = self.choose(cfg, self.partitions(cfg.target))
        except Exception as exc:
            self._failed(cfg, metrics, exc)
            return None
        if pick is None:  # nothing to collapse yet
            self._hold(cfg, wait)
        return pick

    def _run(self, cfg: RunConfig, pick: Partition, metrics: PipelineMetrics) -> None:
        try:
            try:
                seconds = self.merge(cfg.target, pick.partition_id)
            except Exception as exc:  # replication goes on: the next merge does this one's work
                self._failed(cfg, metrics, exc)
                return
            metrics.final_merged(seconds)
            with self._guard:
                self._merged[(cfg.pipeline, pick.partition_id)] = self.clock()
            self._hold(cfg, seconds * (1 / SHARE - 1))
            log.info(
                "final_merge_done", partition=pick.partition_id, parts=pick.parts, rows=pick.rows,
                seconds=round(seconds, 3), pipeline=cfg.pipeline, target=str(cfg.target),
            )  # fmt: skip
        finally:  # (recorded first: the next look must see this merge)
            self.busy.release()

    def _failed(self, cfg: RunConfig, metrics: PipelineMetrics, exc: Exception) -> None:
        metrics.final_merge_failed()
        retry = min(cfg.final_merge_every.total_seconds(), RETRY_AFTER)
        fields = dict(pipeline=cfg.pipeline, target=str(cfg.target), retry_in_s=retry)
        if isinstance(exc, Cdc2chError):
            log.warning("final_merge_failed", error=summarise(str(exc), 500), **fields)
        else:
            log.exception("final_merge_failed", **fields)
        self._hold(cfg, retry)
