"""A local table's log read by Python (source/deltalog/logfiles.py ArrowLogFiles): `run` reads local tables so, as
`status` does, and a path is a path, not a URI."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cdc2ch.source.deltalog.commitlog import KEPT_COMMITS, DeltaLog
from cdc2ch.source.deltalog.logfiles import ArrowLogFiles
from cdc2ch.source.deltalog.logstate import LogStates


def test_a_local_log_is_read_whatever_characters_its_path_holds(tmp_path):
    for name in ("a b", "a#b", "a?b", "ü"):
        log_dir = tmp_path / name / "_delta_log"
        log_dir.mkdir(parents=True)
        (log_dir / f"{0:020d}.json").write_text(
            json.dumps({"commitInfo": {"operation": "CREATE TABLE"}}) + "\n"
        )
        log = DeltaLog(ArrowLogFiles(str(tmp_path / name)))
        assert log.latest_version() == 0 and log.commit(0).operation == "CREATE TABLE"


class CountedFiles:
    """ArrowLogFiles with the calls made to it recorded, (method, file name)."""

    def __init__(self, files: ArrowLogFiles):
        self.files, self.dir, self.calls = files, files.dir, []

    def __getattr__(self, method: str):
        def call(*args):
            self.calls.append((method, args[0] if args else None))
            return getattr(self.files, method)(*args)

        return call


def _commit(log_dir, version: int, operation: str) -> None:
    info = {"commitInfo": {"operation": operation, "timestamp": 1_000 + version}}
    (log_dir / f"{version:020d}.json").write_text(json.dumps(info) + "\n")


def _counted_log(tmp_path, commits: int) -> tuple[Path, CountedFiles, DeltaLog]:
    """A table at tmp_path/t with `commits` WRITE commits: its log directory, its files counted, its log."""
    log_dir = tmp_path / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    for v in range(commits):
        _commit(log_dir, v, "WRITE")
    files = CountedFiles(ArrowLogFiles(str(tmp_path / "t")))
    return log_dir, files, DeltaLog(files)


def test_a_poll_with_nothing_new_reads_no_commit_again(tmp_path):
    """A fleet polls every table each second: with nothing new, the newest commit, read once, is taken as it
    was kept, and the poll only checks that its file is still there and the next is not."""
    log_dir, files, log = _counted_log(tmp_path, 3)
    assert log.latest().version == 2
    files.calls.clear()
    assert log.latest().operation == "WRITE"
    assert files.calls == [("modified", f"{2:020d}.json"), ("exists", f"{3:020d}.json")]
    _commit(log_dir, 3, "MERGE")
    files.calls.clear()
    assert log.latest().operation == "MERGE"
    assert [name for method, name in files.calls if method == "read"] == [f"{3:020d}.json"]


def test_a_turn_with_a_new_commit_looks_at_each_commit_once(tmp_path):
    """A poll that finds a new commit asks for it again for its range and its reads, and for the commit it
    replicated last for its lag: on object storage each look is a request."""
    log_dir, files, log = _counted_log(tmp_path, 3)
    assert log.latest().version == 2
    _commit(log_dir, 3, "MERGE")
    files.calls.clear()
    latest = log.latest()
    assert log.lag(2, latest)[0] == 1 and log.commit(3).operation == "MERGE" and log.commit(2) is not None
    name = "{:020d}.json".format
    assert files.calls == [("modified", name(2)), ("exists", name(3)), ("exists", name(4)),
                           ("modified", name(3)), ("read", name(3))]  # fmt: skip


class _Versions:
    """A log of versions 0..`last`, each commit file dated by its version; the calls counted."""

    dir = "/t/_delta_log/"

    def __init__(self, last: int):
        self.last, self.calls = last, 0

    def modified(self, name: str) -> int | None:
        self.calls += 1
        return int(name[:-5]) if name[:-5].isdigit() and int(name[:-5]) <= self.last else None

    def exists(self, name: str) -> bool:
        return self.modified(name) is not None

    def read(self, name: str) -> str | None:
        if self.modified(name) is None or not name.endswith(".json"):
            return None
        return json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n"


def test_the_search_for_the_latest_version_finds_it_from_any_known_version_in_few_looks():
    for known in range(6):
        for last in range(known, known + 40):
            files = _Versions(known)
            log = DeltaLog(files)
            assert log.latest_version() == known
            files.last, files.calls = last, 0
            assert log.latest_version() == last, (known, last)
            assert files.calls <= 3 + 2 * (last - known).bit_length(), (known, last, files.calls)
            if last == known + 1:  # the common case: one new commit, two looks after the known one's
                assert files.calls == 3


def test_a_turn_reads_the_table_as_of_the_version_its_poll_found(tmp_path):
    """The table's state a turn asks for without a version (its properties) is the state at the version the
    last search found, with no search of its own; a commit made since is the next poll's."""
    log_dir, files, log = _counted_log(tmp_path, 2)
    assert log.newest() == 1 and files.calls  # the first time, a search
    _commit(log_dir, 2, "WRITE")
    files.calls.clear()
    assert log.newest() == 1 and files.calls == []
    assert log.latest().version == 2 and log.newest() == 2


def test_a_commit_file_written_again_is_read_again(tmp_path):
    """A table dropped and made again at the same place writes its versions anew: a kept commit whose file
    changed is read again."""
    log_dir = tmp_path / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    for v in range(2):
        _commit(log_dir, v, "WRITE")
    log = DeltaLog(ArrowLogFiles(str(tmp_path / "t")))
    assert log.latest().operation == "WRITE" and log.commit(0).operation == "WRITE"
    for v in range(2):
        _commit(log_dir, v, "CREATE TABLE")
        os.utime(log_dir / f"{v:020d}.json", ns=(0, (v + 1) * 10**9))
    assert log.latest().operation == "CREATE TABLE" and log.commit(0).operation == "CREATE TABLE"


def test_the_newest_commits_are_kept(tmp_path):
    log_dir, files, log = _counted_log(tmp_path, KEPT_COMMITS + 4)
    for v in range(KEPT_COMMITS + 4):
        assert log.commit(v).version == v
    files.calls.clear()
    # looked at since the last search for the latest version: taken without another look
    assert log.commit(KEPT_COMMITS + 3).version == log.commit(4).version + KEPT_COMMITS - 1
    assert files.calls == []
    assert log.latest_version() == KEPT_COMMITS + 3  # a new search: each commit is looked at again, once
    files.calls.clear()
    assert log.commit(4).version == 4 and log.commit(4).version == 4
    assert files.calls == [("modified", f"{4:020d}.json")]
    assert log.commit(0).version == 0 and ("read", f"{0:020d}.json") in files.calls  # no longer kept


def test_a_state_after_commits_the_log_kept_without_metadata_reads_none_of_them(tmp_path):
    """A range's end needs the table's properties there: where the log kept the commits since the last state
    and none changed the metadata or protocol, the state is the last one's; a commit that did is read."""
    log_dir = tmp_path / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    meta = {"metaData": {"id": "t", "configuration": {"a": "1"}}}
    protocol = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    (log_dir / f"{0:020d}.json").write_text(json.dumps(protocol) + "\n" + json.dumps(meta) + "\n")
    for v in (1, 2):
        _commit(log_dir, v, "WRITE")
    files = CountedFiles(ArrowLogFiles(str(tmp_path / "t")))
    log, states = DeltaLog(files), LogStates()
    assert states.at(files, 0, log.unchanged).properties == {"a": "1"}
    assert [log.commit(v).operation for v in (1, 2)] == ["WRITE", "WRITE"]
    files.calls.clear()
    assert states.at(files, 2, log.unchanged).properties == {"a": "1"} and files.calls == []
    altered = {"metaData": {"id": "t", "configuration": {"a": "2"}}}
    (log_dir / f"{3:020d}.json").write_text(json.dumps(altered) + "\n")
    assert log.commit(3).metadata
    assert states.at(files, 3, log.unchanged).properties == {"a": "2"}
    assert ("read", f"{3:020d}.json") in files.calls
