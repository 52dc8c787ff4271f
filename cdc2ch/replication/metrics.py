"""Prometheus metrics, per pipeline, served on --metrics-port (path /metrics).

A registry of its own rather than the process-wide default: several runners in one test process must not
share counters, and Python's GC collector is noise for a replication dashboard. What the process holds in
memory is not: `process_*` is the Python process, `cdc2ch_jvm_process_*` the Spark JVM it started (where
most of the memory goes), both read from /proc by prometheus_client's ProcessCollector.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from cdc2ch.base.errors import (
    Cdc2chError,
    ConfigError,
    LockedError,
    SchemaChangeError,
    SinkError,
    SourceError,
    StateError,
    chain,
)

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

BATCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


# The kind of a cdc2ch error: that of the first class it is an instance of.
_KIND_OF: tuple[tuple[type[Cdc2chError], str], ...] = (
    (LockedError, "locked"),
    (ConfigError, "config"),
    (SchemaChangeError, "schema_change"),
    (SourceError, "source"),
    (SinkError, "clickhouse"),
    (StateError, "state"),
    (Cdc2chError, "other"),
)
INTERNAL = "internal"  # any other exception: a defect
# Every label `error_kind` gives: each pipeline's cdc2ch_errors_total has a series of each from its start.
ERROR_KINDS = tuple(dict.fromkeys([kind for _, kind in _KIND_OF] + [INTERNAL]))


def error_kind(exc: BaseException) -> str:
    """A small fixed set of labels (ERROR_KINDS), so a dashboard can tell a lake problem from a ClickHouse
    one."""
    for cls, kind in _KIND_OF:
        if isinstance(exc, cls):
            return kind
    # An error of the ClickHouse client that escaped the sink's wrapping (from a Spark task, say) is still
    # ClickHouse's.
    if any(type(e).__module__.partition(".")[0] == "clickhouse_connect" for e in chain(exc)):
        return "clickhouse"
    return INTERNAL


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r, p = self.registry, ["pipeline"]
        self.rows = Counter("cdc2ch_rows_written", "Rows inserted into ClickHouse.", p, registry=r)
        self.batches = Counter("cdc2ch_batches_written", "Insert statements that landed.", p, registry=r)
        self.bytes = Counter(
            "cdc2ch_bytes_written", "Bytes inserted (Arrow size of the batches sent).", p, registry=r
        )
        self.batch_seconds = Histogram(
            "cdc2ch_batch_seconds", "Seconds per insert statement.", p, buckets=BATCH_BUCKETS, registry=r
        )
        self.committed = Gauge("cdc2ch_committed_version", "Last Delta version committed.", p, registry=r)
        self.latest = Gauge("cdc2ch_latest_version", "Latest Delta version seen in the log.", p, registry=r)
        self.versions_behind = Gauge(
            "cdc2ch_versions_behind", "Delta versions not yet replicated.", p, registry=r
        )
        self.seconds_behind = Gauge(
            "cdc2ch_seconds_behind",
            "Commit time of the latest Delta version minus that of the last replicated one.",
            p,
            registry=r,
        )
        self.errors = Counter(
            "cdc2ch_errors", "Failed attempts, by kind of failure.", ["pipeline", "kind"], registry=r
        )
        self.failures = Gauge(
            "cdc2ch_consecutive_failures",
            "Attempts that failed in a row (0 after a success); the pause before the next doubles with each.",
            p,
            registry=r,
        )
        self.last_success = Gauge(
            "cdc2ch_last_success_timestamp_seconds",
            "Unix time of the last poll that ended without error.",
            p,
            registry=r,
        )
        self.verify_ok = Gauge(
            "cdc2ch_verify_ok",
            "1 when the last `cdc2ch verify` found the target equal, 0 when not.",
            p,
            registry=r,
        )
        self.last_verify = Gauge(
            "cdc2ch_last_verify_timestamp_seconds", "Unix time of the last `cdc2ch verify`.", p, registry=r
        )
        self.skipped = Gauge(
            "cdc2ch_tables_skipped",
            "Tables a --table pattern matches that cannot be replicated now (each is in `cdc2ch status`).",
            registry=r,
        )
        self.snapshot_started = Gauge(
            "cdc2ch_snapshot_started_timestamp_seconds",
            "Unix time the snapshot `run` is loading for the pipeline began (an initial load or a schema-change "
            "resync); no series while none runs.",
            p,
            registry=r,
        )
        self.snapshot_rows = Gauge(
            "cdc2ch_snapshot_rows_loaded", "Rows the running (or last) snapshot has loaded.", p, registry=r
        )
        self.snapshot_expected = Gauge(
            "cdc2ch_snapshot_rows_expected",
            "Rows the running (or last) snapshot's version holds.",
            p,
            registry=r,
        )
        self.compactions = Counter(
            "cdc2ch_compactions",
            "Compactions of the target a running service made (--compact-every).",
            p,
            registry=r,
        )
        self.tombstones_removed = Counter(
            "cdc2ch_tombstones_removed", "Tombstones those compactions removed.", p, registry=r
        )
        self.compaction_seconds = Histogram(
            "cdc2ch_compaction_seconds", "Seconds per compaction.", p, buckets=BATCH_BUCKETS, registry=r
        )
        self.compaction_failures = Counter(
            "cdc2ch_compaction_failures", "Compactions that failed (tried again at the next).", p, registry=r
        )
        self.final_merge_seconds = Histogram(
            "cdc2ch_final_merge_seconds",
            "Seconds per merge of a target's partition by a running service's upkeep (--final-merges).",
            p,
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.final_merge_failures = Counter(
            "cdc2ch_final_merge_failures", "Those merges that failed (tried again later).", p, registry=r
        )
        self.paused = Gauge(
            "cdc2ch_paused",
            "1 while `cdc2ch pause` holds the pipeline (not a failure), else 0.",
            p,
            registry=r,
        )
        # The JVM's pid once Spark runs (`jvm_pid`); until then its collector yields nothing.
        self.jvm_pid: int | None = None
        ProcessCollector(registry=r)
        ProcessCollector(namespace="cdc2ch_jvm", pid=lambda: self.jvm_pid or "-", registry=r)
        self._server: WSGIServer | None = None

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        try:
            self._server, _ = start_http_server(port, address, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"Cannot serve metrics on {address}:{port}: {exc.strerror or exc}. Choose a free --metrics-port "
                f"(or stop whatever listens there)."
            ) from None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def pipeline(self, name: str) -> "PipelineMetrics":
        return PipelineMetrics(self, name)


class PipelineMetrics:
    """The metrics of one pipeline, labels bound."""

    def __init__(self, metrics: Metrics, name: str):
        self._m = metrics
        self.name = name
        # The series whose first value is known exist from the start: a counter's 0 before its first
        # increase (without it rate() and increase() miss that increase, and an alert on it never fires), a
        # histogram's empty buckets, no failure and no pause. The gauges of what is not yet known (lag, last
        # success, verify, snapshot) appear once it is.
        m = metrics
        for series in (m.rows, m.batches, m.bytes, m.batch_seconds, m.compactions, m.tombstones_removed,
                       m.compaction_seconds, m.compaction_failures):  # fmt: skip
            series.labels(name)
        for kind in ERROR_KINDS:
            m.errors.labels(name, kind)
        self.failing(0)
        m.paused.labels(name).set(0)

    def batch(self, rows: int, nbytes: int, seconds: float, statements: int = 1) -> None:
        m, n = self._m, self.name
        m.rows.labels(n).inc(rows)
        m.batches.labels(n).inc(statements)
        m.bytes.labels(n).inc(nbytes)
        m.batch_seconds.labels(n).observe(seconds)

    def lag(self, committed: int, latest: int, seconds_behind: float) -> None:
        m, n = self._m, self.name
        m.committed.labels(n).set(committed)
        m.latest.labels(n).set(latest)
        m.versions_behind.labels(n).set(max(latest - committed, 0))
        m.seconds_behind.labels(n).set(max(seconds_behind, 0.0))

    def success(self) -> None:
        self._m.last_success.labels(self.name).set(time.time())
        self.failing(0)

    def verified(self, ok: bool, at: float) -> None:
        self._m.verify_ok.labels(self.name).set(1 if ok else 0)
        self._m.last_verify.labels(self.name).set(at)

    def error(self, exc: BaseException, in_a_row: int | None = None) -> None:
        self._m.errors.labels(self.name, error_kind(exc)).inc()
        if in_a_row is not None:
            self.failing(in_a_row)

    def failing(self, in_a_row: int) -> None:
        """The pipeline's attempts failed `in_a_row` times in a row (0: its last one succeeded)."""
        self._m.failures.labels(self.name).set(in_a_row)

    def compacted(self, removed: int, seconds: float) -> None:
        m, n = self._m, self.name
        m.compactions.labels(n).inc()
        m.tombstones_removed.labels(n).inc(removed)
        m.compaction_seconds.labels(n).observe(seconds)

    def paused(self, paused: bool) -> None:
        self._m.paused.labels(self.name).set(1 if paused else 0)
        if paused:  # a paused pipeline is not failing
            self.failing(0)

    def final_merged(self, seconds: float) -> None:
        self._m.final_merge_seconds.labels(self.name).observe(seconds)

    def final_merge_failed(self) -> None:
        self._m.final_merge_failures.labels(self.name).inc()

    def compaction_failed(self) -> None:
        self._m.compaction_failures.labels(self.name).inc()

    def snapshot_began(self) -> None:
        self._m.snapshot_started.labels(self.name).set(time.time())

    def snapshot_progress(self, rows: int, expected: int | None) -> None:
        self._m.snapshot_rows.labels(self.name).set(rows)
        if expected is not None:
            self._m.snapshot_expected.labels(self.name).set(expected)

    def snapshot_ended(self) -> None:
        """Finished, stopped or failed: the pipeline has no running snapshot (its rows figures stay)."""
        try:
            self._m.snapshot_started.remove(self.name)
        except KeyError:
            pass
