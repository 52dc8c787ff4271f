"""What a request to a read-only `run --serve` may run: one statement that reads, with settings that reach no
file, URL or schema.

ClickHouse's `readonly=1` refuses writes, DDL, SET and most table functions, but the engine's one user holds
every grant and the embedded engine acts as its own client, so some statements get past it: `INTO OUTFILE`
(written by the engine), `KILL QUERY` (the replicator's inserts), `SYSTEM STOP MERGES`, `DESCRIBE file(...)`
or `url(...)` (schema inference reads the file, or connects), several statements in one request, and URL
settings applied before readonly that name files (`format_template_row`, `format_schema`,
`output_format_schema`). These are refused here, before the engine sees them.

The scan below only needs to find statement boundaries and words outside literals: where it could read a
text differently from ClickHouse (heredocs `$$...$$`, `#` comments) it refuses rather than guesses.
"""

from __future__ import annotations

import re

# Statements a reader runs; EXPLAIN is judged by the statement it explains.
READING = frozenset({"SELECT", "WITH", "SHOW", "DESC", "DESCRIBE", "EXISTS"})
# Words of a URL setting's name that make it name a file, directory, URL or schema (templates and schemas
# are read from files): format_template_row, format_schema, output_format_schema, ..._file_path, ..._url.
_REACHES_OUT = frozenset({"schema", "template", "file", "files", "path", "url", "uri", "dir", "directory"})
_TOKEN = re.compile(
    r"""\s+|--[^\r\n]*|/\*.*?(\*/|\Z)              # space and comments (not nested: the first */ ends one)
    |'(?:[^'\\]|\\.|'')*(?:'|\Z)                    # a string literal
    |"(?:[^"\\]|\\.|"")*(?:"|\Z)|`(?:[^`\\]|\\.|``)*(?:`|\Z)   # a quoted identifier
    |(?P<word>[A-Za-z_][A-Za-z_0-9]*)|(?P<other>.)""",
    re.S | re.X,
)


class Refused(RuntimeError):
    """ClickHouse's READONLY refusal (code 164), for a statement or setting the engine would not refuse."""

    def __init__(self, what: str):
        super().__init__(
            f"Code: 164. DB::Exception: {what} is not allowed: this service is read-only (cdc2ch run --serve "
            f"without --serve-writable). (READONLY)"
        )


def check_settings(settings: dict) -> None:
    """Refuse a URL setting that names a file, URL or schema (the engine would read or write it)."""
    for name in settings:
        if _REACHES_OUT & set(name.lower().split("_")) or "profiler" in name.lower():
            raise Refused(f"Setting {name!r}")


def check_statement(sql: str | bytes) -> None:
    """Refuse all but one statement that reads (see the module docstring)."""
    text = sql.decode("latin-1") if isinstance(sql, bytes) else sql  # syntax is ASCII; UTF-8 never collides
    words: list[str] = []
    tokens: list[str] = []  # words (upper case) and punctuation, in order
    for m in _TOKEN.finditer(text):
        if m.group("word"):
            words.append(m.group("word").upper())
            tokens.append(words[-1])
        elif m.group("other"):
            ch = m.group("other")
            if ch in "$#":
                raise Refused(f"{ch!r} outside a string literal")
            tokens.append(ch)
    while tokens and tokens[-1] == ";":
        tokens.pop()
    if ";" in tokens:
        raise Refused("More than one statement in a request")
    _check_one(tokens)
    if any(a == "INTO" and b == "OUTFILE" for a, b in zip(words, words[1:])):
        raise Refused("INTO OUTFILE")


def _check_one(tokens: list[str]) -> None:
    first = tokens[0] if tokens else ""
    if first == "EXPLAIN":  # judged by what it explains: the first reading statement after its options
        start = next((i for i, t in enumerate(tokens) if t in READING or t == "("), None)
        if start is None:
            raise Refused("EXPLAIN of a statement other than a read")
        return _check_one(tokens[start:])
    if first not in READING and first != "(":
        raise Refused(f"{first or 'An empty'} statement")
    if first in ("DESC", "DESCRIBE") and "(" in tokens:  # a table function or subquery: inference reads it
        raise Refused("DESCRIBE of anything but a table")
