"""An unreachable ClickHouse server in cdc2ch's words: one line per retry, no lines of the HTTP library, and a
final paragraph naming the URL without query ids, with the number of attempts made. Real clickhouse-connect
against a port where nothing listens."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc2ch.base.errors import SinkError
from cdc2ch.clickhouse.connection.dsn import connect

ROOT = Path(__file__).resolve().parents[3]
INTERNALS = ("urllib3", "Retrying", "query_id", "library_log", "Max retries", "HTTPConnectionPool")


@pytest.fixture
def refused() -> Iterator[str]:
    """The URL of a port bound but not listening: every connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/"


def _cdc2ch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cdc2ch", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_a_refused_connection_is_said_as_such(refused):
    import clickhouse_connect

    from cdc2ch.clickhouse.faults import cause

    with pytest.raises(Exception) as err:
        clickhouse_connect.get_client(dsn=refused, autogenerate_session_id=False)
    assert cause(err.value) == "connection refused (nothing listens at that address and port)"
    assert "query_id" in str(err.value)  # what clickhouse-connect itself says


def test_an_unreachable_server_is_one_line_per_retry_and_one_paragraph(refused, tmp_path):
    run = _cdc2ch("run", "--once", "--retries", "2", "--table", str(tmp_path), "--primary-key", "id",
                  "--clickhouse", refused)  # fmt: skip
    # Before: a raw urllib3 line per attempt and "… Max retries exceeded with url: /?query_id=… (tried 2 times)".
    assert run.returncode == 1 and not [word for word in INTERNALS if word in run.stderr], run.stderr
    lines = run.stderr.splitlines()
    retries = [line for line in lines if "clickhouse_retry" in line]
    assert len(retries) == 1 and "attempt=1" in retries[0] and "connection refused" in retries[0], lines
    assert len(lines) == 2 and lines[1] == (
        f"cdc2ch: error: Cannot connect to ClickHouse at {refused} (2 attempts): connection refused (nothing "
        f"listens at that address and port). Check host, port and network, and that the server is running; "
        f"nothing was written."
    )
    with pytest.raises(SinkError) as one:  # `query`, `validate`: one attempt
        connect(refused, retries=1)
    assert f"Cannot connect to ClickHouse at {refused} (1 attempt): connection refused" in str(one.value)
