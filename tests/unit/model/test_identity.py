"""A target row's identity: the sorting key and the columns the partition expression reads."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.model.identity import Identity, expression_columns


def test_a_partition_expression_reads_its_quoted_and_bare_column_names():
    assert expression_columns("toYYYYMM(ts)") == ("ts",)
    assert expression_columns('toYYYYMM("event time"), `region`') == ("event time", "region")
    assert expression_columns(r"(`a\`b`, cityHash64('c'))") == ("a`b",)
    assert expression_columns(r'("x\"y", `p\\q`)') == ('x"y', "p\\q")
    assert expression_columns("if(kind = 'a b', ts + INTERVAL 1 DAY, ts) AND NOT flag IS NULL") == (
        "kind",
        "ts",
        "flag",
    )
    assert expression_columns(None) == expression_columns("") == ()


def test_a_sorting_key_must_hold_the_whole_primary_key():
    with pytest.raises(ConfigError) as refused:
        Identity.of(("id", "region", "zone"), ("ts", "id"))
    assert str(refused.value).startswith(
        "The sorting key (ts, id) does not hold primary-key column(s) region, zone. "
    )
    assert "Add region, zone to --order-by" in str(refused.value)


def test_a_sorting_key_names_each_column_once():
    with pytest.raises(ConfigError, match="^--order-by ts,id,ts names a column twice.$"):
        Identity.of(("id",), ("ts", "id", "ts"))


def test_identity_columns_are_the_sorting_key_then_the_partition_columns():
    identity = Identity.of(("id",), ("ts", "id"), "toYYYYMM(day), id")
    assert identity.columns == ("ts", "id", "day")
    assert identity.sorting_extra == ("ts", "day")


@pytest.mark.parametrize(
    "order_by, partition_by, moves",
    [((), None, False), (("id",), "id", False), (("ts", "id"), None, True), ((), "toYYYYMM(day)", True)],
)
def test_an_update_can_move_a_row_only_when_identity_has_columns_beyond_the_primary_key(
    order_by, partition_by, moves
):
    assert Identity.of(("id",), order_by, partition_by).moves() is moves
