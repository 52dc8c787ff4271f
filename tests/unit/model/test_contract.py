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
    from cdc2ch.replication.writers import pushdown

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
