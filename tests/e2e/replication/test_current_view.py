"""The current-state view `<target>_current`: the Delta table's columns and current rows, kept equal to Delta
through updates, deletes and MERGE, added columns, resync and reshape; renamed, excluded, named or none."""

from __future__ import annotations

from cdc2ch.model.config import TargetName
from tests.e2e.replication.test_design import DESIGN, _moves, delta_table
from tests.e2e.replication.test_schema_changes import _sql, mapped_table  # noqa: F401 (a fixture)
from tests.support.helpers import assert_replicated, create_table


def _tables(sink, database: str) -> dict[str, str]:
    return dict(
        sink.query_rows("SELECT name, engine FROM system.tables WHERE database = {d:String}", {"d": database})
    )


def test_view_equals_delta_through_a_history_and_an_added_column(spark, sink, cli, database, tmp_path):
    path = delta_table(spark, tmp_path, "orders", 400)
    target, view = TargetName(database, "orders"), TargetName(database, "orders_current")
    cli.replicate("run", path, target, "--once")
    assert _tables(sink, database)["orders_current"] == "View"
    assert_replicated(spark, sink, path, view, view=True)

    _moves(spark, path)  # updates (moving keys), deletes, a MERGE that deletes, updates and inserts
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` ADD COLUMNS (status STRING)",
        f"UPDATE delta.`{path}` SET status = 'paid' WHERE id % 3 = 0",
    )
    cli.replicate("run", path, target, "--once")
    assert_replicated(spark, sink, path, view, view=True)  # the new column included, in Delta's order
    # What a dashboard asks, without FINAL: the same answer as the table with it.
    by_city = "SELECT city, round(sum(amount), 2) FROM {} GROUP BY city ORDER BY city"
    final = f"`{database}`.`orders` FINAL WHERE _is_deleted = 0"
    assert sink.query_rows(by_city.format(f"`{database}`.`orders_current`")) == sink.query_rows(
        by_city.format(final)
    )


def test_view_follows_a_resync_to_the_new_columns(spark, sink, cli, database, mapped_table):  # noqa: F811
    path, target = mapped_table, TargetName(database, "mapped")
    view = TargetName(database, "mapped_current")
    cli.replicate("run", path, target, "--once")
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` RENAME COLUMN `select` TO `sel.ect`",
        f"ALTER TABLE delta.`{path}` DROP COLUMN gone",
        f"INSERT INTO delta.`{path}` VALUES (3, 'c', 's3')",
        f"DELETE FROM delta.`{path}` WHERE id = 1",
    )
    cli.replicate("run", path, target, "--once", "--on-schema-change", "resync")
    assert_replicated(spark, sink, path, view, view=True)
    assert "mapped__cdc2ch_resync_current" not in _tables(sink, database)  # the side table had none
    _sql(spark, f"UPDATE delta.`{path}` SET `sel.ect` = 'new' WHERE id = 2")
    cli.replicate("run", path, target, "--once")
    assert_replicated(spark, sink, path, view, view=True)


def test_a_named_view_honours_renamed_and_excluded_columns_and_follows_a_reshape(
    spark, sink, cli, database, tmp_path
):
    path = delta_table(spark, tmp_path, "live", 300)
    target, view = TargetName(database, "live"), TargetName(database, "live_now")
    columns = ("--rename-columns", "email=contact", "--current-view", "live_now")
    cli.replicate("run", path, target, "--once", *columns, "--exclude-columns", "name")
    assert "live_current" not in _tables(sink, database)
    assert_replicated(spark, sink, path, view, view=True, rename={"email": "contact"}, exclude=("name",))

    # Reshaped to a new sorting key and partitions, and `name` no longer excluded, while commits arrive.
    _moves(spark, path)
    cli.replicate("reshape", path, target, *DESIGN, *columns)
    assert_replicated(spark, sink, path, view, view=True, rename={"email": "contact"})
    assert not [t for t in _tables(sink, database) if "cdc2ch_reshape" in t]
    _sql(spark, f"UPDATE delta.`{path}` SET name = 'renamed' WHERE id % 4 = 0")
    cli.replicate("run", path, target, "--once", *DESIGN, *columns)
    assert_replicated(spark, sink, path, view, view=True, rename={"email": "contact"})


def test_no_view_with_none_and_none_after_a_refused_first_start(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "plain")
    create_table(spark, path, "id BIGINT, name STRING")
    _sql(spark, f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    target = TargetName(database, "plain")
    refused = cli.replicate("run", path, target, "--once", "--column-codecs", "name=NoSuchCodec", expect=1)
    assert "NoSuchCodec" in refused.stderr
    assert _tables(sink, database) == {}  # neither the table nor its view

    taken = TargetName(database, "taken")  # a name a table has is refused before anything is written
    sink.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    sink.command(f"CREATE TABLE `{database}`.`taken` (x Int8) ENGINE = Memory")
    refused = cli.replicate("run", path, target, "--once", "--current-view", "taken", expect=2)
    assert "taken by a Memory table" in " ".join(refused.stderr.split())
    assert set(_tables(sink, database)) == {"taken"}
    assert sink.table_columns(taken) == {"x": "Int8"}

    cli.replicate("run", path, target, "--once", "--current-view", "none")
    assert not [t for t in _tables(sink, database) if t.endswith("_current")]
    assert_replicated(spark, sink, path, target)


def test_a_view_name_that_is_the_target_is_refused(cli, database, tmp_path):
    target = TargetName(database, "t")
    refused = cli.replicate("run", str(tmp_path / "t"), target, "--once", "--current-view", f"{database}.t",
                            expect=2)  # fmt: skip
    assert "is the target table itself" in " ".join(refused.stderr.split())


def test_on_a_server_the_view_follows_an_added_column(
    spark, http_sink, cli, clickhouse_http, database, tmp_path
):
    """The same over clickhouse-connect and HTTP (the session's engine behind tests/support/chserver.py, or a real
    server with CDC2CH_TEST_CLICKHOUSE_URL)."""
    path = str(tmp_path / "served")
    create_table(spark, path, "id BIGINT, name STRING")
    _sql(spark, f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    target, view = TargetName(database, "served"), TargetName(database, "served_current")
    server = ("--clickhouse", clickhouse_http.dsn)
    cli.replicate("run", path, target, "--once", *server)
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` ADD COLUMNS (score DOUBLE)",
        f"MERGE INTO delta.`{path}` d USING (SELECT 2L AS id, 'B' AS name, 2.5D AS score UNION ALL "
        f"SELECT 4L, 'd', 4.5D) s ON d.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        f"DELETE FROM delta.`{path}` WHERE id = 1",
    )
    cli.replicate("run", path, target, "--once", *server)
    assert_replicated(spark, http_sink, path, view, view=True)
