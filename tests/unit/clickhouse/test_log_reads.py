"""`--reader clickhouse` for a range whose changes come from the Delta log: the files each commit adds and
removes, read by ClickHouse at versions where they are as the commit saw them, in the fewest statements, each
with its own deduplication token; a range of appends is one statement."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta

import pytest
import structlog

from cdc2ch.base.errors import SinkError, SourceError
from cdc2ch.clickhouse.writers import Destination
from cdc2ch.clickhouse.writers.logreads import FileRead, NetReads, file_reads, net_reads
from cdc2ch.clickhouse.writers.pushdown import LakeFunctionReader, PushdownWriter
from cdc2ch.model import changeset, contract
from cdc2ch.model.changeset import LOG, Commit, Files
from cdc2ch.replication.metrics import Metrics
from cdc2ch.replication.plan import state_pointed_at
from tests.support.fakes import T0, FakeTable, Harness, RecordingSink

MS = int(T0.timestamp() * 1000)


def commit(version: int, added=(), removed=(), files: Files | None = None) -> Commit:
    """`added`, `removed`: (path, dataChange), one row each; commits one second apart from T0."""
    files = files or Files(tuple((p, 1, d) for p, d in added), tuple((p, 1, d) for p, d in removed))
    return Commit(version, T0 + timedelta(seconds=version), "WRITE", 1, files=files)


def ms(version: int) -> int:
    return MS + version * 1000


def test_a_range_of_appends_is_one_read_at_its_end_each_file_at_its_commit():
    commits = [commit(3, [("a.parquet", True)]), commit(4, [("p=x%253A1/b.parquet", True)]), commit(5)]
    assert file_reads("/lake/t", 3, 5, commits, "/lake/t") == [
        FileRead(5, "insert", (("/lake/t/a.parquet", 3, ms(3)), ("/lake/t/p=x%3A1/b.parquet", 4, ms(4))))
    ]


def test_removed_files_are_deletes_read_before_their_removal_and_a_re_added_file_is_read_on_both_sides():
    commits = [
        commit(5, [("a", True)]),  # a added
        commit(6, [("b", True)], [("a", True), ("old", True)]),  # a and a file from before rewritten as b
        commit(7, [("b", True)], [("b", True)]),  # b re-added with a new deletion vector
        commit(8, [("c", False)], [("b", False)]),  # OPTIMIZE: no change, but b ends there
        commit(9, [("d", True)]),
    ]
    reads = file_reads("/t", 5, 9, commits, "/t")
    assert reads == [
        FileRead(5, "insert", (("/t/a", 5, ms(5)),)),  # a only lived at 5
        FileRead(6, "insert", (("/t/b", 6, ms(6)),)),  # b before its new vector
        FileRead(7, "insert", (("/t/b", 7, ms(7)),)),  # b after it, before OPTIMIZE compacted it
        FileRead(9, "insert", (("/t/d", 9, ms(9)),)),  # c is no change
        # deletes: a and `old` as they were before 6 (read together at 5), b as it was before 7
        FileRead(5, "delete", (("/t/old", 6, ms(6)), ("/t/a", 6, ms(6)))),
        FileRead(6, "delete", (("/t/b", 7, ms(7)),)),
    ]
    # Every read is at a version the range or the one before it has, and no read names a file twice.
    assert all(4 <= r.version <= 9 and len({f for f, _, _ in r.files}) == len(r.files) for r in reads)


def test_a_file_an_optimize_wrote_and_a_later_commit_removed_is_only_a_delete():
    """Its rows were there before it (no data change): inserting them would write each again."""
    commits = [
        commit(5, [("a", True)]),
        commit(6, [("c", False)], [("a", False)]),
        commit(7, [], [("c", True)]),
    ]
    assert file_reads("/t", 5, 7, commits, "/t") == [
        FileRead(5, "insert", (("/t/a", 5, ms(5)),)),
        FileRead(6, "delete", (("/t/c", 7, ms(7)),)),
    ]


def test_a_range_that_removes_a_file_from_before_it_at_its_first_version_reads_the_version_before():
    reads = file_reads("/t", 6, 6, [commit(6, [("b", True)], [("old", True)])], "/t")
    assert reads == [
        FileRead(6, "insert", (("/t/b", 6, ms(6)),)),
        FileRead(5, "delete", (("/t/old", 6, ms(6)),)),
    ]
    assert file_reads("/t", 6, 7, [commit(6), commit(7)], "/t") == []  # no data change: nothing to read


def test_a_commit_whose_file_actions_are_unknown_or_missing_is_refused_with_advice():
    with pytest.raises(
        SourceError, match=r"versions 3\.\.4 of s:t .*file actions of version 4 are not known"
    ):
        file_reads("/t", 3, 4, [commit(3), Commit(4, T0, "WRITE", 1)], "s:t")
    with pytest.raises(SourceError, match="version 4 are not known.*--reader spark"):
        file_reads("/t", 3, 4, [commit(3)], "/t")  # (no longer in the log)


def test_the_written_metadata_of_files_of_several_commits_follows_the_rank_rule():
    one = contract.sql_files_meta("_path", [("a", 9, 1000), ("b", 9, 1000)], "delete")
    assert one == contract.sql_fixed_meta(9, 1000, "delete")
    meta = contract.sql_files_meta("_path", [("a'", 3, 10), ("b", 4, 20)], "delete")
    assert meta[0] == "toUInt64(transform(_path, ['a\\'', 'b'], [3, 4], 0))"
    assert meta[1] == f"fromUnixTimestamp64Milli(toInt64(transform({meta[0]}, [3, 4], [10, 20], 0)), 'UTC')"
    assert meta[2:4] == ["'delete'", "toUInt8(1)"]
    assert meta[4] == f"{meta[0]} * 4 + 2"
    assert contract.sql_files_meta("_path", [("a'", 3, 10), ("b", 4, 20)], "insert")[3:] == [
        "toUInt8(0)",
        f"{meta[0]} * 4 + 3",
    ]
    # rows at versions an expression gives (a tombstone at the last removal of its key)
    gone = contract.sql_versions_meta("greatest(a, b)", {3: 10, 4: 20}, "delete")
    assert gone[0] == "greatest(a, b)" and gone[4] == "greatest(a, b) * 4 + 2"
    assert (
        gone[1] == "fromUnixTimestamp64Milli(toInt64(transform(greatest(a, b), [3, 4], [10, 20], 0)), 'UTC')"
    )
    token = contract.pushdown_read_token("p", 3, 5, "insert", 4)
    assert token == "p:3-5:clickhouse:insert@4" and contract.batch_index(token) is None


def logged_history() -> FakeTable:
    t = FakeTable(cdf=False)
    t.commit(("insert", {"id": 1, "name": "a"}), files=Files(added=(("a.parquet", 1, True),)))
    t.commit(
        ("update", 1, {"name": "b"}),
        files=Files(added=(("b.parquet", 1, True),), removed=(("a.parquet", 1, True),)),
    )
    return t


def test_the_pushdown_writer_writes_a_range_from_the_log_statement_by_statement():
    from cdc2ch.clickhouse import codes

    h = Harness(logged_history())
    rng, state = h.source.changes(1, 2, origin=LOG), state_pointed_at(None, "p", "/lake/t", "db.t", -1)

    def writer(sink):
        return PushdownWriter(
            Destination(
                h.cfg, sink, "`db`.`t`", threading.Event(), Metrics().pipeline("p"), structlog.get_logger()
            )
        )

    ok = RecordingSink()
    assert writer(ok).write(rng, state, 0).rows == 6
    # each commit on its own (commitreads.py), through the table at versions (a server: the local files are
    # not its own): the adds as of their commit, the removes as of the version before
    tokens = [s["insert_deduplication_token"] for _, s in ok.commands]
    assert tokens == ["p:1-2:clickhouse:insert-commit@1", "p:1-2:clickhouse:insert-commit@2",
                      "p:1-2:clickhouse:delete-commit@2"]  # fmt: skip
    assert [s.get("delta_lake_snapshot_version") for _, s in ok.commands] == [1, 2, None]
    sql, settings = ok.commands[2]
    assert "FROM deltaLakeLocal('/lake/t') WHERE _path IN ('/lake/t/a.parquet') SETTINGS " in sql
    assert "'delete', toUInt8(1), toUInt64(10)" in sql  # version 2, rank 2
    assert "delta_lake_snapshot_start_version" not in settings and settings["insert_null_as_default"] == 0

    refused = RecordingSink(codes.CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN)
    with pytest.raises(
        SourceError, match=r"1 row\(s\) in versions 1\.\.2 of /lake/t have a null .* version 7"
    ):
        writer(refused).write(rng, state, 0)
    ((sql, settings),) = refused.queries  # counted in the files of the statement ClickHouse refused
    assert "WHERE _path IN ('/lake/t/a.parquet') AND `id` IS NULL" in sql
    assert settings == {"delta_lake_snapshot_version": 1}

    # a range that changes the schema: the fewest reads at versions (logreads.py)
    coarse = h.source.changes(1, 2, origin=LOG)
    coarse.range_commits = [dataclasses.replace(c, metadata=c.version == 2) for c in coarse.range_commits]
    ok = RecordingSink()
    writer(ok).write(coarse, state, 0)
    assert [(s["delta_lake_snapshot_version"], s["insert_deduplication_token"]) for _, s in ok.commands] == [
        (1, "p:1-2:clickhouse:insert@1"),
        (2, "p:1-2:clickhouse:insert@2"),
        (1, "p:1-2:clickhouse:delete@1"),
    ]

    unknown = h.source.changes(1, 2, origin=LOG)
    unknown.range_commits = [dataclasses.replace(c, files=None) for c in unknown.range_commits]
    with pytest.raises(SourceError, match="file actions of version 1 are not known"):
        writer(RecordingSink()).write(unknown, state, 0)


def test_a_pipeline_whose_ranges_all_come_from_the_log_needs_no_setting_for_the_feed():
    """A server older than ClickHouse's change-data-feed reading still reads a table's files by version."""
    for cdf, refused in ((False, False), (True, True)):
        table = logged_history()
        table.cdf = cdf
        replicator = Harness(table, reader="clickhouse").replicator()
        old = LakeFunctionReader(lambda setting: setting != "delta_lake_snapshot_start_version")
        replicator.ports = dataclasses.replace(replicator.ports, lake_reader=old)
        if refused:
            with pytest.raises(
                SinkError, match="needs ClickHouse's setting delta_lake_snapshot_start_version"
            ):
                replicator.check_inputs()
        else:
            assert replicator.check_inputs().writer == "clickhouse"


def test_files_removed_by_a_commit_that_changes_the_schema_are_read_with_the_columns_they_had():
    """A range begins at a commit that changes the schema (a metaData action): the files it removes are read
    at the version before, which lacks the columns it added: those are read as NULL."""
    t = FakeTable(cdf=False)
    t.commit(("insert", {"id": 1, "name": "a"}), files=Files(added=(("a.parquet", 1, True),)))
    t.commit(metadata=True, files=Files(added=(("b.parquet", 1, True),), removed=(("a.parquet", 1, True),)))
    h = Harness(t)

    class Described(RecordingSink):
        def query_rows(self, sql, parameters=None, what="", settings=None):
            self.queries.append((sql, settings))
            return [("id", "Int64")]  # `name` came with version 2

    sink = Described()
    destination = Destination(
        h.cfg, sink, "`t`", threading.Event(), Metrics().pipeline("p"), structlog.get_logger()
    )
    state = state_pointed_at(None, "p", "/lake/t", "db.t", 1)
    PushdownWriter(destination).write(h.source.changes(2, 2, origin=LOG), state, 0)
    (insert, _), (delete, settings) = sink.commands
    assert "SELECT `id`, `name`, toUInt64(2)" in insert  # read at 2: its own columns
    assert "SELECT `id`, NULL, toUInt64(2)" in delete and settings["delta_lake_snapshot_version"] == 1
    assert sink.queries == [("DESCRIBE TABLE deltaLakeLocal('/lake/t')", {"delta_lake_snapshot_version": 1})]
    PushdownWriter(destination).write(
        h.source.changes(1, 2, origin=LOG), state, 0
    )  # no read before the range
    assert len(sink.queries) == 1


def test_a_read_of_many_files_is_cut_into_statements_clickhouse_parses():
    """ClickHouse parses at most max_query_size (256 KiB) of a statement, which names each of its files thrice."""
    from cdc2ch.clickhouse.writers.lakesql import insert_from_lake
    from cdc2ch.clickhouse.writers.rangereads import lake_reads

    files = Files(added=tuple((f"p=ä/part-{i:05d}.parquet", 1, True) for i in range(6000)))
    t = FakeTable(cdf=False)
    for _ in range(2):
        t.commit(("insert", {"id": len(t.rows), "name": "a"}), files=files)
        files = Files(added=tuple((f"q/{p}", n, d) for p, n, d in files.added))
    h = Harness(t)
    reads = lake_reads(h.cfg, h.source.changes(1, 2, origin=LOG))
    assert len(reads) > 1 and len({r.token for r in reads}) == len(reads)
    assert {r.token for r in reads[:2]} == {"p:1-2:clickhouse:insert@2", "p:1-2:clickhouse:insert@2.1"}
    assert sum(r.where.count("parquet") for r in reads) == 12_000
    for read in reads:
        sql = insert_from_lake("`db`.`t`", "deltaLakeLocal('/lake/t')", ["id", "name"], read.meta, read.where)
        assert len(sql.encode()) < 256 * 1024 - 20_000  # (room for many more columns)


def test_a_range_that_only_appends_reads_its_files_as_they_are():
    """A range of appends (either origin) is read from the files its commits add, with `s3()` or, on the
    embedded engine, `file()`: ClickHouse's Delta reader would read the log again for them. Each file keeps
    its own commit's version; the lake function and its version stay for the reads of the error paths."""
    from cdc2ch.clickhouse.writers.lakesql import LakeAccess, files_function
    from cdc2ch.clickhouse.writers.rangereads import lake_reads

    t = FakeTable(cdf=True)
    t.commit(("insert", {"id": 1, "name": "a"}), files=Files(added=(("part-1.parquet", 1, True),)))
    t.commit(("insert", {"id": 2, "name": "b"}), files=Files(added=(("part-2.parquet", 1, True),)))
    h = Harness(t)
    (read,) = lake_reads(h.cfg, h.source.changes(1, 2), local_files=True)
    assert read.source == (
        f"(SELECT *, _path FROM file('{h.source.location}/part-1.parquet', 'Parquet') "
        f"UNION ALL SELECT *, _path FROM file('{h.source.location}/part-2.parquet', 'Parquet'))"
    )
    assert read.token == "p:1-2:clickhouse:insert@2" and read.settings == {"delta_lake_snapshot_version": 2}
    assert read.meta[0] == (
        f"toUInt64(transform(_path, ['{h.source.location}/part-1.parquet', "
        f"'{h.source.location}/part-2.parquet'], [1, 2], 0))"
    )
    # on a server a local table's files are not its own: the change feed, as before
    (cdf,) = lake_reads(h.cfg, h.source.changes(1, 2), local_files=False)
    assert cdf.source is None and "delta_lake_snapshot_start_version" in cdf.settings
    s3 = files_function("s3a://b/t", ["part-1.parquet"], LakeAccess(collection="lake"), False)
    assert s3 == "s3(lake, url = 'https://b.s3.amazonaws.com/t/part-1.parquet', format = 'Parquet')"


@pytest.mark.parametrize(
    "files",
    [
        Files(added=(("part-2.parquet", 1, True),), removed=(("part-1.parquet", 1, True),)),
        Files(added=(("part-2.parquet", 1, True),), change_files=("_change_data/c.parquet",)),
        Files(added=(("part-2.parquet", 1, True),), vectors=True),
        Files(added=(("p=1/part-2.parquet", 1, True),), partitioned=True),
        Files(added=(("part-2.parquet", 1, True),), partitioned=True),  # (values in the log)
        Files(added=(("part%20two.parquet", 1, True),)),
    ],
    ids=[
        "removes",
        "change files",
        "deletion vector",
        "partition values",
        "partition values at the root",
        "escaped name",
    ],
)
def test_a_range_that_does_more_than_append_plain_files_reads_through_the_lake_function(files):
    from cdc2ch.clickhouse.writers.logreads import appends_only

    plain = commit(1, [("part-1.parquet", True)])
    columns = [{"name": "id", "type": "long"}, {"name": "d", "type": "decimal(10,2)"}]
    assert appends_only(1, 1, [plain], columns)
    assert not appends_only(1, 2, [plain, commit(2, files=files)], columns)
    assert not appends_only(1, 2, [plain], columns)  # a version not known
    assert not appends_only(1, 1, [dataclasses.replace(plain, metadata=True)], columns)
    assert not appends_only(1, 1, [dataclasses.replace(plain, protocol=True)], columns)
    mapped = {
        "fields": [{"name": "id", "type": "long", "metadata": {"delta.columnMapping.physicalName": "c"}}]
    }
    assert not appends_only(1, 1, [plain], mapped)
    for kind in ("timestamp", "timestamp_ntz", "variant", {"type": "struct", "fields": []}):
        assert not appends_only(1, 1, [plain], [{"name": "x", "type": kind}])


def test_a_range_derived_at_once_reads_the_files_it_found_those_it_leaves_and_the_keys_of_the_rest(
    monkeypatch,
):
    """logreads.net_reads: the files there at the range's end read at its end, each at the version that added
    it; those it found read before it, each at the version that removed it; those added and removed again
    read where they are there, each at its removal (only their keys are read: rangereads.py)."""
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)
    commits = [  # (b and d, 10 rows each, are read twice commit by commit: reading at once pays)
        commit(3, files=Files((("b.parquet", 10, True), ("c.parquet", 1, True)), (("a.parquet", 1, True),))),
        commit(
            4, files=Files((("d.parquet", 10, False),), (("b.parquet", 10, False), ("z.parquet", 1, False)))
        ),
        commit(5, [("e.parquet", True)], [("d.parquet", True)]),  # (an OPTIMIZE before it)
    ]
    net = net_reads("/lake/t", 3, 5, commits)
    assert net == NetReads(
        FileRead(5, "insert", (("/lake/t/c.parquet", 3, ms(3)), ("/lake/t/e.parquet", 5, ms(5)))),
        FileRead(2, "delete", (("/lake/t/a.parquet", 3, ms(3)), ("/lake/t/z.parquet", 4, ms(4)))),
        [FileRead(3, "delete", (("/lake/t/b.parquet", 4, ms(4)),)),
         FileRead(4, "delete", (("/lake/t/d.parquet", 5, ms(5)),))],
    )  # fmt: skip
    # not where it does not pay, or a schema change precedes files it removes
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 100)
    assert net_reads("/lake/t", 3, 5, commits) is None
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)
    schema_change = dataclasses.replace(commits[0], metadata=True)
    assert net_reads("/lake/t", 3, 5, [schema_change, *commits[1:]]) is None
    created = [
        dataclasses.replace(commit(2, [("a.parquet", True), ("z.parquet", True)]), metadata=True),
        *commits,
    ]
    assert net_reads("/lake/t", 2, 5, created) is not None  # (no file from before it)
    assert net_reads("/lake/t", 3, 6, commits) is None  # a version not known
    many = [
        commit(3, [(f"{'n' * 200}{i}.parquet", True) for i in range(300)], [("a.parquet", True)]),
        *commits[1:],
    ]
    assert net_reads("/lake/t", 3, 5, many) is None  # more files than one statement should name


def test_a_file_re_added_with_deletion_vectors_is_read_before_the_range_between_and_at_its_end(monkeypatch):
    """Each read is of the table at a version: a file re-added with larger vectors is read as it was before
    the range (its rows then, deletes at the first re-add), as it was between two re-adds (its keys, at the
    later one), and as it is at the end (inserts at the last re-add)."""
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)
    dv = [
        commit(v, files=Files((("a.parquet", 10 - v, True), *new), (("a.parquet", 10, True),), vectors=True))
        for v, new in ((3, (("b.parquet", 1, True),)), (4, ()), (5, ()), (6, ()))
    ]
    net = net_reads("/lake/t", 3, 6, dv)
    assert net == NetReads(
        FileRead(6, "insert", (("/lake/t/b.parquet", 3, ms(3)), ("/lake/t/a.parquet", 6, ms(6)))),
        FileRead(2, "delete", (("/lake/t/a.parquet", 3, ms(3)),)),
        [FileRead(3, "delete", (("/lake/t/a.parquet", 4, ms(4)),)),
         FileRead(4, "delete", (("/lake/t/a.parquet", 5, ms(5)),)),
         FileRead(5, "delete", (("/lake/t/a.parquet", 6, ms(6)),))],
    )  # fmt: skip
