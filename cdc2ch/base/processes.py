"""Whether a process of this host, known by its pid, has ended."""

from __future__ import annotations

import os


def process_gone(pid: int) -> bool:
    """True when no process has this pid (one owned by another user is there: not gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
