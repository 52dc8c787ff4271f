"""Processes of this host: what this one is doing (for the record another reads), whether one has ended,
and ending one with everything it started."""

from __future__ import annotations

import getpass
import os
import signal
import socket
import sys
from pathlib import Path

from cdc2ch.base.log import in_api_call


def process_gone(pid: int) -> bool:
    """True when no process has this pid (one owned by another user is there: not gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def command_name() -> str:
    """`cdc2ch run`, `cdc2ch snapshot`...: what the holder is doing, without any argument values."""
    if in_api_call():  # the process's arguments are the caller's
        return "cdc2ch Python API"
    args = [a for a in sys.argv[1:2] if not a.startswith("-")]
    return " ".join(["cdc2ch", *args])


def requester() -> str:
    """user@host of this process, as a request records who made it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _children() -> dict[int, list[int]]:
    """Each process's children, from /proc (empty where there is no /proc)."""
    out: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        parent = int(text[text.rindex(")") + 2 :].split()[1])
        out.setdefault(parent, []).append(int(stat.parent.name))
    return out


def kill_tree(pid: int) -> None:
    """End `pid` and every process below it at once (SIGKILL). Each is stopped first, parents before their
    children, until no new one appears: a stopped process forks no more, and its children stay its own (a
    parent killed first would leave them to init, out of reach)."""
    held: list[int] = []
    while True:
        children = _children()
        tree, todo = [], [pid]
        while todo:
            p = todo.pop()
            tree.append(p)
            todo.extend(children.get(p, []))
        new = [p for p in tree if p not in held]
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            held.append(p)
        if not held:
            break
    for p in held or [pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
