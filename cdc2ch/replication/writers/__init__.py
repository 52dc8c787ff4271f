"""Range writers (the RangeWriter port): driver Arrow batches, Spark executors, ClickHouse push-down."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model.config import RunConfig
from cdc2ch.replication.metrics import PipelineMetrics


@dataclass(frozen=True)
class Destination:
    """What every writer of a pipeline is given: its options, the target and where to report."""

    cfg: RunConfig
    sink: Sink
    table_sql: str
    stop: threading.Event
    metrics: PipelineMetrics
    log: Any  # a structlog logger bound to the pipeline
