"""Driver writes: rows collected to this process as Arrow and inserted in batches (`run` and `snapshot`).

One insert loop for both: refuse null keys, warn about keys the Delta table holds more than once (written
twice by one commit, or live again in a later commit without a delete in between), leave out the rows a
later row of their key outranks (FINAL would not show them), put the rest in replay order (so a replay cuts
the same batches), then insert batch by batch, each with its deduplication token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow as pa

from cdc2ch.base import phases
from cdc2ch.clickhouse.transport import Sink
from cdc2ch.model import contract
from cdc2ch.model.config import RunConfig
from cdc2ch.model.offset import PipelineState
from cdc2ch.replication import changes
from cdc2ch.replication.ports import Changes, RangeResult
from cdc2ch.replication.writers import Destination

DUPLICATES_HINT = (
    "the Delta table holds several rows with these keys and ClickHouse keeps one per key; choose a "
    "--primary-key that identifies a row (`cdc2ch validate` counts the duplicates in the whole table)"
)


def insert_rows(
    sink: Sink,
    table_sql: str,
    rows: pa.Table,
    cfg: RunConfig,
    where: str,
    token: Callable[[int, pa.Table], str],
    log,
    stop: threading.Event | None = None,
    on_batch: Callable[[int, pa.Table, float], None] = lambda i, batch, seconds: None,
    **context,
) -> tuple[int, int, bool]:
    """Insert `rows` (target layout) in batches of cfg.batch_size, without the outranked ones. Returns (rows
    written, batches written, complete): complete is False when `stop` was set before the last batch."""
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
        written += sink.insert_arrow(table_sql, batch, token(i, batch))
        batches += 1
        seconds = time.monotonic() - t0
        phases.add("insert", seconds)
        on_batch(i, batch, seconds)
    return written, batches, True


class DriverWriter:
    kind = "driver"
    range_factor = 1  # a range is collected whole: --max-rows-per-read bounds memory
    collects = True  # and the next is read meanwhile: two ranges at most

    def __init__(self, to: Destination):
        self.to, self.cfg = to, to.cfg
        # the range check() read, for write(), with the seconds its read took
        self._checked: tuple[int, int, pa.Table, float] | None = None

    def check(self, rng: Changes) -> None:
        """Read the range (kept for the write that follows) and refuse its null keys."""
        t0 = time.monotonic()
        rows = rng.arrow_rows(self.cfg.immutable_keys)
        seconds = time.monotonic() - t0
        contract.check_keys(
            rows, self.cfg.identity.primary_key, f"versions {rng.start}..{rng.end} of {rng.uri}"
        )
        self._checked = (rng.start, rng.end, rows, seconds)

    def _read(self, rng: Changes) -> tuple[pa.Table, float]:
        """The range's rows and the seconds reading them took (by check(), when it read this range)."""
        checked, self._checked = self._checked, None
        if checked is not None and checked[:2] == (rng.start, rng.end):
            return checked[2], checked[3]
        t0 = time.monotonic()
        rows = rng.arrow_rows(self.cfg.immutable_keys)
        return rows, time.monotonic() - t0

    def write(self, rng: Changes, state: PipelineState, estimate: int) -> RangeResult:
        cfg, start, end = self.cfg, rng.start, rng.end
        rows, seconds = self._read(rng)
        self.to.log.info("range_read", start=start, end=end, rows=rows.num_rows, seconds=round(seconds, 3))

        def batch_done(i: int, batch: pa.Table, seconds: float) -> None:
            self.to.metrics.batch(batch.num_rows, batch.nbytes, seconds)
            self.to.log.info(
                "batch", start=start, end=end, batch=i, rows=batch.num_rows, seconds=round(seconds, 3)
            )

        written, batches, complete = insert_rows(
            self.to.sink,
            self.to.table_sql,
            rows,
            cfg,
            f"versions {start}..{end} of {rng.uri}",
            lambda i, batch: contract.driver_batch_token(cfg.pipeline, start, end, i, batch),
            self.to.log,
            self.to.stop,
            batch_done,
        )
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
        return RangeResult(start, end, written, True)
