"""When a service merges what FINAL would collapse (fleet/merges.py): only after a turn that ended caught up
(deferred while its pipeline is behind), never when switched off (or with --once, or on a cluster), one merge
at a time in the process, each partition at most once per --final-merge-every, merges at most a tenth of the
pipeline's time, partitions that stopped changing first. The merge itself runs on chdb
(tests/e2e/replication/test_generated_histories.py); here it is replaced by a recorder."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta

import pytest

from cdc2ch.base.errors import SinkError
from cdc2ch.fleet.merges import RETRY_AFTER, FinalMerges
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.replication.metrics import Metrics
from cdc2ch.replication.standing import StepOutcome
from tests.support.fakes import Clock, FakeTable, Harness

pytestmark = pytest.mark.unit

CAUGHT_UP = StepOutcome(committed=True, caught_up=True)
BEHIND = StepOutcome(committed=True, gave_way=True)


@dataclass(frozen=True)
class Part:
    partition_id: str
    parts: int
    rows: int = 100
    quiet_seconds: float = 0.0


class World:
    def __init__(self, *partitions: Part, seconds: float = 2.0):
        self.found = {"db.a": list(partitions)}
        self.merged: list[tuple[str, str]] = []
        self.listed = 0
        self.failures: list[Exception] = []
        self.seconds = seconds
        self.clock = Clock(1000.0)
        self.busy = threading.Lock()
        self.metrics = Metrics()
        self.merges = FinalMerges(self.partitions, self.merge, self.busy, self.clock, start=lambda job: job())

    def partitions(self, target: TargetName) -> list[Part]:
        self.listed += 1
        return self.found.get(str(target), [])

    def merge(self, target: TargetName, partition: str) -> float:
        if self.failures:
            raise self.failures.pop()
        self.merged.append((str(target), partition))
        parts = self.found[str(target)]
        self.found[str(target)] = [
            Part(p.partition_id, 1, p.rows) if p.partition_id == partition else p for p in parts
        ]
        self.clock.now += self.seconds
        return self.seconds

    def turn(self, outcome: StepOutcome = CAUGHT_UP, **more) -> bool:
        return self.merges.after_turn(_cfg(**more), outcome, self.metrics.pipeline("a"))


def _cfg(**more) -> RunConfig:
    values = dict(final_merge_every=timedelta(seconds=60)) | more
    return RunConfig("/t", ("id",), TargetName("db", "a"), "chdb:///x", "a", **values)  # type: ignore[arg-type]


def test_deferred_while_the_pipeline_is_behind_then_merged_once_caught_up():
    w = World(Part("all", 4))
    assert not w.turn(BEHIND) and not w.turn(StepOutcome(committed=False))  # behind, or a failed turn
    assert w.listed == 0 and w.merged == []  # not even a look at its parts
    assert w.turn(CAUGHT_UP)
    assert w.merged == [("db.a", "all")]
    labels = {"pipeline": "a"}
    assert w.metrics.registry.get_sample_value("cdc2ch_final_merge_seconds_count", labels) == 1
    assert w.metrics.registry.get_sample_value("cdc2ch_final_merge_seconds_sum", labels) == 2.0


def test_switched_off_with_once_or_on_a_cluster_it_never_merges():
    w = World(Part("all", 4))
    assert not w.turn(final_merges="off")
    assert not w.turn(once=True)
    assert not w.turn(cluster="c")
    assert w.listed == 0 and w.merged == []
    assert _cfg().final_merges == "on"  # on by default


def test_one_merge_at_a_time_in_the_process():
    w = World(Part("all", 4))
    with w.busy:  # another pipeline's merge, or a compaction, runs
        assert not w.turn()
    assert w.merged == [] and w.turn()


def test_each_partition_at_most_once_per_interval_and_a_tenth_of_the_time():
    w = World(Part("all", 3), seconds=2.0)
    assert w.turn()
    w.found["db.a"] = [Part("all", 3)]  # new parts right after it
    w.clock.now += 17.9  # a 2 s merge holds the next look off for 18 s
    assert not w.turn() and w.listed == 1
    w.clock.now += 0.1
    assert not w.turn() and w.listed == 2  # looked: merged 18 s ago, within the minute
    w.clock.now += 41.9
    assert not w.turn() and w.listed == 2  # held until the minute is over
    w.clock.now += 0.1
    assert w.turn() and w.merged == [("db.a", "all")] * 2


def test_nothing_to_collapse_looks_again_after_the_interval():
    w = World(Part("202601", 1), Part("202602", 1))
    assert not w.turn() and w.listed == 1
    w.found["db.a"][1] = Part("202602", 2)
    w.clock.now += 59
    assert not w.turn() and w.listed == 1
    w.clock.now += 1
    assert w.turn() and w.merged == [("db.a", "202602")]


def test_partitions_that_stopped_changing_first_then_the_most_parts():
    w = World(Part("hot", 9, quiet_seconds=1), Part("old", 2, quiet_seconds=600), Part("older", 3, quiet_seconds=900),
              seconds=0.0)  # fmt: skip
    for _ in range(3):
        assert w.turn()
    assert [p for _, p in w.merged] == ["older", "old", "hot"]
    assert not w.turn()  # every partition one part now


def test_a_failed_merge_is_counted_and_tried_again_later():
    w = World(Part("all", 4))
    w.failures.append(SinkError("Code: 241. Memory limit exceeded"))
    assert w.turn(final_merge_every=timedelta(hours=1)) and w.merged == []  # started, and failed
    assert not w.busy.locked()
    assert w.metrics.registry.get_sample_value("cdc2ch_final_merge_failures_total", {"pipeline": "a"}) == 1
    w.clock.now += RETRY_AFTER - 1
    assert not w.turn(final_merge_every=timedelta(hours=1)) and w.merged == []
    w.clock.now += 1
    assert w.turn(final_merge_every=timedelta(hours=1)) and w.merged == [("db.a", "all")]


def test_the_merge_runs_beside_the_pipeline_and_one_at_a_time_until_it_ends():
    w = World(Part("all", 4))
    begun, end = threading.Event(), threading.Event()

    def slow(target: TargetName, partition: str) -> float:
        begun.set()
        end.wait(10)
        return w.merge(target, partition)

    merges = FinalMerges(w.partitions, slow, w.busy, w.clock)  # on a thread of its own
    assert merges.after_turn(_cfg(), CAUGHT_UP, w.metrics.pipeline("a"))  # returned while it runs
    assert begun.wait(10) and w.merged == [] and w.busy.locked()  # a compaction or merge waits for it
    closing = threading.Thread(target=merges.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # the service's end waits for it
    end.set()
    closing.join(10)
    assert not closing.is_alive() and w.merged == [("db.a", "all")] and not w.busy.locked()


def test_a_turn_that_gives_way_is_not_caught_up_and_the_one_that_finishes_is():
    t = FakeTable()
    for v in range(4):
        t.commit(*[("insert", {"id": v * 10 + i, "name": f"n{i}"}) for i in range(3)])
    h = Harness(t, once=False)
    job = h.replicator()
    job.start()
    job.turn_over = lambda: True  # another pipeline waits: end the turn between two ranges
    first = job.step()
    assert first.gave_way and not first.caught_up
    job.turn_over = lambda: False
    assert job.step().caught_up
    assert job.step() == StepOutcome(committed=False, caught_up=True)  # nothing new: caught up still
    job.close()
    assert h.final() == h.expected()


def test_bad_intervals_are_refused_with_a_paragraph():
    with pytest.raises(Exception, match="--final-merge-every must be a positive duration"):
        _cfg(final_merge_every=timedelta(0))
    with pytest.raises(Exception, match="final-merges must be"):
        _cfg(final_merges="sometimes")
