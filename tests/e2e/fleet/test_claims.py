"""Claims: of runners claiming one pipeline in the same instant exactly one holds it, on a database only this
process writes (the embedded engine: claims take turns) and on one that runners in other processes write too
(a server: each claim looks again after a pause).

A claim whose insert began first (the earlier claimed_at) can become visible after another runner's, which
then saw only its own and took the pipeline: without the turns, or without the pause, this test finds two
holders within a few rounds. The second case runs on a second connection to the same engine, told that
other processes write there (what a server connection is)."""

from __future__ import annotations

import threading

import pytest

from cdc2ch.base.errors import LockedError
from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.clickhouse.state.lock import PipelineLock


@pytest.fixture(params=["one process", "several processes"])
def claimed_on(request, sink, chdb_dsn):
    if request.param == "one process":
        yield sink
        return
    shared = connect(chdb_dsn)
    shared.one_process = False
    yield shared
    shared.close()


def _race(sink, database: str, pipeline: str, runners: int) -> tuple[list[PipelineLock], int]:
    locks = [PipelineLock(sink, database, pipeline) for _ in range(runners)]
    gate, won, refused = threading.Barrier(runners), [], []

    def claim(lock: PipelineLock) -> None:
        gate.wait()
        try:
            lock.acquire()
            won.append(lock)
        except LockedError:
            refused.append(lock)

    threads = [threading.Thread(target=claim, args=(lock,)) for lock in locks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, len(refused)


def test_of_runners_claiming_at_once_exactly_one_holds_the_pipeline(claimed_on, database):
    sink = claimed_on
    sink.widen(4)  # the claims' statements overlap, as those of runners in several processes would
    for round_ in range(8):
        won, refused = _race(sink, database, f"p{round_}", 3)
        assert len(won) == 1 and refused == 2, f"round {round_}: {len(won)} runners hold the pipeline"
        won[0].release()
        again = PipelineLock(sink, database, f"p{round_}")
        again.acquire()  # released: free for the next runner
        again.release()
