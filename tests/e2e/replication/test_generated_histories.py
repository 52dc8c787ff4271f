"""Generated histories: Hypothesis draws a Delta history (inserts, updates moving rows, deletes, MERGEs,
key changes, delete and re-insert in one commit, overwrites, deleted partitions, added columns, checkpoints,
OPTIMIZE) on a table with a change data feed or without one (its changes then derived from its log), delta-rs
writes it, and both readers replicate it into the embedded ClickHouse, one pipeline
running after every version and one running once for the whole history (Spark deriving each of its ranges
from the log at once wherever it can: netchanges.py), in ranges of drawn sizes; after
each run FINAL equals the Delta table at the version it reached (read by delta-rs; Spark reads the last
version too). Between the runs of the first, a service's merge upkeep (fleet/merges.py) is forced to merge
every partition it would: FINAL is the same after it.

Derandomized: every run replays the same examples. Longer runs: `CDC2CH_HISTORY_EXAMPLES=N` draws N examples
(default 4), `CDC2CH_HISTORY_LENGTH=N` histories of up to N operations (default 8)."""

from __future__ import annotations

import itertools
import os
import threading
from functools import partial

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from cdc2ch.clickhouse.tables import merging
from cdc2ch.fleet.merges import FinalMerges
from cdc2ch.model import changeset
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.replication.metrics import Metrics
from cdc2ch.replication.standing import StepOutcome
from tests.support.helpers import assert_rows_equal, clickhouse_rows, delta_rows, delta_rs_rows
from tests.support.histories import History, Layout, keys, layouts, operations

EXAMPLES = int(os.environ.get("CDC2CH_HISTORY_EXAMPLES", "4"))
LENGTH = int(os.environ.get("CDC2CH_HISTORY_LENGTH", "8"))
READERS = ("spark", "clickhouse")
COLUMNS = ["id", "grp", "name", "v"]
_ids = itertools.count()

read_sizes = st.sampled_from((1, 3, 500_000))  # --max-rows-per-read: a range per version, a few, everything

# Every kind of operation at least once, for every run whatever is drawn (MERGE inserts and deletes).
EVERY_KIND = [
    ("update", [0, 2], True),
    ("rekey", [(0, 7), (1, 3), (3, 1)], True),  # a move to a free key and a swap, both to another group
    ("merge", [1, 12], [4, 9], True),
    ("add_column", True),
    ("replace", [3, 12, 13]),
    ("checkpoints",),
    ("delete_group", 2),
    ("add_column", False),
    ("optimize",),
    ("overwrite", [1, 3, 15]),
]


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,  # no examples saved between runs: every run replays exactly the same
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    layouts,
    keys,
    st.lists(operations, min_size=3, max_size=LENGTH),
    st.fixed_dictionaries({r: st.tuples(read_sizes, read_sizes) for r in READERS}),
)
@example(
    Layout(True, True), [0, 1, 2, 3, 4, 5, 6], EVERY_KIND, {"spark": (1, 500_000), "clickhouse": (500_000, 3)}
)
@example(  # the same on a table without a feed: every kind derived from the log, by both readers
    Layout(False, True, feed=False),
    [0, 1, 2, 3, 4, 5, 6],
    EVERY_KIND,
    {"spark": (500_000, 3), "clickhouse": (1, 3)},
)
def test_final_equals_delta_after_every_run(spark, sink, cli, tmp_path_factory, layout, first, ops, sizes):
    history, database = _new(tmp_path_factory, layout)

    merged = []

    def run(pipeline: str, size: int) -> None:
        with pytest.MonkeyPatch.context() as patch:
            if (
                pipeline == "whole"
            ):  # Spark derives each range of the log at once wherever it can, paying or not
                patch.setattr(changeset.FileSpan, "pays", lambda span: span.derivable)
            for reader in READERS:
                target = TargetName(database, f"{reader}_{pipeline}")
                merged.append(
                    _run_and_compare(
                        sink, cli, history, target, reader, sizes[reader][size], upkeep=pipeline == "each"
                    )
                )

    history.create(first)
    run("each", 0)
    for op in ops:
        done = history.apply(op)
        event(f"commit: {done}")
        if done is not None:  # else nothing was committed
            run("each", 0)
    run("whole", 1)
    if ops is EVERY_KIND:  # a drawn history may commit too little to leave parts to merge
        assert sum(merged) > 0, "the upkeep never merged: nothing was shown"
    # The reference is read by delta-rs, which wrote the table: Spark must read the same rows.
    columns = COLUMNS + history.extra
    latest = history.version()
    assert_rows_equal(
        delta_rows(spark, history.path, latest, columns),
        delta_rs_rows(history.path, latest, columns),
        "Spark vs delta-rs",
    )


def test_the_comparison_fails_where_key_changes_are_lost(spark, sink, cli, tmp_path_factory):
    """The property can fail: told that keys never change (`--immutable-keys`, pre-images not read), a
    replica keeps the row at its old key after a key-changing update, and the comparison says so."""
    history, database = _new(tmp_path_factory, Layout(False, False))
    history.create([0, 1])
    assert history.apply(("rekey", [(0, 5)], False)) == "rekey"
    with pytest.raises(AssertionError, match=r"3 vs 2 rows|2 vs 3 rows"):
        _run_and_compare(sink, cli, history, TargetName(database, "t"), "spark", 500_000, "--immutable-keys")


def _new(tmp_path_factory, layout: Layout) -> tuple[History, str]:
    n = next(_ids)
    return History(str(tmp_path_factory.mktemp(f"history{n}") / "t"), layout), f"h{os.getpid()}_{n}"


def _run_and_compare(
    sink, cli, history: History, target, reader: str, rows: int, *options: str, upkeep: bool = False
) -> int:
    """`run --once` of `target`'s pipeline, then FINAL must equal Delta at the version the run found; with
    `upkeep`, again once a service's upkeep has merged every partition it would. Returns its merges."""
    version = history.version()
    cli.replicate(
        "run", history.path, str(target), "--once", "--reader", reader, "--initial-load", "changes",
        "--max-rows-per-read", str(rows), *history.layout.options(), *options,
    )  # fmt: skip
    columns = COLUMNS + history.extra
    expected = delta_rs_rows(history.path, version, columns)
    assert len({row[0] for row in expected}) == len(expected), (
        f"the generated history repeats a key: {expected}"
    )
    assert_rows_equal(expected, clickhouse_rows(sink, target, columns), f"{target} after version {version}")
    if not upkeep:
        return 0
    done = _upkeep(sink, target)
    assert_rows_equal(
        expected,
        clickhouse_rows(sink, target, columns),
        f"{target} after version {version} and {done} merges",
    )
    return done


def _upkeep(sink, target: TargetName) -> int:
    """A service's merges of `target` after a caught-up turn, each due at once, until none is left."""
    ticks = itertools.count(0, 10**6)  # every interval and share elapsed at each look
    merges = FinalMerges(partial(merging.partitions, sink), partial(merging.merge, sink), threading.Lock(),
                         clock=lambda: float(next(ticks)), start=lambda job: job())  # fmt: skip
    cfg = RunConfig("/t", ("id",), target, "chdb:///x", str(target))
    turn, metrics = StepOutcome(committed=True, caught_up=True), Metrics().pipeline(str(target))
    done = 0
    while merges.after_turn(cfg, turn, metrics):
        done += 1
        assert done < 100, f"merges of {target} never end"
    return done
