"""A service's ports in memory (cdc2ch/fleet/serviceports.py), for tests of fleet.runner.Runner without a JVM
or a ClickHouse engine: records kept in lists, and pipelines a test makes (a Replicator of fakes.Harness, or
`Refusing`, one whose start fails)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from cdc2ch.fleet.serviceports import ServicePorts
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import Health
from cdc2ch.replication.standing import Standing


class MemoryRecords:
    """Every kind of record a service reads and writes per database, all in one: `known` is what it loads
    (health by pipeline), `saved` what it saved."""

    def __init__(self, known: dict[str, Health] | None = None):
        self.known, self.saved = dict(known or {}), []

    def ensure(self) -> None:
        pass

    def load_all(self) -> dict:
        return dict(self.known)

    def save(self, health: Health) -> None:
        self.saved.append(health)

    def resynced(self, asked, by: str) -> bool:
        return True


class _Jobs:
    def of(self, pipeline: str):
        return nullcontext()

    def cancel(self, pipeline: str) -> None:
        pass


class Refusing:
    """A pipeline whose start raises `error` (bad input found before anything is written)."""

    def __init__(self, error: BaseException):
        self.error, self.standing, self.turn_over = error, Standing(), None
        self.closed = False

    def start(self) -> None:
        raise self.error

    def close(self) -> None:
        self.closed = True


def service_ports(
    pipeline: Callable[[RunConfig], object], records: MemoryRecords | None = None
) -> ServicePorts:
    """Ports whose records are `records` (empty ones by default) and whose pipelines `pipeline(cfg)` makes."""
    records = records or MemoryRecords()

    def compact(target, keep):
        raise AssertionError("no compaction is due in these tests")

    return ServicePorts(
        health=lambda db: records,
        verified=lambda db: MemoryRecords(),
        requests=lambda db: MemoryRecords(),
        compactions=lambda db: MemoryRecords(),
        compact=compact,
        partitions=lambda target: [],
        merge=lambda target, partition: 0.0,
        pipeline=lambda cfg, stop, metrics, budget: pipeline(cfg),  # type: ignore[arg-type, return-value]
        jobs=_Jobs(),
    )
