"""changes.py's rules not covered by test_outranked and test_duplicates: a null sorting column never makes
two rows one key, warnings of ranges with nothing outranked, and how many versions a warning names."""

from __future__ import annotations

import pyarrow as pa

from cdc2ch.clickhouse.writers import changerows as changes
from cdc2ch.model import contract
from tests.unit.replication.test_duplicates import target_rows


def keyed_rows(*changes_: tuple[int | None, int, int, str]) -> pa.Table:
    """(ts, id, commit version, change type) -> target rows of a table sorted by (ts, id); ts may be null."""
    cdf = pa.table(
        {
            "ts": pa.array([t for t, _, _, _ in changes_], pa.int64()),
            "id": [k for _, k, _, _ in changes_],
            "_change_type": [c for _, _, _, c in changes_],
            "_commit_version": pa.array([v for _, _, v, _ in changes_], pa.int64()),
            "_commit_timestamp": pa.array([0] * len(changes_), pa.timestamp("us", tz="UTC")),
        }
    )
    return contract.arrow_rows(cdf)


def ids_and_versions(rows: pa.Table, order: pa.Array | None = None) -> list[tuple]:
    rows = rows if order is None else rows.take(order)
    return list(zip(*(rows.column(c).to_pylist() for c in ("ts", "id", "_commit_version"))))


def test_a_null_in_a_sorting_column_never_lets_one_row_outrank_another():
    rows = keyed_rows(
        (None, 1, 1, "insert"), (None, 1, 2, "insert"),  # null ts: not known to be one key, both stay
        (5, 2, 1, "insert"), (5, 2, 2, "update_preimage"), (5, 2, 2, "update_postimage"),  # an ordinary update
    )  # fmt: skip
    ready = changes.prepare(rows, ("ts", "id"), across_commits=False)
    assert ids_and_versions(ready.rows, ready.order) == [
        (None, 1, 1),
        (5, 2, 2),
        (None, 1, 2),
    ]  # replay order
    in_place = changes.latest_in_place(rows, ("ts", "id"))
    assert ids_and_versions(in_place) == [(None, 1, 1), (None, 1, 2), (5, 2, 2)]


def test_an_executor_partition_with_nothing_outranked_is_written_as_it_came():
    rows = target_rows((2, 1, "insert"), (1, 1, "insert"), (3, 2, "delete"))
    assert changes.latest_in_place(rows, ("id",)).to_pylist() == rows.to_pylist()
    single = target_rows((1, 1, "insert"))
    assert changes.latest_in_place(single, ("id",)).to_pylist() == single.to_pylist()


def test_a_range_with_nothing_outranked_still_reports_its_duplicate_keys():
    rows = target_rows((1, 3, "insert"), (1, 3, "insert"), (2, 4, "insert"))
    ready = changes.prepare(rows, ("id",), across_commits=True)
    assert ready.rows.num_rows == 3 and ready.across is None
    assert ready.duplicates == [
        {"version": 3, "duplicate_keys": 1, "extra_rows": 1, "example_key": {"id": "1"}}
    ]
    assert ready.rows.take(ready.order).column("_commit_version").to_pylist() == [3, 3, 4]


def test_duplicate_warnings_name_the_first_ten_versions_unless_told_otherwise():
    rows = target_rows(*[(k, v, "insert") for v in range(1, 13) for k in (v, v)])  # versions 1..12
    order = changes.replay_order(rows, ("id",))
    assert [d["version"] for d in changes.duplicate_keys(rows, ("id",), order)] == list(range(1, 11))
    assert [d["version"] for d in changes.duplicate_keys(rows, ("id",), order, limit=3)] == [1, 2, 3]
    prepared = changes.prepare(rows, ("id",), across_commits=False)
    assert [d["version"] for d in prepared.duplicates] == list(range(1, 11))


def test_a_key_live_again_in_a_later_commit_is_summarised_with_an_example():
    rows = target_rows(
        (7, 1, "insert"), (7, 3, "insert"),  # live at 1, live again at 3: one more row in Delta
        (6, 2, "insert"), (6, 4, "insert"), (6, 5, "insert"),  # and two more rows of another key
        (8, 1, "insert"), (8, 2, "delete"), (8, 3, "insert"),  # deleted between: not a repeat
        (9, 2, "insert"), (9, 3, "update_postimage"),  # an update's post-image: never counted
    )  # fmt: skip
    assert changes.repeated_across_commits(rows, ("id",)) == {
        "duplicate_keys": 2,
        "extra_rows": 3,
        "first_version": 3,
        "last_version": 5,
        "example_key": {"id": "6"},
    }
    assert changes.prepare(rows, ("id",), across_commits=True).across == changes.repeated_across_commits(
        rows, ("id",)
    )


def test_repeats_are_looked_for_only_across_commits():
    assert changes.repeated_across_commits(target_rows((7, 3, "insert"), (7, 3, "insert")), ("id",)) is None
    assert changes.repeated_across_commits(target_rows((7, 3, "insert")), ("id",)) is None
    assert changes.repeated_across_commits(target_rows((7, 3, "insert"), (8, 4, "insert")), ("id",)) is None
