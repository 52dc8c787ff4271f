"""Catalog names next to paths: the rule telling them apart, default targets, the offset's location check,
status columns and secrets kept out of the JVM's command line."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from cdc2ch.base.errors import ConfigError, StateError
from cdc2ch.commands.invocation.options import build_config
from cdc2ch.commands.status import render_table
from cdc2ch.model.config import SparkSettings, TargetName, is_secret_key
from cdc2ch.model.records import PipelineState
from cdc2ch.model.tableref import display_name, parse_table, same_location
from cdc2ch.replication import plan

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text",
    [
        "/lake/orders",
        "./orders",
        "../lake/orders.delta",
        "~/lake/orders",
        "orders/",
        "lake/sales.orders",
        "s3a://bucket/lake/orders",
        "s3://bucket/orders",
        "abfss://c@acct.dfs.core.windows.net/orders",
        "file:/data/orders",
        "file:///data/orders",
        "C:\\lake\\orders",
        ".hidden",
    ],
)
def test_paths_and_uris_are_paths(text):
    ref = parse_table(text)
    assert not ref.is_name and ref.parts is None


@pytest.mark.parametrize(
    "text, parts",
    [
        ("sales.orders", ("sales", "orders")),
        ("main.sales.orders", ("main", "sales", "orders")),
        ("spark_catalog.default.t_2024", ("spark_catalog", "default", "t_2024")),
        ("2024_sales.orders", ("2024_sales", "orders")),
        ("`my-schema`.`my.table`", ("my-schema", "my.table")),
        ("`cat`.sales.`odd``name`", ("cat", "sales", "odd`name")),
        ("  sales.orders  ", ("sales", "orders")),
    ],
)
def test_two_or_three_identifiers_are_a_name(text, parts):
    ref = parse_table(text)
    assert ref.is_name and ref.parts == parts
    assert parse_table(ref.sql()).parts == parts  # the quoted form reads back the same


@pytest.mark.parametrize(
    "text, why",
    [
        ("orders", "single word"),
        ("a.b.c.d", "4 dot-separated parts"),
        ("sales.my orders", "not allowed unquoted"),
        ("sales..orders", "cannot start an unquoted identifier"),
        ("sales.orders.", "cannot start an unquoted identifier"),
        ("sales.`orders", "not closed"),
        ("sales.``", "empty"),
        ("1.2", "cannot start an unquoted identifier"),
        ("sales.orders:v2", "not allowed unquoted"),
        ("", "empty"),
    ],
)
def test_anything_else_is_refused_with_what_to_write(text, why):
    with pytest.raises(ConfigError) as err:
        parse_table(text)
    message = str(err.value)
    assert why in message
    if text:
        assert f"./{text.strip()}" in message and "schema.table or catalog.schema.table" in message


def test_default_target_is_the_tables_own_name():
    assert TargetName.for_source("sales.orders") == TargetName("cdc2ch", "orders")
    assert TargetName.for_source("main.sales.`daily.orders`") == TargetName("cdc2ch", "daily.orders")
    assert TargetName.for_source("/lake/orders/") == TargetName("cdc2ch", "orders")
    # One pipeline whether the table is named by path or by name: the offset row stays the same.
    by_name = build_config({"table": "sales.orders", "primary_key": "id", "clickhouse_dsn": "chdb:///x"})
    by_path = build_config(
        {"table": "/warehouse/sales.db/orders", "primary_key": "id", "clickhouse_dsn": "chdb:///x"}
    )
    assert by_name.pipeline == by_path.pipeline == "cdc2ch.orders"
    with pytest.raises(ConfigError, match="neither a path nor a catalog table name"):
        build_config({"table": "orders", "primary_key": "id", "target": "db.orders"})


def test_display_name_quotes_only_what_needs_it():
    assert display_name(["spark_catalog", "sales", "orders"]) == "spark_catalog.sales.orders"
    assert display_name(["main", "my-schema", "a`b"]) == "main.`my-schema`.`a``b`"


def test_same_location_ignores_scheme_spelling():
    assert same_location("file:/w/sales.db/orders", "/w/sales.db/orders/")
    assert same_location("file:///w/t", "/w/t")
    assert not same_location("/w/t", "/w/t2") and not same_location("", "/w/t")


def _state(source: str, location: str = "", table_id: str = "") -> PipelineState:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return PipelineState("cdc2ch.orders", source, "cdc2ch.orders", 3, 3, 10, at, location, table_id)


def test_an_offset_follows_its_table_by_location():
    name, where = "spark_catalog.sales.orders", "/w/sales.db/orders"
    # Same name, same place: resumes.
    assert plan.start_version(name, "cdc2ch.orders", _state(name, where), None, 5, False, where) == 4
    # A path pipeline now named through the catalog (and back): the same table.
    assert plan.start_version(name, "cdc2ch.orders", _state(where), None, 5, False, where) == 4
    assert plan.start_version(where, "cdc2ch.orders", _state(name, where), None, 5, False, where) == 4
    # A state from before locations were recorded resumes and gets one.
    assert plan.start_version(name, "cdc2ch.orders", _state(name), None, 5, False, where) == 4


def test_a_name_now_elsewhere_is_refused_not_mixed():
    name = "spark_catalog.sales.orders"
    with pytest.raises(StateError) as err:
        plan.start_version(name, "cdc2ch.orders", _state(name, "/w/old"), None, 5, False, "/w/new")
    message = str(err.value)
    assert "/w/old" in message and "/w/new" in message and "dropped and recreated" in message
    assert "Drop cdc2ch.orders, then `cdc2ch run --reset`" in message
    # --reset repoints it knowingly.
    assert plan.start_version(name, "cdc2ch.orders", _state(name, "/w/old"), 0, 5, True, "/w/new") == 0
    # Another table altogether is still another table.
    with pytest.raises(StateError, match="not spark_catalog.sales.other"):
        plan.start_version(
            "spark_catalog.sales.other", "cdc2ch.orders", _state(name, "/w/old"), None, 5, False, "/w/x"
        )


def test_a_table_created_again_in_the_same_place_is_refused():
    """A managed table dropped and created again gets the same location but another Delta table id."""
    name, where = "spark_catalog.sales.orders", "/w/sales.db/orders"
    stored = _state(name, where, "id-1")
    assert plan.start_version(name, "cdc2ch.orders", stored, None, 5, False, where, "id-1") == 4
    assert plan.start_version(name, "cdc2ch.orders", _state(name, where), None, 5, False, where, "id-2") == 4
    with pytest.raises(StateError) as err:
        plan.start_version(name, "cdc2ch.orders", stored, None, 5, False, where, "id-2")
    assert "id-1" in str(err.value) and "id-2" in str(err.value) and "dropped and recreated" in str(err.value)


def test_relabelled_keeps_the_offset():
    moved = _state("/w/sales.db/orders").relabelled("spark_catalog.sales.orders", "/w/sales.db/orders", "")
    assert (moved.source, moved.location, moved.committed_version) == (
        "spark_catalog.sales.orders",
        "/w/sales.db/orders",
        3,
    )


def _row(**kw) -> dict:
    row = dict.fromkeys(
        ("committed_version", "latest_version", "versions_behind", "seconds_behind", "last_success", "error"),
    )
    return {"pipeline": "cdc2ch.orders", "target": "cdc2ch.orders", "rows_written": 1, **row, **kw}


def test_status_table_shows_name_and_location_when_a_pipeline_has_a_name():
    by_path = _row(source="/lake/orders", name=None, location="/lake/orders")
    header = render_table([by_path], wide=True).splitlines()[0].split()
    assert "source" not in header and "location" not in header  # unchanged for path pipelines
    named = _row(source="spark_catalog.sales.orders", name="spark_catalog.sales.orders", location="/w/o")
    lines = render_table([named, by_path], wide=True).splitlines()
    assert lines[0].split()[-2:] == ["source", "location"]
    assert lines[1].split()[-2:] == ["spark_catalog.sales.orders", "/w/o"]


def test_secret_spark_settings_are_recognised_and_masked():
    for key in (
        "spark.sql.catalog.unity.token",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.javax.jdo.option.ConnectionPassword",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
        "spark.hadoop.fs.azure.sas.c.acct.blob.core.windows.net",
        "spark.hadoop.google.cloud.auth.service.account.json.keyfile.credential",
    ):
        assert is_secret_key(key), key
    for key in ("spark.sql.catalog.unity.uri", "spark.driver.memory", "spark.sql.catalogImplementation"):
        assert not is_secret_key(key), key
    settings = SparkSettings(None, (("spark.sql.catalog.unity.token", "dapi-s3cr3t"), ("a.uri", "http://x")))
    assert "dapi-s3cr3t" not in repr(settings) and "http://x" in repr(settings)
