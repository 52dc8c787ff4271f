"""`cdc2ch pause`, `resume` and `resync`: a request for one pipeline, recorded in its target database where
the service running it reads it within one poll (fleet/lifecycle.py); nothing restarts."""

from __future__ import annotations

from cdc2ch.base.errors import ConfigError, SinkError
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.control import ControlStore
from cdc2ch.clickhouse.state.statestore import (
    HEALTH_TABLE,
    STATE_TABLE,
    HealthStore,
    StateStore,
    state_tables,
)
from cdc2ch.model.config import TargetName
from cdc2ch.model.records import PAUSE, RESUME, RESYNC

DONE = {
    PAUSE: "paused: the service running it stops it after the batch in flight, within one poll, and the others "
    "go on. `cdc2ch resume --pipeline {p}` lets it go on from its offset.",
    RESUME: "resumed: the service running it goes on from its offset within one poll.",
    RESYNC: "to be rebuilt: within one poll the service running it loads a snapshot of the latest version into "
    "a side table while the target keeps serving, swaps it in and goes on (`cdc2ch status` shows it pending "
    "until then).",
}


def request(action: str, pipeline: str, reason: str | None, target: str | None, clickhouse_dsn: str) -> str:
    """Record the request; the sentence saying what happens next. `target`: the pipeline's target table, to
    tell apart pipelines of one name in several databases."""
    from cdc2ch.clickhouse.connection.dsn import connect

    within = {TargetName.parse(target).database} if target else None
    with connect(clickhouse_dsn, create=False, reader=True) as sink:
        database = _database_of(sink, pipeline, within)
        try:
            ControlStore(sink, database).request(pipeline, action, reason or "")
        except SinkError as exc:
            if exc.code != codes.READONLY:
                raise
            raise ConfigError(
                f"ClickHouse at {sink.display} only lets this process read, so the {action} of pipeline "
                f"{pipeline!r} could not be recorded. An embedded database held by `cdc2ch run --serve` takes "
                f"requests when that service also has --serve-writable; otherwise give --clickhouse a user that "
                f"may write. Nothing was changed."
            ) from None
    return f"Pipeline {pipeline} ({database}) {DONE[action].format(p=pipeline)}"


def _database_of(sink: Sink, pipeline: str, within: set[str] | None) -> str:
    """The database (of `within`, None: any) holding the pipeline's records (its offset or its health)."""
    found = []
    for db, tables in state_tables(sink, within).items():
        names = set()
        if STATE_TABLE in tables:
            names |= {s.pipeline for s in StateStore(sink, db).load_all(tables[STATE_TABLE])}
        if HEALTH_TABLE in tables:
            names |= set(HealthStore(sink, db).load_all(exists=True))
        if pipeline in names:
            found.append(db)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConfigError(
            f"No pipeline named {pipeline!r} has a record in ClickHouse at {sink.display} (a pipeline has one "
            f"from its first run). `cdc2ch status` lists the pipelines there by name. Nothing was changed."
        )
    raise ConfigError(
        f"Pipelines named {pipeline!r} have records in several databases of ClickHouse at {sink.display}: "
        f"{', '.join(found)}. Add --target with the database.table of the one you mean (`cdc2ch status` shows "
        f"each pipeline's target). Nothing was changed."
    )
