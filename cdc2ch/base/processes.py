"""Processes of this host: what this one is doing (for the record another reads), whether one has ended."""

from __future__ import annotations

import getpass
import os
import socket
import sys

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
