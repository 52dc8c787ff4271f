"""Where a running service records each pipeline's health for `status`: the health table of the pipeline's
database, written best effort (when ClickHouse itself is what fails, the log line is the report)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timezone

from cdc2ch.base.errors import SinkError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.fleet.serviceports import HealthRecords, VerifyRecords
from cdc2ch.model.records import Health
from cdc2ch.replication.metrics import PipelineMetrics

log = get_logger("cdc2ch.runner")

MAX_ERROR_CHARS = 4000  # of an error kept in the health record (status shows it) and its log line


def kept_error(text: str) -> str:
    """An error as the health record keeps it: whole, or summarised when longer than MAX_ERROR_CHARS."""
    return text if len(text) <= MAX_ERROR_CHARS else summarise(text, MAX_ERROR_CHARS)


class HealthBook:
    """The health stores of the databases a service writes to, and the skipped tables already recorded."""

    def __init__(self, health: Callable[[str], HealthRecords], verified: Callable[[str], VerifyRecords]):
        self.health, self.verified = health, verified
        self._stores: dict[str, HealthRecords] = {}
        self._lock = threading.Lock()
        self._skipped: dict[str, str] = {}  # pipeline -> the reason recorded for it

    def store(self, database: str) -> HealthRecords:
        """The database's health store, its table created on first use."""
        with self._lock:
            if database not in self._stores:
                store = self.health(database)
                store.ensure()
                self._stores[database] = store
            return self._stores[database]

    def save(self, health: Health, database: str, metrics: PipelineMetrics) -> bool:
        """Record `health`; whether it was. The pipeline's last `cdc2ch verify` (run by another process)
        reaches its metrics from ClickHouse on the way."""
        try:
            self.store(database).save(health)
            verified = self.verified(database).load_all().get(health.pipeline)
            if verified is not None:
                metrics.verified(verified.ok, verified.finished_at.timestamp())
            return True
        except SinkError as exc:
            log.warning("health_not_saved", pipeline=health.pipeline, error=summarise(str(exc), 300))
            return False

    def skipped(self, skipped: list) -> None:
        """Tables a pattern skips (discovery.Skipped), for `status` as failing pipelines with the reason, once
        per reason."""
        for s in skipped:
            name = str(s.target)
            if s.target is None or self._skipped.get(name) == s.reason:
                continue
            health = Health(name, s.table, name).failed(
                datetime.now(timezone.utc), kept_error(s.reason), "skipped"
            )
            try:
                self.store(s.target.database).save(health)
                self._skipped[name] = s.reason
            except SinkError as exc:
                log.warning("health_not_saved", pipeline=name, error=summarise(str(exc), 300))
