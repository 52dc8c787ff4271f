"""A service's ports on one ClickHouse target and one Spark session: the one place the fleet meets the
adapters (each pipeline's own ports are assembled in replication/target.py)."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from datetime import timedelta
from functools import partial

from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.compactlog import CompactStore
from cdc2ch.clickhouse.state.control import ControlStore
from cdc2ch.clickhouse.state.statestore import HealthStore, VerifyStore
from cdc2ch.clickhouse.tables import merging
from cdc2ch.clickhouse.tables.compaction import compact
from cdc2ch.fleet.serviceports import ServicePorts
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.replication.budget import RowBudget
from cdc2ch.replication.metrics import PipelineMetrics
from cdc2ch.replication.pipeline import Replicator
from cdc2ch.source import open_source
from cdc2ch.source.spark.threads import cancel_jobs, jobs_of


class SparkJobGroups:
    """Job groups on a session (a LazySpark or a session; None: no session, nothing to group)."""

    def __init__(self, spark):
        self.spark = spark

    def of(self, pipeline: str) -> AbstractContextManager[None]:
        return jobs_of(self.spark, pipeline)

    def cancel(self, pipeline: str) -> None:
        cancel_jobs(self.spark, pipeline)


def service_ports(spark, sink: Sink) -> ServicePorts:
    def pipeline(
        cfg: RunConfig, stop: threading.Event, metrics: PipelineMetrics, budget: RowBudget
    ) -> Replicator:
        return Replicator(cfg, open_source(spark, cfg.table), sink, stop, metrics, budget=budget)

    def compacted(target: TargetName, older_than: timedelta | None):
        return compact(sink, target, older_than)

    return ServicePorts(
        health=partial(HealthStore, sink),
        verified=partial(VerifyStore, sink),
        requests=partial(ControlStore, sink),
        compactions=partial(CompactStore, sink),
        compact=compacted,
        partitions=partial(merging.partitions, sink),
        merge=partial(merging.merge, sink),
        pipeline=pipeline,
        jobs=SparkJobGroups(spark),
    )
