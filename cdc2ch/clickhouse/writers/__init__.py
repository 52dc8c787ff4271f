"""Range writers (the loop's RangeWriter port, replication/ports.py): Arrow batches from this process, Spark
tasks inserting from the executors, ClickHouse reading the lake itself."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model.config import RunConfig


class BatchMetrics(Protocol):
    def batch(self, rows: int, nbytes: int, seconds: float, statements: int = 1) -> None:
        """Count rows written by `statements` inserts that took `seconds`."""


@dataclass(frozen=True)
class SparkTasks:
    """What a writer running in Spark tasks needs of the session's plumbing (source/spark/session.py)."""

    positional: Callable[[Any], tuple[Any, list[str]]]  # a frame with positional column names, and the names
    shipped: Callable[..., AbstractContextManager[None]]  # these modules sent to the tasks by value


@dataclass(frozen=True)
class Destination:
    """What every writer of a pipeline is given: its options, the target and where to report."""

    cfg: RunConfig
    sink: Sink
    table_sql: str
    stop: threading.Event
    metrics: BatchMetrics
    log: Any  # a structlog logger bound to the pipeline
    tasks: SparkTasks | None = None  # for the executor writer
    # The paragraph for a storage failure ClickHouse's reader met (source/storefaults.py), or None.
    storage_refusal: Callable[[str, str, str], Exception | None] = lambda text, uri, what: None
