"""`--reader clickhouse` for a range derived from the log: each commit read from its own files as they are, its
inserts the rows of the files it adds (where row tracking tells, only those of its own commit version), its
deletes the removed rows whose key no added row holds; every range the files alone cannot tell is left to
logreads.py."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from cdc2ch.clickhouse.writers.commitreads import VERSIONS_PROPERTY, CommitRead, CommitReads, commit_reads
from cdc2ch.clickhouse.writers.rangereads import COMMIT_READS, lake_reads
from cdc2ch.model.changeset import LOG, Commit, Files
from cdc2ch.model.design import TableDesign
from cdc2ch.source.deltalog.commitlog import parse_commit
from tests.support.fakes import T0, FakeChanges, FakeTable, Harness

PROPERTIES = {VERSIONS_PROPERTY: "_row-commit-version-col-x"}
FIELDS = [{"name": "id", "type": "long"}, {"name": "g", "type": "long"}, {"name": "at", "type": "timestamp"}]
MS = int(T0.timestamp() * 1000)


def commit(version: int, added=(), removed=(), preserved=True, **files) -> Commit:
    """`added`, `removed`: paths with a data change; `files`: the rest of Files."""
    return Commit(
        version, T0 + timedelta(seconds=version), "MERGE", 1, rows_preserved=preserved,
        files=Files(tuple((p, 1, True) for p in added), tuple((p, 1, True) for p in removed), tracked=True, **files),
    )  # fmt: skip


def history() -> list[Commit]:
    optimize = Files(
        (("c.parquet", 3, False),), (("a.parquet", 1, False), ("b2.parquet", 2, False)), tracked=True
    )
    return [
        commit(1, ["a.parquet"], preserved=False),  # an append
        commit(2, ["b2.parquet"], ["b.parquet"]),  # a rewrite
        dataclasses.replace(commit(3), operation="OPTIMIZE", files=optimize),  # no data change
        commit(4, removed=["c.parquet"]),  # a whole file deleted
    ]


def test_each_commit_is_read_from_its_own_files_and_deletes_against_its_adds():
    assert commit_reads(1, 4, history(), FIELDS, PROPERTIES) == CommitReads(
        [
            CommitRead(1, MS + 1000, "insert", ("a.parquet",)),  # an append: every row is new
            CommitRead(2, MS + 2000, "insert", ("b2.parquet",), own_rows=True),
            CommitRead(2, MS + 2000, "delete", ("b.parquet",), ("b2.parquet",)),
            CommitRead(4, MS + 4000, "delete", ("c.parquet",)),
        ],
        as_files=True,
    )


def test_an_append_its_writer_says_kept_row_values_reads_every_row_without_the_version_column():
    """A commit that removes no file copied no row: its files hold only rows it wrote, so reading row
    tracking's version column to find them would only cost."""
    assert commit_reads(1, 1, [commit(1, ["a.parquet"])], FIELDS, PROPERTIES) == CommitReads(
        [CommitRead(1, MS + 1000, "insert", ("a.parquet",))], as_files=True
    )


def test_a_file_re_added_with_a_deletion_vector_is_held_not_inserted():
    """Its rows are those it had, less those its new vector deletes: the deleted ones are removed rows no
    added row holds, the rest are not touched. Read through the table at versions, not as files."""
    dv = commit(2, ["b.parquet", "n.parquet"], ["b.parquet"], vectors=True)
    assert commit_reads(2, 2, [dv], FIELDS, PROPERTIES) == CommitReads(
        [
            CommitRead(2, MS + 2000, "insert", ("n.parquet",), own_rows=True),
            CommitRead(2, MS + 2000, "delete", ("b.parquet",), ("b.parquet", "n.parquet")),
        ],
        as_files=False,
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda c: dataclasses.replace(c, rows_preserved=False),
        lambda c: dataclasses.replace(c, files=dataclasses.replace(c.files, tracked=False)),
    ],
    ids=["copies not kept", "a file added before"],
)
def test_a_rewrite_whose_copies_row_tracking_does_not_tell_writes_them_again(change):
    commits = history()
    commits[1] = change(commits[1])
    planned = commit_reads(1, 4, commits, FIELDS, PROPERTIES)
    assert planned is not None
    assert [r.own_rows for r in planned.reads if r.change_type == "insert"] == [False, False]
    untracked = commit_reads(1, 4, history(), FIELDS, {})  # the table keeps no versions in its files
    assert untracked is not None
    assert [r.own_rows for r in untracked.reads if r.change_type == "insert"] == [False, False]


@pytest.mark.parametrize(
    "change",
    [
        lambda c: dataclasses.replace(c, files=dataclasses.replace(c.files, vectors=True)),
        lambda c: dataclasses.replace(c, files=dataclasses.replace(c.files, partitioned=True)),
        lambda c: dataclasses.replace(
            c, files=dataclasses.replace(c.files, removed=(("b%20c.parquet", 1, True),))
        ),
    ],
    ids=["deletion vector", "partition values", "escaped name"],
)
def test_files_that_need_the_log_to_be_read_are_read_through_the_table_at_versions(change):
    commits = history()
    commits[1] = change(commits[1])
    planned = commit_reads(1, 4, commits, FIELDS, PROPERTIES)
    assert planned is not None and not planned.as_files and len(planned.reads) == 4
    mapped = [{"name": "id", "type": "long", "metadata": {"delta.columnMapping.physicalName": "c"}}]
    nested = [*FIELDS, {"name": "s", "type": {"type": "struct", "fields": []}}]
    for fields in (mapped, nested):
        planned = commit_reads(1, 4, history(), fields, PROPERTIES)
        assert planned is not None and not planned.as_files


@pytest.mark.parametrize(
    "change",
    [
        lambda c: dataclasses.replace(
            c, files=dataclasses.replace(c.files, change_files=("_change_data/x",))
        ),
        lambda c: dataclasses.replace(c, files=None),
        lambda c: dataclasses.replace(c, metadata=True),
        lambda c: dataclasses.replace(c, protocol=True),
    ],
    ids=["change files", "files unknown", "schema change", "feature change"],
)
def test_a_range_a_commit_alone_does_not_tell_is_left_to_the_reads_at_versions(change):
    commits = history()
    commits[1] = change(commits[1])
    assert commit_reads(1, 4, commits, FIELDS, PROPERTIES) is None
    assert commit_reads(1, 5, history(), FIELDS, PROPERTIES) is None  # a version not known


def test_the_statements_read_new_rows_by_version_and_hold_copied_keys_null_safely():
    """The SQL: inserts keep the rows whose materialized version is missing or the commit's; deletes are an
    anti-join on the target's identity (the primary key by `=`, a sorting-key column that may be NULL by
    isNotDistinctFrom); the tokens are their own."""
    table = FakeTable({"id": "long", "g": "long"}, cdf=False)
    h = Harness(table)
    cfg = dataclasses.replace(h.cfg, design=TableDesign(("id",), order_by=("g", "id")))
    rng = FakeChanges(2, 2, "/lake/t", {"id": "long", "g": "long"}, [], LOG)
    rng.range_commits, rng.range_properties = [history()[1]], PROPERTIES
    inserted, deleted = lake_reads(cfg, rng, local_files=True)
    column = "`_row-commit-version-col-x`"
    assert inserted.source == (
        "file('/lake/t/b2.parquet', 'Parquet', "
        f"'`id` Nullable(Int64), `g` Nullable(Int64), {column} Nullable(Int64)')"
    )
    assert inserted.where == f" WHERE coalesce({column}, 2) = 2"
    assert inserted.token == "p:2-2:clickhouse:insert-commit@2"
    assert deleted.where == "" and deleted.token == "p:2-2:clickhouse:delete-commit@2"
    assert deleted.source == (
        "file('/lake/t/b.parquet', 'Parquet', '`id` Nullable(Int64), `g` Nullable(Int64)') AS _removed "
        "LEFT ANTI JOIN (SELECT `g` AS _held_0, `id` AS _held_1 FROM file('/lake/t/b2.parquet', 'Parquet', "
        "'`id` Nullable(Int64), `g` Nullable(Int64)')) AS _held ON isNotDistinctFrom(`g`, _held_0) AND "
        "`id` = _held_1"
    )
    # without row tracking's column, every row of an added file
    rng.range_properties = {}
    copied, _ = lake_reads(cfg, rng, local_files=True)
    assert copied.where == "" and column not in copied.source
    # on a server, a local table's files are not its own: through the table at versions, the removed rows
    # as they were before the commit, the added keys as of it
    inserted, deleted = lake_reads(cfg, rng, local_files=False)
    assert inserted.source is None and inserted.settings == {"delta_lake_snapshot_version": 2}
    assert inserted.where == " WHERE _path IN ('/lake/t/b2.parquet')"
    lake = "deltaLakeLocal('/lake/t')"
    assert deleted.source == (
        f"(SELECT * FROM {lake} WHERE _path IN ('/lake/t/b.parquet') SETTINGS delta_lake_snapshot_version = 1) "
        f"AS _removed LEFT ANTI JOIN (SELECT `g` AS _held_0, `id` AS _held_1 FROM (SELECT * FROM {lake} WHERE "
        "_path IN ('/lake/t/b2.parquet') SETTINGS delta_lake_snapshot_version = 2)) AS _held ON "
        "isNotDistinctFrom(`g`, _held_0) AND `id` = _held_1"
    )


def _long_range() -> list[Commit]:
    return [commit(v, [f"n{v}.parquet"], [f"o{v}.parquet"]) for v in range(1, COMMIT_READS // 2 + 2)]


def _wide_commit(vectors: bool) -> list[Commit]:
    """50 files re-added and 51 new: its deletes would be held against 101 files."""
    kept = [f"f{i}.parquet" for i in range(50)]
    return [commit(1, [*kept, *(f"n{i}.parquet" for i in range(51))], kept, vectors=vectors)]


@pytest.mark.parametrize(
    "commits",
    [_long_range(), _wide_commit(vectors=False), _wide_commit(vectors=True)],
    ids=["more statements than a range reads commit by commit", "adds too many to read as files",
         "files too many to read at versions"],
)  # fmt: skip
def test_a_range_too_long_or_too_wide_to_read_commit_by_commit_takes_the_fewest_reads_at_versions(commits):
    """Never a delete held against fewer files than the commit added, nor statements beyond the bounds."""
    h = Harness(FakeTable({"id": "long", "g": "long"}, cdf=False))
    rng = FakeChanges(1, commits[-1].version, "/lake/t", {"id": "long", "g": "long"}, [], LOG)
    rng.range_commits, rng.range_properties = commits, PROPERTIES
    reads = lake_reads(h.cfg, rng, local_files=True)
    assert reads and not [r.token for r in reads if "-commit@" in r.token]


def test_a_commit_tells_whether_its_files_track_rows_and_how_many_rows_a_tracked_rewrite_yields():
    """Row tracking: each added file's default row commit version is its commit's; then a preserved rewrite
    yields at most what its metrics count (its copies are left out), not every row of its files."""
    stats = '{"numRecords": 1000}'
    add = {"path": "b2.parquet", "size": 10_000, "stats": stats, "baseRowId": 0, "defaultRowCommitVersion": 7}
    remove = {"path": "b.parquet", "size": 10_000, "stats": stats}
    info = {"operation": "MERGE", "tags": {"delta.rowTracking.preserved": "true"},
            "operationMetrics": {"numTargetRowsUpdated": "3", "numTargetRowsDeleted": "1"}}  # fmt: skip

    def parsed(info=info, add=add, remove=remove) -> Commit:
        lines = [{"commitInfo": info}, {"add": add}, {"remove": remove}]
        return parse_commit(7, "\n".join(json_line(x) for x in lines), MS)

    tracked = parsed()
    assert tracked.files is not None and tracked.files.tracked and tracked.rows_preserved
    assert tracked.estimated_rows == 7  # 3 updates, each counted as two rows, and a delete
    assert not parsed(add={**add, "defaultRowCommitVersion": 6}).files.tracked  # re-added (RESTORE)
    assert parsed(add={**add, "defaultRowCommitVersion": 6}).estimated_rows == 2000
    assert parsed(info={**info, "tags": {}}).estimated_rows == 2000  # copies not kept
    vector = {"storageType": "u", "pathOrInlineDv": "x", "offset": 1, "sizeInBytes": 1, "cardinality": 1}
    with_vector = parsed(remove={**remove, "deletionVector": vector})
    assert with_vector.files.vectors
    assert with_vector.estimated_rows == 2000  # with a deletion vector, every row of its files counts
    assert not parsed(add={k: v for k, v in add.items() if k != "baseRowId"}).files.tracked  # no row ids
    # partition values live in the log (an unpartitioned table's adds carry an empty map)
    assert not parsed(add={**add, "partitionValues": {}}).files.partitioned
    assert parsed(add={**add, "partitionValues": {"p": "1"}}).files.partitioned


def json_line(action: dict) -> str:
    import json

    return json.dumps(action)
