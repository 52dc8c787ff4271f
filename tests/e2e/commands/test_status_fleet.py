"""`cdc2ch status` at fleet size, on the real embedded engine: 300 pipelines recorded through cdc2ch's own
stores over Delta tables written by delta-rs (no JVM), listed with their values, filtered, and read with a
number of ClickHouse queries that does not grow with the number of pipelines."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from cdc2ch import api
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.statestore import HealthStore, StateStore, state_tables
from cdc2ch.commands import status
from cdc2ch.commands.invocation.listing import Known
from cdc2ch.commands.selection import Selection
from cdc2ch.model.config import TargetName
from cdc2ch.model.records import Health, PipelineState
from tests.support import fleet


class CountingSink(Sink):
    """The session's engine behind a Sink of our own that records each ClickHouse call it makes."""

    def __init__(self, sink: Sink):
        super().__init__(sink.clients.first, sink.display, retries=1)
        self.calls: list[str] = []

    def _call(self, what, fn, replicating=True):
        self.calls.append(what)
        return super()._call(what, fn, replicating)


def no_spark():
    raise AssertionError("status started Spark for tables Python reads")


def test_three_hundred_pipelines_are_listed_filtered_and_read_in_a_few_queries(cli, sink, database, tmp_path):
    databases = (f"{database}_sales", f"{database}_ops")
    expected = {e.pipeline: e for e in fleet.build(sink, tmp_path, databases, pipelines=300, tables=30)}
    mine = f"{database}_*"

    rows = json.loads(cli("status", "--pattern", mine, "--json").stdout)
    assert sorted(r["pipeline"] for r in rows) == sorted(expected)
    for r in rows:
        e = expected[r["pipeline"]]
        assert r["source"] == e.table and r["committed_version"] == e.committed, r
        assert (r["latest_version"], r["versions_behind"]) == (e.latest, e.versions_behind), r
        assert r["seconds_behind"] == e.seconds_behind and r["failing"] is e.failing, r
        assert r["last_error_kind"] == e.kind, r
        assert (r["error"] is None) is (not e.failing and e.readable), r
    assert {r["pipeline"] for r in rows if "does not exist" in (r["error"] or "")} == {
        e.pipeline for e in expected.values() if not e.readable and not e.failing
    }

    def listed(*flags: str) -> set[str]:
        return {r["pipeline"] for r in json.loads(cli("status", "--format", "json", *flags).stdout)}

    failing = {p for p, e in expected.items() if e.failing}
    assert listed("--pattern", mine, "--failing") == failing
    assert {expected[p].kind for p in failing} == {"clickhouse", "skipped"}
    lagging = {p for p, e in expected.items() if e.versions_behind and e.seconds_behind > 180}
    assert 0 < len(lagging) < len(expected)
    assert listed("--pattern", mine, "--lagging", "3m") == lagging
    ops = f"{databases[1]}.p00[0-4]*"
    few = {p for p in failing & lagging if p.startswith(f"{databases[1]}.p00") and p[-2] in "01234"}
    assert few and listed("--pattern", ops, "--failing", "--lagging", "3m") == few
    assert listed("--pattern", "*/t007") == {p for p, e in expected.items() if e.table.endswith("/t007")}
    chosen = api.status(clickhouse=cli.dsn, pattern=mine, failing=True, lagging="3m")
    assert {s.pipeline for s in chosen} == failing & lagging

    # The table lists the same pipelines; --max-lag checks those listed.
    text = cli("status", "--pattern", mine).stdout.splitlines()
    assert len(text) == 1 + len(expected) and text[0].startswith("pipeline")
    cli("status", "--pattern", mine, "--failing", "--lagging", "1d", "--max-lag", "1d")
    cli("status", "--pattern", mine, "--lagging", "3m", "--max-lag", "3m", expect=2)

    # One query finds the record tables, then one reads each: as many for 300 pipelines as for 400.
    counting = CountingSink(sink)
    ids = [Known(p, TargetName.parse(p)) for p in sorted(expected)]
    assert len(status.collect(counting, no_spark, pipelines=ids)) == 300
    queries = list(counting.calls)
    each_database = ["read the state layout", "read replication offsets", "read pipeline health"]
    assert queries == ["find replication state tables", *each_database, *each_database]
    now = datetime.now(timezone.utc)
    for i in range(300, 400):
        db = databases[i % 2]
        name = f"{db}.p{i:04d}"
        path = f"{tmp_path}/t{i % 30:03d}"
        StateStore(sink, db).save(PipelineState(name, path, name, 0, 0, 1, now))
        HealthStore(sink, db).save(Health(name, path, name).succeeded(now))
        ids.append(Known(name, TargetName.parse(name)))
    counting.calls.clear()
    assert len(status.collect(counting, no_spark, pipelines=ids)) == 400
    assert counting.calls == queries
    # Every database at once (the engine holds other tests' too): one query per record table found.
    counting.calls.clear()
    every = status.collect(counting, no_spark, select=Selection(pattern=mine))
    assert len(every) == 400
    found = sum(len(tables) for tables in state_tables(sink).values())
    assert len(counting.calls) == 1 + found
