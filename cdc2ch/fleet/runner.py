"""Pipelines in one process: one Spark session and one ClickHouse target shared, each pipeline with its own
offset, claim and health record. Pipelines run side by side on a bounded pool of workers (scheduler.py
decides which runs when); a failing one is reported and retried with growing pauses while the others go on.
With a `discover` function (the --table patterns listed again), a service adds the pipelines of new tables
every `discover_interval` seconds and lets go of those whose table is gone (their targets stay).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial

from cdc2ch.base.errors import Cdc2chError, jvm_gone, jvm_stopped, jvm_stopped_error, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.base.stop import Stopped
from cdc2ch.fleet.health import HealthBook, kept_error
from cdc2ch.fleet.lifecycle import Lifecycle
from cdc2ch.fleet.merges import FinalMerges
from cdc2ch.fleet.scheduler import NEVER, Schedule
from cdc2ch.fleet.serviceports import ServicePorts
from cdc2ch.fleet.upkeep import Upkeep
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import Health
from cdc2ch.replication.budget import UNLIMITED, RowBudget
from cdc2ch.replication.metrics import Metrics, PipelineMetrics, error_kind
from cdc2ch.replication.pipeline import Replicator
from cdc2ch.replication.standing import StepOutcome

log = get_logger("cdc2ch.runner")

MAX_BACKOFF = 300.0
HEALTH_EVERY = 60.0  # seconds between health writes while all is well (each write is an insert)
STOP_SEEN = 0.1  # seconds at most between a stop and the dispatcher noticing it


@dataclass
class Slot:
    cfg: RunConfig
    metrics: PipelineMetrics
    health: Health
    job: Replicator | None = None
    retry_at: float = 0.0
    saved_at: float = float("-inf")
    begun: bool = False  # its health recorded as it began (`status`: starting), apart from saved_at
    error: BaseException | None = None  # the last attempt's failure, None after a success
    gone: bool = False  # its table is gone: let go of once its running turn ends

    def failed(self, exc: BaseException, poll_interval: float, retry_told: bool, raised: bool) -> None:
        """An attempt failed: its health, metrics and log line, and when to try again. `raised`: the error
        ends the process, which prints it last (its paragraph, or its traceback): the log line then names
        the pipeline and the kind only, so that the error is printed once."""
        kind = error_kind(exc)
        text = str(exc) if isinstance(exc, Cdc2chError) else f"{type(exc).__name__}: {exc}"
        self.error = exc
        self.health = self.health.failed(_now(), kept_error(text), kind)
        self.metrics.error(exc, self.health.failures)
        pause = backoff(poll_interval, self.health.failures)
        self.retry_at = time.monotonic() + pause
        fields: dict[str, object] = {"pipeline": self.cfg.pipeline, "kind": kind}
        if raised:
            log.error("pipeline_failed", **fields)
            return
        fields["error"] = kept_error(text)
        if retry_told:
            fields["retry_in_s"] = round(pause, 1)
        if isinstance(exc, Cdc2chError):
            log.error("pipeline_failed", **fields)
        else:
            log.exception("pipeline_failed", **fields)

    def succeeded(self) -> bool:
        """An attempt succeeded; whether the pipeline recovered from failing (its health to be saved)."""
        recovered = self.error is not None or self.health.failures > 0
        self.error = None
        self.health = self.health.succeeded(_now())
        self.metrics.success()
        return recovered


def backoff(poll_interval: float, failures: int) -> float:
    """Pause before the next attempt after `failures` failures in a row: the poll interval, doubling."""
    return min(poll_interval * 2 ** max(failures - 1, 0), max(MAX_BACKOFF, poll_interval))


@dataclass(frozen=True)
class Fleet:
    """How one process runs its pipelines: a failure isolated (recorded, retried) or raised, on how many
    workers, holding how many rows at once, and the table patterns listed again for new tables."""

    isolate: bool = False
    workers: int = 1
    budget: RowBudget = UNLIMITED
    discover: Callable[[frozenset[str]], tuple[list[RunConfig], list]] | None = None
    discover_interval: float = 300.0
    skipped: tuple = ()  # tables the patterns matched but no pipeline can follow


class Runner:
    """Drives pipelines until stopped (or once each with --once), up to `fleet.workers` at a time. With
    `fleet.isolate`, a failure is recorded and retried; without it (a single pipeline from flags) it is
    recorded and raised, and the pipeline runs on the calling thread."""

    def __init__(
        self,
        configs: list[RunConfig],
        spark,
        sink,
        stop: threading.Event,
        metrics: Metrics,
        *,
        fleet: Fleet = Fleet(),
        ports: ServicePorts | None = None,
    ):
        self.configs = configs
        self.budget = fleet.budget  # rows all pipelines may hold at once
        self.metrics = metrics
        self.discover, self.discover_interval = fleet.discover, fleet.discover_interval
        self._discover_at = time.monotonic() + fleet.discover_interval
        if ports is None:  # a Spark session (or LazySpark) and a ClickHouse Sink
            from cdc2ch.fleet.assembly import service_ports

            ports = service_ports(spark, sink)
        self.ports = ports
        self.stop = stop
        self.isolate = fleet.isolate
        self.once = configs[0].once
        self.fatal: BaseException | None = None  # what ends the whole process (Spark's JVM gone)
        self.poll_interval = configs[0].poll_interval
        self.schedule = Schedule(fleet.workers if fleet.isolate else 1)
        self.health = HealthBook(ports.health, ports.verified)
        self.upkeep = Upkeep(ports.compactions, ports.compact)  # between a pipeline's turns
        self.merges = FinalMerges(ports.partitions, ports.merge, self.upkeep.busy)  # one at a time with it
        self.lifecycle = Lifecycle(ports.requests, self.poll_interval)  # pause, resume and resync requests
        self._warm = threading.Lock()
        self._warmed = self.once  # a --once run has no first change to speed up
        self.slots: list[Slot] = []
        self._add(self._slots(configs))
        self._report_skipped(list(fleet.skipped))

    def _slots(self, configs: list[RunConfig]) -> list[Slot]:
        known: dict[str, Health] = {}
        for db in sorted({c.target.database for c in configs}):
            known.update(self.ports.health(db).load_all())
        slots = []
        for c in configs:
            health = known.get(c.pipeline) or Health(c.pipeline, c.table, str(c.target))
            metrics = self.metrics.pipeline(c.pipeline)
            metrics.failing(health.failures)  # failures in a row before this process started count
            slots.append(Slot(c, metrics, health))
        return slots

    def _add(self, slots: list[Slot]) -> None:
        for slot in slots:
            self.slots.append(slot)
            self.schedule.add(slot.cfg.pipeline)

    def running(self) -> list[RunConfig]:
        """The pipelines it runs now (those of new tables included, none of tables gone)."""
        return [s.cfg for s in list(self.slots)]

    def run(self) -> list[Slot]:
        """Returns the pipelines whose last attempt failed."""
        schedule = self.schedule
        pool = None
        if schedule.workers > 1:
            pool = ThreadPoolExecutor(schedule.workers, thread_name_prefix="cdc2ch-pipeline")
        try:
            while not self.stop.is_set():
                self.lifecycle.refresh([s.cfg for s in self.slots])
                while not self.stop.is_set() and (name := schedule.take()) is not None:
                    slot = next(s for s in self.slots if s.cfg.pipeline == name)
                    if pool is None:
                        self._turn(slot)  # on this thread: a single pipeline's failure is raised here
                    else:
                        pool.submit(self._guarded, slot)
                if self.once and schedule.running() == 0 and schedule.next_due() == NEVER:
                    break
                if self.discover is not None and time.monotonic() >= self._discover_at:
                    self._rediscover()
                with schedule.cond:  # a turn ending wakes this thread up early; a stop within STOP_SEEN
                    schedule.cond.wait(min(self._pause(), STOP_SEEN))
        finally:
            if pool is not None:
                pool.shutdown(wait=True)  # a running turn ends after its batch (the stop is set)
            self.merges.close()
            for slot in self.slots:
                if slot.job is not None:
                    slot.job.close()
                elif self.stop.is_set() and slot.error is None:  # stopped before it started
                    log.info("stopped", pipeline=slot.cfg.pipeline, started=False)
        if self.fatal is not None:
            raise self.fatal
        return [s for s in self.slots if s.error is not None]

    def _pause(self) -> float:
        waits = [self.schedule.next_due(), self.poll_interval]
        if self.discover is not None:
            waits.append(self._discover_at - time.monotonic())
        return max(min(waits), 0.05)

    def _guarded(self, slot: Slot) -> None:
        """A turn on the pool: whatever escapes it would vanish in its future, so it ends the service (to be
        restarted whole) instead of leaving a pipeline that never runs again."""
        try:
            self._turn(slot)
        except BaseException as exc:
            log.exception("turn_failed", pipeline=slot.cfg.pipeline)
            if self.fatal is None:
                self.fatal = exc
            self.stop.set()
            with self.schedule.cond:
                self.schedule.cond.notify_all()

    def _turn(self, slot: Slot) -> None:
        """One attempt of one pipeline (and its target's compaction or merge when due), then its next turn scheduled:
        at once while it has more to do, after the poll interval when it had nothing new, at its retry time
        after a failure."""
        name, started = slot.cfg.pipeline, time.monotonic()
        turn = StepOutcome(committed=False)
        try:
            if self.lifecycle.holds(slot.cfg, slot.metrics):  # paused: its claim let go until resumed
                if slot.job is not None:
                    slot.job.close()
                    slot.job = None
            else:
                turn = self._attempt(slot)
                if slot.error is None and not slot.gone and not self.stop.is_set():
                    if not self.upkeep.after_turn(slot.cfg, slot.metrics):  # a compaction merges too
                        self.merges.after_turn(slot.cfg, turn, slot.metrics)
        finally:
            if self.once:
                due = NEVER
            elif slot.error is not None:
                due = slot.retry_at
            elif turn.gave_way or turn.committed:
                due = time.monotonic()  # more to do, or something new may have come meanwhile
            else:
                due = started + self.poll_interval
            self.schedule.end(name, due, heavy=True if turn.gave_way else None)
            if slot.gone and slot.job is not None:
                slot.job.close()
                slot.job = None

    def _rediscover(self) -> None:
        """List the patterns again: pipelines for new tables, none for tables gone (a listing that fails
        changes nothing and is tried again next interval)."""
        self._discover_at = time.monotonic() + self.discover_interval
        assert self.discover is not None  # (called with patterns to list only)
        try:
            wanted, skipped = self.discover(frozenset(s.cfg.pipeline for s in self.slots if s.error is None))
        except Cdc2chError as exc:
            log.warning("discovery_failed", error=summarise(str(exc), 500))
            return
        self._report_skipped(skipped)
        have = {s.cfg.pipeline for s in self.slots}
        names = {c.pipeline for c in wanted}
        for slot in [s for s in self.slots if s.cfg.pipeline not in names]:
            log.warning(
                "table_gone", pipeline=slot.cfg.pipeline, table=slot.cfg.table, target=str(slot.cfg.target)
            )
            slot.gone = True
            if self.schedule.is_running(slot.cfg.pipeline):
                self.ports.jobs.cancel(slot.cfg.pipeline)  # its turn ends; _turn lets the job go
            elif slot.job is not None:
                slot.job.close()
                slot.job = None
            self.schedule.remove(slot.cfg.pipeline)
            self.slots.remove(slot)
        new = self._slots([c for c in wanted if c.pipeline not in have])
        for slot in new:
            log.info("table_discovered", pipeline=slot.cfg.pipeline, table=slot.cfg.table)
        self._add(new)

    def _attempt(self, slot: Slot) -> StepOutcome:
        job = slot.job
        try:  # the job group too: setting it is a call to the JVM, which may be gone
            shared = self.schedule.workers > 1  # pipelines side by side: each its own jobs
            with self.ports.jobs.of(slot.cfg.pipeline) if shared else nullcontext():
                if job is None:
                    if self.isolate and not slot.begun:  # `status`: starting, not unrun
                        slot.begun = self.health.save(slot.health, slot.cfg.target.database, slot.metrics)
                    job = self.ports.pipeline(slot.cfg, self.stop, slot.metrics, self.budget)
                    if not self.once:  # end the turn between two ranges: another's turn, a pause, a resync
                        job.turn_over = partial(self._turn_over, slot.cfg)
                    job.may_begin = partial(self.lifecycle.may_begin, slot.cfg)
                    job.start()
                    slot.job = job
                    self._warm_up(job)
                self.lifecycle.resync(slot.cfg, job)
                turn = job.step()
        except Stopped:  # a stop while Spark started (or before a claim): the turn ends, nothing begun
            if job is not None and job.state is None:  # stopped in its start: its claim, if any, let go
                job.close()
                job = None
            slot.job = job  # else closed (and its `stopped` logged) as the runner ends
            return StepOutcome(committed=False)
        except Exception as raised:
            exc = jvm_stopped(raised) or raised  # a JVM gone mid-call: the paragraph, not a traceback
            wrote = job is not None and job.standing.holds_offset  # an offset of its own
            if job is not None:
                job.close()
            slot.job = None
            # A single pipeline refused before it wrote anything (bad input, null keys in a new pipeline's
            # first range) says so on stderr and writes nothing; a pipeline of a config, or one that failed
            # after it had claimed its offset, leaves its error for `cdc2ch status`.
            self._failed(slot, exc, record=self.isolate or wrote)
            if self.isolate and jvm_gone(raised):  # no pipeline can read again: end, to be restarted whole
                self.fatal = jvm_stopped_error()
                self.stop.set()
            if not self.isolate:
                if exc is raised:
                    raise
                raise exc from raised
            return StepOutcome(committed=False)
        self._succeeded(slot)
        return turn

    def _turn_over(self, cfg: RunConfig) -> bool:
        return self.schedule.should_give_way(cfg.pipeline) or self.lifecycle.wants(cfg)

    def _warm_up(self, job: Replicator) -> None:
        """The JVM's first read is slow: the first pipeline pays it before the first change arrives."""
        with self._warm:
            if self._warmed:
                return
            self._warmed = True
        job.warm_up()

    def _report_skipped(self, skipped: list) -> None:
        self.metrics.skipped.set(len(skipped))
        self.health.skipped(skipped)

    def _save(self, slot: Slot) -> None:
        if self.health.save(slot.health, slot.cfg.target.database, slot.metrics):
            slot.saved_at = time.monotonic()

    def _failed(self, slot: Slot, exc: BaseException, record: bool) -> None:
        slot.failed(
            exc, self.poll_interval, retry_told=self.isolate and not self.once, raised=not self.isolate
        )
        if record:
            self._save(slot)

    def _succeeded(self, slot: Slot) -> None:
        if slot.succeeded() or self.once or time.monotonic() - slot.saved_at >= HEALTH_EVERY:
            self._save(slot)


def _now() -> datetime:
    return datetime.now(timezone.utc)
