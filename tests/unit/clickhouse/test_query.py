"""`cdc2ch query` sends the statement as written (issue 17, item 5): which format to ask for, pure logic."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse.query import output_format

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "sql, wanted",
    [
        ("SELECT 1", "TSV"),
        ("  with x AS (SELECT 1) SELECT * FROM x", "TSV"),
        ("SHOW TABLES", "TSV"),
        ("(SELECT 1) UNION ALL (SELECT 2)", "TSV"),
        ("SELECT 1 FORMAT JSONEachRow", None),  # the user's own FORMAT
        ("select 1 format CSV;", None),
        ("SELECT 1 SETTINGS max_threads = 1 FORMAT CSV", None),
        ("SELECT 'x FORMAT JSON' AS s", "TSV"),  # inside a string: no clause
        ("SELECT 1 -- FORMAT JSON", "TSV"),  # inside a comment
        ("SELECT 1 AS `FORMAT JSON`", "TSV"),
        ("INSERT INTO t VALUES (1)", None),  # returns nothing: a FORMAT would be read as data
        ("CREATE TABLE t (x Int8) ENGINE = Memory", None),
        ("INSERT INTO t FORMAT CSV 1", None),
    ],
)
def test_the_format_asked_for(sql, wanted):
    assert output_format(sql, "TSV") == wanted


@pytest.mark.parametrize("sql", ["", "   ", ";", " -- nothing\n", "/* nothing */ ;"])
def test_an_empty_statement_is_refused_clearly(sql):
    with pytest.raises(ConfigError, match="The query is empty: pass one SQL statement"):
        output_format(sql, "TSV")
