"""Rows another row of their key outranks are not written (changes.prepare, and changes.latest_in_place in
executor tasks): FINAL is the same with or without them, and the duplicate-key warnings are the same as on
all the rows."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc2ch.clickhouse.writers import changerows as changes
from cdc2ch.model import contract
from tests.unit.replication.test_duplicates import target_rows

pytestmark = pytest.mark.unit


def written(rows: pa.Table) -> list[tuple[int, int, str]]:
    ready = changes.prepare(rows, ("id",), across_commits=True)
    out = ready.rows.take(ready.order)
    return list(zip(*(out.column(c).to_pylist() for c in ("id", "_commit_version", "_change_type"))))


def final(rows: pa.Table) -> dict:
    """What ReplacingMergeTree(_version, _is_deleted) FINAL shows: per key the highest `_version`, the last
    inserted of equal ones, none when that row is a tombstone."""
    best: dict = {}
    for row in rows.to_pylist():
        if row["id"] not in best or row["_version"] >= best[row["id"]]["_version"]:
            best[row["id"]] = row
    return {k: r for k, r in best.items() if not r["_is_deleted"]}


def test_an_ordinary_updates_pre_image_and_a_delete_undone_in_its_commit_are_left_out():
    rows = target_rows(
        (1, 1, "insert"),
        (1, 2, "update_preimage"), (1, 2, "update_postimage"),  # an ordinary update
        (2, 3, "delete"), (2, 3, "insert"),  # deleted and re-inserted in one commit
        (3, 2, "update_preimage"), (4, 2, "update_postimage"),  # key 3 becomes 4: its tombstone stays
        (5, 1, "insert"), (5, 4, "delete"),  # deleted later: the tombstone stays
    )  # fmt: skip
    assert written(rows) == [  # in replay order: by _version, then key
        (3, 2, "update_preimage"),
        (1, 2, "update_postimage"),
        (4, 2, "update_postimage"),
        (2, 3, "insert"),
        (5, 4, "delete"),
    ]


def test_rows_of_a_keys_newest_version_all_stay_in_their_order():
    rows = target_rows((1, 1, "insert"), (1, 2, "insert"), (1, 2, "insert"), (2, 2, "insert"))
    rows = rows.append_column("name", pa.array(["old", "first", "second", "x"]))
    ready = changes.prepare(rows, ("id",), across_commits=True)
    assert ready.rows.take(ready.order).column("name").to_pylist() == ["first", "second", "x"]


def test_one_version_is_written_whole_in_key_order():
    rows = target_rows(*[(k, 7, "insert") for k in (3, 1, 2, 1)])
    ready = changes.prepare(rows, ("id",), across_commits=True)
    assert ready.rows is rows and ready.rows.take(ready.order).column("id").to_pylist() == [1, 1, 2, 3]


@pytest.mark.parametrize("seed", range(30))
def test_final_and_the_warnings_are_those_of_all_the_rows(seed):
    rnd = random.Random(seed)
    kinds = ("insert", "update_preimage", "update_postimage", "delete")
    picked = [
        (rnd.randrange(12), rnd.randrange(1, 5), rnd.choice(kinds)) for _ in range(rnd.randrange(2, 60))
    ]
    rows = target_rows(*picked).append_column("n", pa.array(range(len(picked))))
    everything = rows.take(changes.replay_order(rows, ("id",)))
    ready = changes.prepare(rows, ("id",), across_commits=True)
    kept = ready.rows.take(ready.order)
    assert final(kept) == final(everything)
    # An executor task's partition comes in replay order and keeps it: the same rows, in the same order.
    assert changes.latest_in_place(everything, ("id",)).equals(kept)
    assert ready.duplicates == changes.duplicate_keys(rows, ("id",), changes.replay_order(rows, ("id",)))
    assert ready.across == changes.repeated_across_commits(rows, ("id",))
    assert kept.num_rows <= rows.num_rows and set(kept.column("_version").to_pylist()) <= {
        v * 4 + r for v in range(1, 5) for r in (1, 2, 3)
    }


def test_composite_keys_compare_every_column():
    cdf = pa.table(
        {
            "a": [1, 1, 1],
            "b": ["x", "y", "x"],
            "_change_type": ["update_preimage", "update_postimage", "update_postimage"],
            "_commit_version": pa.array([2, 2, 3], pa.int64()),
            "_commit_timestamp": pa.array([0] * 3, pa.timestamp("us", tz="UTC")),
        }
    )
    ready = changes.prepare(contract.arrow_rows(cdf), ("a", "b"), across_commits=False)
    got = ready.rows.take(ready.order)
    assert list(zip(got.column("b").to_pylist(), got.column("_commit_version").to_pylist())) == [
        ("y", 2),
        ("x", 3),
    ]


# (a, b, commit version, change type): a composite key with nulls and repeats, commits 1-4
_changes = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 3)),
        st.one_of(st.none(), st.sampled_from(("x", "y", ""))),
        st.integers(1, 4),
        st.sampled_from(("insert", "update_preimage", "update_postimage", "delete")),
    ),
    max_size=40,
)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(_changes)
def test_the_replay_order_is_that_of_sorting_by_version_and_key(picked):
    """prepare's order, derived from its sort by key, is exactly replay_order's: a replay cuts the same batches
    and so gives the same deduplication tokens."""
    cdf = pa.table(
        {
            "a": pa.array([a for a, _, _, _ in picked], pa.int64()),
            "b": pa.array([b for _, b, _, _ in picked], pa.string()),
            "_change_type": pa.array([t for _, _, _, t in picked], pa.string()),
            "_commit_version": pa.array([v for _, _, v, _ in picked], pa.int64()),
            "_commit_timestamp": pa.array([0] * len(picked), pa.timestamp("us", tz="UTC")),
        }
    )
    rows = contract.arrow_rows(cdf)
    ready = changes.prepare(rows, ("a", "b"), across_commits=True)
    assert ready.order.equals(changes.replay_order(ready.rows, ("a", "b")))
