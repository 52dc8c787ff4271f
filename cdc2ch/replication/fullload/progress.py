"""Progress of long loads: a one-line bar on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from cdc2ch.base.log import get_logger, in_api_call

log = get_logger("cdc2ch.progress")


class Progress:
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
        # Under the Python API the terminal is the caller's: log lines only.
        self._tty = self._stream.isatty() and not in_api_call()

    def advance(self, rows: int, chunks: int = 0) -> None:
        self.rows += rows
        self.chunks += chunks
        now = time.monotonic()
        if not self.shown:
            return
        if self._tty:
            self._stream.write("\r" + self.line() + " " * 4)
            self._stream.flush()
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
        f = self.figures()
        frac = (self.rows / self.total_rows) if self.total_rows else (self.chunks / max(self.total_chunks, 1))
        frac = min(max(frac, 0.0), 1.0)
        bar = "#" * int(frac * 30)
        eta = f"ETA {f['eta_s']:.0f}s" if f["eta_s"] is not None else "ETA ?"
        total = f"/{self.total_rows:,}" if self.total_rows else ""
        files = f" ({self.files} files)" if self.files is not None else ""
        return (
            f"{self.what} [{bar:<30}] {frac:6.1%} {self.rows:,}{total} rows, {self.unit} {self.chunks}/"
            f"{self.total_chunks}{files}, {f['rows_per_s']:,} rows/s, {eta}"
        )

    def done(self) -> None:
        if not self.shown:
            return
        if self._tty:
            self._stream.write("\r" + self.line() + "\n")
            self._stream.flush()
        log.info("progress_done", what=self.what, **self.figures())
