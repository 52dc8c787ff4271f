"""The replication loop on in-memory ports: histories, crashes, stops, schema breaks and resync recovery.

Each test ends by comparing FINAL of the in-memory target with the fake table at the committed version:
the rule the real tests check on Spark and ClickHouse, here in milliseconds.
"""

from __future__ import annotations

from functools import partial

import pytest
from structlog.testing import capture_logs

from cdc2ch.base.errors import SchemaChangeError, SourceError, StateError
from cdc2ch.model.design import TableDesign
from cdc2ch.replication import plan
from cdc2ch.replication.fullload import resync
from cdc2ch.replication.plan import state_pointed_at
from tests.support.fakes import Crash, FakeTable, Harness


def history() -> FakeTable:
    t = FakeTable()
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 6)])
    t.commit(("update", 2, {"name": "two"}), ("delete", 3))
    t.commit(("update", 4, {"id": 40}), ("insert", {"id": 4, "name": "again"}))  # key change, key re-used
    t.commit(("delete", 1), ("insert", {"id": 1, "name": "back"}))  # deleted and re-inserted in one commit
    return t


def test_a_history_replicates_and_a_rerun_changes_nothing():
    h = Harness(history())
    state = h.run()
    assert state.committed_version == h.table.latest and h.final() == h.expected()
    raw = len(h.db.tables["db.t"]["rows"])
    assert h.run().committed_version == h.table.latest  # nothing new: nothing to claim (test_idle_claim.py)
    assert len(h.db.tables["db.t"]["rows"]) == raw and h.lock.acquired == 1 and not h.lock.held


def test_every_read_is_told_the_columns_that_identify_a_row_in_the_source_s_names():
    """What lets a source leave out the pre-images another row of their key outranks (preimages.py)."""
    h = Harness(history(), design=TableDesign(("id",), order_by=("name", "id"), rename=(("name", "label"),)))
    assert h.cfg.identity.columns == ("label", "id")
    assert h.run().committed_version == h.table.latest
    assert h.source.keys == {("name", "id")}


def test_ranges_follow_the_row_bound_and_never_split_a_version():
    h = Harness(history(), max_rows_per_read=2)
    h.run()
    # 5 inserts in version 1 exceed the bound but stay one read; the others are read one version each
    assert h.source.reads == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
    assert h.final() == h.expected()


def test_only_a_catch_up_of_more_than_one_range_reports_its_progress():
    with capture_logs() as events:
        Harness(history(), max_rows_per_read=100).run()  # one range
    assert [e for e in events if e["event"].startswith("progress")] == []
    with capture_logs() as events:
        Harness(history(), max_rows_per_read=2).run()
    done = [e for e in events if e["event"] == "progress_done"]
    assert len(done) == 1 and done[0]["ranges"] == done[0]["total_ranges"] == 5, done


def test_a_crash_mid_range_replays_that_range_and_drops_the_landed_batches():
    h = Harness(history(), max_rows_per_read=100)
    h.writer.crash_after = 2  # two batches of the only range landed
    with pytest.raises(Crash):
        h.run()
    state = h.store.load("p")
    assert state.committed_version == -1 and state.interrupted_range == (0, 4)
    h.writer.crash_after = None
    assert len(h.db.tables["db.t"]["rows"]) == 4
    assert h.run().committed_version == 4
    assert h.source.reads[-1] == (0, 4)
    # the two batches that had landed were sent again with the same tokens and dropped
    assert len(h.db.tables["db.t"]["rows"]) == sum(len(v["changes"]) for v in h.table.versions)
    assert h.final() == h.expected()


def test_an_interrupted_range_is_replayed_whole_even_under_another_bound():
    h = Harness(history(), max_rows_per_read=100)
    h.writer.stop_after = 1
    assert h.run().interrupted_range == (0, 4)
    h.writer.stop_after = None
    h.run(max_rows_per_read=2)  # a new bound plans the rest, but first the range as it was
    assert h.source.reads[-1] == (0, 4) and h.final() == h.expected()


def test_a_stop_mid_range_does_not_commit():
    h = Harness(history(), max_rows_per_read=100)
    h.writer.stop_after = 1
    state = h.run()
    assert state.committed_version == -1 and state.pending_version == 4


def test_new_commits_after_a_run_are_picked_up_and_deletes_win():
    t = history()
    h = Harness(t)
    h.run()
    t.commit(("delete", 2), ("update", 5, {"name": "five"}))
    assert h.run().committed_version == t.latest
    assert h.final() == h.expected() and 2 not in [r["id"] for r in h.final()]


def test_bad_inputs_write_nothing():
    h = Harness(FakeTable(cdf=False), changes_from="cdf")
    with pytest.raises(SourceError, match="The Change Data Feed is not enabled"):
        h.run()
    h = Harness(history())
    with pytest.raises(StateError, match="beyond the latest version"):
        h.run(from_version=99)
    with pytest.raises(SourceError, match="Primary-key column\\(s\\) 'nope'"):
        Harness(history()).replicator(primary_key=("nope",)).run()
    assert h.store.saves == 0 and h.lock.acquired == 0 and not h.store.ensured and h.db.tables == {}


def test_versions_removed_from_the_log_are_never_skipped():
    t = history()
    h = Harness(t)
    h.run()
    t.commit(("insert", {"id": 9, "name": "x"}))
    t.commit(("insert", {"id": 10, "name": "y"}))
    t.first_retained = t.latest  # log retention removed the version after the offset
    with pytest.raises(SourceError, match=r"Versions 5\.\.5 of /lake/t are no longer in the Delta log"):
        h.run()
    assert h.store.load("p").committed_version == 4


def test_a_dropped_column_stops_the_pipeline_at_the_version_before():
    t = history()
    h = Harness(t, max_rows_per_read=100)
    h.run()
    t.commit(("insert", {"id": 7, "name": "x"}))
    t.commit(drop="name", operation="DROP COLUMNS")
    with pytest.raises(SchemaChangeError, match=r"at version 6 of /lake/t \(DROP COLUMNS\): column 'name'"):
        h.run()
    assert h.store.load("p").committed_version == 5  # the version before the change landed


def test_resync_rebuilds_swaps_and_moves_the_offset():
    t = history()
    h = Harness(t, on_schema_change="resync")
    h.run()
    t.commit(drop="name", operation="DROP COLUMNS")
    t.commit(("insert", {"id": 8}))
    state = h.run()
    assert h.snapshots == [t.latest] and state.committed_version == t.latest
    assert h.db.statements[-2:] == [f"EXCHANGE db.t{resync.SUFFIX}", f"DROP db.t{resync.SUFFIX}"]
    assert h.final() == h.expected() and "name" not in h.db.tables["db.t"]["columns"]


def test_resync_interrupted_after_the_swap_is_finished_on_restart():
    t = history()
    h = Harness(t)
    h.run()
    version = t.commit(drop="name")
    h._load_snapshot(
        h.config(target=h.cfg.target.__class__("db", "t" + resync.SUFFIX)),
        version,
        resync.marker("p", version),
    )
    h.replicator().ports.tables.exchange(resync.SUFFIX)  # the crash came right after the swap
    state = h.run()
    assert state.committed_version == version and h.snapshots == [version]  # no second snapshot
    assert "db.t" + resync.SUFFIX not in h.db.tables and h.final() == h.expected()


def test_a_stale_side_table_is_dropped_at_start():
    h = Harness(history())
    h.run()
    h.db.tables["db.t" + resync.SUFFIX] = {"columns": {}, "comment": resync.marker("p", 2), "rows": []}
    h.run()
    assert "db.t" + resync.SUFFIX not in h.db.tables
    assert resync.parse_marker(resync.marker("p", 12), "p") == 12
    assert resync.parse_marker(resync.marker("p", 12), "q") is None


def test_immutable_keys_writes_no_pre_images():
    t = FakeTable()
    t.commit(("insert", {"id": 1, "name": "a"}), ("insert", {"id": 2, "name": "b"}))
    t.commit(("update", 1, {"name": "A"}))
    h = Harness(t, immutable_keys=True)
    h.run()
    assert "update_preimage" not in {r["_change_type"] for r in h.db.tables["db.t"]["rows"]}
    assert h.final() == h.expected()
    # a key-changing UPDATE breaks the promise: the old key's row survives, as documented
    t.commit(("update", 2, {"id": 20}))
    h.run()
    assert [r["id"] for r in h.final()] == [1, 2, 20] and [r["id"] for r in h.expected()] == [1, 20]


def test_the_driver_writer_cuts_replayable_batches_and_stops_between_them():
    import threading

    import structlog

    from cdc2ch.clickhouse.writers import Destination
    from cdc2ch.clickhouse.writers.driver import DriverWriter
    from cdc2ch.model import contract
    from cdc2ch.replication.metrics import Metrics

    class Sink:  # the one call the driver writer makes
        def __init__(self):
            self.inserts = []

        def insert_arrow(self, table_sql, data, token=None):
            self.inserts.append((table_sql, data.num_rows, token))
            if len(self.inserts) == stop_after:
                stop.set()
            return data.num_rows

    h = Harness(history())
    rng, state = h.source.changes(0, 4), state_pointed_at(None, "p", "/lake/t", "db.t", -1)
    stop, stop_after = threading.Event(), None
    to = Destination(h.cfg, Sink(), "`db`.`t`", stop, Metrics().pipeline("p"), structlog.get_logger())
    result = DriverWriter(to).write(rng, state, 0)
    # 13 change rows, 6 written: each key's newest row (the outranked ones are left out, test_duplicates)
    assert result.committed and result.rows == 6 and [n for _, n, _ in to.sink.inserts] == [2] * 3
    tokens = [t for _, _, t in to.sink.inserts]
    assert [contract.batch_index(t) for t in tokens] == list(range(3)) and all(
        t.startswith("p:0-4:") for t in tokens
    )
    again = Destination(h.cfg, Sink(), "`db`.`t`", stop, Metrics().pipeline("p"), structlog.get_logger())
    DriverWriter(again).write(rng, state, 0)
    assert [t for _, _, t in again.sink.inserts] == tokens  # a replay sends the same tokens
    stop_after = 2
    third = Destination(h.cfg, Sink(), "`db`.`t`", stop, Metrics().pipeline("p"), structlog.get_logger())
    result = DriverWriter(third).write(rng, state, 0)
    assert not result.committed and result.rows == 4 and len(third.sink.inserts) == 2


@pytest.mark.parametrize(
    "rows, sizes",
    [(0, []), (30, [30]), (100, [100]), (149, [149]), (151, [75, 76]), (250, [125, 125]),
     (399, [99, 100, 100, 100])],
)  # fmt: skip
def test_inserts_are_equal_batches_of_about_the_batch_size_with_no_remainder_alone(rows, sizes):
    """A Spark task of 100,000 rows was an insert of 80,000 and one of 20,000: the rows of a read are cut into
    round(rows / batch size) equal batches instead, each half to one and a half times the batch size; taken in
    the replay order when one is given."""
    import pyarrow as pa

    from cdc2ch.clickhouse.writers.changerows import batches

    table = pa.table({"id": pa.array(range(rows), pa.int64())})
    assert [b.num_rows for b in batches(table, 100)] == sizes
    backwards = list(range(rows - 1, -1, -1))
    taken = batches(table, 100, pa.array(backwards, pa.int64()))
    assert [i for b in taken for i in b.column("id").to_pylist()] == backwards


def test_the_pushdown_writer_sends_one_statement_and_names_null_keys_by_error_code():
    import threading

    import structlog

    from cdc2ch.base.errors import SinkError
    from cdc2ch.clickhouse import codes
    from cdc2ch.clickhouse.writers import Destination
    from cdc2ch.clickhouse.writers.pushdown import PushdownWriter
    from cdc2ch.replication.metrics import Metrics
    from tests.support.fakes import RecordingSink

    def sink(fail_code=None):
        return RecordingSink(fail_code, written=13, answer=[(2, 3)])  # two null keys, the first at version 3

    h = Harness(history())
    rng, state = h.source.changes(0, 4), state_pointed_at(None, "p", "/lake/t", "db.t", -1)

    def writer(sink):
        return PushdownWriter(
            Destination(
                h.cfg, sink, "`db`.`t`", threading.Event(), Metrics().pipeline("p"), structlog.get_logger()
            )
        )

    ok = sink()
    assert writer(ok).write(rng, state, 0).rows == 13
    ((sql, settings),) = ok.commands
    assert "FROM deltaLakeLocal('/lake/t')" in sql and "multiIf(_change_type = 'delete', 2" in sql
    assert (
        settings["insert_deduplication_token"] == "p:0-4:clickhouse"
        and settings["insert_null_as_default"] == 0
    )
    with pytest.raises(
        SourceError, match=r"2 row\(s\) in versions 0\.\.4 of /lake/t have a null in primary-key column 'id'"
    ):
        writer(sink(codes.CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN)).write(rng, state, 0)
    with pytest.raises(SinkError, match="refused"):  # any other refusal is ClickHouse's to explain
        writer(sink(codes.TOO_MANY_PARTS)).write(rng, state, 0)


def test_reader_auto_is_chosen_when_the_pipeline_starts_not_when_it_is_built():
    """Building a Replicator reads nothing; its start chooses the reader, which a first snapshot loads with."""
    h = Harness(history(), reader="auto", initial_load="snapshot")
    asked, loaded_with, load = [], [], h._load_snapshot
    h.source.latest = lambda latest=h.source.latest: asked.append("latest") or latest()
    h._load_snapshot = lambda side, *args: loaded_with.append(side.reader) or load(side, *args)
    replicator = h.replicator()
    assert asked == [] and replicator.cfg.reader == "auto"
    state = replicator.run()
    assert asked and replicator.cfg.reader == "clickhouse" and loaded_with == ["clickhouse"]
    assert state.committed_version == h.table.latest and h.final() == h.expected()


def test_a_streamed_range_is_inserted_chunk_by_chunk_with_tokens_that_ignore_chunk_order():
    import threading

    import pyarrow.compute as pc
    import structlog

    from cdc2ch.base.errors import SinkError
    from cdc2ch.clickhouse.writers import Destination
    from cdc2ch.clickhouse.writers.driver import STREAMED_RANGE_FACTOR, DriverWriter
    from cdc2ch.replication.metrics import Metrics

    class Sink:
        def __init__(self, stop_after=None):
            self.inserts, self.stop_after = [], stop_after

        def insert_arrow(self, table_sql, data, token=None):
            self.inserts.append((data.num_rows, token))
            if len(self.inserts) == self.stop_after:
                stop.set()
            return data.num_rows

    class Streamed:  # one chunk per version, in the order given, as a Spark scan's tasks end
        def __init__(self, changes, order):
            self.changes, self.order, self.closed = changes, order, False
            self.start, self.end, self.uri = changes.start, changes.end, changes.uri

        def arrow_chunks(self, immutable_keys, held_rows):
            rows = self.changes.arrow_rows(immutable_keys)
            try:
                for v in self.order:
                    yield rows.filter(pc.equal(rows["_commit_version"], v))
            finally:
                self.closed = True

    h = Harness(history())
    state = state_pointed_at(None, "p", "/lake/t", "db.t", -1)
    stop = threading.Event()
    streamed = partial(plan.streamed, max_rows_per_read=h.cfg.max_rows_per_read, streams=True)

    def write(order, stop_after=None):
        to = Destination(
            h.cfg, Sink(stop_after), "`db`.`t`", stop, Metrics().pipeline("p"), structlog.get_logger()
        )
        writer = DriverWriter(to, streamed)
        assert writer.range_factor == STREAMED_RANGE_FACTOR
        changes = Streamed(h.source.changes(0, 4), order)
        return writer.write(changes, state, h.cfg.max_rows_per_read + 1), to.sink.inserts, changes

    result, inserts, _ = write([0, 1, 2, 3, 4])
    # each chunk ranked on its own: more rows than the range ranked whole (6), none that FINAL would show wrong
    assert result.committed and result.rows == sum(n for n, _ in inserts) and result.rows > 6
    _, replayed, _ = write([4, 2, 0, 3, 1])
    assert sorted(t for _, t in replayed) == sorted(t for _, t in inserts)  # the same tokens, in any order
    result, inserts, changes = write([0, 1, 2, 3, 4], stop_after=2)
    assert not result.committed and len(inserts) == 2 and changes.closed  # the read ended with the write

    class Refused(Sink):
        def insert_arrow(self, table_sql, data, token=None):
            raise SinkError("refused")

    stop.clear()
    to = Destination(h.cfg, Refused(), "`db`.`t`", stop, Metrics().pipeline("p"), structlog.get_logger())
    changes = Streamed(h.source.changes(0, 4), [0, 1])
    with pytest.raises(SinkError):
        DriverWriter(to, streamed).write(changes, state, h.cfg.max_rows_per_read + 1)
    assert changes.closed  # a failed insert ends the read too (no Spark job left running)


def test_a_streamed_range_leases_the_bound_and_a_new_pipelines_first_its_whole_estimate():
    """What a range leases from the process's row budget is what it holds in memory: a streamed range (one
    above --max-rows-per-read from a source that streams) keeps the bound and spills the rest, but a new
    pipeline's first range is read whole for its check before the claim."""
    from cdc2ch.replication.budget import RowBudget

    class Recording(RowBudget):
        def __init__(self, total):
            super().__init__(total)
            self.leases = []

        def take(self, rows, stop=None):
            self.leases.append(rows)
            return super().take(rows, stop)

        def try_take(self, rows):
            self.leases.append(rows)
            return super().try_take(rows)

    h = Harness(history())
    h.source.streams = True
    budget = Recording(1000)
    h.run(budget=budget, from_version=1, max_rows_per_read=2)
    # estimated rows per version: 5, 3, 3, 2; the first is the new pipeline's, checked whole
    assert budget.leases == [5, 2, 2, 2] and h.final() == h.expected()
