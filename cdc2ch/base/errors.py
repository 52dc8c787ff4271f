"""Errors a user can cause or meet. Each carries one paragraph: what happened and what to do."""

import os
import re
from collections.abc import Iterator


class Cdc2chError(Exception):
    """A failure with a message fit for the user; the CLI prints it and exits non-zero."""

    exit_code = 1


class ConfigError(Cdc2chError):
    """Bad flags or arguments."""

    exit_code = 2


class SourceError(Cdc2chError):
    """The Delta table cannot be read as asked."""


class SinkError(Cdc2chError):
    """ClickHouse refused or could not be reached.

    `code` is ClickHouse's error code when it gave one (see cdc2ch.clickhouse.codes), else None: test
    `exc.code == codes.X` rather than the message text.
    """

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type["SinkError"], tuple[str, int | None]]:
        # keeps the code across pickling (Spark, multiprocessing)
        return (type(self), (str(self), self.code))


class StateError(Cdc2chError):
    """The stored offset disagrees with what was asked."""


class SchemaChangeError(SourceError):
    """The Delta schema changed in a way the ClickHouse table cannot follow in place."""


ELLIPSIS = "…"


# What error_text says of an error that cannot be read: its JVM is gone.
JVM_STOPPED = "Spark's JVM stopped; most often it ran out of memory, as its last log lines say"


def error_text(exc: BaseException) -> str:
    """An exception's text, or JVM_STOPPED when the JVM is gone (a local JVM exits when it runs out of
    memory): a call under way then fails on its connection, the next call cannot connect (even the one
    PySpark makes to describe the error), an error it returned can no longer be read, or the job was
    cancelled by the JVM's shutdown hook. Either way the failure still gets its paragraph."""
    try:
        from py4j.protocol import Py4JError, Py4JNetworkError
    except ImportError:  # no Spark in this process: no JVM to lose
        Py4JError = Py4JNetworkError = ()
    if (
        isinstance(exc, Py4JNetworkError)
        or (type(exc) is Py4JError and (_lost_mid_call(exc) or _own_name_missing(exc)))
        or (isinstance(exc, ConnectionRefusedError) and _raised_by_py4j(exc))
    ):
        return JVM_STOPPED
    try:
        text = str(exc)
    except Exception:
        return JVM_STOPPED
    return JVM_STOPPED if _context_shut_down(text) else text


def jvm_stopped(exc: BaseException) -> "SourceError | None":
    """For an error that only says Spark's JVM is gone (a call cdc2ch does not translate, such as starting
    the session or a cleanup), the paragraph to give instead of a traceback; None for any other error."""
    if isinstance(exc, Cdc2chError) or error_text(exc) != JVM_STOPPED:
        return None
    return jvm_stopped_error()


def jvm_stopped_error() -> "SourceError":
    """The paragraph for Spark's JVM gone, whichever call met it."""
    return SourceError(
        "Spark's JVM stopped while cdc2ch was using it. Most often it ran out of memory; its last log lines "
        "above say why. Give Spark more memory (--spark-conf spark.driver.memory=4g) or read less at a time "
        "(a lower --max-rows-per-read). cdc2ch records progress only after the data landed: the same command "
        "resumes where this one stopped."
    )


def jvm_gone(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, says Spark's JVM is gone. That loses Spark for every
    pipeline of the process, for good: a failure of the process, not of the one pipeline that met it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not isinstance(current, Cdc2chError) and error_text(current) == JVM_STOPPED:
            return True
        current = current.__cause__ or current.__context__
    return False


def _lost_mid_call(exc: BaseException) -> bool:
    """Whether a Py4JError is py4j's bare "An error occurred while calling X": the answer it makes up when the
    connection broke while the JVM worked on the call (reset by a JVM that exited). An error the JVM sent
    back carries its trace, or is a Py4JJavaError."""
    text = str(exc)
    return text.startswith("An error occurred while calling ") and "Trace:" not in text


def _own_name_missing(exc: BaseException) -> bool:
    """Whether a Py4JError says a name in py4j's own namespace "does not exist in the JVM". A working gateway
    always has them; a JVM failing on OutOfMemoryError answers so for whichever name PySpark looks up while
    it describes the job's error (`py4j`, `py4j.reflection`, `py4j.reflection.TypeUtil`, ...), before it
    exits."""
    name, _, rest = str(exc).partition(" ")
    return (name == "py4j" or name.startswith("py4j.")) and rest == "does not exist in the JVM"


# Spark's own words for a job its context's shutdown cancelled (DAGScheduler.cleanUpAfterSchedulerStop)
_CANCELLED_AT_SHUTDOWN = re.compile(
    r"\bSparkException: Job \d+ cancelled because SparkContext was shut down\b"
)


def _context_shut_down(text: str) -> bool:
    """Whether a call failed because its job was cancelled when the SparkContext was shut down. cdc2ch never
    stops the context while it reads, so this is the JVM's shutdown hook at work: a JVM exiting, on
    OutOfMemoryError for one, may cancel the job before the job's own failure reaches it."""
    return _CANCELLED_AT_SHUTDOWN.search(text) is not None


def _raised_by_py4j(exc: BaseException) -> bool:
    """Whether `exc` was raised inside py4j: refused there, it is the JVM's gateway that is gone."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and py4j_source(tb.tb_frame.f_code.co_filename)


def py4j_source(path: str) -> bool:
    """Whether the source file at `path` is py4j's (the Python side of Spark's JVM gateway)."""
    return f"{os.sep}py4j{os.sep}" in path


CHANGE_FEED = "the change data feed"  # what a range read reads, in messages


def out_of_memory(text: str) -> bool:
    """Whether an error's text (error_text) says Spark ran out of memory: its heap, its direct memory
    (Arrow's buffers, `OutOfMemoryException`), or its JVM exited, as a local one does on OutOfMemoryError."""
    return text == JVM_STOPPED or "OutOfMemoryError" in text or "OutOfMemoryException" in text


def range_out_of_memory(what: str, text: str, uri: str, span: str) -> SourceError | None:
    """For a change-feed read whose error `text` says Spark ran out of memory, what to change; else None."""
    if what != CHANGE_FEED or not out_of_memory(text):
        return None
    return SourceError(
        f"Spark ran out of memory reading the change data feed for {span} of {uri}. A read range is held "
        f"whole in memory, and one version is never split across ranges. Read smaller ranges with a lower "
        f"--max-rows-per-read, give Spark more memory (--spark-conf spark.driver.memory=4g), or, where "
        f"ClickHouse can reach the table's files, use --reader clickhouse. Nothing after the last committed "
        f"version was recorded: the same command resumes there."
    )


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) as one space."""
    return " ".join(str(text).split())


def summarise(text: str, limit: int) -> str:
    """`text` on one line, whole when it fits in `limit` characters; otherwise deliberately shortened, never
    cut inside a word: its first sentence when that fits, else the words that fit followed by an ellipsis.
    Callers keep the whole text where the user can still read it (`cdc2ch status --json`, the log)."""
    text = one_line(text)
    if len(text) <= limit:
        return text
    end = _first_sentence_end(text)
    if 0 < end <= limit:
        return text[:end]
    room = max(limit - len(ELLIPSIS), 1)
    cut = text.rfind(" ", 0, room + 1)
    words = text[:cut] if cut > 0 else text[:room]
    return words.rstrip(" ,;:.-(") + ELLIPSIS


def _first_sentence_end(text: str) -> int:
    """The index just after the first sentence's full stop (a period followed by a space and a capital
    letter or a quote), or -1. ClickHouse's "Code: 62." opens its messages and ends no sentence."""
    i = text.find(". ")
    while i != -1:
        nxt = text[i + 2 : i + 3]
        if nxt and (nxt.isupper() or nxt in "`'\"") and not re.search(r"Code: \d+$", text[:i]):
            return i + 1
        i = text.find(". ", i + 1)
    return -1


class LockedError(Cdc2chError):
    """Another process holds the pipeline, or the embedded database's directory."""

    exit_code = 75  # EX_TEMPFAIL: try again later


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`, then what it was raised from or during (`__cause__`, else `__context__`), each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
