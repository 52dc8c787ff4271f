"""The poll/commit loop: versions -> changes -> target rows -> ClickHouse -> offset, driving the ports.

For each version range [s, e]: read the changes once, write them, and only then record committed_version
= e. A crash anywhere replays [s, e]; replayed rows carry the same key and version, so FINAL is
unaffected, and the same batches carry the same deduplication tokens. Decisions (where to start, which
writer, how to cut ranges) are pure functions in plan.py; the ports are in ports.py.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, cast

from cdc2ch.base import phases
from cdc2ch.base.errors import SourceError
from cdc2ch.base.log import get_logger
from cdc2ch.base.phases import Phases
from cdc2ch.base.stop import Stopped
from cdc2ch.model.changeset import FEED, LOG, Changes, Commit, records_feed
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.replication import plan, readers
from cdc2ch.replication.budget import UNLIMITED, Leases, RowBudget
from cdc2ch.replication.fullload.progress import Progress
from cdc2ch.replication.fullload.resync import Resync
from cdc2ch.replication.metrics import Metrics, PipelineMetrics
from cdc2ch.replication.ports import ChangeSource, Ports, RangeWriter
from cdc2ch.replication.projection import designed_source
from cdc2ch.replication.rangesteps import RangeSteps
from cdc2ch.replication.readahead import ReadAhead
from cdc2ch.replication.standing import Standing, StepOutcome
from cdc2ch.replication.startup.bootstrap import Bootstrap
from cdc2ch.replication.startup.inputs import Inputs, check_inputs
from cdc2ch.replication.startup.resume import nothing_to_write, resumed

log = get_logger("cdc2ch.pipeline")


class Replicator:
    """One table into one ClickHouse table, with its offsets; `stop` asks it to end after the current batch.
    Driven as start() / step()... / close() by the runner, or by run() for a single pipeline."""

    def __init__(
        self,
        cfg: RunConfig,
        source: ChangeSource,
        sink: Any = None,  # a clickhouse Sink, for the ports built on it when `ports` is not given
        stop: threading.Event | None = None,
        metrics: PipelineMetrics | None = None,
        ports: Ports | None = None,
        budget: RowBudget = UNLIMITED,
    ) -> None:
        self.cfg, self.source = cfg, designed_source(source, cfg.design)  # rows in the target's columns
        self.budget = budget  # the rows the process's pipelines may hold at once
        self.stop = stop or threading.Event()
        self.metrics = metrics or Metrics().pipeline(cfg.pipeline)
        if ports is None:
            from cdc2ch.replication.target import clickhouse_ports

            ports = clickhouse_ports(cfg, self.source, sink, self.stop, self.metrics, budget)
        # A snapshot (initial load or resync) is seen running in the metrics, so an alert can say it runs long.
        self.ports = dataclasses.replace(ports, load_snapshot=timed(ports.load_snapshot, self.metrics))
        self.log = log.bind(pipeline=cfg.pipeline)
        self.auto = cfg.reader == "auto"  # chosen by check_inputs, kept while readers.check_range passes
        self.choice: readers.ReaderChoice | None = None  # what auto chose, and why (`validate` shows it)
        self.state: PipelineState | None = None
        self.started: PipelineState | None = None
        self.writer: RangeWriter | None = None
        # A new pipeline claims itself only once its first range is read and checked: refused input leaves
        # no table and no offset (standing.py).
        self.standing = Standing()
        # Asked between two ranges of a long catch-up: end this step there and let other pipelines run (the
        # runner asks its schedule).
        self.turn_over: Callable[[], bool] = lambda: False
        # Asked before a new pipeline claims itself for its first write: False (paused meanwhile) holds it.
        self.may_begin: Callable[[], bool] = lambda: True
        self.phases = Phases()  # where its time went (its `stopped` event says)
        self._configure(cfg)

    def _configure(self, cfg: RunConfig) -> None:
        """Run with `cfg`: its snapshots (a new pipeline's first load, a resync) load with its reader."""
        self.cfg, ports = cfg, self.ports
        self.resync = Resync(cfg, self.source, ports.tables, ports.store, ports.load_snapshot, self.log)
        self.bootstrap = Bootstrap(cfg, self.source, ports, self.log)
        self.steps = RangeSteps(cfg, self.source, ports, self.bootstrap, self.log)

    # -- start-up ---------------------------------------------------------------------------------
    def check_inputs(self) -> Inputs:
        """Check table, keys, change data feed, offsets and options, writing nothing (what `validate` runs);
        then run with the reader `--reader auto` chose there."""
        inputs = check_inputs(self.cfg, self.source, self.ports, self.bootstrap, self.log)
        if inputs.reader is not None:
            self.choice = inputs.reader
            self._configure(dataclasses.replace(self.cfg, reader=inputs.reader.reader))
        return inputs

    def claim(self, inputs: Inputs | None = None) -> None:
        """Claim the pipeline's offset by `inputs`, or one held unclaimed before a write it did not foresee (a
        version that came since it looked, a resync asked for); then read the offset again, now that nobody
        else can move it, and finish a resync that a crash interrupted."""
        inputs = inputs or self.standing.inputs
        if inputs is None:
            return
        self.ports.lock.acquire()
        self.standing = self.standing.claim()
        state = resumed(self.cfg, self.source, self.ports.store, inputs.start, inputs.table_id, self.log)
        self.state = self.resync.recover(state)

    @phases.recorded
    def start(self) -> PipelineState:
        """Check the inputs, then claim a pipeline that has an offset (unless a --once poll has nothing to
        write) and finish any interrupted resync. A new pipeline begins before its start version and is
        claimed once its first range passed the checks (catch_up, claim_first_range)."""
        inputs = self.check_inputs()
        self.writer = self.ports.writer(inputs.writer)
        if inputs.initial is not None:  # a new pipeline (no stored offset): how it begins
            self.state = self.bootstrap.begin(inputs.initial, inputs.start, inputs.table_id)
        elif nothing_to_write(self.cfg, inputs, self.source, self.resync):
            self.ports.lock.check()  # one that another runner holds is refused all the same
            self.state, self.standing = inputs.stored, self.standing.held(inputs)
        else:
            if self.stop.is_set():  # a stop while the inputs were checked: no claim after it
                raise Stopped("the claim")
            self.claim(inputs)  # inputs are fine: from here on this process writes
        assert self.state is not None  # set by each branch above
        self.started = self.state  # where this runner took over (what the Python API reports from)
        self.log.info(
            "start",
            source=self.source.uri,
            location=self.source.location,
            target=str(self.cfg.target),
            committed=self.state.committed_version,
        )
        return self.state

    # -- work -------------------------------------------------------------------------------------
    def catch_up(self, state: PipelineState, latest: int | None = None) -> tuple[PipelineState, bool]:
        """Replicate everything after state.committed_version up to `latest` (default: the latest version).
        Returns the state and whether it ended between two ranges to let others run (turn_over)."""
        cfg = self.cfg
        start = state.committed_version + 1
        commits = self.source.commits(start, latest)
        if not commits:
            return state, False
        plan.check_commits(start, commits, self.source.uri, cfg)
        if state.interrupted_range:
            self.log.info(
                "resuming_interrupted_range", start=state.interrupted_range[0], end=state.interrupted_range[1]
            )
        checks_first = not self.standing.claimed  # a new pipeline's first range
        writer = cast("RangeWriter", self.writer)  # set by start()
        cut, read = scheduled(cfg, self.source, writer, start, commits, state.interrupted_range, checks_first)
        ranges, estimates, held = cut.ranges, cut.estimates, cut.held
        by_version = {c.version: c for c in commits}
        breaks = {s: by_version.get(s) for s in cut.breaks}  # ranges that begin at a schema change
        # A long catch-up shows how it goes.
        total, long = sum(c.estimated_rows for c in commits), len(ranges) > 1
        broken, gave_way = None, False
        ahead = self.ports.on_other_threads
        with (
            Progress(f"catch-up {cfg.pipeline}", total, len(ranges), unit="range", shown=long) as progress,
            Leases(self.budget, self.stop) as leases,
            ReadAhead(read, cfg.immutable_keys, writer.collects, ahead) as reads,
        ):
            for i, (s, e) in enumerate(ranges):
                if self.stop.is_set() or gave_way or not leases.need(i, held[i]):
                    break
                changes = reads.open(s, e)
                if writer.kind == "clickhouse":
                    readers.check_range(self.source.uri, changes, state, chosen=self.auto)
                if checks_first and i == 0:
                    writer.check(changes, estimates[i])  # a new pipeline writes nothing before the check
                    if not self.may_begin():  # paused while it started (Spark): nothing written
                        break
                # decided before the next range is read ahead: a range read for nothing would be wasted
                gave_way = i + 1 < len(ranges) and self.turn_over()
                if (
                    not gave_way
                    and plan.reads_ahead(estimates, i, cfg.max_rows_per_read)
                    and leases.ahead(i + 1, held[i + 1])
                ):  # meanwhile: DDL, claim, write
                    reads.read(*ranges[i + 1])
                if self.stop.is_set():  # a stop during the read: no table, no claim, no write after it
                    self.log.info(
                        "range_abandoned", start=s, end=e, batches_written=0, reason="stop requested"
                    )
                    break
                change = self.steps.prepare_target(
                    state, changes.schema, breaks.get(s), self.standing.claimed
                )
                self.standing = self.standing.claim()  # a new pipeline claimed itself with its first DDL
                if change.breaking:  # resync (or refuse) once no read runs any more
                    broken = (breaks.get(s), s, e, change)
                    break
                state, result = self.steps.write_range(state, changes, writer, estimates[i])
                del changes  # its rows are written: give their share of the budget back
                leases.done(i)
                if not result.committed:
                    break
                state = self.state = self.steps.commit_range(state, result)
                newest = commits[-1]
                self.metrics.lag(
                    e, newest.version, (newest.timestamp - by_version[e].timestamp).total_seconds()
                )
                progress.advance(result.rows, 1)
        if broken is not None:
            return self.resync.broken(state, *broken), False
        progress.done()
        return state, gave_way

    def warm_up(self) -> None:
        """A service's first change should be visible as quickly as the rest: let the source pay its first
        read's start-up cost now (best effort)."""
        seconds = self.source.warm_up(self.cfg.immutable_keys)
        if seconds is not None:
            self.log.info("warmed_up", seconds=round(seconds, 3))

    # -- life cycle -------------------------------------------------------------------------------
    @phases.recorded
    def step(self) -> StepOutcome:
        """One poll: replicate whatever is new (a new pipeline's snapshot first, when it begins with one). A
        new pipeline's attempt that fails before committing anything leaves nothing behind
        (Bootstrap.take_back)."""
        assert self.state is not None  # set by start()
        if self.standing.holds_offset:
            return self._step()
        before = self.state.committed_version
        self.bootstrap.mark()
        try:
            return self._step()
        except Exception as exc:
            if self.state.committed_version == before and self.bootstrap.take_back(exc):
                self.standing = self.standing.taken_back()
            raise

    def _step(self) -> StepOutcome:
        assert self.state is not None  # set by start()
        before = self.state.committed_version
        if self.bootstrap.pending is not None:
            if not self.may_begin():  # paused before its snapshot began
                return StepOutcome(committed=False)
            loaded = self.bootstrap.load(self.state)
            if loaded is None:  # stopped between chunks: the next run resumes the snapshot
                return StepOutcome(committed=False)
            self.state, self.standing = loaded, self.standing.claim()
        committed, latest = self.state.committed_version, self.source.latest()
        self.metrics.lag(committed, latest.version, self.source.lag(committed, latest)[1] or 0.0)
        gave_way = False
        if committed < latest.version:
            self.claim()
            self.state, gave_way = self.catch_up(self.state, latest.version)
        return StepOutcome.of(before, self.state.committed_version, latest.version, gave_way)

    def rebuild(self, reason: str) -> bool:
        """`cdc2ch resync`: rebuild the target through the side-table swap; whether it was swapped in."""
        assert self.state is not None  # set by start()
        before, self.state = self.state, self.resync.run(self.state, reason)
        return self.state is not before

    def close(self) -> None:
        self.ports.lock.release()
        if self.state is not None:
            self.log.info(
                "stopped",
                committed=self.state.committed_version,
                rows_written=self.state.rows_written,
                phases=self.phases.seconds(),
            )

    def run(self) -> PipelineState:
        """Catch up, then (unless --once) poll until asked to stop."""
        try:
            self.start()
            if not self.cfg.once:
                self.warm_up()
            while not self.stop.is_set():
                progressed = self.step().committed
                if self.cfg.once:
                    break
                if not progressed:  # nothing new: wait; else look again at once
                    self.stop.wait(self.cfg.poll_interval)
        finally:
            self.close()
        return cast("PipelineState", self.state)  # set by start()


def timed(
    load_snapshot: Callable[[RunConfig, int, str | None], int | None], metrics: PipelineMetrics
) -> Callable[[RunConfig, int, str | None], int | None]:
    """`load_snapshot`, seen running in the metrics (so an alert can say a snapshot runs long)."""

    def load(side: RunConfig, version: int, comment: str | None) -> int | None:
        metrics.snapshot_began()
        try:
            return load_snapshot(side, version, comment)
        finally:
            metrics.snapshot_ended()

    return load


def scheduled(
    cfg: RunConfig,
    source: ChangeSource,
    writer: RangeWriter,
    start: int,
    commits: list[Commit],
    interrupted: tuple[int, int] | None,
    checks_first: bool,
) -> tuple[plan.RangePlan, Callable[[int, int], Changes]]:
    """A catch-up over `commits` (from `start` on) cut into ranges, and what opens a range: from the feed or
    the log (plan.origin), told the key columns (the pre-images a feed read may leave out)."""
    fed = fed_versions(cfg, source, start, commits)
    cut = plan.schedule(
        commits, interrupted, cfg.max_rows_per_read, writer.range_factor, writer.collects, source.streams,
        checks_first, plan.log_reads(cfg.changes_from, fed, commits, writer.kind),
    )  # fmt: skip

    def read(s: int, e: int) -> Changes:
        return source.changes(s, e, key=cfg.identity.columns, origin=plan.origin(cfg.changes_from, fed, s, e))

    return cut, read


def fed_versions(cfg: RunConfig, source: ChangeSource, start: int, commits: list[Commit]) -> frozenset[int]:
    """The versions among `commits` (from `start` on) whose changes the table's change data feed records, where
    --changes-from auto chooses per range (plan.origin)."""
    if cfg.changes_from in (FEED, LOG):
        return frozenset()  # (the option decides every range)
    if not any(c.properties is not None for c in commits):  # none set properties: as they are now (cheap)
        return plan.feed_versions(start > 0 and records_feed(source.properties()), commits)
    try:  # the properties before the first commit: a replay of the log up to there
        before = start > 0 and records_feed(source.properties(start - 1))
    except SourceError:  # a version the log no longer holds: as the table is now
        before = records_feed(source.properties())
    return plan.feed_versions(before, commits)
