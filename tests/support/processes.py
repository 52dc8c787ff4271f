"""The processes a test started, found from /proc (Linux), and a kill -9 that leaves none of them behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import NamedTuple


class Child(NamedTuple):
    pid: int
    group: int  # process group
    command: str  # /proc/<pid>/comm: `java` for a Spark JVM


def descendants(pid: int) -> list[Child]:
    """Every process below `pid`, at any depth."""
    children: dict[int, list[Child]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        command = text[text.index("(") + 1 : text.rindex(")")]
        children.setdefault(int(fields[1]), []).append(Child(int(stat.parent.name), int(fields[2]), command))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child.pid)
    return out


def descendant(pid: int, command: str) -> int | None:
    """The first process below `pid` running `command` (None: none)."""
    return next((c.pid for c in descendants(pid) if c.command == command), None)


def kill_9(pid: int) -> None:
    """kill -9 of `pid`, then of every process it had started, as systemd's KillMode=mixed ends what is left
    of a service once its main process is gone. A cdc2ch process's Spark JVM outlives its killed driver: it
    goes on for a while (finishing tasks, writing a class archive as it exits), taking CPU from the tests
    after it. The driver dies first, so what the test shows is still a kill -9 of cdc2ch."""
    left = descendants(pid)
    os.kill(pid, signal.SIGKILL)
    for child in left:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
