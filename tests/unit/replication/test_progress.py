"""Progress of long loads: rich's bar on a terminal only; log lines elsewhere (a pipe, JSON logs)."""

from __future__ import annotations

import io

import pytest

from cdc2ch.base import log
from cdc2ch.replication.fullload.progress import Progress

pytestmark = pytest.mark.unit


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def console_logs():
    log.configure("console", "info")
    yield
    log.configure("console", "info")


def test_a_bar_on_a_terminal(console_logs):
    out = Terminal()
    with Progress("snapshot v3", 1000, 4, stream=out) as bar:
        bar.advance(250, 1)
        drawn = out.getvalue()
        assert "snapshot v3" in drawn and "25%" in drawn and "250/1,000 rows, chunk 1/4" in drawn, drawn
        assert "rows/s" in drawn
    bar.advance(0, 0)  # after the block: counts only, no display left running


@pytest.mark.parametrize("where", ["pipe", "json"])
def test_no_bar_on_a_pipe_or_with_json_logs(where, console_logs):
    out = Terminal() if where == "json" else io.StringIO()
    if where == "json":
        log.configure("json", "info")
    with Progress("snapshot v3", 1000, 4, stream=out) as bar:
        bar.advance(250, 1)
        bar.done()
    assert not bar.bar and out.getvalue() == ""
