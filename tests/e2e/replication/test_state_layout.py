"""cdc2ch's own tables carry a layout version: an older layout is upgraded in place with its offsets kept and
replication goes on exactly; a layout newer than this release knows is refused by writers and readers."""

from __future__ import annotations

import json

from cdc2ch.clickhouse.state.layout import LAYOUT, LAYOUT_TABLE
from cdc2ch.model.config import TargetName
from tests.support.helpers import assert_replicated, committed_version, create_table, latest_version


def _table(spark, tmp_path) -> str:
    path = str(tmp_path / "t")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    return path


def _layouts(sink, database: str) -> list[int]:
    return [r[0] for r in sink.query_rows(f"SELECT layout FROM {database}.{LAYOUT_TABLE} ORDER BY layout")]


def test_an_older_layout_is_upgraded_in_place_and_replication_goes_on(spark, sink, cli, database, tmp_path):
    path, target = _table(spark, tmp_path), TargetName(database, "t")
    cli.replicate("run", path, target, "--once")
    assert _layouts(sink, database) == [LAYOUT]
    # The tables as a release before layouts left them: no record, and an offsets table without the
    # columns added since.
    sink.command(f"DROP TABLE {database}.{LAYOUT_TABLE}")
    for column in ("location", "table_id", "initial_load", "initial_reason", "changes_from", "reader"):
        sink.command(f"ALTER TABLE {database}.cdc2ch_state DROP COLUMN {column}")
    before = committed_version(sink, database, str(target))
    spark.sql(f"UPDATE delta.`{path}` SET v = 'bb' WHERE id = 2")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'c')")
    result = cli.replicate("run", path, target, "--once")
    assert _layouts(sink, database) == [LAYOUT]
    assert [e["start"] for e in cli.events(result, "batch")][:1] == [before + 1]  # resumed, not replayed
    assert committed_version(sink, database, str(target)) == latest_version(spark, path)
    assert_replicated(spark, sink, path, target)
    # The columns added since are recorded again: where the range came from, and what read it.
    (chosen,) = cli.events(result, "reader_chosen")
    (listed,) = [p for p in json.loads(cli("status", "--json").stdout) if p["pipeline"] == str(target)]
    assert (listed["changes_from"], listed["reader"]) == ("cdf", chosen["reader"])
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (4, 'd')")
    cli.replicate("run", path, target, "--once", "--reader", "spark")
    (listed,) = [p for p in json.loads(cli("status", "--json").stdout) if p["pipeline"] == str(target)]
    assert listed["reader"] == "spark"


def test_a_newer_layout_is_refused_by_writers_and_readers(spark, sink, cli, database, tmp_path):
    path, target = _table(spark, tmp_path), TargetName(database, "t")
    cli.replicate("run", path, target, "--once")
    sink.command(f"INSERT INTO {database}.{LAYOUT_TABLE} VALUES ({LAYOUT + 1}, 'cdc2ch 9.9', now64(3))")
    try:
        committed = committed_version(sink, database, str(target))
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'c')")
        for command in ("run", "status"):
            args = ("--once",) if command == "run" else ()
            result = (
                cli.replicate("run", path, target, *args, expect=1)
                if command == "run"
                else cli("status", expect=1)
            )
            said = " ".join(result.stderr.split())
            assert f"have layout {LAYOUT + 1}, written by a newer cdc2ch" in said, said
        assert committed_version(sink, database, str(target)) == committed
        assert sink.query_rows(f"SELECT count() FROM {database}.t FINAL")[0][0] == 2
    finally:  # the engine is shared by the session's tests: a status over every database must not meet it
        sink.command(f"DROP TABLE {database}.{LAYOUT_TABLE}")
