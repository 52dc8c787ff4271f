"""A pipeline's ports on a ClickHouse target: offsets, claim, target table and writers, all through one
clickhouse-connect client (`Sink`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.footprint import ClickHouseFootprint
from cdc2ch.clickhouse.state.lock import PipelineLock
from cdc2ch.clickhouse.state.statestore import StateStore
from cdc2ch.clickhouse.tables.ddl import ClickHouseTables
from cdc2ch.model.config import RunConfig
from cdc2ch.replication.budget import UNLIMITED, RowBudget
from cdc2ch.replication.fullload.snapshot import Snapshotter
from cdc2ch.replication.metrics import PipelineMetrics
from cdc2ch.replication.ports import Ports, RangeWriter
from cdc2ch.replication.projection import DesignedSource
from cdc2ch.replication.writers import Destination
from cdc2ch.replication.writers.driver import DriverWriter
from cdc2ch.replication.writers.executors import ExecutorWriter
from cdc2ch.replication.writers.pushdown import PushdownWriter

log = get_logger("cdc2ch.pipeline")


def clickhouse_ports(
    cfg: RunConfig,
    source: DesignedSource,
    sink: Sink,
    stop: threading.Event,
    metrics: PipelineMetrics,
    budget: RowBudget = UNLIMITED,
) -> Ports:
    tables = ClickHouseTables(sink, cfg.target, cfg.design)
    to = Destination(cfg, sink, tables.table_sql, stop, metrics, log.bind(pipeline=cfg.pipeline))
    writers: dict[str, Callable[[Destination], RangeWriter]] = {
        "clickhouse": PushdownWriter,
        "executors": ExecutorWriter,
        "driver": lambda to: DriverWriter(to, streams=source.streams),
    }

    return Ports(
        store=StateStore(sink, cfg.target.database),
        lock=PipelineLock(sink, cfg.target.database, cfg.pipeline, cfg.lock_ttl),
        tables=tables,
        writer=lambda kind: writers[kind](to),
        load_snapshot=lambda side, version, comment: Snapshotter(
            side, source, sink, stop, budget, metrics
        ).load(version, comment=comment),
        remote_target=sink.task_client is not None,
        local_master=source.spark_is_local(),
        footprint=ClickHouseFootprint(sink, cfg.target, cfg.pipeline, tables.view),
        has_setting=sink.has_setting,
    )
