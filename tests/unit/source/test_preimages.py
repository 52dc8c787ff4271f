"""Which commits' update pre-images a Spark read leaves out (source/deltalog/preimages.py), told from change files
written here by pyarrow as Delta writes them (the key columns and `_change_type`)."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import structlog
from structlog.testing import capture_logs

from cdc2ch.model.changeset import Commit, Files
from cdc2ch.source.deltalog.logstate import TableState
from cdc2ch.source.deltalog.preimages import left_out, needless
from cdc2ch.source.sparkread.feed import SparkChanges
from tests.support.fakes import T0

pytestmark = pytest.mark.unit

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}}
        for n, t in (("id", "long"), ("part", "string"), ("name", "string"))
    ],
}


def state(partitions=(), mapping: str | None = None) -> TableState:
    conf = {
        "delta.enableChangeDataFeed": "true",
        **({"delta.columnMapping.mode": mapping} if mapping else {}),
    }
    meta = {"schemaString": json.dumps(SCHEMA), "partitionColumns": list(partitions), "configuration": conf}
    return TableState(9, meta, {})


def commit(table, version: int, *files: list[tuple]) -> Commit:
    """A commit whose change files hold `files`' rows: (change type, id, part)."""
    paths = []
    for i, rows in enumerate(files):
        path = f"_change_data/cdc-{version:05d}-{i}.c000.snappy.parquet"
        (table / "_change_data").mkdir(exist_ok=True)
        kinds, ids, parts = zip(*rows) if rows else ((), (), ())
        data = {"id": pa.array(ids, pa.int64()), "part": pa.array(parts, pa.string())}
        data["name"] = pa.array(["x"] * len(ids), pa.string())
        pq.write_table(pa.table({**data, "_change_type": pa.array(kinds, pa.string())}), table / path)
        paths.append(path)
    return Commit(version, T0, "MERGE", 0, {}, files=Files(change_files=tuple(paths)))


def test_only_commits_whose_every_pre_image_meets_another_row_of_its_key_are_named(tmp_path):
    pre, post = "update_preimage", "update_postimage"
    commits = [
        commit(tmp_path, 1, [(pre, 1, "a"), (post, 1, "a"), ("delete", 2, "a")]),  # an ordinary update
        commit(tmp_path, 2, [(pre, 3, "a"), (post, 103, "a")]),  # the key changed: the tombstone stays
        commit(tmp_path, 3, [(pre, 10, "a"), (post, 11, "a")], [(pre, 11, "a"), (post, 10, "a")]),  # a swap
        commit(tmp_path, 4, [(post, 5, "a")], [(pre, 5, "a"), ("insert", 6, "a")]),  # across two files
        Commit(5, T0, "WRITE", 3, {}, files=Files((("part-0.parquet", 3, True),))),  # no change files
        Commit(6, T0, "MERGE", 3, {}, files=None),  # not known: told nothing
        commit(tmp_path, 7, [("delete", 7, "a"), ("insert", 8, "a")]),  # no pre-images at all
    ]
    assert needless(str(tmp_path), state(), commits, ("id",)) == {1, 3, 4, 5, 7}
    # The identity includes `part`: an update that moved a row to another part keeps its tombstone.
    moved = [
        commit(tmp_path, 8, [(pre, 1, "a"), (post, 1, "b")]),
        commit(tmp_path, 9, [(pre, 2, "a"), (post, 2, "a")]),
    ]
    assert needless(str(tmp_path), state(), moved, ("id", "part")) == {9}
    assert needless(str(tmp_path), state(), moved, ("id",)) == {8, 9}


def test_where_the_change_files_cannot_tell_every_pre_image_is_read(tmp_path):
    ordinary = [commit(tmp_path, 1, [("update_preimage", 1, "a"), ("update_postimage", 1, "a")])]
    assert needless(str(tmp_path), state(), ordinary, ("id",)) == {1}
    # Partition values live in the paths, and column mapping gives the files other names.
    assert needless(str(tmp_path), state(partitions=("part",)), ordinary, ("id", "part")) == frozenset()
    assert needless(str(tmp_path), state(mapping="name"), ordinary, ("id",)) == frozenset()
    assert needless(str(tmp_path), state(), ordinary, ("nope",)) == frozenset()
    assert needless(str(tmp_path), state(), ordinary, ()) == frozenset()
    huge = [Commit(3, T0, "MERGE", 10**9, {}, files=ordinary[0].files)]  # its keys would not fit beside Spark
    assert needless(str(tmp_path), state(), huge, ("id",)) == frozenset()
    nulls = [commit(tmp_path, 2, [("update_preimage", None, None), ("update_postimage", None, None)])]
    assert needless(str(tmp_path), state(), nulls, ("id",)) == frozenset()  # a null key is never met
    assert needless(str(tmp_path), state(), nulls, ("id", "part")) == frozenset()
    (tmp_path / ordinary[0].files.change_files[0]).unlink()  # vacuumed: the read will say so, not this
    assert needless(str(tmp_path), state(), ordinary, ("id",)) == frozenset()


def test_a_range_none_of_whose_commits_needs_its_pre_images_leaves_them_out_without_naming_versions():
    # A filter on the change type alone is the same on every poll: Spark compiles it once.
    assert left_out(4, 4, frozenset({4})) == (True, frozenset())
    assert left_out(2, 5, frozenset({1, 2, 3, 4, 5, 9})) == (True, frozenset())
    assert left_out(2, 5, frozenset({2, 3, 5})) == (False, frozenset({2, 3, 5}))  # 4 keeps its tombstones
    assert left_out(2, 5, frozenset()) == (False, frozenset())


@pytest.fixture
def debug_level():
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    yield
    structlog.configure(**before)


def test_a_range_the_files_cannot_tell_about_reads_every_pre_image_and_says_why(debug_level):
    class Unreadable:  # a source whose log cannot be read at the range's end
        uri = location = "/nowhere"

        def table_state(self, version):
            raise FileNotFoundError(f"_delta_log/{version:020}.json")

    with capture_logs() as logs:
        assert SparkChanges(Unreadable(), 3, 5, ("id",))._needless() == frozenset()
    assert logs == [
        {"event": "preimages_all_read", "log_level": "debug", "start": 3, "end": 5,
         "reason": "FileNotFoundError: _delta_log/00000000000000000005.json"}
    ]  # fmt: skip
