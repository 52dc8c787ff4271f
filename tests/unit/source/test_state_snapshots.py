"""Which ranges may plan their change feed with a snapshot already built (source/sparkread/cdfscan.py): only those whose
every version shares that snapshot's protocol and metadata, as the commits read from the log show."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from cdc2ch.model.changeset import Commit
from cdc2ch.source.deltalog.commitlog import parse_commit
from cdc2ch.source.sparkread.cdfscan import StateSnapshots

TS = datetime(2026, 1, 1, tzinfo=timezone.utc)


def commit(version: int, metadata: bool = False, protocol: bool = False) -> Commit:
    return Commit(version, TS, "WRITE", 1, {}, metadata, None, None, protocol)


def test_a_snapshot_is_lent_while_no_commit_changes_schema_or_protocol():
    s = StateSnapshots()
    s.seen([commit(0, metadata=True, protocol=True), commit(1), commit(2)])
    assert s.lend(1, 2) is None  # nothing built yet
    s.keep(2, "snap@2")
    assert s.lend(1, 2) == "snap@2" and s.lend(0, 2) == "snap@2"  # version 0 set the state all share
    assert s.lend(3, 3) is None  # not seen yet: unknown
    s.seen([commit(3), commit(4)])
    assert s.lend(3, 4) == "snap@2"
    s.seen([commit(5, metadata=True)])  # a new schema or new properties
    assert s.lend(5, 5) is None and s.lend(4, 5) is None
    s.keep(5, "snap@5")
    s.seen([commit(6)])
    assert s.lend(5, 6) == "snap@5" and s.lend(4, 6) is None
    s.seen([commit(7, protocol=True)])  # new table features
    assert s.lend(7, 7) is None
    assert s.lend(6, 6) is None  # only the newest span is kept: an older range builds its snapshot (safe)


def test_a_gap_in_the_commits_seen_forgets_what_came_before():
    s = StateSnapshots()
    s.seen([commit(3), commit(4)])
    s.keep(4, "snap@4")
    s.seen([commit(6)])  # 5 was not seen: it may have changed the state
    assert s.lend(6, 6) is None and s.lend(4, 4) is None
    s.keep(6, "snap@6")
    assert s.lend(6, 6) == "snap@6"


def test_a_change_inside_a_span_thought_clean_ends_it():
    s = StateSnapshots()
    s.seen([commit(3), commit(4), commit(5)])
    s.keep(5, "snap@5")
    s.seen([commit(4, metadata=True)])  # the log says otherwise now (a table written again at the path)
    assert s.lend(5, 5) is None and s.lend(4, 4) is None


def test_commits_say_whether_they_carry_a_protocol_action():
    actions = [{"commitInfo": {"operation": "WRITE"}}, {"protocol": {"minReaderVersion": 3}}]
    assert parse_commit(4, "\n".join(json.dumps(a) for a in actions), 0).protocol
    assert not parse_commit(4, json.dumps({"commitInfo": {"operation": "WRITE"}}), 0).protocol
