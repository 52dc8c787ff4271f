"""Errors a user can cause or meet. Each carries one paragraph: what happened and what to do."""

import re


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

    def __reduce__(self):  # keeps the code across pickling (Spark, multiprocessing)
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
    memory): a call under way then fails on its connection, and an error it returned can no longer be read.
    Either way the failure still gets its paragraph."""
    try:
        from py4j.protocol import Py4JNetworkError
    except ImportError:  # no Spark in this process: no JVM to lose
        Py4JNetworkError = ()
    if isinstance(exc, Py4JNetworkError):
        return JVM_STOPPED
    try:
        return str(exc)
    except Exception:
        return JVM_STOPPED


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
