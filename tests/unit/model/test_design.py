"""The target table's design and a row's identity, without a JVM or an engine: parsing the options, the
identity rule, the types a column may be stored as, the DDL, the rows left out, and the adoption check."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse.tables.adopt import Existing, its_design, problems
from cdc2ch.clickhouse.writers import changerows as changes
from cdc2ch.commands.invocation.options import build_config, convert, options_of
from cdc2ch.model import contract, schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign, pairs
from cdc2ch.model.identity import Identity, expression_columns
from cdc2ch.replication.projection import arrow

pytestmark = pytest.mark.unit

TARGET = TargetName("db", "orders")
SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True},
        {"name": "city", "type": "string", "nullable": True},
        {"name": "created_at", "type": "date", "nullable": True},
        {"name": "email", "type": "string", "nullable": True},
    ],
}


def test_the_columns_a_partition_expression_reads():
    assert expression_columns("toYYYYMM(created_at)") == ("created_at",)
    assert expression_columns("(toMonday(`day of`), intDiv(id, 1000), 'x y', city IS NULL)") == (
        "day of",
        "id",
        "city",
    )
    assert expression_columns("toStartOfInterval(ts, INTERVAL 1 DAY)") == ("ts",)
    assert expression_columns(None) == ()


def test_identity_is_the_sorting_key_and_the_partition_columns():
    identity = Identity.of(("id",), ("city", "id"), "toYYYYMM(created_at)")
    assert identity.columns == ("city", "id", "created_at") and identity.sorting_extra == (
        "city",
        "created_at",
    )
    assert Identity.of(("tenant", "id")).columns == ("tenant", "id") and not Identity.of(("id",)).moves()
    with pytest.raises(ConfigError, match="does not hold primary-key column"):
        Identity.of(("tenant", "id"), ("city", "id"))


def test_design_options_parse_and_refuse():
    assert pairs("ts=Delta, ZSTD(3),b=LZ4", "--column-codecs", "") == (("ts", "Delta, ZSTD(3)"), ("b", "LZ4"))
    assert pairs(["d=Decimal(18, 2)", "n=Int64"], "--column-types", "") == (
        ("d", "Decimal(18, 2)"),
        ("n", "Int64"),
    )
    with pytest.raises(ConfigError, match="names 'a' twice"):
        pairs("a=1,a=2", "--column-types", "")
    with pytest.raises(ConfigError, match="not of the form"):
        pairs("oops", "--rename-columns", "")
    with pytest.raises(ConfigError, match="needs to identify a row"):
        TableDesign(("id",), exclude=("id",))
    with pytest.raises(ConfigError, match="same name"):
        TableDesign(("id",), rename=(("a", "x"), ("b", "x")))
    design = TableDesign(("id",), order_by=("city", "id"), rename=(("city", "town"),), exclude=("email",))
    assert design.identity.order_by == ("town", "id")  # the identity speaks the target's names
    with pytest.raises(ConfigError, match="--partition-by toYYYYMM\\(day\\) reads 'day'"):
        TableDesign(("id",), partition_by="toYYYYMM(day)").checked_schema(SCHEMA)
    with pytest.raises(ConfigError, match="--exclude-columns names column\\(s\\) 'mail'"):
        TableDesign(("id",), exclude=("mail",)).checked_schema(SCHEMA)
    projected = design.project_schema(SCHEMA)
    assert [f["name"] for f in projected["fields"]] == ["id", "town", "created_at"]


def test_options_flags_toml_and_api_build_one_design():
    values = {o.param: o.default for o in options_of("run")}
    values.update(
        table="/lake/orders", primary_key="id", clickhouse_dsn="chdb:///x", order_by="city,id",
        partition_by="toYYYYMM(created_at)",
        rename_columns=convert(next(o for o in options_of("run") if o.name == "rename-columns"), {"email": "mail"}),
        column_types=("city=LowCardinality(String)",), table_settings=("index_granularity=1024",),
    )  # fmt: skip
    cfg = build_config(values)
    assert cfg.design.rename == (("email", "mail"),) and cfg.identity.columns == ("city", "id", "created_at")
    assert cfg.design.settings == (("index_granularity", "1024"),)
    assert build_config({**values, "order_by": None}).identity.order_by == ("id",)


def test_types_a_column_may_be_stored_as():
    for chosen, needed in [
        ("LowCardinality(String)", "String"),
        ("LowCardinality(Nullable(String))", "Nullable(String)"),
        ("Nullable(String)", "String"),
        ("Int64", "Int32"),
        ("DateTime64(9, 'UTC')", "DateTime64(6, 'UTC')"),
        ("Decimal(20, 2)", "Decimal(18, 2)"),
    ]:
        assert schema.fits(chosen, needed), (chosen, needed)
    for chosen, needed in [
        ("Date", "Date32"),
        ("String", "Nullable(String)"),
        ("DateTime64(3, 'UTC')", "DateTime64(6, 'UTC')"),
        ("Int16", "Int32"),
        ("Float32", "Float64"),
    ]:
        assert not schema.fits(chosen, needed), (chosen, needed)
    # An existing column takes Delta's type as it is only when schema evolution would leave it alone: a
    # wider one is a type Delta narrowed to, which stops replication (tests/e2e/replication/test_schema_changes.py).
    assert schema.takes("LowCardinality(Nullable(String))", "Nullable(String)")
    assert schema.takes("Nullable(String)", "String") and not schema.takes("Int64", "Int32")
    design = TableDesign(("id",), types=(("created_at", "Date"),))
    with pytest.raises(ConfigError, match="cannot hold every value"):
        schema.column_types(SCHEMA, design)


def test_ddl_of_a_designed_table():
    design = TableDesign(
        ("id",), order_by=("city", "id"), partition_by="toYYYYMM(created_at)",
        settings=(("index_granularity", "1024"),), codecs=(("email", "ZSTD(3)"),),
        types=(("city", "LowCardinality(Nullable(String))"),),
    )  # fmt: skip
    types = schema.column_types(SCHEMA, design)
    assert types == {
        "id": "Int64",
        "city": "LowCardinality(Nullable(String))",
        "created_at": "Nullable(Date32)",
        "email": "Nullable(String)",
    }
    ddl = " ".join(schema.target_table_ddl(TARGET, types, design).split())
    assert "`email` Nullable(String) CODEC(ZSTD(3))" in ddl
    assert "PARTITION BY toYYYYMM(created_at) ORDER BY (`city`, `id`)" in ddl
    assert ddl.endswith(
        "SETTINGS non_replicated_deduplication_window = 10000, vertical_merge_algorithm_min_columns_to_activate = 1, "
        "allow_nullable_key = 1, index_granularity = 1024"
    )


def _rows(*changes_):
    """Target-layout rows of (id, city, commit version, change type)."""
    ids, cities, versions, kinds = zip(*changes_)
    cdf = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "city": pa.array(cities),
            "_change_type": pa.array(kinds),
            "_commit_version": pa.array(versions, pa.int64()),
            "_commit_timestamp": pa.array([0] * len(ids), pa.timestamp("us", "UTC")),
        }
    )
    return contract.arrow_rows(cdf)


def test_a_moved_rows_pre_image_is_kept_as_the_tombstone_of_its_old_identity():
    rows = _rows((1, "a", 1, "insert"), (1, "a", 2, "update_preimage"), (1, "b", 2, "update_postimage"))
    by_identity = changes.prepare(rows, Identity.of(("id",), ("city", "id")).columns, True).rows
    assert sorted(zip(by_identity["city"].to_pylist(), by_identity["_is_deleted"].to_pylist())) == [
        ("a", 1),  # the old identity's tombstone: without it FINAL would show key 1 twice
        ("b", 0),
    ]
    by_key = changes.prepare(rows, ("id",), True).rows  # what ranking by primary key alone would write
    assert by_key["city"].to_pylist() == ["b"]


def test_columns_left_out_and_renamed_in_arrow_rows():
    rows = _rows((1, "a", 1, "insert"))
    out = arrow(rows, TableDesign(("id",), rename=(("city", "town"),)))
    assert out.column_names[:2] == ["id", "town"] and out.num_rows == 1
    assert arrow(rows, TableDesign(("id",), exclude=("city",))).column_names[0:2] == ["id", "_commit_version"]


def _table(**over) -> Existing:
    columns = {"id": "Int64", "city": "LowCardinality(Nullable(String))", "created_at": "Nullable(Date32)"}
    meta = {c: "UInt64" for c in contract.WRITTEN_META}
    base = dict(
        engine="ReplacingMergeTree",
        engine_full="ReplacingMergeTree(_version, _is_deleted) PARTITION BY toYYYYMM(created_at) ORDER BY (city, id)",
        sorting_key="city, id",
        partition_key="toYYYYMM(created_at)",
        columns={**columns, **meta},
    )
    return Existing(**{**base, **over})


def test_adoption_checks_engine_keys_and_types():
    design = TableDesign(("id",), order_by=("city", "id"), partition_by="toYYYYMM(created_at)")
    wanted = {"id": "Int64", "city": "Nullable(String)", "created_at": "Nullable(Date32)"}
    assert problems(_table(), design, wanted, new=True) == []
    blog = _table(
        engine_full="ReplacingMergeTree(_commit_version) PARTITION BY toYYYYMM(created_at) ORDER BY (name, city)",
        sorting_key="name, city",
        columns={"id": "Int64", "city": "String", "created_at": "Date", "_commit_version": "UInt64"},
    )
    found = " ".join(problems(blog, TableDesign(("id",)), wanted, new=True))
    for part in ("needs ReplacingMergeTree(_version, _is_deleted)", "no column _commit_timestamp",
                 "sorted by (name, city)", "partitioned by toYYYYMM(created_at)", "'city' is String",
                 "'created_at' is Date, which does not take Delta's Nullable(Date32)"):  # fmt: skip
        assert part in found, found
    assert "'city' is String" not in " ".join(
        problems(blog, design, wanted, new=False)
    )  # evolution's to follow
    suggested = its_design(blog, TableDesign(("id",)))
    assert (
        suggested.identity.order_by == ("name", "city", "id")
        and suggested.partition_by == "toYYYYMM(created_at)"
    )
    replicated = _table(
        engine="ReplicatedReplacingMergeTree",
        engine_full="ReplicatedReplacingMergeTree('/t/{shard}', '{replica}', _version, _is_deleted) ORDER BY id",
        sorting_key="id",
        partition_key="",
    )
    assert problems(replicated, TableDesign(("id",)), {"id": "Int64"}, new=False) == []
