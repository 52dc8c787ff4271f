"""A new pipeline's initial load: the pure decision (initial.py), what the log says about replaying it
(replay.py, fed real log lines), and the loop acting on it over the in-memory ports."""

from __future__ import annotations

import json

import pytest

from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.model.changeset import Commit, Files
from cdc2ch.replication.startup import initial
from cdc2ch.replication.startup.initial import CHANGES, SNAPSHOT, Facts, decide
from cdc2ch.replication.startup.replay import Replay, replay
from cdc2ch.source.deltalog.commitlog import parse_commit
from tests.support.fakes import T0, FakeTable, Harness, late_feed_table

CDF_ON = {"delta.enableChangeDataFeed": "true"}


def commits(*specs) -> list[Commit]:
    """(version, properties or None, estimated rows) -> commits, with file actions known."""
    return [Commit(v, T0, "WRITE", rows, {}, p is not None, p, Files()) for v, p, rows in specs]


# -- the decision ------------------------------------------------------------------------------------------
def test_changes_and_an_explicit_start_replay_the_feed_whatever_the_history():
    gap = Facts(commits(*[(v, None, 1) for v in (3, 4)]), interrupted=2)
    assert decide("changes", None, 0, 4, gap) == initial.Choice(
        CHANGES, 0, "--initial-load changes: the changes from version 0"
    )
    chosen = decide("auto", 3, 3, 4, gap)
    assert (chosen.load, chosen.version) == (CHANGES, 3) and "--from-version" in chosen.reason


def test_snapshot_loads_the_latest_version_and_an_interrupted_snapshot_is_resumed_at_its_own():
    assert decide("snapshot", None, 0, 9, Facts()) == initial.Choice(SNAPSHOT, 9, "--initial-load snapshot")
    resumed = decide("auto", None, 0, 9, Facts(interrupted=5))
    assert (resumed.load, resumed.version, resumed.describe()) == (SNAPSHOT, 5, "snapshot at version 5")
    assert "begun for this pipeline and not finished" in resumed.reason
    assert decide("snapshot", None, 0, 9, Facts(interrupted=5)).version == 5


@pytest.mark.parametrize(
    "facts, why",
    [
        # log retention removed versions 0..2
        (Facts(commits((3, CDF_ON, 1), (4, None, 1))), "versions 0..2 are no longer in the Delta log"),
        # CDF switched on at version 2, as the metaData action's properties say...
        (Facts(commits((0, {}, 0), (1, None, 5), (2, CDF_ON, 0))), "enabled at version 2"),
        # ... off and on again
        (Facts(commits((0, CDF_ON, 0), (1, {}, 5), (2, None, 1), (3, CDF_ON, 0))), "enabled at version 3"),
        # a file a replay reads is gone
        (
            Facts(commits((0, CDF_ON, 0), (1, None, 5)), gone=(1, "a.parquet")),
            "version 1 (a.parquet) is gone",
        ),
        # the history is much longer than the table
        (Facts(commits((0, CDF_ON, 0)), Replay(100_000, 1_500_000, None)), "about 1,500,000 change rows"),
        # one version holds more than ten reads' worth: read whole, where a snapshot reads in chunks
        (
            Facts(commits((0, CDF_ON, 20_000_000), (1, None, 5)), read_rows=500_000),
            "version 0 alone holds about 20,000,000 change rows, over 10x --max-rows-per-read (500,000)",
        ),
    ],
)
def test_auto_snapshots_where_the_feed_cannot_replay_the_history_or_costs_clearly_more(facts, why):
    chosen = decide("auto", None, 0, 4, facts)
    assert (chosen.load, chosen.version) == (SNAPSHOT, 4) and why in chosen.reason


def test_the_operation_that_switched_cdf_on_counts_too():
    found = commits((0, None, 0), (1, None, 3))
    found.append(
        Commit(2, T0, "SET TBLPROPERTIES", 0, {"properties": json.dumps(CDF_ON)}, False, None, Files())
    )
    assert initial.cdf_since(found) == 2
    assert initial.cdf_since(commits((0, CDF_ON, 0), (1, None, 3))) == 0
    assert initial.cdf_since(commits((0, None, 0))) is None


@pytest.mark.parametrize(
    "replayed",
    [
        Replay(100_000, 1_050_000, None),  # over 2x, but under a million rows more: a few seconds
        Replay(1_000_000, 1_900_000, None),  # a million rows more, but under 2x
        Replay(None, 50_000_000, None),  # no row counts to compare
        None,  # the log cannot say
    ],
)
def test_auto_replays_a_feed_that_covers_the_history_at_about_a_snapshots_cost(replayed):
    chosen = decide("auto", None, 0, 4, Facts(commits((0, CDF_ON, 0), (1, None, 5)), replayed))
    assert (chosen.load, chosen.version) == (CHANGES, 0)
    assert chosen.reason.startswith("the changes of versions 0..4 can be replayed")
    assert chosen.describe() == "changes from version 0"


def test_auto_replays_a_version_of_up_to_ten_reads():
    chosen = decide(
        "auto", None, 0, 4, Facts(commits((0, CDF_ON, 5_000_000), (1, None, 5)), read_rows=500_000)
    )
    assert (chosen.load, chosen.version) == (CHANGES, 0)


def test_snapshot_and_an_explicit_start_are_refused_together():
    h = Harness(FakeTable())
    with pytest.raises(ConfigError, match="--initial-load snapshot"):
        h.config(initial_load="snapshot", from_version=1)


# -- what the log says about a replay --------------------------------------------------------------------
def action(kind: str, path: str, records: int | None = None, data_change: bool = True, dv: int = 0) -> str:
    body = {"path": path, "size": 100, "dataChange": data_change}
    if records is not None:
        body["stats"] = json.dumps({"numRecords": records})
    if dv:
        body["deletionVector"] = {"cardinality": dv}
    return json.dumps({kind: body})


def log_commit(version: int, *actions: str) -> Commit:
    return parse_commit(version, "\n".join([json.dumps({"commitInfo": {"operation": "WRITE"}}), *actions]), 0)


def test_a_replay_counts_the_live_rows_and_finds_the_first_file_to_leave_the_table():
    history = [
        log_commit(0, json.dumps({"metaData": {"configuration": CDF_ON}})),
        log_commit(1, action("add", "a.parquet", 10)),
        log_commit(2, action("add", "b.parquet", 10)),  # an append: stays
        log_commit(3, action("remove", "a.parquet"), action("add", "c.parquet", 10)),  # overwrites a
        log_commit(4, action("remove", "b.parquet"), action("add", "b.parquet", 10, dv=4)),  # a new DV
        log_commit(
            5,
            json.dumps({"cdc": {"path": "_change_data/x.parquet", "size": 50}}),
            action("remove", "c.parquet"),
            action("add", "d.parquet", 9),
        ),
    ]
    found = replay(history)
    assert found.rows == 6 + 9  # b less its deleted rows, and d
    assert found.change_rows == sum(c.estimated_rows for c in history)
    assert found.first_gone == (1, "a.parquet")  # read as inserts by version 1, removed by version 3


def test_change_files_and_removed_files_leave_the_table_at_their_own_version():
    history = [
        log_commit(0, action("add", "a.parquet", 5)),
        log_commit(
            1,
            json.dumps({"cdc": {"path": "_change_data/y.parquet", "size": 50}}),
            action("remove", "a.parquet"),
            action("add", "b.parquet", 4),
        ),
    ]
    # a, which version 0 read, and the change file both left at version 1; of one version, its change file
    assert replay(history).first_gone == (1, "_change_data/y.parquet")
    history = [log_commit(0), log_commit(1, json.dumps({"cdc": {"path": "_change_data/y.parquet"}}))]
    assert replay(history).first_gone == (1, "_change_data/y.parquet")
    appends = [log_commit(0, action("add", "a.parquet", 5)), log_commit(1, action("add", "b.parquet", 5))]
    assert replay(appends) == Replay(10, 10, None)
    optimized = appends + [
        log_commit(
            2,
            action("remove", "a.parquet", data_change=False),
            action("remove", "b.parquet", data_change=False),
            action("add", "ab.parquet", 10, data_change=False),
        ),
    ]
    assert replay(optimized) == Replay(10, 10, (0, "a.parquet"))  # OPTIMIZE compacted what version 0 added


def test_a_replay_the_log_cannot_describe_is_unknown():
    assert replay([log_commit(0, action("add", "a.parquet"))]).rows is None  # no numRecords
    assert replay([log_commit(1, action("add", "a.parquet", 1))]) is None  # version 0 is gone
    assert replay([log_commit(0), log_commit(2)]) is None  # a gap
    assert replay([Commit(0, T0, "WRITE", 0)]) is None  # no file actions (a share)


# -- the loop --------------------------------------------------------------------------------------------
late_cdf = late_feed_table


def test_a_late_feed_read_as_the_only_source_begins_with_a_snapshot_then_follows_the_changes():
    h = Harness(late_cdf(), changes_from="cdf")
    state = h.run()
    assert h.snapshots == [3] and state.committed_version == 3 and h.final() == h.expected()
    assert (state.initial_load, state.initial_reason) == (
        "snapshot at version 3",
        "the Change Data Feed was enabled at version 2; versions before it have no change data",
    )
    assert h.store.load("p").initial_load == "snapshot at version 3" and h.lock.acquired == 1
    h.table.commit(("insert", {"id": 9, "name": "nine"}), ("delete", 1))
    state = h.run()
    assert h.snapshots == [3] and h.source.reads == [(4, 4)]  # the change feed continues after it
    assert state.committed_version == 4 and h.final() == h.expected()
    assert state.initial_load == "snapshot at version 3"  # kept for status


def test_changes_refuses_a_late_feed_as_before_and_writes_nothing():
    h = Harness(late_cdf(), initial_load="changes", changes_from="cdf")
    with pytest.raises(SourceError, match="was enabled at version 2"):
        h.run()
    assert h.db.tables == {} and h.store.states == {} and h.snapshots == []


def test_expired_log_and_vacuumed_files_begin_with_a_snapshot():
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 5)])
    t.commit(("delete", 4))
    t.first_retained = 1
    h = Harness(t)
    assert (
        h.run().initial_reason == "versions 0..0 are no longer in the Delta log (log retention removed them)"
    )
    assert h.snapshots == [2] and h.final() == h.expected()

    t = FakeTable()
    t.versions[0]["commit"] = Commit(0, T0, "CREATE TABLE", 0, {}, True, CDF_ON, Files())
    t.commit(("insert", {"id": 1, "name": "a"}), files=Files((("a.parquet", 1, True),)))
    t.commit(("delete", 1), files=Files((), (("a.parquet", 1, True),)))
    t.vacuumed.add("a.parquet")
    h = Harness(t)
    assert "version 1 (a.parquet) is gone from storage" in h.run().initial_reason
    assert h.snapshots == [2] and h.final() == h.expected() == []


def test_a_history_the_feed_covers_is_replayed_and_the_choice_recorded():
    t = FakeTable()
    t.versions[0]["commit"] = Commit(0, T0, "CREATE TABLE", 0, {}, True, CDF_ON, Files())
    t.commit(("insert", {"id": 1, "name": "a"}), files=Files((("a.parquet", 1, True),)))
    h = Harness(t)
    state = h.run()
    assert h.snapshots == [] and h.source.reads[0][0] == 0 and h.final() == h.expected()
    assert state.initial_load == "changes from version 0"
    assert state.initial_reason.startswith("the changes of versions 0..1 can be replayed, and replaying them")


def test_an_existing_offset_is_resumed_whatever_the_mode():
    h = Harness(late_cdf(), initial_load="snapshot")
    h.run()
    h.table.first_retained = 2  # log retention since: a replay from the offset still has what it needs
    h.table.commit(("delete", 1))
    replicator = h.replicator()
    assert replicator.check_inputs().initial is None
    assert replicator.run().committed_version == 4 and h.snapshots == [3] and h.final() == h.expected()


def test_a_stopped_or_killed_initial_snapshot_is_resumed_at_its_version_by_the_next_run():
    h = Harness(late_cdf(), changes_from="cdf")
    loads, load = [], h._load_snapshot

    def load_snapshot(cfg, version, comment):
        loads.append(version)
        if len(loads) == 1:  # the first chunk lands, then the stop event ends the load
            h.store.begun["p"] = version
            h.db.tables["db.t"] = {"columns": {}, "comment": "", "rows": []}
            h.stop.set()
            return None
        return load(cfg, version, comment)

    h._load_snapshot = load_snapshot
    h.run()
    assert loads == [3] and h.store.states == {}  # no offset: still a new pipeline
    h.table.commit(("delete", 1))  # v4: the table moved on meanwhile
    state = h.run()
    assert (
        loads == [3, 3] and "version 3 was begun for this pipeline and not finished" in state.initial_reason
    )
    assert state.committed_version == 4 and h.source.reads == [(4, 4)] and h.final() == h.expected()


# -- the option: flag, config file (top level, entry, pattern), Python API ---------------------------------
def test_initial_load_is_a_flag_a_config_key_and_a_keyword(tmp_path):
    from cdc2ch import api
    from cdc2ch.cli import invocation, main
    from cdc2ch.commands.invocation.options import load_config, resolve

    def resolved(*argv: str):
        given = invocation(main.commands["run"].make_context("run", list(argv)))
        return resolve(given, load_config(given))[0]

    (flag,) = resolved("--table", "/lake/a", "--primary-key", "id")
    assert flag.initial_load == "auto"
    (flag,) = resolved("--table", "/lake/a", "--primary-key", "id", "--initial-load", "changes")
    assert flag.initial_load == "changes"
    config = tmp_path / "cdc2ch.toml"
    config.write_text(
        'initial-load = "changes"\n[[pipelines]]\ntable = "/lake/a"\nprimary-key = "id"\n'
        '[[pipelines]]\ntable = "/lake/b/*"\nprimary-key = "id"\ninitial_load = "snapshot"\n'
    )
    entry, pattern = resolved("--config", str(config))
    assert entry.initial_load == "changes" and pattern.values["initial_load"] == "snapshot"
    keyword = {"table": "/d/orders", "primary_key": "id"}
    assert (
        api._config("run", "replicate", {**keyword, "initial_load": "snapshot"}, True).initial_load
        == "snapshot"
    )
    with pytest.raises(ConfigError, match="is not one of 'auto', 'snapshot', 'changes'"):
        api._config("run", "replicate", {**keyword, "initial_load": "later"}, True)


def test_a_table_loaded_in_one_commit_larger_than_ten_reads_begins_with_a_snapshot():
    t = FakeTable()
    t.versions[0]["commit"] = Commit(0, T0, "CREATE TABLE", 0, {}, True, CDF_ON, Files())
    t.commit(
        *[("insert", {"id": i, "name": f"n{i}"}) for i in range(25)], files=Files((("a.parquet", 25, True),))
    )
    h = Harness(t, batch_size=2, max_rows_per_read=2)
    assert "version 1 alone holds about 25 change rows, over 10x" in h.run().initial_reason
    assert h.snapshots == [1] and h.final() == h.expected()
