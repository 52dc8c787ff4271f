"""base/phases.py: a pipeline's time split into phases, each counting its own time only, across threads."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cdc2ch.base import phases
from cdc2ch.source.spark.threads import on_other_threads

pytestmark = pytest.mark.unit


def test_nothing_is_recorded_outside_a_pipeline():
    with phases.timed("scan"):
        phases.add("insert", 1.0)
    assert not phases.recording_now()


def test_a_phase_inside_another_counts_only_once():
    p = phases.Phases()
    with phases.recording(p):
        with phases.timed("plan"):
            time.sleep(0.05)
            with phases.timed("jvm"):
                time.sleep(0.5)
            phases.add("scan", 0.01)  # a figure measured inside "plan"'s time span
    got = p.seconds()
    assert list(got) == ["jvm", "plan", "scan"]  # in the order of the pipeline's work
    assert got["jvm"] >= 0.5 and got["scan"] == 0.01
    # its own 0.05 s (a loaded machine sleeps longer), less the JVM's 0.5 s and the scan's 0.01 s: were the
    # JVM's time counted in it too, it would be 0.55 s or more
    assert 0.03 <= got["plan"] < 0.45


def test_a_read_ahead_thread_records_into_its_pipeline():
    p, other = phases.Phases(), phases.Phases()

    def read():
        with phases.timed("scan"):
            time.sleep(0.02)

    with ThreadPoolExecutor(2) as pool:
        with phases.recording(p):
            pool.submit(on_other_threads(read)).result()
        with phases.recording(other):
            pool.submit(read).result()  # a plain thread does not carry the pipeline along
    assert p.seconds()["scan"] >= 0.02 and other.seconds() == {}


def test_timed_methods_of_an_object():
    class Files:
        dir = "/t/_delta_log"

        def read(self, name):
            time.sleep(0.01)
            return name

    p = phases.Phases()
    files = phases.Timed(Files())
    with phases.recording(p):
        assert files.read("0.json") == "0.json" and files.dir == "/t/_delta_log"
    assert p.seconds()["log"] >= 0.01


def test_recorded_methods_record_into_their_objects_phases():
    class Job:
        def __init__(self):
            self.phases = phases.Phases()

        @phases.recorded
        def step(self):
            phases.add("insert", 0.25)
            return True

    job = Job()
    assert job.step() and job.phases.seconds() == {"insert": 0.25} and not phases.recording_now()
