"""A snapshot that `run` loads (a new pipeline's initial load, a schema-change resync) shows in the metrics
while it runs: `cdc2ch_snapshot_started_timestamp_seconds` exists for that pipeline from the moment it
begins until it ends, however it ends, so the alert `CdcSnapshotRunningLong` can tell how long it has run."""

from __future__ import annotations

import os
import time

import pytest

from cdc2ch.replication.metrics import Metrics
from tests.support.fakes import FakeTable, Harness
from tests.unit.replication.test_initial import late_cdf

STARTED = "cdc2ch_snapshot_started_timestamp_seconds"


class Boom(Exception):
    pass


def _watching(h: Harness, metrics: Metrics, fail: bool = False) -> list[float | None]:
    """Record the started gauge of pipeline p as the snapshot port sees it, each time it is called."""
    seen: list[float | None] = []
    load = h._load_snapshot

    def watched(side, version, comment):
        seen.append(metrics.registry.get_sample_value(STARTED, {"pipeline": "p"}))
        if fail:
            raise Boom("the snapshot failed")
        return load(side, version, comment)

    h._load_snapshot = watched
    return seen


def test_an_initial_load_is_seen_running_and_no_longer_once_it_is_done():
    metrics = Metrics()
    h = Harness(late_cdf(), changes_from="cdf")
    seen = _watching(h, metrics)
    before = time.time()
    h.replicator(metrics=metrics.pipeline("p")).run()
    assert h.snapshots == [3] and h.final() == h.expected()
    assert len(seen) == 1 and before <= seen[0] <= time.time()
    assert metrics.registry.get_sample_value(STARTED, {"pipeline": "p"}) is None


def test_a_failing_snapshot_leaves_no_running_one_behind():
    metrics = Metrics()
    h = Harness(late_cdf(), changes_from="cdf")
    seen = _watching(h, metrics, fail=True)
    with pytest.raises(Boom):
        h.replicator(metrics=metrics.pipeline("p")).run()
    assert seen[0] is not None
    assert metrics.registry.get_sample_value(STARTED, {"pipeline": "p"}) is None


def test_a_resync_is_a_snapshot_too():
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 4)])
    metrics = Metrics()
    h = Harness(t, on_schema_change="resync")
    seen = _watching(h, metrics)
    h.replicator(metrics=metrics.pipeline("p")).run()
    assert seen == []  # the change feed from version 0: no snapshot
    t.commit(drop="name", operation="DROP COLUMNS")
    h.replicator(metrics=metrics.pipeline("p")).run()
    assert h.snapshots == [t.latest] and len(seen) == 1 and seen[0] is not None
    assert metrics.registry.get_sample_value(STARTED, {"pipeline": "p"}) is None


def test_snapshot_rows_and_memory_are_exported():
    metrics = Metrics()
    p = metrics.pipeline("p")
    p.snapshot_progress(40, 100)
    p.snapshot_progress(70, None)  # the expected rows stay as they were
    value = metrics.registry.get_sample_value
    assert value("cdc2ch_snapshot_rows_loaded", {"pipeline": "p"}) == 70
    assert value("cdc2ch_snapshot_rows_expected", {"pipeline": "p"}) == 100
    assert value("process_resident_memory_bytes") > 10_000_000  # this Python process
    assert value("cdc2ch_jvm_process_resident_memory_bytes") is None  # no JVM known yet
    metrics.jvm_pid = os.getpid()  # any process: the collector reads its /proc entry
    jvm, python = value("cdc2ch_jvm_process_resident_memory_bytes"), value("process_resident_memory_bytes")
    assert abs(jvm - python) < 0.1 * python


def test_failures_in_a_row_count_up_and_a_success_resets_them():
    metrics = Metrics()
    p = metrics.pipeline("p")
    value = metrics.registry.get_sample_value
    p.error(RuntimeError("x"), 1)
    p.error(RuntimeError("x"), 2)
    assert value("cdc2ch_consecutive_failures", {"pipeline": "p"}) == 2
    assert value("cdc2ch_errors_total", {"pipeline": "p", "kind": "internal"}) == 2
    p.success()
    assert value("cdc2ch_consecutive_failures", {"pipeline": "p"}) == 0
