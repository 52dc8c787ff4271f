"""One commit of a Delta table as replication needs it: its version, time, operation, an upper bound of the
change rows it yields, and its file actions where the log names them. Every source makes these (the Delta log
read directly or through the JVM, a Delta Sharing answer) and the loop plans its ranges from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Files:
    """A commit's file actions, as far as the table's size and the files its change feed reads need them
    (replication/startup/replay.py). Paths as the log writes them: relative to the table, URI-encoded."""

    added: tuple[tuple[str, int | None, bool], ...] = ()  # (path, live rows or None, dataChange)
    removed: tuple[tuple[str, bool], ...] = ()  # (path, dataChange)
    change_files: tuple[str, ...] = ()  # its change files (_change_data/...), if it wrote any


@dataclass(frozen=True)
class Commit:
    """One commit as its log file records it."""

    version: int
    timestamp: datetime
    operation: str
    estimated_rows: int  # change rows it yields, from file statistics and metrics (an upper bound)
    parameters: dict[str, Any] = field(default_factory=dict, compare=False)
    metadata: bool = False  # carries a metaData action: a new schema or new table properties
    properties: dict[str, Any] | None = None  # the table properties of that metaData action
    files: Files | None = field(default=None, compare=False)  # None: not known (a share's answer)
    protocol: bool = False  # carries a protocol action: new table features
