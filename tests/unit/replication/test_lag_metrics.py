"""The lag gauges carry the pipeline label, set by the replicator from the commits' times: a dashboard
can rank the pipelines by how far behind they are (topk(10, cdc2ch_seconds_behind))."""

from __future__ import annotations

import pytest

from cdc2ch.replication.metrics import Metrics
from tests.support.fakes import Crash, FakeTable, Harness

LAG_GAUGES = (
    "cdc2ch_committed_version",
    "cdc2ch_latest_version",
    "cdc2ch_versions_behind",
    "cdc2ch_seconds_behind",
)


def history() -> FakeTable:
    """Version 0 creates the table, 1 inserts five rows, 2-4 change them: commits 1 s apart."""
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 6)])
    for i in (2, 3, 4):
        t.commit(("update", i, {"name": "changed"}))
    return t


def test_lag_gauges_carry_each_pipeline_so_a_dashboard_can_rank_them():
    metrics = Metrics()
    done = Harness(history(), pipeline="sales.orders")
    done.replicator(metrics=metrics.pipeline("sales.orders")).run()
    stuck = Harness(history(), pipeline="ops.events")  # crashes inside version 1
    stuck.writer.crash_after = 1
    with pytest.raises(Crash):
        stuck.replicator(metrics=metrics.pipeline("ops.events")).run()

    def value(name: str, pipeline: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"pipeline": pipeline})

    latest = stuck.table.latest
    assert [value(g, "ops.events") for g in LAG_GAUGES] == [0, latest, latest, float(latest)]
    assert [value(g, "sales.orders") for g in LAG_GAUGES] == [latest, latest, 0, 0]
    for family in metrics.registry.collect():
        if family.name in LAG_GAUGES:
            assert {tuple(s.labels) for s in family.samples} == {("pipeline",)}, family.name
    worst = sorted(("ops.events", "sales.orders"), key=lambda p: -value("cdc2ch_seconds_behind", p))
    assert worst == ["ops.events", "sales.orders"]
