"""Claims on the embedded engine: of runners claiming one pipeline in the same instant exactly one holds it.

One engine does not make the pause before the second look at the claims unnecessary: a claim whose insert
began first (the earlier claimed_at) can become visible after another runner's, which then saw only its own
and took the pipeline. Without the pause this test finds two holders within a few rounds."""

from __future__ import annotations

import threading

from cdc2ch.clickhouse.lock import LockedError, PipelineLock


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


def test_of_runners_claiming_at_once_exactly_one_holds_the_pipeline(sink, database):
    sink.widen(4)  # the claims' statements overlap, as those of runners in several processes would
    for round_ in range(8):
        won, refused = _race(sink, database, f"p{round_}", 3)
        assert len(won) == 1 and refused == 2, f"round {round_}: {len(won)} runners hold the pipeline"
        won[0].release()
        again = PipelineLock(sink, database, f"p{round_}")
        again.acquire()  # released: free for the next runner
        again.release()
