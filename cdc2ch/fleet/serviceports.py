"""The ports a service drives besides each pipeline's own (replication/ports.py): the records it keeps per
target database, the compaction it schedules, the Spark jobs it groups per pipeline, and the pipelines it
opens. assembly.py builds them on a ClickHouse target and a Spark session; tests build them in memory.

    HealthRecords      each pipeline's health, for `status`     (clickhouse/state/statestore.py)
    VerifyRecords      each pipeline's last `cdc2ch verify`     (clickhouse/state/statestore.py)
    RequestRecords     pause, resume and resync requests        (clickhouse/state/control.py)
    CompactionRecords  each target's last compaction            (clickhouse/state/compactlog.py)
    Partition          a target's partition and its parts        (clickhouse/tables/merging.py)
    JobGroups          a pipeline's Spark jobs, to cancel alone (source/spark/threads.py)
    TableListing       what a table pattern's base holds now     (source/tablelisting.py)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import Compacted, Health, Request, Verified
from cdc2ch.replication.budget import RowBudget
from cdc2ch.replication.metrics import PipelineMetrics
from cdc2ch.replication.pipeline import Replicator


class HealthRecords(Protocol):
    def ensure(self) -> None:
        """Create the record table if missing. Idempotent."""

    def load_all(self) -> dict[str, Health]:
        """Every pipeline's health, by pipeline. Read-only."""

    def save(self, health: Health) -> None:
        """Record `health`; the newest save wins. Idempotent."""


class VerifyRecords(Protocol):
    def load_all(self) -> dict[str, Verified]:
        """Every pipeline's last verify (written by another process), by pipeline. Read-only."""


class RequestRecords(Protocol):
    def load_all(self) -> dict[str, Request]:
        """Every pipeline's latest request, by pipeline. Read-only."""

    def resynced(self, asked: Request, by: str) -> bool:
        """Record the resync `asked` as carried out by `by`, unless a later request replaced it (whether it
        was recorded). Idempotent."""


class CompactionRecords(Protocol):
    def load_all(self) -> dict[str, Compacted]:
        """Every target's last compaction, by target. Read-only."""


class Compaction(Protocol):
    dropped: int  # tombstones removed
    seconds: float


class Partition(Protocol):
    @property
    def partition_id(self) -> str: ...

    @property
    def parts(self) -> int:
        """Its active parts."""

    @property
    def rows(self) -> int: ...

    @property
    def quiet_seconds(self) -> float:
        """Since its newest part was written."""


class JobGroups(Protocol):
    def of(self, pipeline: str) -> AbstractContextManager[None]:
        """Inside the block, the jobs this thread starts belong to `pipeline` (its group, its fair share)."""

    def cancel(self, pipeline: str) -> None:
        """Cancel the running jobs of `pipeline`, and only those. Idempotent."""


class TableListing(Protocol):
    def directories(self, glob: str, why: str) -> list[tuple[str, str, str, bool]]:
        """(table, name, parent's name, whether it is a Delta table) of each directory a storage `glob`
        matches. `why`: what the listing is for, should it need to start Spark. Read-only."""

    def catalog(self, schema: tuple[str, ...], why: str) -> list[str]:
        """The names of the tables of a catalog schema; the catalog's error when it cannot. Read-only."""

    def shared(self, profile: str, share: str, schema: str) -> list[tuple[str, str]]:
        """(schema, table) of each table of a share's schema. Read-only."""


@dataclass(frozen=True)
class ServicePorts:
    """What a service reads, writes and opens, by target database where it keeps records there."""

    health: Callable[[str], HealthRecords]
    verified: Callable[[str], VerifyRecords]
    requests: Callable[[str], RequestRecords]
    compactions: Callable[[str], CompactionRecords]
    # Drop a target's old tombstones (recording the compaction); raises on failure, the tables unharmed.
    compact: Callable[[TargetName, timedelta | None], Compaction]
    # A target's partitions with their active parts; the merge of one (its seconds), what FINAL returns unchanged.
    partitions: Callable[[TargetName], Sequence[Partition]]
    merge: Callable[[TargetName, str], float]
    # One pipeline, its table opened and its ports wired: (config, stop, metrics, the shared row budget).
    pipeline: Callable[[RunConfig, threading.Event, PipelineMetrics, RowBudget], Replicator]
    jobs: JobGroups
