"""`cdc2ch pause`, `resume` and `resync` (commands/pipeline_requests.py): who acts on a request, as far as
can be told when it is recorded. ClickHouse's claim table is an in-memory one here; a request to a running
service is tested end to end in tests/e2e/clickhouse/test_serve.py."""

from __future__ import annotations

import os
import socket
from datetime import datetime
from types import SimpleNamespace

import pytest

from cdc2ch.commands.invocation.listing import Known
from cdc2ch.commands.pipeline_requests import claims_of
from cdc2ch.model.config import TargetName

pytestmark = pytest.mark.unit

ORDERS = TargetName("sales", "orders")


def _claims(*ages: float) -> SimpleNamespace:
    """A sink whose claim table holds one live process's claim on `orders` per age (seconds since its last
    heartbeat)."""
    rows = [(f"t{i}", "cdc2ch run", socket.gethostname(), os.getpid(), datetime(2026, 12, 1), age)
            for i, age in enumerate(ages)]  # fmt: skip
    return SimpleNamespace(
        own=SimpleNamespace(exists=lambda database, table: True), query_rows=lambda *a, **kw: rows
    )


def test_a_claim_counts_for_the_pipeline_s_own_lock_ttl():
    sink = _claims(90.0)  # a service with --lock-ttl 300 checks in every 75 s: 90 s is alive
    assert claims_of(sink, "sales", "orders", Known("orders", ORDERS, lock_ttl=300.0))  # type: ignore[arg-type]
    assert not claims_of(sink, "sales", "orders", None)  # type: ignore[arg-type]  # unknown: the default, 60 s
    other = Known("orders", TargetName("crm", "orders"), lock_ttl=300.0)  # another database's pipeline
    assert not claims_of(sink, "sales", "orders", other)  # type: ignore[arg-type]


def test_a_service_asked_about_a_pipeline_it_runs_unclaimed_says_it_is_starting():
    from cdc2ch.commands.pipeline_requests import DONE, Runs, runs_of
    from cdc2ch.model.records import PAUSE

    assert runs_of(claimed=True, served=True, opened=False) is Runs.NOW
    assert runs_of(claimed=False, served=True, opened=False) is Runs.STARTING  # before: "no process is
    # replicating it now", while the service was starting it
    assert runs_of(claimed=False, served=False, opened=False) is Runs.UNCLAIMED
    assert runs_of(claimed=False, served=False, opened=True) is Runs.NOTHING
    said = DONE[PAUSE, Runs.STARTING].format(p="sales.items", holder="")
    assert said.startswith("paused: the service running it holds no claim on it now") and "resume" in said
