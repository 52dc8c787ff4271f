"""`cdc2ch query`: one SQL statement sent as the user wrote it, its result in ClickHouse's own rendering.

The statement is never rewritten. A FORMAT clause the user gives is ClickHouse's to honour; only a
statement that returns rows and names no format gets `--format` (sent the way clickhouse-connect adds a
format: a FORMAT clause after the statement). Statements that return nothing (INSERT ... VALUES, DDL) are
sent as they are: a FORMAT after them would be read as input data or refused.
"""

from __future__ import annotations

import re

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse.connection.transport import Sink

# Statements whose result is rows, by their first word.
_RETURNS_ROWS = frozenset(
    {"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS", "CHECK", "VALUES"}
)
_QUOTED_OR_COMMENT = re.compile(
    r"'(?:[^'\\]|\\.|'')*'"  # 'string'
    r'|"(?:[^"\\]|\\.|"")*"'  # "identifier"
    r"|`(?:[^`\\]|\\.|``)*`"  # `identifier`
    r"|--[^\n]*|#[^\n]*"  # line comments
    r"|/\*.*?\*/",  # block comments
    re.S,
)
_FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+[A-Za-z_][A-Za-z0-9_]*\b", re.I)


def skeleton(sql: str) -> str:
    """The statement without string literals, quoted identifiers and comments, and without a final `;`."""
    return _QUOTED_OR_COMMENT.sub(" ", sql).strip().rstrip(";").strip()


def output_format(sql: str, default: str) -> str | None:
    """The format to ask for: None when the statement names its own (or returns no rows), else `default`.
    ConfigError for an empty statement."""
    bare = skeleton(sql)
    if not bare:
        raise ConfigError(
            "The query is empty: pass one SQL statement, e.g. "
            '`cdc2ch query "SELECT count() FROM cdc2ch.orders FINAL"`.'
        )
    if _FORMAT_CLAUSE.search(bare):
        return None
    first = bare.split(None, 1)[0].upper().lstrip("(")
    return default if first in _RETURNS_ROWS else None


def run(sink: Sink, sql: str, default_format: str) -> bytes:
    """ClickHouse's rendering of the statement's result (empty for statements that return nothing)."""
    return sink.raw_query(sql.strip(), output_format(sql, default_format))
