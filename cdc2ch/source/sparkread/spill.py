"""What a streamed read holds for inserts that lag behind the scan: at most a given number of rows in memory,
the rest spilled to local disk, so the thread that takes Spark's batches never waits."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class _Spilled:
    path: str


class RowQueue:
    """Items handed from one thread to another, first in first out, without ever making the giver wait.

    Batches wait in memory while they hold at most `limit` rows together (a batch is kept in memory whatever
    its size when nothing else is); a batch beyond that is written to an Arrow file in a directory of this
    queue's own (made at the first spill, under the system's temporary directory) and read back in its turn,
    its file removed as it is. Items of no rows, such as the end of a stream, always wait in memory.
    close() drops what waits and removes the directory; after it, put() drops what it is given."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spilled = 0  # batches written to disk so far
        self._cond = threading.Condition()
        self._items: deque = deque()
        self._rows = 0  # rows of the batches waiting in memory
        self._closed = False
        self._dir: str | None = None
        self._names = itertools.count()

    def put(self, item, rows: int = 0) -> None:
        with self._cond:
            if self._closed:
                return
            keep = not rows or not self._items or self._rows + rows <= self.limit
            if keep:
                self._append(item, rows)
                return
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="cdc2ch-spill-")
            path = os.path.join(self._dir, f"{next(self._names)}.arrow")
        with (
            pa.OSFile(path, "wb") as sink,
            pa.ipc.new_file(sink, item.schema) as writer,
        ):  # one giver: in order
            writer.write_batch(item)
        with self._cond:
            self.spilled += 1
            if not self._closed:
                self._append(_Spilled(path), 0)
                return
        # closed while this file was written: close() may have listed the directory before the file was in it,
        # and left both
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)

    def _append(self, item, rows: int) -> None:
        self._items.append((item, rows))
        self._rows += rows
        self._cond.notify_all()

    def get(self):
        with self._cond:
            self._cond.wait_for(lambda: self._items)
            item, rows = self._items.popleft()
            self._rows -= rows
        if not isinstance(item, _Spilled):
            return item
        with open(item.path, "rb") as f:
            data = f.read()
        os.unlink(item.path)
        return pa.ipc.open_file(pa.py_buffer(data)).get_batch(0)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            spill_dir, self._dir = self._dir, None
        if spill_dir is not None:
            shutil.rmtree(spill_dir, ignore_errors=True)
