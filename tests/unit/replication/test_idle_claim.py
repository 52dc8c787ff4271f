"""A --once poll of a pipeline with an offset claims it only when it has something to write (resume.nothing_to_write):
a claim is two writes and, against a server, a pause for rivals, on every cron poll of every table."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import LockedError
from cdc2ch.replication.fullload import resync
from cdc2ch.replication.standing import Stage, Standing, StepOutcome
from tests.support.fakes import FakeTable, Harness


def replicated() -> Harness:
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 6)])
    t.commit(("update", 2, {"name": "two"}), ("delete", 3))
    h = Harness(t)
    h.run()
    assert h.lock.acquired == 1 and h.final() == h.expected()
    return h


def test_a_once_poll_with_nothing_new_only_looks():
    h = replicated()
    saves, checked, statements = h.store.saves, h.lock.checked, list(h.db.statements)
    state = h.run()
    assert state.committed_version == h.table.latest and h.final() == h.expected()
    assert h.lock.acquired == 1 and not h.lock.held  # no claim taken
    assert h.lock.checked == checked + 1  # but a look whether another runner holds it
    assert h.store.saves == saves and h.db.statements == statements  # nothing written


def test_a_pipeline_another_runner_holds_is_refused_with_nothing_new_too():
    h = replicated()
    h.lock.other = "cdc2ch run (pid 42 on host-b)"
    with pytest.raises(LockedError, match="pid 42"):
        h.run()


def test_a_version_that_comes_after_the_look_is_claimed_before_it_is_written():
    h = replicated()
    job = h.replicator()
    job.start()
    assert job.standing.stage is Stage.HELD and job.standing.inputs is not None
    h.table.commit(("insert", {"id": 9, "name": "nine"}), ("delete", 1))
    assert job.step() == StepOutcome(committed=True, caught_up=True)
    job.close()
    assert h.lock.acquired == 2 and job.standing == Standing(Stage.CLAIMED)
    assert h.final() == h.expected()


def test_a_claim_taken_late_reads_the_offset_again():
    """Between the look and the claim another runner may have moved the offset: the claim reads it again,
    and the range written begins after that runner's."""
    h = replicated()
    job = h.replicator()
    job.start()
    version = h.table.commit(("insert", {"id": 9, "name": "nine"}))
    h.run()  # another runner, meanwhile: it writes that version and lets go
    h.table.commit(("delete", 9))
    job.step()
    job.close()
    assert h.final() == h.expected() and h.store.load("p").committed_version == h.table.latest
    assert len([r for r in h.db.tables["db.t"]["rows"] if r["_commit_version"] == version]) == 1


@pytest.mark.parametrize("why", ["service", "reset", "stale side table"])
def test_what_writes_even_with_nothing_new_claims_first(why):
    h = replicated()
    more = {"service": {"once": False}, "reset": {"reset": True, "from_version": 0}}.get(why, {})
    if why == "stale side table":  # a crash after a resync's swap and offset, before the side table went
        h.db.tables["db.t" + resync.SUFFIX] = {"columns": {}, "comment": resync.marker("p", 1), "rows": []}
    job = h.replicator(**more)
    job.start()
    job.close()
    assert h.lock.acquired == 2 and job.standing.claimed
    assert "db.t" + resync.SUFFIX not in h.db.tables
