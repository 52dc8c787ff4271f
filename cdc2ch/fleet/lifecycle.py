"""Which of a service's pipelines are paused or owe a resync, from the requests `cdc2ch pause`, `resume` and
`resync` record (clickhouse/state/control.py): read once per poll interval, one query per target database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from cdc2ch.base.errors import Cdc2chError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.base.processes import requester
from cdc2ch.fleet.serviceports import RequestRecords
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import Request
from cdc2ch.replication.metrics import PipelineMetrics

log = get_logger("cdc2ch.lifecycle")


class Lifecycle:
    """The requests for a service's pipelines. Thread-safe: the dispatcher refreshes them, turns read them."""

    def __init__(
        self,
        requests: Callable[[str], RequestRecords],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.requests, self.interval, self.clock = requests, interval, clock
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], Request] = {}  # (database, pipeline) -> its latest request
        self._read_at = float("-inf")
        self._paused: set[str] = set()  # pipelines this service holds paused now
        # The resync requests this service carried out: a read that began before one was recorded done
        # brings it back as pending, and it must not run twice.
        self._done: dict[tuple[str, str], Request] = {}
        self.me = requester()

    def refresh(self, configs: Iterable[RunConfig]) -> None:
        """Read the requests again when a poll interval has passed (a failed read keeps the last ones)."""
        if self.clock() - self._read_at < self.interval:
            return
        self._read_at = self.clock()
        found = {}
        for database in sorted({c.target.database for c in configs}):
            try:
                found.update({(database, p): r for p, r in self.requests(database).load_all().items()})
            except Cdc2chError as exc:
                log.warning("requests_not_read", database=database, error=summarise(str(exc), 300))
                return
        with self._lock:
            self._requests = found

    def may_begin(self, cfg: RunConfig) -> bool:
        """Whether a new pipeline may claim itself and write its first range or snapshot: not when paused,
        by the requests of its database read now. Its first turn may have begun long ago (Spark starting
        meanwhile), and a pause asked for since holds it before it writes anything."""
        database = cfg.target.database
        try:
            found = self.requests(database).load_all()
        except Cdc2chError as exc:
            log.warning("requests_not_read", database=database, error=summarise(str(exc), 300))
        else:
            with self._lock:
                kept = {k: r for k, r in self._requests.items() if k[0] != database}
                self._requests = kept | {(database, p): r for p, r in found.items()}
        request = self.of(cfg)
        return request is None or not request.paused

    def of(self, cfg: RunConfig) -> Request | None:
        with self._lock:
            return self._requests.get((cfg.target.database, cfg.pipeline))

    def _owed(self, cfg: RunConfig) -> Request | None:
        """The resync asked for and not yet carried out by this service, if any."""
        request = self.of(cfg)
        if request is None or not request.resync_pending:
            return None
        with self._lock:
            return None if self._done.get((cfg.target.database, cfg.pipeline)) == request else request

    def wants(self, cfg: RunConfig) -> bool:
        """Whether a running turn should end after the range in hand: a pause or a resync waits for it."""
        request = self.of(cfg)
        return request is not None and (request.paused or self._owed(cfg) is not None)

    def holds(self, cfg: RunConfig, metrics: PipelineMetrics) -> bool:
        """Whether the pipeline is paused now (said once when it pauses and when it resumes)."""
        request = self.of(cfg)
        paused = request is not None and request.paused
        with self._lock:
            changed = paused != (cfg.pipeline in self._paused)
            (self._paused.add if paused else self._paused.discard)(cfg.pipeline)
        metrics.paused(paused)
        if changed and paused and request is not None:  # (paused: there is a request)
            log.warning(
                "paused",
                pipeline=cfg.pipeline,
                by=request.by,
                at=request.at.isoformat(),
                reason=request.reason,
            )
        elif changed:
            log.info("resumed", pipeline=cfg.pipeline)
        return paused

    def resync(self, cfg: RunConfig, job) -> None:
        """Rebuild the pipeline's target through the side-table swap when a resync is asked for (a claimed
        pipeline, between two steps); recorded as done once swapped in, so it runs once."""
        request = self._owed(cfg)
        if request is None or not job.standing.holds_offset:
            return
        job.claim()
        reason = f"requested by {request.by}" + (f": {request.reason}" if request.reason else "")
        if job.rebuild(reason):
            with self._lock:  # done: not again, whatever a read that began before this brings back
                self._done[(cfg.target.database, cfg.pipeline)] = request
            self.requests(cfg.target.database).resynced(request, self.me)
