"""Table patterns: which `--table` values are patterns, what each lists, and each table's key and target."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.commands.invocation.catalogue import table_keys
from cdc2ch.commands.invocation.options import Invocation, convert, options_of, resolve
from cdc2ch.fleet import patterns
from cdc2ch.fleet.patterns import CATALOG, SHARING, STORAGE, Match, Pattern, TablePattern
from cdc2ch.model.config import TargetName

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("/lake/sales/*", Pattern("/lake/sales/*", STORAGE, ("/lake/sales",), ("*",))),
        (
            "s3a://lake/sales/orders_*",
            Pattern("s3a://lake/sales/orders_*", STORAGE, ("s3a://lake/sales",), ("orders_*",)),
        ),
        ("/lake/*/t?", Pattern("/lake/*/t?", STORAGE, ("/lake",), ("*", "t?"))),
        ("sales.*", Pattern("sales.*", CATALOG, ("sales",), ("*",))),
        ("main.sales.orders_*", Pattern("main.sales.orders_*", CATALOG, ("main", "sales"), ("orders_*",))),
        ("./p.share#s.sch.*", Pattern("./p.share#s.sch.*", SHARING, ("./p.share", "s", "sch"), ("*",))),
        ("./p.share#s.*", Pattern("./p.share#s.*", SHARING, ("./p.share", "s", ""), ("*",))),
    ],
)
def test_patterns_by_kind(text, pattern):
    assert patterns.is_pattern(text)
    assert patterns.parse_pattern(text) == pattern


@pytest.mark.parametrize(
    "text", ["/lake/orders", "sales.orders", "main.sales.orders", "./p.share#s.sch.t", None]
)
def test_plain_tables_are_not_patterns(text):
    assert not patterns.is_pattern(text)


@pytest.mark.parametrize(
    "text, why",
    [
        ("sal*.orders", "only the table part"),
        ("a.b.c.*", "only the table part"),
        ("./p.share#s.ord*", "a glob over a whole share is `*`"),
        ("./p.share#s*.sch.t*", "a shared pattern is"),
    ],
)
def test_bad_patterns_are_refused_with_the_forms_that_work(text, why):
    with pytest.raises(ConfigError, match="reads as a pattern of tables") as err:
        patterns.parse_pattern(text)
    assert why in str(err.value) and "/lake/sales/*" in str(err.value)


def test_a_catalog_glob_matches_table_names_case_sensitively():
    p = patterns.parse_pattern("sales.orders_*")
    assert p.matches("orders_eu") and not p.matches("Orders_eu") and not p.matches("customers")


MATCH = Match("/lake/sales/orders.v2", "orders.v2", "sales")


def test_targets_come_from_the_template_part_by_part():
    assert patterns.target_of(None, MATCH) == TargetName(
        "cdc2ch", "orders.v2"
    )  # a dotted name stays one part
    assert patterns.target_of("analytics.{table}", MATCH) == TargetName("analytics", "orders.v2")
    assert patterns.target_of("{schema}.raw_{table}", MATCH) == TargetName("sales", "raw_orders.v2")
    with pytest.raises(ConfigError, match=r"not a target template: 'tabel'.*\{table\} \(the table's name\)"):
        patterns.target_of("analytics.{tabel}", MATCH)


def test_keys_per_table_then_the_default():
    keys = dict(table_keys(("orders=tenant,id", "customers=id")))
    assert keys == {"orders": ("tenant", "id"), "customers": ("id",)}
    assert patterns.key_of("orders", ("id",), keys) == ("tenant", "id")
    assert patterns.key_of("items", ("id",), keys) == ("id",)
    assert patterns.key_of("items", None, keys) == ()


def test_keys_from_a_config_file_table():
    option = next(o for o in options_of("run") if o.name == "primary-keys")
    value = convert(option, {"orders": ["tenant", "id"], "customers": "id"})
    assert value == (("orders", ("tenant", "id")), ("customers", ("id",)))


def test_two_tables_into_one_target_are_refused_naming_both():
    a, b = Match("/l/x/t", "t", "x"), Match("/l/y/t", "t", "y")
    with pytest.raises(ConfigError, match=r"Tables /l/x/t and /l/y/t, both matched by --table '/l/\*/t'"):
        patterns.check_targets("/l/*/t", [(a, TargetName("c", "t")), (b, TargetName("c", "t"))])
    patterns.check_targets("/l/*/t", [(a, TargetName("x", "t")), (b, TargetName("y", "t"))])


def test_a_pattern_resolves_to_a_table_pattern_left_for_discovery():
    values = {o.param: o.default for o in options_of("run")}
    values.update(table="/lake/sales/*", primary_key=None, primary_keys=(("orders", ("id",)),))
    (item,), _ = resolve(Invocation("run", values), None)
    assert (
        isinstance(item, TablePattern) and item.text == "/lake/sales/*" and item.pipeline == "/lake/sales/*"
    )
