"""Driver writes: rows collected to this process as Arrow and inserted in batches (`run` and `snapshot`).

One insert loop for both: refuse null keys, put the rows in replay order (so a replay cuts the same
batches), warn about keys the Delta table holds more than once (written twice by one commit, or live
again in a later commit without a delete in between), then insert batch by batch, each with its deduplication
token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow as pa

from cdc2ch import changes, contract
from cdc2ch.clickhouse.transport import Sink
from cdc2ch.config import RunConfig
from cdc2ch.offset import PipelineState
from cdc2ch.ports import Changes, RangeResult
from cdc2ch.writers import Destination

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
    """Insert `rows` (target layout) in batches of cfg.batch_size. Returns (rows written, batches written,
    complete): complete is False when `stop` was set before the last batch."""
    contract.check_keys(rows, cfg.primary_key, where)
    order = changes.replay_order(rows, cfg.primary_key)
    for dup in changes.duplicate_keys(rows, cfg.primary_key, order):
        log.warning("duplicate_keys", where=where, **context, **dup, hint=DUPLICATES_HINT)
    across = None if cfg.immutable_keys else changes.repeated_across_commits(rows, cfg.primary_key)
    if across is not None:
        log.warning("duplicate_keys_across_commits", where=where, **context, **across, hint=DUPLICATES_HINT)
    written = batches = 0
    for i, batch in enumerate(changes.batches(rows, cfg.batch_size, order)):
        if stop is not None and stop.is_set():
            return written, batches, False
        t0 = time.monotonic()
        written += sink.insert_arrow(table_sql, batch, token(i, batch))
        batches += 1
        on_batch(i, batch, time.monotonic() - t0)
    return written, batches, True


class _ReadAhead:
    """One range read on a background thread. A read nobody asks for is dropped with the process (a
    daemon thread): it wrote nothing."""

    def __init__(self, rng: Changes, immutable_keys: bool):
        self.span = (rng.start, rng.end)
        self._out: dict = {}

        def read() -> None:
            t0 = time.monotonic()
            try:
                self._out["rows"] = rng.arrow_rows(immutable_keys)
            except BaseException as exc:  # raised again where the rows are asked for
                self._out["error"] = exc
            self._out["seconds"] = time.monotonic() - t0

        self._thread = threading.Thread(
            target=read, name=f"cdc2ch-read-ahead {rng.start}..{rng.end}", daemon=True
        )
        self._thread.start()

    def result(self) -> tuple[pa.Table, float]:
        self._thread.join()
        if "error" in self._out:
            raise self._out["error"]
        return self._out["rows"], self._out["seconds"]


class DriverWriter:
    kind = "driver"
    range_factor = 1  # a range is collected whole: --max-rows-per-read bounds memory

    def __init__(self, to: Destination):
        self.to, self.cfg = to, to.cfg
        # the range check() read, for write(), with the seconds its read took
        self._checked: tuple[int, int, pa.Table, float] | None = None
        self._next: Changes | None = None  # the range to read ahead once the current one is read
        self._ahead: _ReadAhead | None = None

    def check(self, rng: Changes) -> None:
        """Read the range (kept for the write that follows) and refuse its null keys."""
        t0 = time.monotonic()
        rows = rng.arrow_rows(self.cfg.immutable_keys)
        seconds = time.monotonic() - t0
        contract.check_keys(rows, self.cfg.primary_key, f"versions {rng.start}..{rng.end} of {rng.uri}")
        self._checked = (rng.start, rng.end, rows, seconds)

    def prefetch(self, rng: Changes) -> None:
        self._next = rng

    def _read(self, rng: Changes) -> tuple[pa.Table, float]:
        """The range's rows and the seconds reading them took (by check() or a read ahead, when one read
        this range); then the read ahead of the range prefetch() named, while this one is inserted. At most
        two ranges are in memory: the one inserted and the one read."""
        checked, self._checked = self._checked, None
        ahead, self._ahead = self._ahead, None
        if checked is not None and checked[:2] == (rng.start, rng.end):
            got = checked[2], checked[3]
        elif ahead is not None and ahead.span == (rng.start, rng.end):
            got = ahead.result()
        else:
            t0 = time.monotonic()
            got = rng.arrow_rows(self.cfg.immutable_keys), time.monotonic() - t0
        upcoming, self._next = self._next, None
        if upcoming is not None and not self.to.stop.is_set():
            self._ahead = _ReadAhead(upcoming, self.cfg.immutable_keys)
        return got

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
