"""The --cluster DDL (cdc2ch.clickhouse.connection.cluster) is ClickHouse SQL: each statement goes through ClickHouse's
own parser (formatQuery, in the embedded engine), and the assertions read the text it normalized.

The embedded engine has no cluster or Keeper, so the statements are parsed, not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc2ch.base.errors import SinkError
from cdc2ch.clickhouse import codes
from cdc2ch.clickhouse.connection.cluster import (
    database_ddl,
    distributed_table_ddl,
    local_table_ddl,
    state_table_ddl_on_cluster,
)
from cdc2ch.clickhouse.connection.placement import Cluster, OneServer
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.contract import sql_literal
from cdc2ch.model.design import TableDesign
from cdc2ch.model.view import current_select

SQL = Path(__file__).resolve().parents[3] / "sql"
# Every template but the target's creates a state table.
STATE_TEMPLATES = sorted(p.name for p in SQL.glob("create_*.sql") if p.name != "create_target_table.sql")

CUSTOM = TableDesign(("id",), order_by=("city", "id"), partition_by="toYYYYMM(created_at)")
TYPES = {
    "id": "Int64",
    "city": "Nullable(String)",
    "created_at": "Nullable(Date32)",
    "amount": "Nullable(Float64)",
}
TARGET_ENGINE = (
    "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', "
    "_version, _is_deleted)"
)


def parsed(sink, sql: str) -> str:
    """`sql` as ClickHouse's parser normalizes it; SinkError (SYNTAX_ERROR) when it is not ClickHouse SQL."""
    return sink.query_rows(f"SELECT formatQuery({sql_literal(sql)})")[0][0]


def changed_lines(plain: str, clustered: str) -> list[tuple[str, str]]:
    """The (single-node, cluster) line pairs that differ between two normalized CREATE statements."""
    a, b = plain.splitlines(), clustered.splitlines()
    assert len(a) == len(b), (plain, clustered)
    return [(x, y) for x, y in zip(a, b) if x != y]


def test_the_state_templates_are_all_covered():
    assert STATE_TEMPLATES == [
        "create_compact_table.sql",
        "create_control_table.sql",
        "create_health_table.sql",
        "create_layout_table.sql",
        "create_locks_table.sql",
        "create_snapshot_chunks_table.sql",
        "create_state_table.sql",
        "create_verify_table.sql",
    ]


def test_database(sink, database):
    assert parsed(sink, database_ddl(database, "main")) == (
        f"CREATE DATABASE IF NOT EXISTS {database} ON CLUSTER main"
    )


@pytest.mark.parametrize(
    "design, order_by, partition",
    [
        (CUSTOM, "ORDER BY (city, id)", "PARTITION BY toYYYYMM(created_at)"),
        (TableDesign(("id",)), "ORDER BY (id)", None),
    ],
    ids=["custom", "default"],
)
def test_local_table_is_the_single_node_table_replicated(sink, database, design, order_by, partition):
    target = TargetName(database, "orders")
    text = parsed(sink, local_table_ddl(target, TYPES, design, "main"))
    lines = text.splitlines()
    assert lines[0] == f"CREATE TABLE IF NOT EXISTS {database}.orders_local ON CLUSTER main"
    assert TARGET_ENGINE in lines
    assert order_by in lines
    assert (partition in lines) if partition else not any(x.startswith("PARTITION BY") for x in lines)
    settings = lines[-1]
    assert settings.startswith("SETTINGS replicated_deduplication_window = 10000")
    assert "non_replicated" not in text
    # A Nullable sorting column needs allow_nullable_key, as on a single node.
    assert ("allow_nullable_key = 1" in settings) == (design is CUSTOM)
    # Apart from the name, the engine and the window, it is the single-node table, line for line.
    plain = parsed(sink, schema.target_table_ddl(TargetName(database, "orders_local"), TYPES, design))
    assert changed_lines(plain, text) == [
        (f"CREATE TABLE IF NOT EXISTS {database}.orders_local", lines[0]),
        ("ENGINE = ReplacingMergeTree(_version, _is_deleted)", TARGET_ENGINE),
        (settings.replace("SETTINGS replicated", "SETTINGS non_replicated"), settings),
    ]


def test_local_table_keeps_the_users_window_and_comment(sink, database):
    target = TargetName(database, "orders")
    mine = TableDesign(("id",), settings=(("non_replicated_deduplication_window", "500"),))
    text = parsed(sink, local_table_ddl(target, TYPES, mine, "main", comment="from s3://bucket/orders"))
    assert (
        "SETTINGS vertical_merge_algorithm_min_columns_to_activate = 1, replicated_deduplication_window = 500"
        in text.splitlines()
    )
    assert text.splitlines()[-1] == "COMMENT 'from s3://bucket/orders'"
    # A replicated window the user gives wins over the non-replicated one (theirs or the default).
    both = TableDesign(
        ("id",),
        settings=(("non_replicated_deduplication_window", "500"), ("replicated_deduplication_window", "700")),
    )
    text = parsed(sink, local_table_ddl(target, TYPES, both, "main"))
    assert text.splitlines()[-1] == (
        "SETTINGS vertical_merge_algorithm_min_columns_to_activate = 1, replicated_deduplication_window = 700"
    )


def test_the_window_is_a_merge_tree_setting(sink):
    rows = sink.query_rows(
        "SELECT name FROM system.merge_tree_settings WHERE name = 'replicated_deduplication_window'"
    )
    assert rows == [("replicated_deduplication_window",)]


@pytest.mark.parametrize(
    "design",
    [CUSTOM, TableDesign(("region", "id"), order_by=("day", "region", "id"))],
    ids=["custom", "composite"],
)
def test_distributed_table_is_sharded_by_the_primary_key_only(sink, database, design):
    text = parsed(sink, distributed_table_ddl(TargetName(database, "orders"), design, "main"))
    key = ", ".join(design.identity.primary_key)  # not the sorting key's leading city or day
    assert text.splitlines() == [
        f"CREATE TABLE IF NOT EXISTS {database}.orders ON CLUSTER main AS {database}.orders_local",
        f"ENGINE = Distributed(main, {database}, orders_local, cityHash64({key}))",
    ]


@pytest.mark.parametrize("template", STATE_TEMPLATES)
def test_state_tables_are_replicated_on_the_cluster(sink, database, template):
    table = "cdc2ch_" + template.removeprefix("create_").removesuffix("_table.sql")
    text = parsed(sink, state_table_ddl_on_cluster(database, table, template, "main"))
    plain = parsed(sink, schema.state_table_ddl(database, table, template))
    (head, engine) = changed_lines(plain, text)
    assert head == (f"CREATE TABLE IF NOT EXISTS {database}.{table}", f"{head[0]} ON CLUSTER main")
    # Same version column (and ORDER BY, TTL: unchanged lines) as the template's ReplacingMergeTree.
    version = engine[0].removeprefix("ENGINE = ReplacingMergeTree(")
    assert engine[1] == (
        f"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{{database}}/{{table}}', '{{replica}}', "
        f"{version}"
    )


def test_names_are_quoted(sink):
    target = TargetName("my db", "order items")
    design = TableDesign(("order id",))
    cluster = "prod `east`"
    types = {"order id": "Int64", "note": "String"}
    statements = [
        database_ddl("my db", cluster),
        local_table_ddl(target, types, design, cluster),
        distributed_table_ddl(target, design, cluster),
        state_table_ddl_on_cluster("my db", "cdc2ch_state", "create_state_table.sql", cluster),
    ]
    texts = [parsed(sink, s) for s in statements]
    assert all("ON CLUSTER `prod \\`east\\``" in t for t in texts)
    assert texts[2].splitlines()[1] == (
        "ENGINE = Distributed(`prod \\`east\\``, `my db`, `order items_local`, cityHash64(`order id`))"
    )


def test_the_parser_rejects_broken_sql(sink, database):
    ddl = distributed_table_ddl(TargetName(database, "orders"), CUSTOM, "main")
    with pytest.raises(SinkError) as failed:
        parsed(sink, ddl.removesuffix(")"))  # an unclosed Distributed(
    assert failed.value.code == codes.SYNTAX_ERROR


def test_a_template_of_another_shape_is_refused(monkeypatch):
    monkeypatch.setattr(
        schema,
        "state_table_ddl",
        lambda *_: "CREATE TABLE IF NOT EXISTS `d`.`t` (x Int8)\nENGINE = MergeTree\nORDER BY x",
    )
    with pytest.raises(RuntimeError, match="one ReplacingMergeTree"):
        state_table_ddl_on_cluster("d", "t", "create_state_table.sql", "main")


def test_every_statement_a_cluster_pipeline_sends_is_clickhouse_sql(sink, database):
    """What placement.Cluster sends for a target's life: create, add and widen columns, swap in a rebuilt
    table, follow it with the Distributed table and the current-state view, drop the side tables, and the
    state tables."""
    target, side = TargetName(database, "orders"), TargetName(database, "orders__cdc2ch_resync")
    place = Cluster("main")
    view = place.view(TargetName(database, "orders_current"), current_select(target, TYPES))
    statements = [
        *place.database(database),
        *place.target(target, TYPES, CUSTOM, "cdc2ch: marker"),
        *view,
        *place.alter_columns(target, "ADD COLUMN IF NOT EXISTS `note` Nullable(String) AFTER `amount`"),
        *place.alter_columns(target, "MODIFY COLUMN `amount` Nullable(Decimal(38, 2))"),
        *place.swap(side, target, CUSTOM),
        *place.settle(target, CUSTOM),
        *view,
        *place.drop(side),
        *(place.state_table(database, f"t{i}", name) for i, name in enumerate(STATE_TEMPLATES)),
    ]
    texts = [parsed(sink, sql) for sql in statements]
    assert all(" ON CLUSTER main" in text for text in texts)
    assert texts[-len(STATE_TEMPLATES) - 5 :][:4] == [
        f"EXCHANGE TABLES {database}.orders__cdc2ch_resync_local AND {database}.orders_local ON CLUSTER main",
        f"CREATE OR REPLACE TABLE {database}.orders ON CLUSTER main AS {database}.orders_local\n"
        f"ENGINE = Distributed(main, {database}, orders_local, cityHash64(id))",
        f"CREATE OR REPLACE VIEW {database}.orders_current ON CLUSTER main\nAS SELECT\n    id,\n    city,\n"
        f"    created_at,\n    amount\nFROM {database}.orders\nFINAL\nWHERE _is_deleted = 0\n"
        "SETTINGS do_not_merge_across_partitions_select_final = 1",
        f"DROP TABLE IF EXISTS {database}.orders__cdc2ch_resync ON CLUSTER main SYNC",
    ]


def test_one_server_sends_what_it_always_did(sink, database):
    target = TargetName(database, "orders")
    place = OneServer()
    assert place.target(target, TYPES, CUSTOM) == [schema.target_table_ddl(target, TYPES, CUSTOM)]
    assert place.stored(target) == target
    assert [parsed(sink, sql) for sql in place.swap(TargetName(database, "x"), target, CUSTOM)] == [
        f"EXCHANGE TABLES {database}.x AND {database}.orders"
    ]
    assert place.settle(target, CUSTOM) == []


def test_run_on_a_cluster_the_server_lacks_writes_nothing(
    spark, http_sink, cli, clickhouse_http, database, tmp_path, monkeypatch
):
    """`run --cluster` against a server (the session's engine over HTTP) that has no such cluster: refused
    from the server's own list of clusters before any statement, and no database, table or offset is left."""
    path = str(tmp_path / "orders")
    spark.range(5).selectExpr("id", "cast(id AS string) AS name").write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).save(path)
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    result = cli.replicate(
        "run", path, TargetName(database, "orders"), "--once", "--cluster", "cdc2ch_no_such_cluster",
        "--clickhouse", clickhouse_http.dsn, expect=2,
    )  # fmt: skip
    assert "--cluster cdc2ch_no_such_cluster names no cluster of ClickHouse at" in result.stderr
    assert not http_sink.query_rows(
        "SELECT name FROM system.databases WHERE name = {db:String}", {"db": database}
    )
