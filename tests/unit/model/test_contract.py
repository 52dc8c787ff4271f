"""The row contract: one rule, rendered as Arrow and SQL, and the token formats."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest

from cdc2ch.base.errors import SourceError
from cdc2ch.model import contract

TS = datetime(2026, 1, 1, tzinfo=timezone.utc)


def cdf(*rows) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"id": k, "v": v, "_change_type": t, "_commit_version": c, "_commit_timestamp": TS}
            for k, v, t, c in rows
        ]
    )


def test_ranks_order_a_commit_so_the_keys_last_state_wins():
    assert [contract.version(7, t) for t in ("update_preimage", "delete", "insert", "update_postimage")] == [
        29,
        30,
        31,
        31,
    ]
    assert contract.version(7, contract.SNAPSHOT) == 31
    # every row of a later commit outranks every row of an earlier one
    assert contract.first_version(8) > max(contract.version(7, t) for t in contract.RANK)


def test_arrow_form_applies_the_rule():
    rows = contract.arrow_rows(
        cdf(
            (1, "a", "insert", 3),
            (2, "b", "update_preimage", 3),
            (2, "c", "update_postimage", 3),
            (4, "d", "delete", 5),
        )
    )
    assert rows.column_names == ["id", "v", *contract.WRITTEN_META]
    assert rows.column("_version").to_pylist() == [15, 13, 15, 22]
    assert rows.column("_is_deleted").to_pylist() == [0, 1, 0, 1]
    assert rows.column("_change_type").to_pylist() == [
        "insert",
        "update_preimage",
        "update_postimage",
        "delete",
    ]


def test_immutable_keys_drops_pre_images_only():
    rows = contract.arrow_rows(
        cdf((2, "b", "update_preimage", 3), (2, "c", "update_postimage", 3), (4, "d", "delete", 3)), True
    )
    assert rows.column("_change_type").to_pylist() == ["update_postimage", "delete"]
    assert contract.sql_change_filter(True) == " WHERE _change_type != 'update_preimage'"
    assert contract.sql_change_filter(False) == ""


def test_sql_form_renders_the_same_ranks():
    meta = contract.sql_change_meta()
    assert len(meta) == len(contract.WRITTEN_META)
    assert meta[-1] == (
        "toUInt64(_commit_version) * 4 + multiIf(_change_type = 'delete', 2, _change_type = 'update_preimage', 1, 3)"
    )
    assert meta[3] == "toUInt8(_change_type IN ('delete', 'update_preimage'))"
    fixed = contract.sql_fixed_meta(9, 1000, "delete")
    assert fixed[2:] == ["'delete'", "toUInt8(1)", "toUInt64(38)"]


def test_token_formats_and_their_batch_number():
    batch = pa.table({"id": [1, 2]})
    digest = contract.digest(batch)
    assert len(digest) == 20 and digest != contract.digest(pa.table({"id": [1, 3]}))
    tokens = [
        contract.driver_batch_token("p", 3, 5, 2, batch),
        contract.executor_batch_token(contract.range_token("p", 3, 5), 7, 2, batch),
        contract.snapshot_batch_token("p", 9, "spark:abc", 4, 2, batch),
    ]
    assert tokens == [f"p:3-5:2:{digest}", f"p:3-5:p7:2:{digest}", f"p:snap9:spark:abc:4:2:{digest}"]
    assert [contract.batch_index(t) for t in tokens] == [2, 2, 2]
    others = [contract.pushdown_range_token("p", 3, 5), contract.snapshot_chunk_token("p", 9, "x", 1)]
    assert others == ["p:3-5:clickhouse", "p:snap9:x:1"]
    assert [contract.batch_index(t) for t in [*others, contract.sweep_token("p", 9), ""]] == [None] * 4


def test_every_insert_into_a_target_drops_a_replay_and_leaves_the_replacing_pass_to_merges():
    """One set of insert settings for the Arrow inserts, the executors' and the push-down statement, which
    also refuses a null key instead of storing 0 or ''."""
    from cdc2ch.clickhouse.writers import pushdown

    assert contract.target_insert("tok") == {
        "insert_deduplicate": 1, "insert_deduplication_token": "tok", "optimize_on_insert": 0,
    }  # fmt: skip
    assert contract.target_insert(None) == {"insert_deduplicate": 0, "optimize_on_insert": 0}
    assert pushdown.insert_settings("tok") == {"insert_null_as_default": 0, **contract.target_insert("tok")}


def test_null_keys_are_found_and_refused():
    rows = contract.arrow_rows(cdf((1, "a", "insert", 3), (None, "b", "insert", 4), (None, "c", "insert", 5)))
    assert contract.null_keys(rows, ("id",)) == ("id", 2, 4)
    assert contract.null_keys(rows.slice(0, 1), ("id",)) is None
    with pytest.raises(
        SourceError, match=r"2 row\(s\) in here have a null in primary-key column 'id' \(first at version 4\)"
    ):
        contract.check_keys(rows, ("id",), "here")


def test_repair_rows_sit_between_their_commit_and_the_next():
    assert contract.version(7, contract.REPAIR) == contract.version(7, contract.REPAIR_DELETE) == 32
    assert (
        max(contract.version(7, t) for t in contract.RANK)
        < 32
        < min(contract.version(8, t) for t in contract.RANK)
    )
    assert contract.is_deleted(contract.REPAIR_DELETE) and not contract.is_deleted(contract.REPAIR)
    assert "_change_type = 'repair', 4" in contract.sql_version()
    assert "repair" not in contract.sql_change_meta()[-1]  # a change feed never carries repair rows
    assert contract.sql_fixed_meta(7, 0, contract.REPAIR_DELETE)[3:] == ["toUInt8(1)", "toUInt64(32)"]


def test_a_change_type_the_rule_does_not_list_is_a_live_row_of_the_top_rank():
    assert contract.version(7, "some_future_type") == 7 * contract.SLOTS + contract.LIVE_RANK == 31
    assert not contract.is_deleted("some_future_type")


def test_rows_before_a_commit_are_those_of_earlier_commit_versions():
    assert contract.sql_before(12) == "_commit_version < 12"
    assert contract.first_version(12) == 48 == contract.version(12, "update_preimage") - 1


def test_sql_literals_escape_backslashes_and_quotes():
    assert contract.sql_literal("it's") == r"'it\'s'"
    assert contract.sql_literal("a\\b") == r"'a\\b'"
    assert contract.sql_literal("\\'") == r"'\\\''"


def test_sql_form_writes_every_metadata_column_from_the_change_feed():
    assert contract.sql_change_meta() == [
        "toUInt64(_commit_version)",
        "toDateTime64(_commit_timestamp, 3, 'UTC')",
        "_change_type",
        "toUInt8(_change_type IN ('delete', 'update_preimage'))",
        "toUInt64(_commit_version) * 4 + multiIf(_change_type = 'delete', 2, _change_type = 'update_preimage', 1, 3)",
    ]


def test_arrow_form_keeps_not_null_metadata_not_null_as_spark_gives_it():
    """`_is_deleted` is as nullable as `_change_type`, `_version` as `_commit_version`: the same schema, the same
    batches and digests as the rows Spark collects."""
    for nullable in (False, True):
        schema = pa.schema(
            [
                pa.field("id", pa.int64(), False),
                pa.field("_change_type", pa.string(), nullable),
                pa.field("_commit_version", pa.int64(), nullable),
                pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC"), False),
            ]
        )
        table = pa.Table.from_pylist(
            [{"id": 1, "_change_type": "insert", "_commit_version": 3, "_commit_timestamp": TS}],
            schema=schema,
        )
        rows = contract.arrow_rows(table)
        assert rows.schema.field("_is_deleted").nullable is nullable
        assert rows.schema.field("_version").nullable is nullable
        assert rows.schema.field("_version").type == pa.int64()


def test_a_null_key_without_a_version_column_is_reported_at_an_unknown_version():
    rows = pa.table({"id": [1, None]})
    assert contract.null_keys(rows, ("id",)) == ("id", 1, "?")
    with pytest.raises(SourceError, match=r"first at version \?\)"):
        contract.check_keys(rows, ("id",), "the snapshot")


def test_a_token_whose_last_part_is_no_digest_has_no_batch_number():
    assert contract.batch_index("p:3-5:2:" + "d" * 20) == 2
    assert contract.batch_index("p:3-5:2:not-a-digest") is None
    assert contract.batch_index("p:3-5:x:" + "d" * 20) is None


def test_repair_tokens_name_the_version_and_the_rows():
    batch = pa.table({"id": [1, 2]})
    token = contract.repair_token("p", 9, batch)
    assert token == f"p:repair9:{contract.digest(batch)}"
    assert token != contract.repair_token("p", 9, pa.table({"id": [1, 3]}))


def test_the_digest_feed_is_a_write_only_file_pyarrow_can_close():
    chunks: list[bytes] = []
    feed = contract._Feed(chunks.append)
    sink = pa.PythonFile(feed, mode="w")
    sink.write(b"abc")
    sink.flush()
    assert not feed.closed
    sink.close()
    assert feed.closed is True and b"".join(chunks) == b"abc"


# -- snapshot rows: constants appended to a table's rows ------------------------------------------------------
META = pa.schema(
    [
        pa.field("_commit_version", pa.int64(), False),
        pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC"), True),
        pa.field("_change_type", pa.string(), False),
        pa.field("_is_deleted", pa.int8(), False),
        pa.field("_version", pa.int64(), False),
    ]
)
MS = 1767225600123  # 2026-01-01 00:00:00.123 UTC


def snapshot_table() -> pa.Table:
    return pa.table({"id": pa.array([1, 2, 3], pa.int32()), "a.b`c": ["x", None, "z"]})


@pytest.mark.parametrize(
    "change_type, deleted, version",
    [
        (contract.SNAPSHOT, 0, 12 * 4 + 3),
        (contract.REPAIR, 0, 12 * 4 + 4),
        (contract.REPAIR_DELETE, 1, 12 * 4 + 4),
    ],
)
def test_snapshot_rows_are_the_tables_rows_with_constant_metadata(change_type, deleted, version):
    rows = contract.arrow_snapshot_rows(snapshot_table(), 12, MS, META, change_type)
    assert rows.schema == pa.schema([*snapshot_table().schema, *META])
    ts = datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=timezone.utc)
    assert rows.to_pylist() == [
        {**r, "_commit_version": 12, "_commit_timestamp": ts, "_change_type": change_type,
         "_is_deleted": deleted, "_version": version}
        for r in snapshot_table().to_pylist()
    ]  # fmt: skip


def test_snapshot_rows_default_to_the_snapshot_change_type_and_of_no_rows_are_none():
    rows = contract.arrow_snapshot_rows(snapshot_table(), 12, MS, META)
    assert set(rows.column("_change_type").to_pylist()) == {contract.SNAPSHOT}
    assert set(rows.column("_version").to_pylist()) == {contract.version(12, contract.SNAPSHOT)}
    empty = contract.arrow_snapshot_rows(snapshot_table().slice(0, 0), 12, MS, META)
    assert empty.num_rows == 0 and empty.schema == rows.schema


# -- Spark form: the same rule, evaluated by tests/unit/model/spark_columns.py ------------------------------------
CHANGES = [
    (1, "a", "insert", 3),
    (2, "b", "update_preimage", 3),
    (2, "c", "update_postimage", 3),
    (4, "d", "delete", 3),
    (5, "e", "update_preimage", 5),
    (5, "f", "update_postimage", 5),
    (6, None, "insert", 5),
]


def spark_frame(rows=CHANGES):
    from tests.support.spark_columns import Frame

    # a user column whose name has a dot and a backtick: Spark must not read it as a nested field
    return Frame(
        [
            {"id": k, "a.b`c": v, "_change_type": t, "_commit_version": c, "_commit_timestamp": TS}
            for k, v, t, c in rows
        ]
    )


def arrow_changes(rows=CHANGES) -> pa.Table:
    return pa.Table.from_pylist(spark_frame(rows).rows)


def test_spark_col_names_a_top_level_column_exactly(monkeypatch):
    from tests.support import spark_columns

    spark_columns.installed(monkeypatch)
    row = {"a.b`c": 1, "a": {"b`c": 2}, "plain": 3}
    assert contract.spark_col("a.b`c").eval(row) == 1
    assert contract.spark_col("plain").eval(row) == 3
    assert contract.spark_col("a.b`c").name == "a.b`c"


def test_spark_form_gives_the_rows_the_arrow_form_gives(monkeypatch):
    from tests.support import spark_columns

    spark_columns.installed(monkeypatch)
    rows = contract.spark_rows(spark_frame())
    expected = contract.arrow_rows(arrow_changes())
    assert rows.columns == expected.column_names == ["id", "a.b`c", *contract.WRITTEN_META]
    assert rows.rows == expected.to_pylist()
    assert [r["_version"] for r in rows.rows] == [15, 13, 15, 14, 21, 23, 23]


def test_spark_form_leaves_out_the_pre_images_asked(monkeypatch):
    from tests.support import spark_columns

    spark_columns.installed(monkeypatch)

    def kept(frame) -> list[tuple[int, str]]:
        return [(r["_commit_version"], r["_change_type"]) for r in frame.rows]

    every = [(c, t) for _, _, t, c in CHANGES]
    assert kept(contract.spark_changes(spark_frame())) == every
    no_preimages = [(c, t) for c, t in every if t != contract.PREIMAGE]
    assert kept(contract.spark_changes(spark_frame(), no_preimages=True)) == no_preimages
    assert kept(contract.spark_changes(spark_frame(), no_preimages=True, needless={5})) == no_preimages
    # only the pre-images of the commits named: commit 5's stays, and no other row of commit 3 goes
    needless_3 = [(c, t) for c, t in every if (c, t) != (3, contract.PREIMAGE)]
    assert kept(contract.spark_changes(spark_frame(), needless={3})) == needless_3
    assert kept(contract.spark_changes(spark_frame(), needless=[3, 4])) == needless_3
    assert kept(contract.spark_rows(spark_frame(), needless={3})) == needless_3
    assert kept(contract.spark_rows(spark_frame(), no_preimages=True)) == no_preimages
    assert (
        contract.spark_rows(spark_frame(), True).rows
        == contract.arrow_rows(arrow_changes(), True).to_pylist()
    )


@pytest.mark.parametrize("change_type", [contract.SNAPSHOT, contract.REPAIR])
def test_spark_snapshot_rows_are_the_arrow_snapshot_rows(monkeypatch, change_type):
    from tests.support import spark_columns

    spark_columns.installed(monkeypatch)
    frame = spark_columns.Frame(snapshot_table().to_pylist())
    rows = contract.spark_snapshot_rows(frame, 12, MS, change_type)
    expected = contract.arrow_snapshot_rows(snapshot_table(), 12, MS, META, change_type)
    assert rows.columns == expected.column_names
    assert rows.rows == expected.to_pylist()
    default = contract.spark_snapshot_rows(frame, 12, MS)
    assert default.rows == contract.arrow_snapshot_rows(snapshot_table(), 12, MS, META).to_pylist()


def test_files_gone_says_what_is_gone_and_how_to_resync():
    error = contract.files_gone_error("/lake/t", "versions 3 to 5")
    assert isinstance(error, SourceError)
    assert str(error) == (
        "Files needed to read versions 3 to 5 of /lake/t are gone (removed by VACUUM or log retention). These "
        "changes can no longer be replayed: resync with `cdc2ch snapshot` at the latest version, then `cdc2ch "
        "run` continues from there."
    )
