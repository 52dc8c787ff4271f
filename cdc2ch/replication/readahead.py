"""Reading the next version range while the current one is written.

A writer that collects a range into this process (Changes.arrow_rows) leaves the source idle while it
inserts, and the target idle while it reads. The loop lets this module plan and read the next range
meanwhile, on one helper thread that runs with the loop thread's Spark job group, pool and tags. Planning
there too keeps it off the loop's path (a Delta range is planned from its end version's snapshot, ~0.1 s
a range). Nothing else changes: a failure to plan or read the range is raised when the loop reaches that
range, where it would have been raised without reading ahead, so offsets move exactly the same. The loop
uses the source only once the read it asked for is over (open waits for it), so one thread at a time does.
A read is side-effect free (the Changes contract), so a range read ahead and then not written (a stop, a
schema break, a refused claim) costs only the read.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from cdc2ch.model.changeset import Changes, Commit


class ReadAhead:
    """Opens the loop's ranges, the next one read ahead after read() was asked for it. A context manager:
    leaving it waits for a read still running, so no read outlives the loop that asked for it."""

    def __init__(
        self,
        open_range: Callable[[int, int], Changes],
        immutable_keys: bool,
        enabled: bool,
        on_other_threads: Callable[[Callable[..., Any]], Callable[..., Any]],
    ):
        """`on_other_threads`: a function wrapped to run on the helper thread as part of the loop's reads."""
        self._open, self._immutable, self._carried = open_range, immutable_keys, on_other_threads
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cdc2ch-read-ahead") if enabled else None
        # the range asked for: (start, end, its planned Changes, its rows), both set by the helper thread
        self._next: tuple[int, int, Future[Changes], Future[pa.Table]] | None = None

    def open(self, start: int, end: int) -> Changes:
        """The changes of [start, end]: the range read ahead, or opened now."""
        ahead, self._next = self._next, None
        if ahead is None or ahead[:2] != (start, end):
            return self._open(start, end)
        planned, rows = ahead[2], ahead[3]
        return Prefetched(planned.result(), rows, self._immutable)  # planning's failure raised here

    def read(self, start: int, end: int) -> None:
        """Start planning and reading [start, end] in the background (when enabled)."""
        if self._pool is None:
            return
        planned: Future[Changes] = Future()

        def plan_and_read() -> pa.Table:
            try:
                changes = self._open(start, end)
            except BaseException as exc:
                planned.set_exception(exc)
                raise
            planned.set_result(changes)
            return changes.arrow_rows(self._immutable)

        self._next = (start, end, planned, self._pool.submit(self._carried(plan_and_read)))

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self._next = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # a read still running ends before the loop goes on


class Prefetched:
    """Changes whose rows are being read on the helper thread: the first arrow_rows() takes them."""

    def __init__(self, changes: Changes, rows: Future[pa.Table], immutable_keys: bool):
        self._rows: Future[pa.Table] | None = rows
        self.changes, self._immutable = changes, immutable_keys
        self.start, self.end, self.uri = changes.start, changes.end, changes.uri
        self.location, self.schema, self.origin = changes.location, changes.schema, changes.origin

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        rows, self._rows = self._rows, None  # taken once: the writer holds them, not this object
        if rows is None or immutable_keys != self._immutable:
            return self.changes.arrow_rows(immutable_keys)  # read again: the same rows (the Changes contract)
        return rows.result()  # raises what the read raised

    def arrow_chunks(self, immutable_keys: bool, held_rows: int) -> Generator[pa.Table, None, None]:
        yield self.arrow_rows(immutable_keys)

    def spark_rows(self, immutable_keys: bool) -> Any:
        return self.changes.spark_rows(immutable_keys)

    def read_error(self, exc: Exception) -> Exception:
        return self.changes.read_error(exc)

    def commits(self) -> list[Commit]:
        return self.changes.commits()

    def properties(self) -> dict[str, str]:
        return self.changes.properties()
