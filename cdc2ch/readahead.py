"""Reading the next version range while the current one is written.

A writer that collects a range into this process (Changes.arrow_rows) leaves the source idle while it
inserts, and the target idle while it reads. The loop lets this module read the next range meanwhile, on one
helper thread that runs with the loop thread's Spark job group, pool and tags. Nothing else changes: the
range is planned (`open_range`) on the loop's thread as before, only its rows are read early, and a failure
to read them is raised when the loop reaches that range, so offsets move exactly as without reading ahead.
A read is side-effect free (the Changes contract), so a range read ahead and then not written (a stop, a
schema break) costs only the read.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from cdc2ch.ports import Changes
from cdc2ch.source.threads import on_other_threads


class ReadAhead:
    """Opens the loop's ranges, the next one read ahead after read() was asked for it. A context manager:
    leaving it waits for a read still running, so no read outlives the loop that asked for it."""

    def __init__(self, open_range: Callable[[int, int], Changes], immutable_keys: bool, enabled: bool):
        self._open, self._immutable = open_range, immutable_keys
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cdc2ch-read-ahead") if enabled else None
        self._next: tuple[int, int, Prefetched | Exception] | None = None

    def open(self, start: int, end: int) -> Changes:
        """The changes of [start, end]: the range read ahead, or opened now."""
        ahead, self._next = self._next, None
        if ahead is None or ahead[:2] != (start, end):
            return self._open(start, end)
        if isinstance(ahead[2], Exception):  # planning it failed: raised where it would have been
            raise ahead[2]
        return ahead[2]

    def read(self, start: int, end: int) -> None:
        """Start reading [start, end] in the background (when enabled)."""
        if self._pool is None:
            return
        try:
            changes = self._open(start, end)
        except Exception as exc:
            self._next = (start, end, exc)
            return
        rows = self._pool.submit(on_other_threads(changes.arrow_rows), self._immutable)
        self._next = (start, end, Prefetched(changes, rows, self._immutable))

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc) -> None:
        self._next = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # a read still running ends before the loop goes on


class Prefetched:
    """Changes whose rows are being read on the helper thread: the first arrow_rows() takes them."""

    def __init__(self, changes: Changes, rows: Future, immutable_keys: bool):
        self.changes, self._rows, self._immutable = changes, rows, immutable_keys
        self.start, self.end, self.uri = changes.start, changes.end, changes.uri
        self.location, self.schema = changes.location, changes.schema

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        rows, self._rows = self._rows, None  # taken once: the writer holds them, not this object
        if rows is None or immutable_keys != self._immutable:
            return self.changes.arrow_rows(immutable_keys)  # read again: the same rows (the Changes contract)
        return rows.result()  # raises what the read raised

    def spark_rows(self, immutable_keys: bool):
        return self.changes.spark_rows(immutable_keys)

    def read_error(self, exc: Exception) -> Exception:
        return self.changes.read_error(exc)
