"""structlog set-up: readable lines on a terminal, JSON lines for machines (--log-format json).

Output of other programs running for cdc2ch (the Spark JVM and its Python workers) goes through `relay`, so
that with --log-format json every line on stderr is JSON.

Modules log through `get_logger`: structlog as configured (the CLI's `configure`), or while a call of the
Python API runs (`api_call`), records of the stdlib `logging` loggers `cdc2ch.*`, so that the caller's
handlers, levels and format apply and cdc2ch configures and prints nothing itself."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import IO, Any

import structlog

from cdc2ch.base.errors import one_line, py4j_source

_format = "console"
_level = logging.INFO
# log4j's lines as cdc2ch/source/spark/log4j2.properties lays them out: `26/11/23 06:40:00 ERROR Executor: ...`
_LOG4J = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (FATAL|ERROR|WARN|INFO|DEBUG|TRACE) ([^:\s]+): (.*)$")
_LEVELS = {
    "FATAL": "error",
    "ERROR": "error",
    "WARN": "warning",
    "INFO": "info",
    "DEBUG": "debug",
    "TRACE": "debug",
}
# Printed by every JVM start (Spark adds --add-modules=jdk.incubator.vector), with no option to silence it,
# and by the JVM when it saves its class archive (source/spark/classarchive.py).
NOISE = ("WARNING: Using incubator modules:", "Dynamic dump to file")


_configured = False  # configure() ran: the format of lines is known
_deferred: list[Callable[[], object]] = []  # log calls made before that, to make once it is
_deferred_lock = threading.Lock()


def when_configured(call: Callable[[], object]) -> None:
    """Make the log call `call()` now if logging is set up, else as soon as configure() runs: a line logged
    before the command's format is known is not printed in another one."""
    with _deferred_lock:
        if not _configured:
            _deferred.append(call)
            return
    call()


class _Stderr:
    """sys.stderr as it is at each write: while a progress bar shows (replication/fullload/progress.py), rich
    stands in for it, and the log lines are printed above the bar instead of through it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()

    @property
    def closed(self) -> bool:
        return bool(getattr(sys.stderr, "closed", False))


def configure(fmt: str = "console", level: str = "info") -> None:
    global _format, _level, _configured
    _format, _level = fmt, getattr(logging, level.upper(), logging.INFO)
    stream: Any = _Stderr()
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Libraries)]:
        root.removeHandler(handler)
    root.addHandler(_Libraries(stream))
    with _deferred_lock:
        _configured, pending = True, _deferred[:]
        _deferred.clear()
    for call in pending:
        call()


# Loggers of the libraries that carry cdc2ch's ClickHouse calls. Their records are internals (urllib3's
# "Retrying (Retry(total=0, …))" with a query id, per connection attempt): cdc2ch says what failed itself, one
# `clickhouse_retry` line per retry and a final paragraph, so these are shown at --log-level debug only.
TRANSPORT_LOGGERS = ("urllib3", "clickhouse_connect")


def _level_of(record: logging.LogRecord) -> str:
    if py4j_source(record.pathname) or record.name.split(".")[0] in TRANSPORT_LOGGERS:
        return "debug"
    for level, name in ((logging.ERROR, "error"), (logging.WARNING, "warning"), (logging.INFO, "info")):
        if record.levelno >= level:
            return name
    return "debug"


class _Libraries(logging.Handler):
    """Records the libraries cdc2ch uses send to the stdlib logging (warnings and errors), shown as cdc2ch's
    log lines: JSON with --log-format json, an exception as one line, never a traceback. py4j logs a
    connection to the JVM it lost with a traceback, urllib3 each connection it retries; cdc2ch says what
    these mean itself, so their records are shown at --log-level debug only."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream  # structlog's, as configured with this handler

    def emit(self, record: logging.LogRecord) -> None:
        if in_api_call() or record.name == "cdc2ch" or record.name.startswith("cdc2ch."):
            return  # the caller's logging handles these
        if getattr(self.stream, "closed", False):
            return  # the stream of an in-process run that has ended (click.testing)
        try:
            fields = {"logger": record.name, "message": record.getMessage()}
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                fields["error"] = one_line(f"{type(exc).__name__}: {exc}")
            getattr(structlog.get_logger("cdc2ch.libraries"), _level_of(record))("library_log", **fields)
        except Exception:
            self.handleError(record)


def relay(source: str, line: str, previous: str | None = None) -> str | None:
    """Show one line another program wrote: as it is on the console, as a JSON event (`<source>_output`,
    with the level and logger read from log4j's layout) with --log-format json. Known start-up noise is
    shown only at --log-level debug. `previous` is the level of the line before: lines of a stack trace
    keep it. Returns this line's level."""
    if not line.strip():
        return previous
    noise = line.lstrip().startswith(NOISE)
    m = _LOG4J.match(line)
    if noise:
        level = "debug"
    elif m:
        level = _LEVELS[m.group(1)]
    elif previous and (line[:1].isspace() or line.startswith(("Caused by", "..."))):
        level = previous
    else:
        level = "warning"
    if _format != "json":
        if not noise or _level <= logging.DEBUG:
            print(line, file=sys.stderr, flush=True)
        return level
    fields = {"logger": m.group(2), "message": m.group(3)} if m else {"message": line}
    getattr(structlog.get_logger(f"cdc2ch.{source}"), level)(f"{source}_output", **fields)
    return level


def final(message: str, exit_code: int, kind: str = "error") -> str:
    """cdc2ch's last line before it exits non-zero: `cdc2ch: error: …` on the console, an `error` event with
    the whole message (and the exit code) with --log-format json, so that every line stays parseable."""
    if _format != "json":
        return f"cdc2ch: {kind}: {message}"
    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    event = {"event": kind, "message": message, "exit_code": exit_code, "level": "error", "timestamp": now}
    return json.dumps(event, ensure_ascii=False)


def summary(message: str, **fields: Any) -> str:
    """The line a command that wrote ends with, on stdout at any log level: `message` on the console, a
    `summary` event with `fields` (and the message) with --log-format json, so that every line stays
    parseable."""
    if _format != "json":
        return message
    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    event = {"event": "summary", "message": message, **fields, "level": "info", "timestamp": now}
    return json.dumps(event, ensure_ascii=False)


def json_lines() -> bool:
    """Whether the command logs JSON lines (--log-format json): nothing is drawn on the terminal then."""
    return _format == "json"


# -- the Python API: the caller's logging ---------------------------------------------------------------
_api_calls = 0
_api_lock = threading.Lock()


@contextmanager
def api_call() -> Iterator[None]:
    """While this runs (API calls may overlap on several threads), cdc2ch's events are stdlib records and
    cdc2ch draws nothing on the terminal. Nothing global is configured: structlog's set-up stays as it was."""
    global _api_calls
    with _api_lock:
        _api_calls += 1
    try:
        yield
    finally:
        with _api_lock:
            _api_calls -= 1


def in_api_call() -> bool:
    """Whether a Python API call is running: the process and its terminal are the caller's."""
    return _api_calls > 0


def _stdlib_record(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """The stdlib call for one event: a message `event key=value ...`, the event's name and fields as the
    record's `event` and `fields` attributes (for structured handlers), and its exception if any."""
    event = str(event_dict.pop("event", ""))
    exc_info = event_dict.pop("exc_info", None)
    words = [event] + [f"{k}={_text(v)}" for k, v in event_dict.items()]
    return {"msg": " ".join(words), "exc_info": exc_info, "extra": {"event": event, "fields": event_dict}}


def _text(value: object) -> str:
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() or c in '"=' for c in text) else text


class Logger:
    """A cdc2ch logger that picks its route at each call: structlog as configured, or the stdlib logger of
    the same name during an API call. `bind` keeps the context for either route."""

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name, self._context = name, context or {}

    def bind(self, **values: Any) -> "Logger":
        return Logger(self._name, {**self._context, **values})

    def _route(self) -> Any:
        if in_api_call():
            logger = structlog.wrap_logger(
                logging.getLogger(self._name),
                processors=[structlog.stdlib.filter_by_level, _stdlib_record],
                wrapper_class=structlog.stdlib.BoundLogger,
            )
        else:
            logger = structlog.get_logger(self._name)
        return logger.bind(**self._context)

    def __getattr__(self, method: str) -> Any:  # info, warning, error, exception, debug
        return getattr(self._route(), method)


def get_logger(name: str) -> Logger:
    return Logger(name)
