"""Keys the Delta table holds more than once, found in the change rows (issue 17, item 10): a key live in one
commit and live again in a later one, with no delete or update pre-image between, is a second row."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cdc2ch.clickhouse.writers import changerows as changes
from cdc2ch.model import contract

pytestmark = pytest.mark.unit


def target_rows(*changes_: tuple[int, int, str]) -> pa.Table:
    """(key, commit version, change type) -> rows in the target layout, as the writers get them."""
    cdf = pa.table(
        {
            "id": [k for k, _, _ in changes_],
            "_change_type": [t for _, _, t in changes_],
            "_commit_version": pa.array([v for _, v, _ in changes_], pa.int64()),
            "_commit_timestamp": pa.array([0] * len(changes_), pa.timestamp("us", tz="UTC")),
        }
    )
    return contract.arrow_rows(cdf)


def test_a_key_inserted_again_in_a_later_commit_is_a_duplicate():
    # Key 1: five rows in Delta (two at v1, one at v2, two at v3); ClickHouse keeps one.
    rows = target_rows(
        (1, 1, "insert"),
        (1, 1, "insert"),
        (1, 2, "insert"),
        (1, 3, "insert"),
        (1, 3, "insert"),
        (2, 1, "insert"),
    )
    found = changes.repeated_across_commits(rows.take([5, 3, 0, 4, 2, 1]), ("id",))
    assert found == {
        "duplicate_keys": 1,
        "extra_rows": 2,  # v2 and v3 over v1; the second rows within v1 and v3 are the per-commit warning's
        "first_version": 2,
        "last_version": 3,
        "example_key": {"id": "1"},
    }


def test_updates_deletes_and_reinserts_are_not_duplicates():
    rows = target_rows(
        (1, 1, "insert"),
        (1, 2, "update_preimage"), (1, 2, "update_postimage"),  # an ordinary update
        (1, 3, "delete"), (1, 4, "insert"),  # deleted, inserted again later
        (2, 1, "insert"), (2, 3, "delete"), (2, 3, "insert"),  # deleted and re-inserted in one commit
        (3, 1, "insert"), (3, 2, "update_preimage"), (4, 2, "update_postimage"),  # key 3 becomes 4
    )  # fmt: skip
    assert changes.repeated_across_commits(rows, ("id",)) is None
    assert changes.repeated_across_commits(target_rows((1, 1, "insert"), (1, 1, "insert")), ("id",)) is None
    # An ordinary update whose pre-image the read left out (source/deltalog/preimages.py) is still an update.
    without = target_rows((1, 1, "insert"), (1, 2, "update_postimage"), (1, 3, "update_postimage"))
    assert changes.repeated_across_commits(without, ("id",)) is None
    assert changes.repeated_across_commits(target_rows((1, 1, "insert"), (1, 2, "insert")), ("id",))
