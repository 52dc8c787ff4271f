"""What a pipeline exports on /metrics from its start, through the Runner with in-memory ports: every
counter before its first increase, so that rate() and increase() see that increase."""

from __future__ import annotations

import threading

from cdc2ch.base.errors import (
    Cdc2chError,
    ConfigError,
    LockedError,
    SchemaChangeError,
    SinkError,
    SourceError,
    StateError,
)
from cdc2ch.fleet.runner import Runner
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import Health
from cdc2ch.replication.metrics import Metrics, error_kind
from tests.support.service import MemoryRecords, Refusing, service_ports


def _cfg(name: str) -> RunConfig:
    return RunConfig(f"/lake/{name}", ("id",), TargetName("analytics", name), "chdb:///x", name)


# One error of each kind a pipeline can fail with, and a defect.
EACH_KIND = [
    LockedError("held"),
    ConfigError("bad"),
    SchemaChangeError("changed"),
    SourceError("unreadable"),
    SinkError("refused"),
    StateError("offset"),
    Cdc2chError("other"),
    RuntimeError("defect"),
]


def test_every_series_a_pipeline_counts_is_exported_from_its_start_at_0():
    """Counters exist at 0 before their first increase: rate() and increase() see that increase, and an
    alert on it fires (before: no cdc2ch_errors_total series until the first error)."""
    metrics = Metrics()
    known = {"late": Health("late", "/lake/late", "analytics.late").failed(None, "gone", "source")}
    configs = [_cfg("orders"), _cfg("late")]
    Runner(
        configs, None, None, threading.Event(), metrics, ports=service_ports(Refusing, MemoryRecords(known))
    )

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    kinds = sorted({error_kind(e) for e in EACH_KIND})
    assert len(kinds) == len(EACH_KIND)
    for pipeline in ("orders", "late"):
        assert [value("cdc2ch_errors_total", pipeline=pipeline, kind=k) for k in kinds] == [0] * len(kinds)
        for counter in ("rows_written", "batches_written", "bytes_written", "compactions",
                        "tombstones_removed", "compaction_failures"):  # fmt: skip
            assert value(f"cdc2ch_{counter}_total", pipeline=pipeline) == 0, counter
        for histogram in ("batch_seconds", "compaction_seconds"):
            assert value(f"cdc2ch_{histogram}_count", pipeline=pipeline) == 0, histogram
        assert value("cdc2ch_paused", pipeline=pipeline) == 0
    # Failures in a row carry over a restart: the alert on them does not start again from 0.
    assert value("cdc2ch_consecutive_failures", pipeline="orders") == 0
    assert value("cdc2ch_consecutive_failures", pipeline="late") == 1
    # What is not known yet has no series: no lag before the log was read, no success before one.
    assert value("cdc2ch_versions_behind", pipeline="orders") is None
    assert value("cdc2ch_last_success_timestamp_seconds", pipeline="orders") is None
