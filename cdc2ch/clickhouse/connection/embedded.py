"""The embedded target: ClickHouse's engine in this process (chdb), persisted in a directory."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError

from cdc2ch.base.errors import LockedError, SinkError, summarise
from cdc2ch.base.processes import command_name
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection import remote
from cdc2ch.clickhouse.connection.fileroot import from_root
from cdc2ch.clickhouse.connection.transport import Sink, TargetTraits
from cdc2ch.model.config import default_data_dir

HOLDER_FILE = "cdc2ch-holder.json"  # who has the directory open, written by cdc2ch
STATUS_FILE = "status"  # the engine's own lock file in the directory
METADATA_DIR = "metadata"  # the engine's catalogue, once a database was created
# The engine compiles an expression to machine code (LLVM) once it has run it three times in the process.
# Statements on a few rows (lookups, claims) gain nothing from it, and a cron poll, which runs its claim
# check four times and exits, paid ~16 MiB of peak RSS and ~60 ms for it: those statements run interpreted.
NO_JIT = {"compile_expressions": 0, "compile_aggregate_expressions": 0, "compile_sort_description": 0}


def data_path(dsn: str) -> Path:
    raw = dsn[len("chdb:") :]
    if raw.startswith("//"):
        raw = raw[2:]
    if not raw:
        raise SinkError("The embedded DSN has no path: use chdb:///absolute/path/to/data.")
    return Path(raw).expanduser().resolve()


def connect(dsn: str, retries: int, create: bool = True, via_service: bool = False) -> Sink:
    """Open the engine on the DSN's directory. With `create` False (commands that work on an existing
    database: status, query, compact) a directory holding none is an error, never a new database.
    `via_service`: for readers (status, query); when another process holds the directory and serves it
    (`cdc2ch run --serve`), connect to that service instead."""
    path = data_path(dsn)
    if not create and not _may_hold_database(path):
        raise SinkError(
            f"There is no embedded ClickHouse database at {path}"
            f"{' (the directory does not exist)' if not path.exists() else ''}: nothing was replicated there. "
            f"Check --clickhouse (or CDC2CH_CLICKHOUSE_URL): it must name the directory `cdc2ch run` "
            f"writes to, e.g. chdb://{default_data_dir() / 'clickhouse'} (the default)."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SinkError(f"Cannot create the embedded ClickHouse directory {path}: {exc.strerror}.") from exc
    try:
        with _engine_output_captured() as engine_said:
            client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    except ClickHouseError as exc:
        if _held_by_another_process(path):
            service = _service(path)
            if service and via_service:
                return remote.connect(service["url"], retries, served=True, ca_cert=service.get("tls_cert"))
            served = (
                f" It serves the database at {service['url']}: readers can use --clickhouse {service['url']}."
                if service
                else " (A `cdc2ch run` started with --serve HOST:PORT lets status, query and others read meanwhile.)"
            )
            raise LockedError(
                f"The embedded ClickHouse database at {path} is in use by {_holder(path)} (only one process "
                f"can open it at a time). Wait for it to finish or stop it, or point this one at another "
                f"directory with --clickhouse chdb:///other/path. For several pipelines on one embedded "
                f"database, run them from one process, or use a ClickHouse server.{served}"
            ) from exc
        if _open_elsewhere_in_this_process(exc):
            raise SinkError(
                f"This process already has an embedded ClickHouse open at another path; cannot also open {path}."
            ) from exc
        said = summarise(" ".join(engine_said), 400).rstrip(".")
        raise SinkError(
            f"Cannot open the embedded ClickHouse at {path}: {summarise(str(exc), 400).rstrip('.')}"
            f"{f' (the engine said: {said})' if said else ''}. Check that the directory is writable and "
            f"holds a ClickHouse database (or nothing yet).",
            code=codes.error_code(exc),
        ) from exc
    _write_holder(path)
    # More clients of the same engine open at once (calls of pipelines that run side by side overlap).
    opener = lambda: clickhouse_connect.get_client(dsn=f"chdb://{path}")  # noqa: E731
    return Sink(
        client,
        f"chdb://{path}",
        retries,
        opener=opener,
        traits=TargetTraits(reads_files=from_root, small_settings=NO_JIT, one_process=True),
    )


# Why the engine refused to start cannot be told by an error code: clickhouse-connect raises a
# ProgrammingError with `code` None (from chdb's RuntimeError), whose text carries the generic code 36,
# BAD_ARGUMENTS, for both cases below (chdb-core 26.9). The engine's own reason for a locked directory
# ("Cannot lock file <path>/status", code 76) goes to stderr only.


def _may_hold_database(path: Path) -> bool:
    """Whether the directory exists and is the engine's (its catalogue, its lock file or cdc2ch's holder
    note is there) or still empty; not a missing directory, nor one full of something else."""
    if not path.is_dir():
        return False
    if (path / METADATA_DIR).is_dir() or (path / STATUS_FILE).exists() or (path / HOLDER_FILE).exists():
        return True
    return next(path.iterdir(), None) is None


@contextmanager
def _engine_output_captured():
    """While the engine starts, what it writes to the process's stderr (file descriptor 2) goes to a
    scratch file instead: on a locked directory it prints its own `Code: 76. DB::Exception: Cannot lock
    file .../status` above cdc2ch's message. Yields a list that receives those lines afterwards."""
    said: list[str] = []
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to keep quiet
        yield said
        return
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            scratch.seek(0)
            said.extend(
                line for line in scratch.read().decode("utf-8", errors="replace").splitlines() if line.strip()
            )


def _held_by_another_process(path: Path) -> bool:
    """Whether another process runs the engine on `path`: ClickHouse holds an exclusive flock on
    <path>/status while it runs (the kernel drops it when the process dies), so a shared probe fails."""
    try:
        fd = os.open(path / STATUS_FILE, os.O_RDONLY)
    except OSError:
        return False  # no engine ever ran there, or it stopped cleanly (it removes the file)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _open_elsewhere_in_this_process(exc: ClickHouseError) -> bool:
    """chdb runs one engine per process, on one path; asked for another it refuses with this text and no
    code of its own (see above). The only place cdc2ch reads ClickHouse's message instead of a code."""
    return "already initialized with path" in str(exc)


def _write_holder(path: Path) -> None:
    """Name this process in the data directory, so a second process refused by the engine's lock can say
    who holds it. Stale after a crash, which is harmless: the lock itself is released by the kernel."""
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


def announce_service(path: Path, url: str, tls_cert: str | None) -> None:
    """Record in the holder file that this process serves the directory at `url` (user in it, never the
    password), for readers refused by the engine's lock."""
    _update_holder(
        path, serve={"url": url, **({"tls_cert": str(Path(tls_cert).resolve())} if tls_cert else {})}
    )


def withdraw_service(path: Path) -> None:
    _update_holder(path, serve=None)


def _update_holder(path: Path, **changes) -> None:
    try:
        info = json.loads((path / HOLDER_FILE).read_text())
        if info.get("pid") != os.getpid():
            return  # not ours (any more)
        info = {k: v for k, v in {**info, **changes}.items() if v is not None}
        tmp = path / f".{HOLDER_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(info))
        tmp.replace(path / HOLDER_FILE)
    except (OSError, ValueError):
        pass


def _service(path: Path) -> dict | None:
    """The service the holder of the directory announced, if any."""
    try:
        serve = json.loads((path / HOLDER_FILE).read_text()).get("serve")
        return serve if isinstance(serve, dict) and serve.get("url") else None
    except (OSError, ValueError, AttributeError):
        return None


def _holder(path: Path) -> str:
    try:
        info = json.loads((path / HOLDER_FILE).read_text())
        return f"{info['command']} (pid {info['pid']} on host {info['host']}, since {info['since']})"
    except (OSError, ValueError, KeyError):
        return "another process"
