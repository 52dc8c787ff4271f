"""`cdc2ch reshape`: give a live replica a new design (sorting key, partitions, columns, settings) without
stopping its readers: build a side table with the new design from the Delta table at the committed version,
catch it up with the change feed while `run` keeps the old table serving, and swap the two atomically.

Every step is a pipeline of its own (`<pipeline>__cdc2ch_reshape`, into `<target>__cdc2ch_reshape`), so the
snapshot resumes chunk by chunk and the catch-up from its offset. The side table carries a comment naming
the pipeline and the design; after `EXCHANGE TABLES` the target carries it, which is how a rerun after a
crash tells a finished swap (record the offset, drop the old table) from a side table still being built (go
on) or one built for another design (drop it, start over). The last catch-up and the swap run holding the
pipeline's claim, so no `run` writes the old table meanwhile.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, fields, replace

from cdc2ch.base.errors import ConfigError, LockedError, StateError
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import PipelineState
from cdc2ch.model.view import NONE as NO_VIEW
from cdc2ch.replication.pipeline import Replicator
from cdc2ch.replication.ports import Lock
from cdc2ch.replication.projection import designed_source
from cdc2ch.replication.target import clickhouse_snapshotter, snapshot_ports

log = get_logger("cdc2ch.reshape")

SUFFIX = "__cdc2ch_reshape"
EXCHANGING = ("Atomic", "Replicated", "Shared")  # database engines that can EXCHANGE TABLES
WAIT_LOG_SECONDS = 30


@dataclass(frozen=True)
class Reshaped:
    pipeline: str
    target: str
    version: int  # the Delta version the reshaped table holds
    rows: int  # rows the side table's snapshot wrote
    seconds: float


def marker(cfg: RunConfig) -> str:
    """The comment of a table built for this pipeline with this design (its view's name is not the table's)."""
    design = cfg.design
    text = repr(
        [(f.name, getattr(design, f.name)) for f in fields(design) if f.init and f.name != "current_view"]
    )
    return f"cdc2ch: reshape of pipeline {cfg.pipeline} into design {hashlib.sha1(text.encode()).hexdigest()[:16]}"


def side_config(cfg: RunConfig) -> RunConfig:
    """The side table's own pipeline: the new design, into `<target>__cdc2ch_reshape`, without a view (the
    target's follows the swap)."""
    side = TargetName(cfg.target.database, cfg.target.table + SUFFIX)
    return replace(cfg, target=side, pipeline=cfg.pipeline + SUFFIX, once=True, reset=False,
                   from_version=None, from_timestamp=None,
                   design=replace(cfg.design, current_view=NO_VIEW))  # fmt: skip


class Reshape:
    def __init__(self, cfg: RunConfig, source, sink: Sink, stop: threading.Event | None = None):
        self.cfg, self.source, self.sink = cfg, designed_source(source, cfg.design), sink
        self.stop = stop or threading.Event()
        self.side = side_config(cfg)
        self.mark = marker(cfg)
        self.log = log.bind(pipeline=cfg.pipeline)
        self.ports = snapshot_ports(cfg, sink, self.log)  # the target's offsets, claim and tables
        self.store, self.tables = self.ports.store, self.ports.tables

    def run(self) -> Reshaped | None:
        """Reshape the target; None when stopped midway (the same command resumes)."""
        t0 = time.monotonic()
        cfg, sink = self.cfg, self.sink
        self._check_database()
        state = self.store.load(cfg.pipeline)
        if self.tables.comment() == self.mark:  # swapped already: a crash before the hand-over
            self.tables.settle()
            return self._hand_over(state, time.monotonic() - t0)
        if state is None or state.committed_version < 0 or not sink.table_exists(cfg.target):
            raise StateError(
                f"Pipeline {cfg.pipeline!r} has not replicated anything into {cfg.target} yet, so there is no "
                f"replica to reshape. Run `cdc2ch run` with the new design options instead: they shape the "
                f"table it creates."
            )
        if self.tables.comment(SUFFIX) not in (None, self.mark):  # built for another design
            self.log.warning("reshape_side_dropped", side_table=str(self.side.target))
            self._drop_side()
        side = self.store.load(self.side.pipeline)
        rows = 0
        if side is None or side.committed_version < 0:
            self.log.info(
                "reshape_snapshot", version=state.committed_version, side_table=str(self.side.target)
            )
            at = replace(self.side, snapshot_version=state.committed_version)
            job = clickhouse_snapshotter(at, self.source, sink, self.stop)
            if job.run(comment=self.mark) is None:
                return None
            assert job.loaded is not None  # set by a run that ends
            rows = job.loaded[1]
        if self._catch_up() is None:  # while `run` serves the old table
            return None
        return self._swap(rows, t0)

    def _check_database(self) -> None:
        rows = self.sink.query_rows(
            "SELECT engine FROM system.databases WHERE name = {db:String}",
            {"db": self.cfg.target.database},
            what="look up the target database",
        )
        if rows and rows[0][0] not in EXCHANGING:
            raise ConfigError(
                f"Database {self.cfg.target.database} uses the {rows[0][0]} engine, which cannot swap two tables "
                f"atomically (EXCHANGE TABLES needs an Atomic database, ClickHouse's default since 20.10), so "
                f"cdc2ch cannot reshape {self.cfg.target} in place. Nothing was written. Replicate into a new "
                f"--target in an Atomic database with the new design, then point readers at it."
            )

    def _catch_up(self) -> PipelineState | None:
        """The side table up to the latest version, as its own pipeline."""
        state = Replicator(self.side, self.source, self.sink, self.stop).run()
        return None if self.stop.is_set() else state

    def _swap(self, rows: int, t0: float) -> Reshaped | None:
        """Hold the pipeline (waiting for a `run` to let go), catch the side table up to where the old
        table is, swap them, hand the offset over."""
        lock = self.ports.lock
        if not self._claim(lock):
            return None
        try:
            state = self.store.load(self.cfg.pipeline)
            assert state is not None  # (run checked it)
            side = self._catch_up()
            if side is None:
                return None
            if side.committed_version < state.committed_version:  # the table moved past the latest read
                raise StateError(
                    f"The side table of pipeline {self.cfg.pipeline!r} reached version {side.committed_version} "
                    f"but {self.cfg.target} holds {state.committed_version}. Run the same command again."
                )
            self.tables.exchange(SUFFIX)
            self.log.info("reshape_swapped", version=side.committed_version)
            done = self._hand_over(state, time.monotonic() - t0)
            return replace(done, rows=rows)
        finally:
            lock.release()

    def _claim(self, lock: Lock) -> bool:
        """Take the pipeline's claim, waiting while a `run` holds it; False when asked to stop."""
        waited = last = time.monotonic()
        while not self.stop.is_set():
            try:
                lock.acquire()
                return True
            except LockedError as exc:
                if time.monotonic() - last >= WAIT_LOG_SECONDS or last == waited:
                    self.log.warning(
                        "reshape_waiting", reason=str(exc), waited=round(time.monotonic() - waited)
                    )
                    last = time.monotonic()
                self.stop.wait(2)
        return False

    def _hand_over(self, state: PipelineState | None, seconds: float) -> Reshaped:
        """After the swap: the offset of the side table's pipeline becomes the pipeline's (if further), the
        old table (now under the side name) and the side pipeline go."""
        side = self.store.load(self.side.pipeline)
        if state is not None and side is not None and side.committed_version > state.committed_version:
            state = state.advanced(side.committed_version, 0)
            self.store.save(state)
        self._drop_side()
        version = state.committed_version if state is not None else -1
        self.log.info("reshape_done", version=version, seconds=round(seconds, 3))
        return Reshaped(self.cfg.pipeline, str(self.cfg.target), version, 0, seconds)

    def _drop_side(self) -> None:
        self.tables.drop(SUFFIX)
        self.store.forget(self.side.pipeline)
