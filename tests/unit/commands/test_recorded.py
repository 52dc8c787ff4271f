"""A pipeline named on the command line is found by its records (commands/recorded.py): one lookup and one
set of refusals for `compact`, `pause`, `resume` and `resync`."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import ConfigError
from cdc2ch.commands.recorded import one_target
from cdc2ch.model.config import TargetName

pytestmark = pytest.mark.unit

WHERE = "http://default@127.0.0.1:8123/"


def test_the_one_target_recorded_or_a_paragraph_saying_what_to_do():
    orders = TargetName("sales", "orders")
    assert one_target("orders", [orders], WHERE) == orders
    with pytest.raises(ConfigError) as unknown:
        one_target("ordres", [], WHERE)
    assert str(unknown.value) == (
        f"No pipeline named 'ordres' has a record in ClickHouse at {WHERE} (a pipeline has one from its first "
        f"run). `cdc2ch status` lists the pipelines there by name. Nothing was changed."
    )
    with pytest.raises(ConfigError, match=r"records in several databases .*: sales, crm\. Add --target"):
        one_target("orders", [orders, TargetName("crm", "orders")], WHERE)


def test_a_pipeline_with_no_record_yet_is_where_its_config_or_service_names_it():
    """pause --config before the pipeline's first commit: the file (or the service running it) says where it
    is; before, `No pipeline named 'sales.items' has a record`."""
    items, elsewhere = TargetName("sales", "items"), TargetName("crm", "items")
    assert one_target("sales.items", [], WHERE, known=items) == items
    assert one_target("sales.items", [items, elsewhere], WHERE, known=items) == items  # its database's
    assert one_target("sales.items", [elsewhere], WHERE, known=items) == items  # another's is not it
