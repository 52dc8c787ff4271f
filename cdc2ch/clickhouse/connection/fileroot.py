"""Where the embedded engine may read files from: table functions read only below the process's working
directory, and lake files can be anywhere, so statements that read them run from /."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Table functions that read the local file system.
_LOCAL_READS = re.compile(rb"\b(deltaLakeLocal|icebergLocal|file)\s*\(", re.I)


def reads_local_files(statement: bytes) -> bool:
    """Whether a statement names a table function that reads local files (a false positive costs nothing)."""
    return _LOCAL_READS.search(statement) is not None


class _FromRoot:
    """Statements of several pipelines overlap: the first to begin moves to /, the last to end moves back (one
    alone would move back under another still running, or leave the process in /)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._previous = ""

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._running == 0:
                self._previous = os.getcwd()
                os.chdir("/")
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    os.chdir(self._previous)


from_root = _FromRoot()
