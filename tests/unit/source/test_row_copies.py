"""Which commits' copied rows the Spark reader leaves out of changes derived from the log
(source/sparkread/rowcopies.py), and how: those of a MERGE, UPDATE or DELETE that rewrote files and whose
writer says it kept row tracking's values by their row commit versions, where the rows' key is known; those of
any other commit that rewrote files by comparing rows, where every column can be grouped."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone

from cdc2ch.model import changeset
from cdc2ch.model.changeset import Commit, Files
from cdc2ch.source.deltalog.commitlog import parse_commit
from cdc2ch.source.sparkread import rowcopies
from cdc2ch.source.sparkread.rowcopies import groupable, rewrites

TS = datetime(2026, 1, 1, tzinfo=timezone.utc)
REWRITE = Files(added=(("b.parquet", 10, True),), removed=(("a.parquet", 1, True),))


def commit(
    version: int, operation: str, preserved: bool = True, files: Files | None = REWRITE, rows: int = 1
) -> Commit:
    return Commit(version, TS, operation, rows, files=files, rows_preserved=preserved)


APPEND = Files(added=(("c.parquet", 1, True),))


def test_rewrites_whose_writer_kept_row_tracking_values_are_marked_and_other_rewrites_compared(monkeypatch):
    monkeypatch.setattr(rowcopies, "COMPARED_FROM_ROWS", 0)
    commits = [
        commit(1, "WRITE", files=APPEND),  # an append: every row is new
        commit(2, "MERGE"),
        commit(3, "UPDATE", preserved=False),  # row tracking off, or a writer that did not keep its values
        commit(4, "RESTORE"),  # restored rows keep their old row commit versions: not marked
        commit(5, "DELETE", files=Files(removed=(("a.parquet", 1, True),))),  # whole files removed: no copies
        commit(6, "DELETE", files=None),  # file actions not known
        commit(7, "UPDATE"),
        # a file re-added with a deletion vector copies nothing: its rows are not read again
        commit(8, "DELETE", files=Files(added=(("a.parquet", 9, True),), removed=(("a.parquet", 1, True),))),
        # files OPTIMIZE rewrote change no data
        commit(9, "OPTIMIZE", files=Files(added=(("b", 10, False),), removed=(("a", 1, False),))),
        commit(10, "WRITE", preserved=False),  # an overwrite writing rows it had again
        # a file removed and another added without a data change: the added one yields no rows to compare
        commit(11, "DELETE", files=Files(added=(("d", 5, False),), removed=(("e", 1, True),))),
        # and the other way round: the removed one yields no rows to compare with
        commit(12, "WRITE", files=Files(added=(("f", 5, True),), removed=(("g", 1, False),))),
        # a file re-added with a larger deletion vector and a new file of the rows it updated: no copies,
        # unless row tracking marks the new file's rows
        commit(
            13,
            "UPDATE",
            preserved=False,
            files=Files(added=(("a", 9, True), ("h", 1, True)), removed=(("a", 1, True),)),
        ),
        commit(14, "UPDATE", files=Files(added=(("a", 9, True), ("h", 1, True)), removed=(("a", 1, True),))),
    ]
    copies = rewrites(commits, ("id",))
    assert copies is not None and copies.versions == {2: TS, 7: TS, 14: TS} and copies.key == ("id",)
    assert copies.compared == {3, 4, 10}
    # no key, no way to tell a copied key from a deleted one by row tracking: compared instead
    unkeyed = rewrites(commits, ())
    assert unkeyed is not None and unkeyed.versions == {} and unkeyed.compared == {2, 3, 4, 7, 10}
    assert rewrites(commits[:1], ("id",)) is None and rewrites([commits[4], commits[7]], ("id",)) is None


def test_rewrites_are_compared_only_where_they_yield_enough_rows_for_it_to_pay(monkeypatch):
    monkeypatch.setattr(rowcopies, "COMPARED_FROM_ROWS", 100)
    few = [commit(2, "MERGE", preserved=False, rows=60), commit(3, "MERGE", preserved=False, rows=39)]
    assert rewrites(few, ("id",)) is None
    # the marked ones count for nothing: they are not compared
    marked = rewrites([*few, commit(4, "MERGE", rows=500)], ("id",))
    assert marked is not None and marked.versions == {4: TS} and marked.compared == frozenset()
    enough = rewrites([*few, commit(4, "UPDATE", preserved=False)], ("id",))
    assert enough is not None and enough.compared == {2, 3, 4}


TRACKED = Files(added=(("b.parquet", 10, True),), removed=(("a.parquet", 10, True),), tracked=True)


def test_a_range_is_derived_at_once_where_its_files_tell_its_net_effect_and_that_pays(monkeypatch):
    """netchanges.py: every commit's time is kept where the range's files tell their rows, none carries a
    deletion vector, deriving it at once pays (FileSpan) and a key is known; row versions are read where
    every commit adds only files it first added."""
    monkeypatch.setattr(changeset, "AT_ONCE_FROM_ROWS", 0)
    append = commit(2, "WRITE", files=Files(added=(("c", 5, True),), tracked=True))
    merge = commit(3, "MERGE", files=TRACKED)
    again = commit(
        4, "MERGE", files=replace(TRACKED, added=(("e", 10, True),), removed=(("b.parquet", 10, True),))
    )
    deleted = commit(5, "DELETE", files=Files(removed=(("e", 10, True),), tracked=True))
    copies = rewrites([append, merge, again, deleted], ("id",))  # before 10 rows, between 20, after 5
    assert copies is not None and copies.times == {2: TS, 3: TS, 4: TS, 5: TS} and copies.tracked
    assert copies.versions == {3: TS, 4: TS}
    restored = commit(
        6, "RESTORE", preserved=False, files=Files((("b.parquet", 10, True),), (("c", 5, True),))
    )
    found = rewrites(
        [append, merge, again, deleted, restored], ("id",)
    )  # re-adds an old file: no row versions
    assert found is not None and list(found.times) == [2, 3, 4, 5, 6] and not found.tracked
    plain = [
        commit(v, c.operation, False, replace(c.files, tracked=False))
        for v, c in enumerate([merge, again, deleted], 3)
    ]
    found = rewrites(plain, ("id",))  # copy-on-write without row tracking: every row of `after` written
    assert found is not None and list(found.times) == [3, 4, 5] and not found.tracked
    assert rewrites(plain, ()) is None  # no key: nothing to tell a key gone by
    vectors = Files(added=(("d", 9, True),), removed=(("b.parquet", 10, True),), vectors=True, tracked=True)
    for other in (
        commit(4, "UPDATE", files=vectors),
        commit(4, "UPDATE", files=None),
        commit(4, "WRITE", files=APPEND),
    ):
        found = rewrites([append, merge, other], ("id",))  # vectors, files not known, or too little rewritten
        assert found is not None and found.times == {}


def test_rows_are_compared_only_where_spark_can_group_every_column():
    from pyspark.sql import types as T

    def table(*types) -> T.StructType:
        return T.StructType([T.StructField(f"c{i}", t) for i, t in enumerate(types)])

    nested = table(T.ArrayType(T.DoubleType()), T.BinaryType())
    assert groupable(table(T.LongType(), T.StringType(), T.DecimalType(38, 10), T.TimestampType(), nested))
    assert not groupable(table(T.LongType(), T.MapType(T.StringType(), T.IntegerType())))
    inner = T.StructType([T.StructField("m", T.MapType(T.StringType(), T.StringType()))])
    assert not groupable(table(T.LongType(), T.ArrayType(inner)))
    assert not groupable(table(T.LongType(), T.VariantType()))


def test_commits_say_whether_their_writer_kept_row_tracking_values():
    def parsed(tags: dict | None) -> Commit:
        info = {"operation": "MERGE", **({"tags": tags} if tags is not None else {})}
        return parse_commit(4, json.dumps({"commitInfo": info}), 0)

    assert parsed({"delta.rowTracking.preserved": "true"}).rows_preserved
    assert not parsed({"delta.rowTracking.preserved": "false"}).rows_preserved
    assert not parsed({}).rows_preserved and not parsed(None).rows_preserved
