"""The embedded target: ClickHouse's engine in this process (chdb), persisted in a directory."""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError

from cdc2ch.errors import SinkError


def data_path(dsn: str) -> Path:
    raw = dsn[len("chdb:") :]
    if raw.startswith("//"):
        raw = raw[2:]
    if not raw:
        raise SinkError("The embedded DSN has no path: use chdb:///absolute/path/to/data.")
    return Path(raw).expanduser().resolve()


def connect(dsn: str, retries: int) -> "Sink":  # noqa: F821 - imported lazily to keep the import graph one-way
    from cdc2ch.sink import Sink

    path = data_path(dsn)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SinkError(f"Cannot create the embedded ClickHouse directory {path}: {exc.strerror}.") from exc
    try:
        client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    except ClickHouseError as exc:
        text = str(exc)
        if "Cannot lock file" in text or "Error initializing EmbeddedServer" in text:
            raise SinkError(
                f"The embedded ClickHouse database at {path} is in use by {_holder(path)} (only one process "
                f"can open it at a time). Wait for it to finish or stop it, or point this one at another "
                f"directory with --clickhouse chdb:///other/path. For several pipelines on one embedded "
                f"database, run them from one process, or use a ClickHouse server."
            ) from exc
        if "already initialized with path" in text:
            raise SinkError(
                f"This process already has an embedded ClickHouse open at another path; cannot also open {path}."
            ) from exc
        raise SinkError(f"Cannot open the embedded ClickHouse at {path}: {text}") from exc
    _write_holder(path)
    return Sink(client, f"chdb://{path}", retries, reads_files=_from_root)


HOLDER_FILE = "cdc2ch-holder.json"


def _write_holder(path: Path) -> None:
    """Name this process in the data directory, so a second process refused by the engine's lock can say
    who holds it. Stale after a crash, which is harmless: the lock itself is released by the kernel."""
    from cdc2ch.lock import command_name

    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command_name(),
        "since": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    try:
        (path / HOLDER_FILE).write_text(json.dumps(info))
    except OSError:
        pass


def _holder(path: Path) -> str:
    try:
        info = json.loads((path / HOLDER_FILE).read_text())
        return f"{info['command']} (pid {info['pid']} on host {info['host']}, since {info['since']})"
    except (OSError, ValueError, KeyError):
        return "another process"


@contextmanager
def _from_root():
    """The embedded engine lets table functions read files only below the process's working directory;
    lake files can be anywhere, so statements that read them run from /."""
    previous = os.getcwd()
    os.chdir("/")
    try:
        yield
    finally:
        os.chdir(previous)
