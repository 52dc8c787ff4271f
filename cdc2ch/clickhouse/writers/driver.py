"""Driver writes: rows collected to this process as Arrow and inserted in batches (`run` and `snapshot`).

One insert loop for both: refuse null keys, warn about keys the Delta table holds more than once (written
twice by one commit, or live again in a later commit without a delete in between), leave out the rows a
later row of their key outranks (FINAL would not show them), put the rest in replay order (so a replay cuts
the same batches), then insert batch by batch, each with its deduplication token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cdc2ch.base import phases
from cdc2ch.base.log import Logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.writers import Destination
from cdc2ch.model import contract
from cdc2ch.model.changeset import Changes, RangeResult
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState

DUPLICATES_HINT = (
    "the Delta table holds several rows with these keys and ClickHouse keeps one per key; choose a "
    "--primary-key that identifies a row (`cdc2ch validate` counts the duplicates in the whole table)"
)


@dataclass(frozen=True)
class InsertInto:
    """Where insert_rows sends its batches, where it reports, and what makes it stop between two: the part of a
    writer's Destination that a snapshot or a repair, which have no pipeline metrics, can give."""

    sink: Sink
    table_sql: str
    log: Logger
    stop: threading.Event | None = None


def insert_rows(
    into: InsertInto | Destination,
    rows: pa.Table,
    cfg: RunConfig,
    where: str,
    token: Callable[[int, pa.Table], str],
    on_batch: Callable[[int, pa.Table, float], None] = lambda i, batch, seconds: None,
    **context: Any,
) -> tuple[int, int, bool]:
    """Insert `rows` (target layout) in batches of cfg.batch_size, without the outranked ones. Returns (rows
    written, batches written, complete): complete is False when `into.stop` was set before the last batch."""
    sink, log, stop = into.sink, into.log, into.stop
    from cdc2ch.clickhouse.writers import (
        changerows as changes,  # pyarrow.compute: loaded once there are rows (contract.py)
    )

    contract.check_keys(rows, cfg.identity.primary_key, where)
    with phases.timed("rank"):
        ready = changes.prepare(rows, cfg.identity.columns, across_commits=not cfg.immutable_keys)
    for dup in ready.duplicates:
        log.warning("duplicate_keys", where=where, **context, **dup, hint=DUPLICATES_HINT)
    if ready.across is not None:
        log.warning(
            "duplicate_keys_across_commits", where=where, **context, **ready.across, hint=DUPLICATES_HINT
        )
    written = batches = 0
    for i, batch in enumerate(changes.batches(ready.rows, cfg.batch_size, ready.order)):
        if stop is not None and stop.is_set():
            return written, batches, False
        t0 = time.monotonic()
        written += sink.insert_arrow(into.table_sql, batch, token(i, batch))
        batches += 1
        seconds = time.monotonic() - t0
        phases.add("insert", seconds)
        on_batch(i, batch, seconds)
    return written, batches, True


# How many times --max-rows-per-read one range may hold when the source streams its rows (ChangeSource.streams):
# a range above the bound is streamed (replication/plan.streamed), inserted chunk by chunk while Spark scans,
# and at most --max-rows-per-read of its rows wait for the inserts (threads.arrow_batches), so its size costs
# time to plan, not memory. Eight takes each of the benchmarks' backlogs (2-4M change rows) in one read:
# planned once, its inserts beside its scan.
STREAMED_RANGE_FACTOR = 8


class DriverWriter:
    """Writes a range's rows from this process: collected whole and ranked together (the loop reads the next
    range meanwhile), or, for a range `streamed` says (replication/plan.streamed), handed over a chunk at a
    time while Spark still scans, each chunk inserted as it comes."""

    kind = "driver"
    collects = True

    def __init__(self, to: Destination, streamed: Callable[[int], bool] | None = None):
        """`streamed`: whether a range of an estimated number of rows is handed over a chunk at a time (None:
        the source does not stream, every range is collected whole)."""
        self.to, self.cfg, self.streamed = to, to.cfg, streamed
        self.range_factor = STREAMED_RANGE_FACTOR if streamed is not None else 1
        # the range check() read, for write(): its chunks and the seconds reading them took
        self._checked: tuple[int, int, list[pa.Table], float] | None = None

    def _read(self, rng: Changes, estimate: int) -> Iterator[pa.Table]:
        if self.streamed is not None and self.streamed(estimate):
            yield from rng.arrow_chunks(self.cfg.immutable_keys, self.cfg.max_rows_per_read)
        else:
            yield rng.arrow_rows(self.cfg.immutable_keys)

    def check(self, rng: Changes, estimate: int) -> None:
        """Read the range (kept for the write that follows, in the chunks the write would read: a replay
        cuts the same batches) and refuse its null keys."""
        t0 = time.monotonic()
        chunks = list(self._read(rng, estimate))
        seconds = time.monotonic() - t0
        for rows in chunks:
            contract.check_keys(
                rows, self.cfg.identity.primary_key, f"versions {rng.start}..{rng.end} of {rng.uri}"
            )
        self._checked = (rng.start, rng.end, chunks, seconds)

    def _chunks(self, rng: Changes, estimate: int) -> Generator[pa.Table, None, None]:
        """The range's rows: as check() read them, when it read this range; else read now."""
        checked, self._checked = self._checked, None
        if checked is not None and checked[:2] == (rng.start, rng.end):
            while checked[2]:
                yield checked[2].pop(0)  # handed over: the writer holds a chunk while it inserts it
        else:
            yield from self._read(rng, estimate)

    def write(self, rng: Changes, state: PipelineState, estimate: int) -> RangeResult:
        """Each chunk is checked, ranked and inserted on its own: the rows a later row of their key outranks
        in the same chunk are left out (a streamed chunk is one Spark task's rows, read from whole change
        files: an update's pre-image meets its post-image there), and a replay cuts the same chunks, batches
        and tokens."""
        cfg, start, end = self.cfg, rng.start, rng.end
        where = f"versions {start}..{end} of {rng.uri}"
        read = written = batches = 0
        seconds = 0.0
        checked = self._checked[3] if self._checked is not None and self._checked[:2] == (start, end) else 0.0
        chunks = self._chunks(rng, estimate)
        try:  # however the write ends, the source's read ends with it (a streamed read's Spark job is cancelled)
            while True:
                t0 = time.monotonic()
                rows = next(chunks, None)  # the wait for the source: its read
                seconds += time.monotonic() - t0
                if rows is None:
                    break
                read += rows.num_rows

                def batch_done(i: int, batch: pa.Table, took: float, first: int = batches) -> None:
                    self.to.metrics.batch(batch.num_rows, batch.nbytes, took)
                    self.to.log.info(
                        "batch",
                        start=start,
                        end=end,
                        batch=first + i,
                        rows=batch.num_rows,
                        seconds=round(took, 3),
                    )

                done, sent, complete = insert_rows(
                    self.to,
                    rows,
                    cfg,
                    where,
                    lambda i, batch: contract.driver_batch_token(cfg.pipeline, start, end, i, batch),
                    batch_done,
                )
                del rows
                written, batches = written + done, batches + sent
                if not complete:
                    self.to.log.warning(
                        "range_abandoned",
                        start=start,
                        end=end,
                        reason="stop requested",
                        batches_written=batches,
                        committed=state.committed_version,
                    )
                    return RangeResult(start, end, written, False)
        finally:
            chunks.close()
        self.to.log.info("range_read", start=start, end=end, rows=read, seconds=round(seconds + checked, 3))
        return RangeResult(start, end, written, True)
