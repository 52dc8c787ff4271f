"""Progress of long loads: a bar on a terminal (rich's, log lines printed above it), periodic log lines
otherwise. No bar with --log-format json, under the Python API, or when stderr is not a terminal."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from cdc2ch.base.log import get_logger, in_api_call, json_lines

log = get_logger("cdc2ch.progress")


class Progress:
    """Counts of one load, shown as it goes; used as a context manager, so that a load that ends early
    (stopped, failed) takes its bar down too."""

    def __init__(
        self,
        what: str,
        total_rows: int | None,
        total_chunks: int,
        files: int | None = None,
        interval: float = 10.0,
        stream: TextIO | None = None,
        unit: str = "chunk",
        shown: bool = True,
    ):
        self.what = what
        self.shown = shown  # False: counts only (a load too short to show), neither bar nor log lines
        self.unit = unit
        self.total_rows = total_rows
        self.total_chunks = total_chunks
        self.files = files
        self.rows = 0
        self.chunks = 0
        self.started = time.monotonic()
        self._last_log = self.started
        self._interval = interval
        self._stream = stream or sys.stderr
        # Under the Python API the terminal is the caller's, and JSON lines are for machines: log lines only.
        self.bar = self._stream.isatty() and not in_api_call() and not json_lines()
        self._drawn: Any = None  # rich's bar once drawn
        self._closed = False  # the bar taken down: counts only from then on

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, rows: int, chunks: int = 0) -> None:
        self.rows += rows
        self.chunks += chunks
        now = time.monotonic()
        if not self.shown:
            return
        if self.bar:
            self._draw()
        elif now - self._last_log >= self._interval:
            self._last_log = now
            log.info("progress", what=self.what, **self.figures())

    def figures(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.rows / elapsed
        eta = None
        if self.total_rows and rate > 0:
            eta = round(max(self.total_rows - self.rows, 0) / rate, 1)
        return {
            "rows": self.rows,
            "total_rows": self.total_rows,
            f"{self.unit}s": self.chunks,
            f"total_{self.unit}s": self.total_chunks,
            **({"files": self.files} if self.files is not None else {}),
            "rows_per_s": round(rate),
            "eta_s": eta,
        }

    def line(self) -> str:
        """The counts beside the bar: rows, chunks, files, rate."""
        f = self.figures()
        total = f"/{self.total_rows:,}" if self.total_rows else ""
        files = f" ({self.files} files)" if self.files is not None else ""
        return (
            f"{self.rows:,}{total} rows, {self.unit} {self.chunks}/{self.total_chunks}{files}, "
            f"{f['rows_per_s']:,} rows/s"
        )

    def _draw(self) -> None:
        if self._closed:
            return
        if self._drawn is None:
            self._drawn = _Bar(self.what, self._stream)
        by_rows = bool(self.total_rows)
        done, total = (self.rows, self.total_rows) if by_rows else (self.chunks, self.total_chunks)
        self._drawn.update(done, total, self.line())

    def done(self) -> None:
        if not self.shown:
            return
        if self.bar:
            self._draw()
        self.close()
        log.info("progress_done", what=self.what, **self.figures())

    def close(self) -> None:
        """Take the bar down (it stays on the terminal as last drawn)."""
        self._closed = True
        drawn, self._drawn = self._drawn, None
        if drawn is not None:
            drawn.close()


class _Bar:
    """One load's line in rich's progress display on `stream`. The loads of one process (pipelines side by
    side) share one display, which shows while any of them runs; meanwhile the log lines (sys.stderr) are
    printed above it."""

    _lock = threading.Lock()
    _shown: Any = None  # the display, while a bar shows
    _bars = 0

    def __init__(self, what: str, stream: TextIO):
        with _Bar._lock:
            if _Bar._shown is None:
                _Bar._shown = _display(stream)
                _Bar._shown.start()
            _Bar._bars += 1
            self._display = _Bar._shown
            self._task = self._display.add_task(what, total=None, counts="")

    def update(self, done: int, total: int | None, counts: str) -> None:
        self._display.update(self._task, completed=done, total=total or None, counts=counts, refresh=True)

    def close(self) -> None:
        with _Bar._lock:
            _Bar._bars -= 1
            if _Bar._bars == 0:  # the last one stays on the terminal as last drawn
                _Bar._shown = None
                self._display.stop()
            else:
                self._display.remove_task(self._task)


def _display(stream: TextIO) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeRemainingColumn(),
        console=Console(file=stream),
        redirect_stdout=False,
        redirect_stderr=True,
    )
