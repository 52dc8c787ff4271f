"""Where a claimed pipeline resumes (resume.resumed): its offset as stored, recording how the table was reached
this time, or with --reset moved to just before the start version; and when a --once poll is idle."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.records import PipelineState
from cdc2ch.replication.startup import resume
from cdc2ch.replication.startup.inputs import Inputs
from tests.support.fakes import MemoryStore

STAMP = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Log:
    def __init__(self):
        self.events: list[tuple[str, str, dict]] = []

    def info(self, event: str, **fields) -> None:
        self.events.append(("info", event, fields))

    def warning(self, event: str, **fields) -> None:
        self.events.append(("warning", event, fields))


def config(**more) -> RunConfig:
    values = {"table": "/lake/t", "primary_key": ("id",), "target": TargetName("db", "t"),
              "clickhouse_dsn": "chdb:///mem", "pipeline": "p", "once": True, **more}  # fmt: skip
    return RunConfig(**values)


def source(uri: str = "/lake/t", location: str = "/lake/t"):
    return SimpleNamespace(uri=uri, location=location)


def stored(**more) -> PipelineState:
    values = {"location": "/lake/t", "table_id": "id-1", "initial_load": "snapshot at version 2",
              "initial_reason": "new table", **more}  # fmt: skip
    return PipelineState("p", "/lake/t", "db.t", 7, 7, 40, STAMP, **values)


def store_with(state: PipelineState | None) -> MemoryStore:
    store = MemoryStore()
    if state is not None:
        store.states[state.pipeline] = state
    return store


def test_a_stored_offset_reached_as_recorded_resumes_as_it_is_without_a_save():
    store, log = store_with(stored()), Log()
    state = resume.resumed(config(), source(), store, 8, "id-1", log)
    assert state == stored() and store.saves == 0 and log.events == []
    assert store.ensured


@pytest.mark.parametrize(
    "reached, table_id",
    [
        (source("main.sales.t", "/lake/t"), "id-1"),
        (source("/lake/t", "file:/lake/t"), "id-1"),
        (source(), ""),
    ],
)
def test_a_stored_offset_records_the_name_location_and_id_the_table_was_reached_by(reached, table_id):
    store, log = store_with(stored(table_id="")), Log()
    state = resume.resumed(config(), reached, store, 8, table_id, log)
    expected = stored(table_id="").relabelled(reached.uri, reached.location, table_id)
    assert state == expected and store.load("p") == expected
    if expected != stored(table_id=""):
        assert store.saves == 1
        assert log.events == [
            (
                "info",
                "source_recorded",
                {"source": reached.uri, "location": reached.location, "was": "/lake/t"},
            )
        ]
    else:
        assert store.saves == 0 and log.events == []


def test_a_reset_moves_the_offset_to_just_before_the_start_and_keeps_the_history():
    store, log = store_with(stored()), Log()
    state = resume.resumed(config(reset=True), source("main.sales.t", "s3://lake/t"), store, 3, "id-2", log)
    assert (state.pipeline, state.source, state.target, state.location, state.table_id) == (
        "p", "main.sales.t", "db.t", "s3://lake/t", "id-2"
    )  # fmt: skip
    assert (state.committed_version, state.pending_version, state.rows_written) == (2, 2, 40)
    assert (state.initial_load, state.initial_reason) == ("snapshot at version 2", "new table")
    assert state.updated_at > STAMP and store.load("p") == state and store.saves == 1
    assert log.events == [("warning", "state_reset", {"was": 7, "now": 2})]


@pytest.mark.parametrize("reset", [False, True])
def test_a_new_pipeline_starts_just_before_its_start_version(reset):
    store, log = store_with(None), Log()
    state = resume.resumed(config(reset=reset), source("main.sales.t", "s3://lake/t"), store, 5, "id-1", log)
    assert (state.pipeline, state.source, state.target, state.location, state.table_id) == (
        "p", "main.sales.t", "db.t", "s3://lake/t", "id-1"
    )  # fmt: skip
    assert (state.committed_version, state.pending_version, state.rows_written) == (4, 4, 0)
    assert store.load("p") == state and store.saves == 1 and log.events == []


def test_a_once_poll_is_idle_only_when_the_table_is_the_one_recorded():
    class NoResync:
        def leftover(self, state: PipelineState) -> bool:
            return False

    def idle(table_id: str, **more) -> bool:
        inputs = Inputs(start=8, stored=stored(**more), latest=7, writer="driver", table_id=table_id)
        return resume.nothing_to_write(config(), inputs, source(), NoResync())

    assert idle("id-1")
    assert idle("")  # no id read: the recorded one stands
    assert not idle("id-2")  # another table under the same name: claim, and let the checks refuse it
    assert not idle("id-1", location="/old/t")
