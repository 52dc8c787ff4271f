"""Which commits' copied rows the Spark reader leaves out of changes derived from the log
(source/sparkread/rowcopies.py): a MERGE, UPDATE or DELETE that removed files and whose writer says it kept
row tracking's values, and only where the rows' key is known."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from cdc2ch.model.changeset import Commit, Files
from cdc2ch.source.deltalog.commitlog import parse_commit
from cdc2ch.source.sparkread.rowcopies import marked

TS = datetime(2026, 1, 1, tzinfo=timezone.utc)
REWRITE = Files(added=(("b.parquet", 10, True),), removed=(("a.parquet", True),))


def commit(version: int, operation: str, preserved: bool = True, files: Files | None = REWRITE) -> Commit:
    return Commit(version, TS, operation, 1, files=files, rows_preserved=preserved)


def test_only_rewrites_whose_writer_kept_row_tracking_values_are_marked():
    commits = [
        commit(1, "WRITE"),  # an append: every row is new
        commit(2, "MERGE"),
        commit(3, "UPDATE", preserved=False),  # row tracking off, or a writer that did not keep its values
        commit(
            4, "RESTORE"
        ),  # restored rows keep their old commit versions: not copies of the version before
        commit(5, "DELETE", files=Files(added=(("c.parquet", 1, True),))),  # removed nothing
        commit(6, "DELETE", files=None),  # file actions not known
        commit(7, "UPDATE"),
    ]
    copies = marked(commits, ("id",))
    assert copies is not None and copies.versions == {2: TS, 7: TS} and copies.key == ("id",)
    assert marked(commits, ()) is None  # no key, no way to tell a copied key from a deleted one
    assert marked(commits[:1], ("id",)) is None


def test_commits_say_whether_their_writer_kept_row_tracking_values():
    def parsed(tags: dict | None) -> Commit:
        info = {"operation": "MERGE", **({"tags": tags} if tags is not None else {})}
        return parse_commit(4, json.dumps({"commitInfo": info}), 0)

    assert parsed({"delta.rowTracking.preserved": "true"}).rows_preserved
    assert not parsed({"delta.rowTracking.preserved": "false"}).rows_preserved
    assert not parsed({}).rows_preserved and not parsed(None).rows_preserved
