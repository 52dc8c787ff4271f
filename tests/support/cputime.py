"""Each test's CPU time, its own process and every process it started (Spark JVMs, cdc2ch commands)
included: `CDC2CH_TEST_CPU=FILE pytest ...` appends one `seconds<TAB>test id` line per test to FILE. On two
cores the suite is bound by CPU, so this, not the wall time each test takes under contention, says where its
minutes go (`sort -rn FILE | head`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of its children it has waited for)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / TICKS


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by `root` and its descendants, living or waited for."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) is not None}
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo.extend(children.get(pid, []))
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = tree_cpu(os.getpid())
    yield
    used = tree_cpu(os.getpid()) - before
    with open(os.environ["CDC2CH_TEST_CPU"], "a") as out:
        out.write(f"{used:.1f}\t{item.nodeid}\n")
