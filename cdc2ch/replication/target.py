"""A pipeline's ports on a ClickHouse target: offsets, claim, target table, writers and snapshots, all
through one clickhouse-connect client (`Sink`), with the Spark session's plumbing the writers need. The one
place the replication loop meets the adapters (the fleet's is fleet/assembly.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

from cdc2ch.base.log import Logger, get_logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.footprint import ClickHouseFootprint
from cdc2ch.clickhouse.state.lock import PipelineLock
from cdc2ch.clickhouse.state.statestore import StateStore
from cdc2ch.clickhouse.tables.ddl import ClickHouseTables
from cdc2ch.clickhouse.writers import Destination, SparkTasks
from cdc2ch.clickhouse.writers.driver import DriverWriter
from cdc2ch.clickhouse.writers.executors import ExecutorWriter
from cdc2ch.clickhouse.writers.pushdown import LakeFunctionReader, PushdownWriter
from cdc2ch.clickhouse.writers.snapshotload import SnapshotTable
from cdc2ch.model.config import RunConfig
from cdc2ch.replication import plan
from cdc2ch.replication.budget import UNLIMITED, RowBudget
from cdc2ch.replication.fullload.snapshot import Snapshotter
from cdc2ch.replication.metrics import PipelineMetrics
from cdc2ch.replication.ports import ChangeSource, Lock, Ports, RangeWriter, SnapshotPorts
from cdc2ch.replication.projection import DesignedSource
from cdc2ch.source.spark.session import positional_columns, shipped_by_value
from cdc2ch.source.spark.threads import on_other_threads
from cdc2ch.source.sparkread.snapshotframe import FrameSnapshot
from cdc2ch.source.storefaults import storage_error

log = get_logger("cdc2ch.pipeline")


def clickhouse_ports(
    cfg: RunConfig,
    source: DesignedSource,
    sink: Sink,
    stop: threading.Event,
    metrics: PipelineMetrics,
    budget: RowBudget = UNLIMITED,
) -> Ports:
    bound = log.bind(pipeline=cfg.pipeline)
    tables = ClickHouseTables(sink, cfg.target, cfg.design)
    snapshots = snapshot_ports(cfg, sink, bound, tables)  # the offsets and the claim
    tasks = SparkTasks(positional_columns, shipped_by_value)
    to = Destination(cfg, sink, tables.table_sql, stop, metrics, bound, tasks, storage_error)
    streamed = partial(plan.streamed, max_rows_per_read=cfg.max_rows_per_read, streams=True)
    writers: dict[str, Callable[[Destination], RangeWriter]] = {
        "clickhouse": PushdownWriter,
        "executors": ExecutorWriter,
        "driver": lambda to: DriverWriter(to, streamed if source.streams else None),
    }

    return Ports(
        store=snapshots.store,
        lock=snapshots.lock,
        tables=tables,
        writer=lambda kind: writers[kind](to),
        load_snapshot=lambda side, version, comment: clickhouse_snapshotter(
            side, source, sink, stop, budget, metrics
        ).load(version, comment=comment),
        remote_target=sink.task_client is not None,
        local_master=source.spark_is_local(),
        footprint=ClickHouseFootprint(sink, cfg.target, cfg.pipeline, tables.view),
        lake_reader=LakeFunctionReader(sink.has_setting, sink),
        on_other_threads=on_other_threads,
    )


def clickhouse_snapshotter(
    cfg: RunConfig,
    source: ChangeSource,
    sink: Sink,
    stop: threading.Event | None = None,
    budget: RowBudget = UNLIMITED,
    metrics: PipelineMetrics | None = None,
) -> Snapshotter:
    """A snapshot of `source` into the pipeline's table on `sink`'s ClickHouse."""
    ports = snapshot_ports(cfg, sink, log.bind(pipeline=cfg.pipeline))
    return Snapshotter(cfg, source, ports, stop, budget, metrics)


def snapshot_ports(
    cfg: RunConfig, sink: Sink, log: Logger, tables: ClickHouseTables | None = None
) -> SnapshotPorts:
    """A snapshot's ports on a ClickHouse target; `tables`: the pipeline's, where its ports hold them already."""
    tables = tables or ClickHouseTables(sink, cfg.target, cfg.design)
    store = StateStore(sink, cfg.target.database)
    return SnapshotPorts(
        store=store,
        chunks=store.chunks,
        lock=pipeline_lock(cfg, sink),
        tables=tables,
        target=SnapshotTable(sink, tables.table_sql, log),
        frame=FrameSnapshot,
        remote_target=sink.task_client is not None,
        lake_reader=LakeFunctionReader(sink.has_setting, sink),
    )


def pipeline_lock(cfg: RunConfig, sink: Sink) -> Lock:
    """The claim of the pipeline of `cfg` in its target database."""
    return PipelineLock(sink, cfg.target.database, cfg.pipeline, cfg.lock_ttl)
