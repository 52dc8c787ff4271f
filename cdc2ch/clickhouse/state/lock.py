"""One runner per pipeline: a claim in ClickHouse, next to the offsets, kept alive by a heartbeat.

ClickHouse has no compare-and-set, so a claim is taken optimistically: write it, read all live claims,
and the oldest (by server time, then token) wins; the loser withdraws. Timestamps come from the server
clock, so clocks of different runners never matter. On the embedded engine every claimer is in this process
(one process holds its directory): claims take turns there, and need neither the second look nor its pause.
A runner killed with -9 stops heartbeating: its claim no longer counts after the TTL, or at once when it ran
on this host and its process is gone.

The lock keeps work from being done twice; correctness never depends on it, since every write cdc2ch
makes is idempotent under FINAL.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime

from cdc2ch.base.errors import LockedError, SinkError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.base.processes import command_name, process_gone
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model import schema

log = get_logger("cdc2ch.lock")

LOCK_TABLE = "cdc2ch_locks"
DEFAULT_TTL = 60.0
RIVAL_PAUSE = 0.25  # seconds for a rival's claim, written in the same instant, to show

# Claims taken on a database only this process writes (the embedded engine) take turns here: each then sees
# every earlier claim at once, and none waits for a rival's to show.
_TURNS = threading.Lock()


@dataclass(frozen=True)
class Claim:
    token: str
    holder: str
    host: str
    pid: int
    claimed_at: datetime
    age_s: float  # seconds since the last heartbeat, by the server's clock

    def describe(self) -> str:
        return (
            f"{self.holder} on host {self.host} (pid {self.pid}), which took it at "
            f"{self.claimed_at:%Y-%m-%d %H:%M:%S} UTC and last checked in {self.age_s:.0f} s ago"
        )


class PipelineLock:
    def __init__(self, sink: Sink, database: str, pipeline: str, ttl: float = DEFAULT_TTL):
        self.sink = sink
        self.pipeline = pipeline
        self.ttl = ttl
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.table = f"{schema.quote(database)}.{schema.quote(LOCK_TABLE)}"
        self.database = database
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- claims -----------------------------------------------------------------------------------
    def _live(self) -> list[Claim]:
        """The claims that hold the pipeline: not released, heartbeat younger than the TTL. A claim of a
        process of this host that is gone (killed) is released on the way, however old: the table keeps no
        claim of a dead runner that this host can vouch for."""
        claims = []
        for claim in _unreleased(self.sink, self.table, self.pipeline):
            if claim.token != self.token and claim.host == self.host and process_gone(claim.pid):
                if claim.age_s < self.ttl:  # an expired one blocked no one: released without a word
                    log.warning("stale_claim_released", pipeline=self.pipeline, holder=claim.describe())
                self._write(
                    token=claim.token, holder=claim.holder, host=claim.host, pid=claim.pid, released=1
                )
            elif claim.age_s < self.ttl:
                claims.append(claim)
        return claims

    def _write(self, released: int = 0, token=None, holder=None, host=None, pid=None) -> None:
        """Insert or refresh a claim row (server time for both timestamps; claimed_at kept if present)."""
        token = token or self.token
        self.sink.command(
            f"INSERT INTO {self.table} SELECT {schema.literal(self.pipeline)}, {schema.literal(token)}, "
            f"{schema.literal(holder or command_name())}, {schema.literal(host or self.host)}, "
            f"{int(pid or self.pid)}, "
            f"ifNull((SELECT minOrNull(claimed_at) FROM {self.table} WHERE pipeline = {schema.literal(self.pipeline)} "
            f"AND token = {schema.literal(token)}), now64(3)), now64(3), {int(released)}",
            what="record the pipeline claim",
            settings={"insert_deduplicate": 0, **self.sink.small_settings},
        )

    def check(self) -> None:
        """Refuse if another runner holds the pipeline; writes nothing when the pipeline is free."""
        if self.sink.own.exists(self.database, LOCK_TABLE):
            self._refuse_if_held(self._live())

    def acquire(self) -> None:
        self.sink.ensure_state_table(
            self.database, LOCK_TABLE, "create_locks_table.sql", what="create the lock table"
        )
        one_process = self.sink.one_process
        with _TURNS if one_process else nullcontext():
            self._refuse_if_held(self._live())
            self._write()
        if not one_process:
            self._yield_to_rivals()
        self._thread = threading.Thread(target=self._heartbeat, name="cdc2ch-lock-heartbeat", daemon=True)
        self._thread.start()
        log.debug("pipeline_claimed", pipeline=self.pipeline, token=self.token)

    def _yield_to_rivals(self) -> None:
        """After claiming where runners in other processes may claim in the same instant: both see both
        claims only after both have written (and a claim whose insert began first can show after the
        other's), so look again after a pause; the older claim stays, this one withdraws if it is not it."""
        for pause in (0.0, RIVAL_PAUSE):
            time.sleep(pause)
            claims = self._live()
            if claims and claims[0].token != self.token:
                self._write(released=1)
                self._refuse_if_held(claims)

    def _refuse_if_held(self, claims: list[Claim]) -> None:
        others = [c for c in claims if c.token != self.token]
        if others:
            raise LockedError(
                f"Pipeline {self.pipeline!r} is already being run by {others[0].describe()}. Only one process "
                f"may write a pipeline at a time, so this one exits without doing anything. If that process "
                f"is gone for good (its host died), its claim expires {self.ttl:.0f} s after its last "
                f"check-in (--lock-ttl); on the same host a dead process is noticed at once."
            )

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self._write()
            except SinkError as exc:
                log.warning("heartbeat_failed", pipeline=self.pipeline, error=summarise(str(exc), 300))

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            try:
                self._write(released=1)
            except SinkError as exc:  # the claim will age out after the TTL
                log.warning("release_failed", pipeline=self.pipeline, error=summarise(str(exc), 300))
            self._thread = None

    def __enter__(self) -> "PipelineLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _unreleased(sink: Sink, table: str, pipeline: str) -> list[Claim]:
    """The pipeline's claims not released, oldest first, however old their heartbeat."""
    rows = sink.query_rows(
        f"SELECT token, holder, host, pid, claimed_at, "
        f"dateDiff('millisecond', heartbeat_at, now64(3)) / 1000 "
        f"FROM {table} FINAL WHERE pipeline = {{p:String}} AND released = 0 "
        f"ORDER BY claimed_at, token",
        {"p": pipeline},
        what="read pipeline claims",
    )
    return [Claim(t, holder, host, int(pid), at, float(age)) for t, holder, host, pid, at, age in rows]


def holders(sink: Sink, database: str, pipeline: str, ttl: float) -> list[Claim]:
    """Who runs the pipeline now, by the claims that count (as a runner's `_live`, for the pipeline's
    --lock-ttl `ttl`), oldest first; read only: a claim of a process of this host that is gone does not
    count, and is left as it is."""
    if not sink.own.exists(database, LOCK_TABLE):
        return []
    here = socket.gethostname()
    table = f"{schema.quote(database)}.{schema.quote(LOCK_TABLE)}"
    return [
        c
        for c in _unreleased(sink, table, pipeline)
        if c.age_s < ttl and not (c.host == here and process_gone(c.pid))
    ]
