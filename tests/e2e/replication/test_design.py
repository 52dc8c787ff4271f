"""Target tables designed for the user's queries (design.py, identity.py, clickhouse/tables/adopt.py): a sorting key
and partitions over non-key columns, excluded, renamed, retyped and compressed columns, and hand-made
tables checked before anything is written. After every history FINAL equals the Delta table, on both
readers and both writers, and `verify` compares what FINAL shows."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from cdc2ch.model import contract, schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign
from tests.support.helpers import (
    assert_replicated,
    clickhouse_rows,
    committed_version,
    create_table,
    delta_rows,
)

COLUMNS = "id BIGINT, name STRING, city STRING, created_at DATE, amount DOUBLE, email STRING"
DESIGN = ("--order-by", "city,id", "--partition-by", "toYYYYMM(created_at)")


def _load(spark, path: str, lo: int, hi: int) -> None:
    spark.sql(
        f"INSERT INTO delta.`{path}` SELECT id, concat('n', id), concat('c', id % 5), "
        f"date_add(DATE'2024-01-01', CAST(id % 90 AS INT)), id * 1.5, concat('e', id, '@x.org') "
        f"FROM range({lo}, {hi})"
    )


def delta_table(spark, tmp_path, name: str, rows: int) -> str:
    """A Delta table of COLUMNS with change data feed, holding ids 0..rows-1."""
    path = str(tmp_path / name)
    create_table(spark, path, COLUMNS)
    _load(spark, path, 0, rows)
    return path


def _moves(spark, path: str) -> None:
    """Commits that move rows to another sorting key and partition, delete, re-insert in one commit and
    change primary keys: each leaves a row behind at its old identity unless its pre-image removes it."""
    t = f"delta.`{path}`"
    spark.sql(f"UPDATE {t} SET city = concat(city, 'x') WHERE id % 7 = 0")  # another sorting key
    spark.sql(f"UPDATE {t} SET created_at = date_add(created_at, 45) WHERE id % 5 = 0")  # another partition
    spark.sql(f"DELETE FROM {t} WHERE id % 11 = 0")
    spark.sql(  # delete and re-insert keys in one commit, some into another city and month
        f"MERGE INTO {t} d USING (SELECT id, concat('m', id) AS name, 'c9' AS city, DATE'2023-12-31' AS "
        f"created_at, 0.5 AS amount, 'm@x.org' AS email FROM range(0, 400, 3)) s ON d.id = s.id "
        f"WHEN MATCHED AND d.id % 2 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql(f"UPDATE {t} SET id = id + 100000, city = 'moved' WHERE id % 13 = 1")  # a key-changing update


def _verify(cli, path: str, target: TargetName, *design: str, expect: int = 0) -> dict:
    args = ("verify", "--table", path, "--primary-key", "id", "--target", str(target), *design, "--json")
    return json.loads(cli(*args, expect=expect).stdout)[0]


@pytest.mark.parametrize("reader", ["spark", "clickhouse"])
def test_rows_that_move_between_sorting_keys_and_partitions(spark, sink, cli, database, tmp_path, reader):
    path = delta_table(spark, tmp_path, "moves", 400)
    target = TargetName(database, "moves")
    args = ("--once", "--reader", reader, *DESIGN)
    cli.replicate("run", path, target, *args)
    assert_replicated(spark, sink, path, target)
    _moves(spark, path)
    cli.replicate("run", path, target, *args)
    assert_replicated(spark, sink, path, target)
    (ddl,) = sink.query_rows(
        f"SELECT sorting_key, partition_key FROM system.tables WHERE database = '{database}' AND name = 'moves'"
    )
    assert ddl == ("city, id", "toYYYYMM(created_at)")
    report = _verify(cli, path, target, *DESIGN)
    assert report["ok"] and report["delta_rows"] == report["target_rows"], report


def test_verify_sees_what_final_shows(spark, sink, cli, database, tmp_path):
    """A live row left at an old identity (as a replicator that ranks by primary key leaves it) is what a
    query with FINAL shows: verify reports it as extra and --repair removes it."""
    path = delta_table(spark, tmp_path, "stale", 100)
    target = TargetName(database, "stale")
    cli.replicate("run", path, target, "--once", *DESIGN)
    table = schema.qualified(target)
    sink.command(  # key 7's row again, live, under another city: the same primary key twice in FINAL
        f"INSERT INTO {table} SELECT * REPLACE ('elsewhere' AS city) FROM {table} FINAL WHERE id = 7"
    )
    report = _verify(cli, path, target, *DESIGN, expect=1)
    assert not report["ok"] and report["extra"] == 1, report
    assert report["sample"][0]["key"]["city"] == "elsewhere"
    cli("verify", "--table", path, "--primary-key", "id", "--target", str(target), *DESIGN, "--repair")
    assert_replicated(spark, sink, path, target)
    assert _verify(cli, path, target, *DESIGN)["ok"]


@pytest.mark.parametrize("writer", ["driver", "executors"])
def test_server_writers_follow_moved_rows(
    spark, http_sink, cli, clickhouse_http, database, tmp_path, monkeypatch, writer
):
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    path = delta_table(spark, tmp_path, "server", 400)
    target = TargetName(database, "server")
    args = ("--once", "--writer", writer, "--batch-size", "100", "--clickhouse", clickhouse_http.dsn)
    cli.replicate("run", path, target, *args, *DESIGN)
    _moves(spark, path)
    result = cli.replicate("run", path, target, *args, *DESIGN)
    assert cli.events(result, "range_written" if writer == "executors" else "batch")
    assert_replicated(spark, http_sink, path, target)


def test_schema_changes_resync_and_compact_keep_the_design(spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "evolving")
    create_table(spark, path, COLUMNS)
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
        f"'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
    )
    _load(spark, path, 0, 300)
    target = TargetName(database, "evolving")
    args = ("--once", "--on-schema-change", "resync", "--column-codecs", "note=ZSTD(5)", *DESIGN)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (note STRING)")
    cli.replicate("run", path, target, *args)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (extra INT)")  # added in place, after the first run
    spark.sql(f"UPDATE delta.`{path}` SET note = 'n', extra = 1, city = 'c8' WHERE id % 4 = 0")
    cli.replicate("run", path, target, *args)
    assert_replicated(spark, sink, path, target)
    spark.sql(f"ALTER TABLE delta.`{path}` DROP COLUMN amount")  # not followed in place: a resync
    spark.sql(f"UPDATE delta.`{path}` SET city = 'c9', created_at = DATE'2022-02-02' WHERE id % 3 = 0")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 1")
    result = cli.replicate("run", path, target, *args)
    assert cli.events(result, "resync_done")
    assert_replicated(spark, sink, path, target)
    (create,) = sink.query_rows(
        f"SELECT create_table_query FROM system.tables WHERE database = '{database}' AND name = 'evolving'"
    )[0]
    assert "ORDER BY (city, id)" in create and "CODEC(ZSTD(5))" in create, create
    cli("compact", "--target", str(target))
    assert_replicated(spark, sink, path, target)
    assert sink.query_rows(f"SELECT count() FROM {schema.qualified(target)} WHERE _is_deleted = 1")[0][0] == 0


def test_columns_left_out_renamed_retyped_and_compressed(spark, sink, cli, database, tmp_path):
    path = delta_table(spark, tmp_path, "cols", 200)
    design = (
        "--exclude-columns", "email", "--rename-columns", "name=full_name,amount=total",
        "--column-types", "city=LowCardinality(Nullable(String))", "--column-codecs", "amount=Gorilla, ZSTD(3)",
        "--table-settings", "index_granularity=1024", "--order-by", "city,id",
    )  # fmt: skip
    target, loaded = TargetName(database, "cols"), TargetName(database, "cols_snap")
    cli.replicate("run", path, target, "--once", *design)
    spark.sql(f"UPDATE delta.`{path}` SET email = 'changed', city = 'c7' WHERE id < 20")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id BETWEEN 50 AND 60")
    cli.replicate("run", path, target, "--once", *design)
    cli.replicate("snapshot", path, loaded, *design)
    delta = delta_rows(spark, path, columns=["id", "name", "city", "created_at", "amount"])
    for t in (target, loaded):
        columns = dict(sink.table_columns(t))
        assert "email" not in columns and "name" not in columns
        assert (
            columns["city"] == "LowCardinality(Nullable(String))"
            and columns["full_name"] == "Nullable(String)"
        )
        (create,) = sink.query_rows(
            f"SELECT create_table_query FROM system.tables WHERE database = '{database}' AND name = '{t.table}'"
        )[0]
        assert "CODEC(Gorilla(8), ZSTD(3))" in create and "index_granularity = 1024" in create
        assert clickhouse_rows(sink, t, ["id", "full_name", "city", "created_at", "total"]) == delta
        assert _verify(cli, path, t, *design)["ok"]


@pytest.mark.parametrize(
    "options, says, code",
    [
        (("--order-by", "city"), "does not hold primary-key column(s) id", 2),
        (("--exclude-columns", "id"), "which the target needs to identify a row", 2),
        (("--column-types", "created_at=Date"), "cannot hold every value of its Delta type", 2),
        (("--column-types", "city=LowCardinality(String)"), "LowCardinality(Nullable(String)) where", 2),
        (("--order-by", "town,id"), "--order-by names column(s) 'town'", 2),
        (("--partition-by", "toYYYYMM(day)"), "reads 'day', which is not a column of the target", 2),
        (("--table-settings", "index granularity=4"), "is not a ClickHouse table setting", 2),
        (
            ("--column-codecs", "amount=NoSuchCodec"),
            "failed to create the target table",
            1,
        ),  # ClickHouse's say
    ],
)
def test_design_refusals_write_nothing(spark, sink, cli, database, tmp_path, options, says, code):
    path = delta_table(spark, tmp_path, "refused", 10)
    result = cli.replicate("run", path, TargetName(database, "refused"), "--once", *options, expect=code)
    assert says in " ".join(result.stderr.split()), result.stderr
    assert sink.query_rows(f"SELECT count() FROM system.databases WHERE name = '{database}'")[0][0] == 0


def _blog_table(sink, target: TargetName, nullable: bool) -> None:
    sink.ensure_database(target.database)
    n = (lambda t: f"Nullable({t})") if nullable else (lambda t: t)
    sink.command(
        f"CREATE TABLE {schema.qualified(target)} (id Int64, name {n('String')}, city {n('String')}, "
        f"created_at Date, amount {n('Float64')}, email {n('String')}, _commit_version UInt64, "
        f"_commit_timestamp DateTime64(3, 'UTC'), _change_type String, _version UInt64) "
        f"ENGINE = ReplacingMergeTree(_commit_version) PARTITION BY toYYYYMM(created_at) ORDER BY (name, city)"
        f"{' SETTINGS allow_nullable_key = 1' if nullable else ''}"
    )


def test_a_hand_made_table_it_cannot_keep_equal_is_refused(spark, sink, cli, database, tmp_path):
    path = delta_table(spark, tmp_path, "blog", 50)
    target = TargetName(database, "blog")
    _blog_table(sink, target, nullable=False)
    before = sink.table_columns(target)
    result = cli.replicate("run", path, target, "--once", expect=2)
    err = " ".join(result.stderr.split())
    for part in ("already exists", "ReplacingMergeTree(_version, _is_deleted)", "no column _is_deleted",
                 "sorted by (name, city)", "column 'created_at' is Date", "no offset was recorded",
                 "CREATE TABLE IF NOT EXISTS", "ORDER BY (`name`, `city`, `id`)"):  # fmt: skip
        assert part in err, err
    assert "Traceback" not in result.stderr
    assert sink.table_columns(target) == before and sink.row_count(schema.qualified(target)) == 0
    tables = sink.query_rows(f"SELECT name FROM system.tables WHERE database = '{database}'")
    assert tables == [("blog",)]  # no state table: nothing recorded


def test_a_compatible_hand_made_table_is_adopted(spark, sink, cli, database, tmp_path):
    """Made by hand with a partition and a low-cardinality column ahead of the key."""
    path = delta_table(spark, tmp_path, "adopted", 300)
    target = TargetName(database, "adopted")
    sink.ensure_database(database)
    sink.command(
        f"CREATE TABLE {schema.qualified(target)} (id Int64, name Nullable(String), "
        f"city LowCardinality(Nullable(String)), created_at Nullable(Date32), amount Nullable(Float64), "
        f"email Nullable(String), _commit_version UInt64, _commit_timestamp DateTime64(3, 'UTC'), "
        f"_change_type LowCardinality(String), _is_deleted UInt8, _version UInt64, "
        f"_synced_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        f"ENGINE = ReplacingMergeTree(_version, _is_deleted) PARTITION BY toYYYYMM(created_at) "
        f"ORDER BY (city, id) SETTINGS allow_nullable_key = 1"
    )
    result = cli.replicate("run", path, target, "--once", expect=2)  # the design must say how it is sorted
    assert "--order-by city,id --partition-by 'toYYYYMM(created_at)'" in " ".join(result.stderr.split())
    cli.replicate("run", path, target, "--once", *DESIGN)
    _moves(spark, path)
    cli.replicate("run", path, target, "--once", *DESIGN)
    assert_replicated(spark, sink, path, target)
    assert sink.table_columns(target)["city"] == "LowCardinality(Nullable(String))"
    assert committed_version(sink, database, str(target)) > 0


def test_the_python_api_takes_the_design_as_keyword_arguments(spark, sink, chdb_dsn, database, tmp_path):
    from cdc2ch import api

    path = delta_table(spark, tmp_path, "api", 100)
    target = TargetName(database, "api")
    design = dict(order_by=["city", "id"], partition_by="toYYYYMM(created_at)", exclude_columns=["email"],
                  rename_columns={"name": "customer"},
                  column_types={"city": "LowCardinality(Nullable(String))"})  # fmt: skip
    api.replicate(spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target), **design)
    _moves(spark, path)
    result = api.replicate(
        spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target), **design
    )
    assert result.versions == 5
    assert list(sink.table_columns(target))[:5] == ["id", "customer", "city", "created_at", "amount"]
    delta = delta_rows(spark, path, columns=["id", "name", "city", "created_at", "amount"])
    assert clickhouse_rows(sink, target, ["id", "customer", "city", "created_at", "amount"]) == delta


def _gathered(sink) -> int:
    """Columns the engine has merged one at a time (the vertical algorithm's second stage), process-wide."""
    rows = sink.query_rows("SELECT value FROM system.events WHERE name = 'GatheredColumns'")
    return int(rows[0][0]) if rows else 0


def _versions(ids, commit: int, deleted) -> pa.Table:
    """Target rows (contract.arrow_rows) of `ids` at Delta version `commit`: deletes where `deleted`, inserts
    elsewhere."""
    n = len(ids)
    cdf = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}-{commit}" for i in ids]),
            "_change_type": pa.array(["delete" if d else "insert" for d in deleted]),
            "_commit_version": pa.array([commit] * n, pa.int64()),
            "_commit_timestamp": pa.array([commit * 1000] * n, pa.timestamp("ms", tz="UTC")),
        }
    )
    return contract.arrow_rows(cdf)


@pytest.mark.parametrize("vertical", [True, False], ids=["default", "users-threshold"])
def test_targets_merge_one_column_at_a_time_and_keep_final(sink, database, vertical):
    """The default settings have the engine merge a target vertically (key and version columns, then each
    other column alone), which holds far less in memory than every column at once; the user's own threshold
    wins. Either way FINAL keeps each key's newest state, tombstones hiding deleted keys."""
    settings = (("min_bytes_for_wide_part", "0"),)  # wide parts at this size: the vertical algorithm's own
    if not vertical:
        settings += (("vertical_merge_algorithm_min_columns_to_activate", "11"),)  # the engine's default
    target = TargetName(database, "merged")
    sink.ensure_database(database)
    types = {"id": "Int64", "name": "Nullable(String)"}
    sink.command(schema.target_table_ddl(target, types, TableDesign(("id",), settings=settings)))
    table = schema.qualified(target)
    # two parts of 100,000 rows (the engine merges vertically from 131,072): the second replaces half of
    # the first's keys and adds as many, every other one of its keys a tombstone
    sink.insert_arrow(table, _versions(range(100_000), 1, [0] * 100_000))
    sink.insert_arrow(table, _versions(range(50_000, 150_000), 2, [i % 2 for i in range(50_000, 150_000)]))
    before = _gathered(sink)
    sink.command(f"OPTIMIZE TABLE {table} FINAL")
    assert (_gathered(sink) > before) == vertical
    assert sink.query_rows(f"SELECT count() FROM system.parts WHERE active AND database = '{database}'") == [
        (1,)
    ]
    live = [*range(50_000), *range(50_000, 150_000, 2)]
    rows = sink.query_rows(f"SELECT count(), sum(id), countIf(name LIKE '%-2') FROM {table} FINAL")
    assert rows == [(len(live), sum(live), 50_000)]  # the second version of each key it left alive
    assert sink.query_rows(f"SELECT count(), sum(_is_deleted) FROM {table}") == [(150_000, 50_000)]
