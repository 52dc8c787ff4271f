"""structlog set-up: readable lines on a terminal, JSON lines for machines (--log-format json).

Output of other programs running for cdc2ch (the Spark JVM and its Python workers) goes through `relay`, so
that with --log-format json every line on stderr is JSON."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone

import structlog

_format = "console"
_level = logging.INFO
# log4j's lines as cdc2ch/source/log4j2.properties lays them out: `26/11/23 06:40:00 ERROR Executor: ...`
_LOG4J = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (FATAL|ERROR|WARN|INFO|DEBUG|TRACE) ([^:\s]+): (.*)$")
_LEVELS = {
    "FATAL": "error",
    "ERROR": "error",
    "WARN": "warning",
    "INFO": "info",
    "DEBUG": "debug",
    "TRACE": "debug",
}
# Printed by every JVM start (Spark adds --add-modules=jdk.incubator.vector), with no option to silence it.
NOISE = ("WARNING: Using incubator modules:",)


def configure(fmt: str = "console", level: str = "info") -> None:
    global _format, _level
    _format, _level = fmt, getattr(logging, level.upper(), logging.INFO)
    stream = sys.stderr
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


def relay(source: str, line: str, previous: str | None = None) -> str | None:
    """Show one line another program wrote: as it is on the console, as a JSON event (`<source>_output`,
    with the level and logger read from log4j's layout) with --log-format json. Known start-up noise is
    shown only at --log-level debug. `previous` is the level of the line before: lines of a stack trace
    keep it. Returns this line's level."""
    if not line.strip():
        return previous
    noise = line.startswith(NOISE)
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
