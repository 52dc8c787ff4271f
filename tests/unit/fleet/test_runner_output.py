"""What a failing pipeline leaves on stderr, through the Runner and the CLI's error handling with in-memory
ports: its error printed once."""

from __future__ import annotations

import json
import threading

import pytest

from cdc2ch.base import log
from cdc2ch.base.errors import SourceError
from cdc2ch.cli import handle_errors
from cdc2ch.fleet.runner import Fleet, Runner
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.replication.metrics import Metrics
from tests.support.service import Refusing, service_ports

GONE = "The Delta table path /lake/gone does not exist. Check --table (a local path or a URI)."


def _cfg(name: str = "orders", once: bool = True) -> RunConfig:
    return RunConfig(f"/lake/{name}", ("id",), TargetName("analytics", name), "chdb:///x", name, once=once)


def _run(error: BaseException, fmt: str, capsys) -> tuple[int, str]:
    """`run --once` of one pipeline from flags whose start fails with `error`: its exit code and stderr."""

    @handle_errors
    def command() -> None:
        ports = service_ports(lambda cfg: Refusing(error))
        Runner([_cfg()], None, None, threading.Event(), Metrics(), ports=ports).run()

    try:
        log.configure(fmt)
        capsys.readouterr()
        with pytest.raises(SystemExit) as ended:
            command()
        return int(ended.value.code or 0), capsys.readouterr().err
    finally:
        with capsys.disabled():  # not onto capsys's stream, which closes with this test
            log.configure("console")


def test_a_single_pipeline_s_error_is_printed_once_after_a_line_naming_its_pipeline_and_kind(capsys):
    code, err = _run(SourceError(GONE), "console", capsys)
    # Before: `pipeline_failed error='The Delta table path … does not exist …'`, then the same paragraph.
    assert code == 1 and err.count("does not exist") == 1, err
    assert err.rstrip().endswith(f"cdc2ch: error: {GONE}")
    failed = [line for line in err.splitlines() if "pipeline_failed" in line]
    assert len(failed) == 1 and "kind=source" in failed[0] and "pipeline=orders" in failed[0]

    # JSON logs: the event says which pipeline failed and how, the final event says what it said.
    code, err = _run(SourceError(GONE), "json", capsys)
    events = [json.loads(line) for line in err.splitlines()]
    assert [(e["event"], e.get("pipeline"), e.get("kind")) for e in events] == [
        ("pipeline_failed", "orders", "source"),
        ("error", None, None),
    ]
    assert events[-1]["message"] == GONE and events[-1]["exit_code"] == 1 and code == 1


def test_a_single_pipeline_s_defect_leaves_its_traceback_to_the_interpreter(capsys):
    """An exception that is no cdc2ch error escapes the command (Python prints its traceback once): the log
    line does not print it a first time."""

    @handle_errors
    def command() -> None:
        ports = service_ports(lambda cfg: Refusing(RuntimeError("a defect")))
        Runner([_cfg()], None, None, threading.Event(), Metrics(), ports=ports).run()

    try:
        log.configure("console")
        capsys.readouterr()
        with pytest.raises(RuntimeError, match="a defect"):
            command()
        err = capsys.readouterr().err
    finally:
        with capsys.disabled():
            log.configure("console")
    assert "Traceback" not in err and "a defect" not in err and "kind=internal" in err, err


def test_a_pipeline_of_a_service_keeps_its_whole_error_in_its_log_line(capsys):
    """A pipeline of a config is one failure among others: nothing is printed after it, so its log line
    carries the error."""
    ports = service_ports(lambda cfg: Refusing(SourceError(GONE)))
    try:
        log.configure("json")
        capsys.readouterr()
        runner = Runner(
            [_cfg()], None, None, threading.Event(), Metrics(), fleet=Fleet(isolate=True), ports=ports
        )
        failed = runner.run()
        err = capsys.readouterr().err
    finally:
        with capsys.disabled():
            log.configure("console")
    events = [json.loads(line) for line in err.splitlines() if '"pipeline_failed"' in line]
    assert len(failed) == 1 and [e["error"] for e in events] == [GONE]


def test_a_service_records_a_pipeline_as_begun_before_its_start_so_status_says_starting():
    """Spark's start and the first read take seconds before a new pipeline claims itself: a health record
    with no outcome yet, saved before the pipeline starts, lets `status` say it is starting."""
    import threading

    from cdc2ch.fleet.runner import Fleet, Runner
    from cdc2ch.model.config import RunConfig, TargetName
    from cdc2ch.replication.metrics import Metrics
    from tests.support.service import MemoryRecords, Refusing, service_ports

    records = MemoryRecords()
    saved_before_start: list[int] = []

    class Starting(Refusing):
        def start(self) -> None:
            saved_before_start.append(len(records.saved))
            super().start()

    cfg = RunConfig("/t", ("id",), TargetName("db", "p"), "chdb:///x", "p", once=True)
    ports = service_ports(lambda c: Starting(RuntimeError("refused")), records)
    runner = Runner([cfg], None, None, threading.Event(), Metrics(), fleet=Fleet(isolate=True), ports=ports)
    runner.run()
    assert saved_before_start == [1]
    begun = records.saved[0]
    assert (begun.pipeline, begun.last_success_at, begun.failures) == ("p", None, 0)
    assert records.saved[-1].failures == 1  # then its failure, as before


def test_a_pipeline_s_first_success_is_recorded_at_once_after_its_begun_record():
    """The begun record must not count as the last save: a service's first success is saved at once (status
    shows last_success), not a health interval later."""
    import time

    from tests.support.fakes import FakeTable, Harness
    from tests.support.service import MemoryRecords, service_ports

    lake = FakeTable()
    lake.commit(("insert", {"id": 1, "name": "a"}))
    harness = Harness(lake, once=False, poll_interval=0.01, target=TargetName("db", "p"))
    records, stop = MemoryRecords(), threading.Event()
    ports = service_ports(lambda cfg: harness.replicator(), records)
    runner = Runner([harness.cfg], None, None, stop, Metrics(), fleet=Fleet(isolate=True), ports=ports)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while len(records.saved) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(10)
    assert [h.last_success_at is not None for h in records.saved[:2]] == [False, True]
