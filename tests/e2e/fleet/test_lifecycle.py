"""`cdc2ch pause`, `resume` and `resync` from another process, on a running service with several pipelines
(two named ones and two from a table pattern) over a server target: the pipeline asked for stops or is
rebuilt while the others go on, and every table equals its Delta table afterwards. And what they print when
no service runs the pipeline. (On the embedded default through `run --serve`: tests/e2e/clickhouse/test_serve.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdc2ch.clickhouse.state.control import ControlStore
from cdc2ch.clickhouse.state.lock import PipelineLock
from cdc2ch.clickhouse.state.statestore import HealthStore
from cdc2ch.model.config import TargetName
from cdc2ch.model.records import PAUSE, RESUME, RESYNC, Health
from tests.e2e.fleet.test_operations import _wait, _write_config
from tests.support.helpers import Proc, assert_replicated, create_table, latest_version, recorded_version


def _request(dsn: str, env: dict, database: str, action: str, name: str, *args: str) -> str:
    """`cdc2ch <action> --pipeline name` in a process of its own (--target: other tests name pipelines `a`)."""
    proc = Proc(action, "--pipeline", name, "--target", f"{database}.{name.rpartition('.')[2]}", *args,
                "--clickhouse", dsn, env=env)  # fmt: skip
    assert proc.wait(120) == 0, proc.stderr[-3000:]
    return proc.stdout


def _append(path: str, ids, v: int) -> None:
    """A commit of rows (id, v), by delta-rs: what is shown is the service's answer to requests, whoever
    writes the table, and Spark takes many times the CPU for each commit."""
    ids = pa.array(ids, pa.int64())
    write_deltalake(path, pa.table({"id": ids, "v": pa.array([v] * len(ids), pa.int64())}), mode="append")


def _log_version(path: str) -> int:
    """A local table's latest version, from its log's file names: the polls below ask it hundreds of times,
    and Spark's answer (latest_version) costs a job each."""
    return max(int(p.name.split(".")[0]) for p in Path(path, "_delta_log").glob("*.json"))


def _pauses(service: Proc, pipeline: str) -> int:
    """How many times the service has paused the pipeline."""
    return len([e for e in service.events("paused") if e["pipeline"] == pipeline])


def test_pause_resume_resync_a_running_service(spark, http_sink, clickhouse_http, database, tmp_path):
    paths = {n: str(tmp_path / n) for n in ("a", "b")} | {n: str(tmp_path / "lake" / n) for n in ("p1", "p2")}
    for path in paths.values():
        create_table(spark, path, "id BIGINT, v BIGINT")
        _append(path, range(20), 0)
    names = {"a": "a", "b": "b", "p1": f"{database}.p1", "p2": f"{database}.p2"}  # pipelines of the pattern
    config = _write_config(
        tmp_path,
        f'clickhouse = "{clickhouse_http.dsn}"\npoll-interval = 0.5\nmax-parallel = 2\n'
        f'[[pipelines]]\nname = "a"\ntable = "{paths["a"]}"\nprimary-key = "id"\ntarget = "{database}.a"\n'
        f"batch-size = 1\nmax-rows-per-read = 1\n"  # a catch-up of a: slow, in many ranges
        f'[[pipelines]]\nname = "b"\ntable = "{paths["b"]}"\nprimary-key = "id"\ntarget = "{database}.b"\n'
        f'[[pipelines]]\ntable = "{tmp_path}/lake/*"\nprimary-key = "id"\ntarget = "{database}.{{table}}"\n',
    )
    env = {"CDC2CH_CLICKHOUSE_PASSWORD": clickhouse_http.password}
    dsn = clickhouse_http.dsn

    def caught_up(*which: str) -> bool:
        return all(
            (v := recorded_version(http_sink, database, names[n])) is not None and v == _log_version(paths[n])
            for n in which
        )

    service = Proc("run", "--config", config, env=env)
    try:
        _wait(lambda: caught_up("a", "b", "p1", "p2"), 300, service, "every pipeline replicated")

        # Pause a named pipeline and one of the pattern: within a poll they stop; the others go on.
        out = _request(dsn, env, database, "pause", "a", "--reason", "loading by hand")
        assert f"Pipeline a ({database}) paused" in out, out
        _request(dsn, env, database, "pause", names["p1"])
        _wait(lambda: {e["pipeline"] for e in service.events("paused")} >= {"a", names["p1"]}, 60, service,
              "a and p1 paused")  # fmt: skip
        held = {n: recorded_version(http_sink, database, names[n]) for n in ("a", "p1")}
        for name in paths:
            _append(paths[name], [100], 1)
        _wait(lambda: caught_up("b", "p2"), 120, service, "b and p2 replicating while a and p1 are paused")
        time.sleep(2)  # four polls more: still held
        assert {n: recorded_version(http_sink, database, names[n]) for n in ("a", "p1")} == held
        assert not caught_up("a") and not caught_up("p1")

        status = Proc("status", "--clickhouse", dsn, "--pattern", f"{database}.*", "--json", env=env)
        assert status.wait() == 0, status.stderr[-3000:]
        rows = {r["pipeline"]: r for r in json.loads(status.stdout)}
        a = rows["a"]
        assert a["paused"] is True and a["paused_reason"] == "loading by hand" and a["failing"] is False, a
        assert "@" in a["paused_by"] and a["paused_at"], a
        assert rows[names["p1"]]["paused"] is True and rows["b"]["paused"] is False, rows
        table = Proc("status", "--clickhouse", dsn, "--pattern", f"{database}.*", env=env)
        assert table.wait() == 0 and "loading by hand" in table.stdout, table.stdout

        # Resumed, each goes on from its offset.
        _request(dsn, env, database, "resume", "a")
        _request(dsn, env, database, "resume", names["p1"])
        _wait(lambda: caught_up("a", "b", "p1", "p2"), 120, service, "a and p1 resumed")

        # Resync b (and p2, of the pattern): rebuilt through the side table and swapped in while the others go on.
        _request(dsn, env, database, "resync", "b", "--reason", "suspect rows")
        _request(dsn, env, database, "resync", names["p2"])
        DeltaTable(paths["a"]).update(updates={"v": "2"}, predicate="id < 5")
        _wait(lambda: {e["pipeline"] for e in service.events("resync_done")} >= {"b", names["p2"]}, 180, service,
              "b and p2 rebuilt")  # fmt: skip
        for name in ("b", "p2"):
            DeltaTable(paths[name]).delete("id < 3")
        _wait(
            lambda: caught_up("a", "b", "p1", "p2"),
            120,
            service,
            "every pipeline replicated after the resync",
        )
        starts = [e for e in service.events("resync_start") if e["pipeline"] == "b"]
        assert len(starts) == 1 and "suspect rows" in starts[0]["reason"], starts  # once, as asked
        comment = http_sink.query_rows(
            "SELECT comment FROM system.tables WHERE database = {db:String} AND name = 'b'", {"db": database}
        )[0][0]
        assert comment.startswith("cdc2ch: rebuilt by resync of pipeline b"), comment

        # A pause during a long catch-up ends it after the range in flight: the offset exact, FINAL equal to
        # Delta at the committed version. (Requests written from here: no process to start, so it lands early.)
        requests = ControlStore(http_sink, database)
        requests.request("a", PAUSE, "backlog", "test@here")
        _wait(lambda: _pauses(service, "a") == 2, 60, service, "a paused")
        held = recorded_version(http_sink, database, "a")
        for k in range(20):  # versions of 5 rows: a range each, 5 inserts of one row each
            _append(paths["a"], range(200 + 5 * k, 205 + 5 * k), k)
        latest = latest_version(spark, paths["a"])
        requests.request("a", RESUME, "", "test@here")
        _wait(lambda: recorded_version(http_sink, database, "a") > held, 60, service, "a catching up")
        requests.request("a", PAUSE, "mid-way", "test@here")
        _wait(lambda: _pauses(service, "a") == 3, 60, service, "a paused")
        stopped = recorded_version(http_sink, database, "a")
        time.sleep(1)
        assert recorded_version(http_sink, database, "a") == stopped and held < stopped < latest, (
            held,
            stopped,
        )
        assert_replicated(spark, http_sink, paths["a"], TargetName(database, "a"), stopped)
        requests.request("a", RESUME, "", "test@here")
        _wait(lambda: caught_up("a"), 120, service, "a resumed after the backlog")
    finally:
        service.signal(signal.SIGTERM)
        code = service.wait()
    assert code == 0, service.stderr[-3000:]
    for name, path in paths.items():
        assert_replicated(spark, http_sink, path, TargetName(database, name))
    status = Proc("status", "--clickhouse", dsn, "--pattern", f"{database}.*", "--json", env=env)
    assert status.wait() == 0
    rows = {r["pipeline"]: r for r in json.loads(status.stdout)}
    assert not any(r["paused"] or r["resync_requested_at"] for r in rows.values()), rows


def test_what_a_request_says_when_no_service_runs_the_pipeline(
    cli, sink, chdb_dsn, http_sink, clickhouse_http, database
):
    """Issue 68, finding 9: with no service running it, a request said "within one poll the service running
    it loads a snapshot". Now: no process holds the embedded database (this one opened it), so the request
    waits for the pipeline's next run; on a server, no claim on it; with a live claim, the service acting."""
    now = datetime.now(timezone.utc)
    for s in (sink, http_sink):  # a pipeline that ran once: its health record
        s.command(f"CREATE DATABASE IF NOT EXISTS {database}")
        store = HealthStore(s, database)
        store.ensure()
        store.save(Health("orders", "/lake/orders", f"{database}.orders").succeeded(now))
    args = ("--pipeline", "orders", "--target", f"{database}.orders")
    try:
        # The embedded database, opened by this command itself: nothing can be running the pipeline.
        out = cli("resync", *args, "--clickhouse", chdb_dsn).stdout
        assert "within one poll" not in out and "the service running it" not in out, out
        assert f"Pipeline orders ({database}) to be rebuilt: no service is running it" in out, out
        assert "when the pipeline next runs (`cdc2ch run ...`)" in out, out
        assert ControlStore(sink, database).load_all()["orders"].action == RESYNC  # recorded all the same
        out = cli("pause", *args, "--clickhouse", chdb_dsn).stdout
        assert "no service is running it" in out and "recorded for its next run" in out, out

        # A server: no live claim on the pipeline, then one (a service running it).
        dsn = clickhouse_http.dsn
        out = cli("resume", *args, "--clickhouse", dsn).stdout
        assert "no process is replicating it now (none holds a claim on it)" in out, out
        assert "when the pipeline next runs" in out and "the service running it" not in out, out
        with PipelineLock(http_sink, database, "orders"):
            out = cli("pause", *args, "--clickhouse", dsn).stdout
        assert f"Pipeline orders ({database}) paused: the service running it (" in out, out
        assert f"pid {os.getpid()} on host" in out and "within one poll" in out, out
        assert ControlStore(http_sink, database).load_all()["orders"].action == PAUSE
    finally:
        for s in (sink, http_sink):
            s.command(f"DROP DATABASE IF EXISTS {database}")
