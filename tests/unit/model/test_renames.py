"""Renames and drops told apart by column mapping field ids (model/renames.py), as --on-schema-change follow
sees them: no JVM, no ClickHouse."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import SchemaChangeError
from cdc2ch.model.design import TableDesign
from cdc2ch.model.renames import (
    Moves,
    TargetMoves,
    check_keys,
    column_moves,
    in_target,
    pending,
    renamed_columns,
)

pytestmark = pytest.mark.unit


def _schema(*fields: tuple[str, int | None]) -> dict:
    """A Spark JSON schema whose fields carry the given column mapping ids (None: no id)."""
    out = []
    for name, fid in fields:
        meta = (
            {}
            if fid is None
            else {"delta.columnMapping.id": fid, "delta.columnMapping.physicalName": f"col-{fid}"}
        )
        out.append({"name": name, "type": "string", "nullable": True, "metadata": meta})
    return {"type": "struct", "fields": out}


def test_a_rename_is_the_same_field_id_under_a_new_name():
    before = _schema(("id", 1), ("a", 2), ("b", 3))
    assert column_moves(before, _schema(("id", 1), ("a new", 2), ("b", 3))) == Moves(
        renamed=(("a", "a new"),)
    )
    assert column_moves(before, _schema(("id", 1), ("b", 3))) == Moves(dropped=("a",))
    assert (
        column_moves(before, _schema(("id", 1), ("a", 2), ("b", 3), ("c", 4))) == Moves()
    )  # an add: prepare's
    # a swap of two names is two renames, not nothing
    assert column_moves(before, _schema(("id", 1), ("b", 2), ("a", 3))) == Moves(
        renamed=(("a", "b"), ("b", "a"))
    )


def test_a_dropped_name_added_again_is_a_new_column_not_the_old_one():
    moves = column_moves(_schema(("id", 1), ("a", 2)), _schema(("id", 1), ("a", 7)))
    assert moves == Moves(replaced=("a",))
    assert "whose older rows hold no value" in in_target(moves, TableDesign(("id",))).breaking[0]


def test_without_field_ids_a_rename_cannot_be_told_from_a_drop_and_an_add():
    assert column_moves(_schema(("id", None), ("a", None)), _schema(("id", None), ("b", None))) is None
    assert column_moves(None, _schema(("id", 1))) is None
    cdf = {"name": "_change_type", "type": "string", "nullable": True, "metadata": {}}
    with_cdf = _schema(("id", 1), ("a", 2))
    with_cdf["fields"].append(cdf)  # the change feed's own columns carry no id and are not the table's
    assert column_moves(with_cdf, _schema(("id", 1), ("b", 2))) == Moves(renamed=(("a", "b"),))


def test_the_target_names_compose_with_rename_and_exclude_columns():
    design = TableDesign(("id",), rename=(("b", "contact"),), exclude=("secret",))
    moves = Moves(renamed=(("a", "a2"), ("b", "b2"), ("secret", "s2")), dropped=("secret",))
    # --rename-columns names Delta's columns: `b` renamed away from under it waits for the option to follow
    got = in_target(moves, design)
    assert got.renamed == (("a", "a2"),)
    assert got.dropped == ()
    assert "name it 'b2' there and run again" in got.breaking[0]
    assert "left out by --exclude-columns" in got.breaking[1]
    # the config updated to the new name: the target keeps its name, nothing to do
    updated = TableDesign(("id",), rename=(("b2", "contact"),))
    assert in_target(Moves(renamed=(("b", "b2"),)), updated).renamed == (("b", "contact"),)
    # a column renamed into an excluded name leaves the target: a drop
    assert in_target(Moves(renamed=(("a", "secret"),)), design) == TargetMoves(dropped=("a",))


def test_pending_skips_what_a_crash_left_done_and_refuses_what_is_unclear():
    moves = TargetMoves(renamed=(("a", "a2"), ("b", "b2")), dropped=("c",))
    assert pending(["id", "a", "b", "c"], moves) == ([("a", "a2"), ("b", "b2")], ["c"], [])
    assert pending(["id", "a2", "b", "c"], moves) == ([("b", "b2")], ["c"], [])  # killed after the first
    assert pending(["id", "a2", "b2"], moves) == ([], [], [])  # all done: a rerun changes nothing
    _, _, refused = pending(["id", "b", "b2"], moves)
    assert refused == [
        "column 'a' was renamed to 'a2', and the target has neither",
        "column 'b' was renamed to 'b2', a name the target already has",
    ]
    current = {"id": "Int32", "a": "String", "c": "Int64", "_version": "UInt64"}
    assert list(renamed_columns(current, [("a", "a2")], ["c"])) == ["id", "a2", "_version"]


@pytest.mark.parametrize(
    "design, moves, role",
    [
        (TableDesign(("id",)), Moves(renamed=(("id", "key"),)), "primary-key"),
        (
            TableDesign(("id",), order_by=("region", "id")),
            Moves(renamed=(("region", "area"),)),
            "sorting-key",
        ),
        (TableDesign(("id",), partition_by="toYYYYMM(day)"), Moves(dropped=("day",)), "partition"),
        (TableDesign(("id",), rename=(("id", "key"),)), Moves(renamed=(("id", "k2"),)), "primary-key"),
    ],
)
def test_a_key_column_renamed_or_dropped_is_refused_in_a_paragraph(design, moves, role):
    with pytest.raises(SchemaChangeError) as info:
        check_keys(moves, design, "/lake/t at version 5 (RENAME COLUMN)", 4, "db.t")
    text = str(info.value)
    assert f"is a {role} column of ClickHouse table db.t" in text
    assert "cannot rename or drop a column of a table's sorting or partition key in place" in text
    assert "replication stopped with version 4 committed and the table unchanged" in text
    assert "new --target" in text


def test_other_columns_pass_the_key_check():
    check_keys(Moves(renamed=(("a", "b"),), dropped=("c",)), TableDesign(("id",)), "t", 1, "db.t")
