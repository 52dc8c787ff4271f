"""`cdc2ch pause`, `resume` and `resync`: a request for one pipeline, recorded in its target database where
the service running it reads it within one poll (fleet/lifecycle.py); nothing restarts.

An embedded database held by a `cdc2ch run --serve` is reached through that service, which records the
request itself (clickhouse/serving/requestroute.py: its data stays read-only to every client); any other
target takes the request from this process. A pipeline is found by its records, or, before it has any, where
the config file names it or the service recording the request runs it. What it prints says what happens
next, as things stand: a service running the pipeline (a live claim on it), the service recording it that
runs it without a claim yet (starting), none that can be (this process opened the embedded database
itself), or none holding a claim on it now (a service may hold it paused)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from cdc2ch.base.errors import ConfigError, SinkError
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.serving import requestroute
from cdc2ch.clickhouse.serving.requestroute import Ask
from cdc2ch.clickhouse.state.control import ControlStore
from cdc2ch.clickhouse.state.lock import DEFAULT_TTL, Claim, holders
from cdc2ch.commands.invocation.listing import Known
from cdc2ch.commands.recorded import target_of
from cdc2ch.model.config import TargetName
from cdc2ch.model.records import PAUSE, RESUME, RESYNC

log = get_logger("cdc2ch.requests")


class Runs(Enum):
    """Who acts on a request, as far as can be told when it is recorded."""

    NOW = "a service runs the pipeline: a live claim on it"
    STARTING = "the service recording it runs the pipeline, with no claim on it: not begun writing, or paused"
    UNCLAIMED = "no claim on it: nothing replicates it now, or a service holds it paused"
    NOTHING = "this process opened the embedded database, which a running service would hold"


_REBUILD = (
    "loads a snapshot of the latest version into a side table while the target keeps serving, swaps it in "
    "and goes on (`cdc2ch status` shows it pending until then)"
)
DONE = {
    (PAUSE, Runs.NOW): "paused: the service running it ({holder}) stops it after the batch in flight, within "
    "one poll, and the others go on. `cdc2ch resume --pipeline {p}` lets it go on from its offset.",
    (RESUME, Runs.NOW): "resumed: the service running it ({holder}) goes on from its offset within one poll.",
    (RESYNC, Runs.NOW): f"to be rebuilt: within one poll the service running it ({{holder}}) {_REBUILD}.",
    (PAUSE, Runs.STARTING): "paused: the service running it holds no claim on it now (it has not begun "
    "writing it, Spark may be starting, or it is paused already), and writes nothing of it until "
    "`cdc2ch resume --pipeline {p}`.",
    (RESUME, Runs.STARTING): "resumed: the service running it holds no claim on it now; it begins or goes on "
    "from its offset within one poll.",
    (RESYNC, Runs.STARTING): "to be rebuilt: the service running it holds no claim on it now (it has not "
    f"begun writing it, or it is paused), so the rebuild waits for its next turn with an offset; it then "
    f"{_REBUILD}.",
    (PAUSE, Runs.UNCLAIMED): "paused: no process is replicating it now (none holds a claim on it); a service "
    "that runs it, or its next `cdc2ch run`, leaves it alone until `cdc2ch resume --pipeline {p}`.",
    (
        RESUME,
        Runs.UNCLAIMED,
    ): "resumed: no process is replicating it now (none holds a claim on it). A service "
    "that holds it paused goes on from its offset within one poll; otherwise it goes on when the pipeline "
    "next runs (`cdc2ch run ...`).",
    (
        RESYNC,
        Runs.UNCLAIMED,
    ): "to be rebuilt: no process is replicating it now (none holds a claim on it), so "
    "the rebuild waits for its next turn: when the pipeline next runs (`cdc2ch run ...`), or, if a service "
    f"holds it paused, once it is resumed. It then {_REBUILD}.",
    (PAUSE, Runs.NOTHING): "paused: no service is running it (this command could open its embedded database, "
    "which a running service holds), so the request is recorded for its next run: `cdc2ch run` leaves it "
    "alone until `cdc2ch resume --pipeline {p}`.",
    (RESUME, Runs.NOTHING): "resumed: no service is running it (this command could open its embedded "
    "database, which a running service holds), so the request is recorded for its next run: it goes on from "
    "its offset when the pipeline next runs (`cdc2ch run ...`).",
    (RESYNC, Runs.NOTHING): "to be rebuilt: no service is running it (this command could open its embedded "
    "database, which a running service holds), so the request is recorded for its next run: when the "
    f"pipeline next runs (`cdc2ch run ...`) it {_REBUILD}.",
}


def request(
    action: str,
    pipeline: str,
    reason: str | None,
    target: str | None,
    clickhouse_dsn: str,
    known: Known | None = None,
) -> str:
    """Record the request; the sentence saying what happens next. `target`: the pipeline's target table, to
    tell apart pipelines of one name in several databases; `known`: the pipeline as the config file names it."""
    from cdc2ch.base.processes import requester
    from cdc2ch.clickhouse.connection.dsn import connect

    ask = Ask(
        action, pipeline, reason or "", TargetName.parse(target).database if target else None, requester()
    )
    with connect(clickhouse_dsn, create=False, reader=True) as sink:
        if sink.task_client is not None and requestroute.takes_requests(sink.task_client):  # a `run --serve`
            return requestroute.send(sink.task_client, ask)
        return record(sink, ask, known={known.name: known} if known else {})


def record(sink: Sink, ask: Ask, serving: bool = False, known: Mapping[str, Known] | None = None) -> str:
    """Record `ask` in the control table of the pipeline's database: what `request` does on a target it
    writes, and what a `run --serve` does with a request that comes to it (`serving`: this process runs the
    service). `known`: pipelines as a config file, or the service running them, knows them (their claims
    count for their --lock-ttl). The sentence saying what happens next."""
    ours = (known or {}).get(ask.pipeline)
    if ours is not None and ask.database not in (None, ours.target.database):
        ours = None  # another database's pipeline of that name
    within = {ask.database} if ask.database else None
    database = target_of(sink, ask.pipeline, within, ours.target if ours else None).database
    claims = claims_of(sink, database, ask.pipeline, ours)
    runs = runs_of(bool(claims), serving and ours is not None, sink.one_process and not serving)
    try:
        ControlStore(sink, database).request(ask.pipeline, ask.action, ask.reason, ask.by)
    except SinkError as exc:
        if exc.code != codes.READONLY:
            raise
        raise ConfigError(
            f"ClickHouse at {sink.display} only lets this process read, so the {ask.action} of pipeline "
            f"{ask.pipeline!r} could not be recorded: give --clickhouse a user that may write (the pipeline's "
            f"service reads its requests there). Nothing was changed."
        ) from None
    if serving:
        log.info("request_recorded", pipeline=ask.pipeline, action=ask.action, by=ask.by, reason=ask.reason)
    holder = f"{claims[0].holder}, pid {claims[0].pid} on host {claims[0].host}" if claims else ""
    return (
        f"Pipeline {ask.pipeline} ({database}) {DONE[ask.action, runs].format(p=ask.pipeline, holder=holder)}"
    )


def runs_of(claimed: bool, served: bool, opened: bool) -> Runs:
    """Who acts on a request: `claimed`, a live claim on the pipeline; `served`, the service recording the
    request runs it; `opened`, this command opened the embedded database itself (no service holds it)."""
    if claimed:
        return Runs.NOW
    if served:
        return Runs.STARTING
    return Runs.NOTHING if opened else Runs.UNCLAIMED


def claims_of(sink: Sink, database: str, pipeline: str, ours: Known | None) -> list[Claim]:
    """The live claims on the pipeline of `database`: live for its --lock-ttl, where a config file or the
    service running it says what that is (`ours`), else for the default."""
    ttl = ours.lock_ttl if ours is not None and ours.target.database == database else DEFAULT_TTL
    return holders(sink, database, pipeline, ttl)
