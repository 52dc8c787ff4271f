"""Faults on the server path (clickhouse-connect over real HTTP) and crashes of real processes.

The endpoint is tests/support/chserver.py on the session's chdb engine (or a real server when
CDC2CH_TEST_CLICKHOUSE_URL is set); FaultProxy sits in front of it and injects resets, errors, delays and
outages, or kills the client at a chosen request. After every fault the table must converge to Delta with
no row lost, and replays must add no duplicate blocks (merges are stopped, so duplicates would show).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cdc2ch.model import contract, schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign
from tests.support.helpers import (
    Proc,
    assert_replicated,
    committed_version,
    create_table,
    latest_version,
    recorded_version,
)
from tests.support.processes import descendant

COLS = "id BIGINT, grp STRING, amount DOUBLE"


def _history(built, path: str, versions: int = 4, rows: int = 120) -> None:
    """A copy at `path` of `_write_history` (written once per test process for each shape)."""
    built.copy(_write_history, Path(path), versions, rows)


def _write_history(spark, path: str, versions: int, rows: int) -> None:
    """Inserts, updates and deletes over several versions: several batches per range at --batch-size 50."""
    create_table(spark, path, COLS)
    for v in range(versions):
        spark.createDataFrame(
            [(v * rows + i, f"g{i % 3}", float(i)) for i in range(rows)],
            "id BIGINT, grp STRING, amount DOUBLE",
        ).write.format("delta").mode("append").save(path)
        spark.sql(f"UPDATE delta.`{path}` SET amount = amount + 1 WHERE id % 7 = {v}")
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 11 = {v}")


def _precreate(spark, sink, path: str, target: TargetName) -> None:
    """Create the target as cdc2ch would, with merges stopped, so a duplicate block would stay visible."""
    types = schema.column_types(
        spark.read.format("delta").load(path).schema.jsonValue(), TableDesign(("id",))
    )
    sink.ensure_database(target.database)
    sink.command(schema.target_table_ddl(target, types, TableDesign(("id",))))
    sink.command(f"SYSTEM STOP MERGES {schema.qualified(target)}")


def _duplicates(sink, target: TargetName) -> int:
    """Rows stored more than once: the same key at the same version in two parts (merges are stopped, so
    nothing hides them; ClickHouse may still collapse a key's versions within one inserted block)."""
    return sink.query_rows(f"SELECT count() - uniqExact(id, _version) FROM {schema.qualified(target)}")[0][0]


@pytest.fixture
def server(clickhouse_http, monkeypatch):
    """Password for in-process runs; the same goes to subprocesses through `env`."""
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    monkeypatch.delenv("CDC2CH_CLICKHOUSE_PASSWORD_FILE", raising=False)
    return clickhouse_http


def _env(endpoint) -> dict:
    return {"CDC2CH_CLICKHOUSE_PASSWORD": endpoint.password, "CDC2CH_SKIP_SLOW": "1"}


def _is_data_insert(target: TargetName):
    return lambda req: req.is_insert and f"`{target.table}`" in req.sql and "cdc2ch_" not in req.sql


def _batch(target: TargetName, index: int):
    """Data inserts of batch `index` of a range (by the batch number in their deduplication token)."""

    def match(req) -> bool:
        token = req.params.get("insert_deduplication_token", "")
        return _is_data_insert(target)(req) and contract.batch_index(token) == index

    return match


def _state_insert(req):
    """The offset row a state insert writes, or None."""
    if not (req.is_insert and "cdc2ch_state" in req.sql):
        return None
    return req.rows()[0]


def test_transient_faults_are_retried_without_duplicates(
    built, spark, cli, http_sink, server, fault_proxy, database, tmp_path
):
    path = str(tmp_path / "flaky")
    _history(built, path)
    target = TargetName(database, "flaky")
    _precreate(spark, http_sink, path, target)
    # One fault per batch, so each costs exactly one retry (a retry carries the same token and passes).
    fault_proxy.add_fault("reset", match=_batch(target, 0))  # lost before reaching ClickHouse
    fault_proxy.add_fault("reset_after", match=_batch(target, 1))  # landed, but the answer was lost
    fault_proxy.add_fault(
        "error", match=_batch(target, 2), code=242
    )  # TABLE_IS_READ_ONLY: a replica restarting
    fault_proxy.add_fault("reset_after", match=_batch(target, 3))
    fault_proxy.add_fault("reset", match=_batch(target, 4))
    fault_proxy.add_fault("error", match=lambda r: "cdc2ch_state" in r.sql, code=209)  # SOCKET_TIMEOUT
    for i in (5, 6, 7):
        fault_proxy.add_fault("delay", match=_batch(target, i), seconds=0.5)

    result = cli.replicate(
        "run", path, target, "--once", "--batch-size", "50", "--clickhouse", fault_proxy.url_for()
    )
    assert fault_proxy.hits() == 9
    assert len(cli.events(result, "clickhouse_retry")) == 6  # every fault but the delays cost one retry
    assert_replicated(spark, http_sink, path, target)
    assert committed_version(http_sink, database, str(target)) == latest_version(spark, path)
    # The two inserts that landed unheard were retried with the same token and dropped by ClickHouse.
    assert _duplicates(http_sink, target) == 0


def test_outage_stops_with_offset_unchanged_then_catches_up(
    built, spark, cli, http_sink, server, fault_proxy, database, tmp_path
):
    path = str(tmp_path / "outage")
    _history(built, path, versions=2)
    target = TargetName(database, "outage")
    proxy_dsn = fault_proxy.url_for()
    # Part one lands (a new pipeline's failed first attempt would be taken back: test_new_pipeline_failures);
    # then ClickHouse starts failing every insert.
    cli.replicate("run", path, target, "--once", "--clickhouse", proxy_dsn)
    first = committed_version(http_sink, database, str(target))
    spark.createDataFrame([(10_000, "z", 1.0)], "id BIGINT, grp STRING, amount DOUBLE").write.format(
        "delta"
    ).mode("append").save(path)
    fault_proxy.add_fault("error", match=_is_data_insert(target), code=210, times=None)  # NETWORK_ERROR
    result = cli.replicate(
        "run", path, target, "--once", "--retries", "3", "--clickhouse", proxy_dsn, expect=1
    )
    err = " ".join(result.stderr.split())
    assert "could not be reached after 3 attempts" in err and "offset was not moved" in err
    assert len(cli.events(result, "clickhouse_retry")) == 2
    assert committed_version(http_sink, database, str(target)) == first  # nothing claimed that did not land

    # Down altogether: refused connections, bounded retries, a clear message, nothing moves.
    fault_proxy.clear()
    fault_proxy.down()
    result = cli.replicate(
        "run", path, target, "--once", "--retries", "2", "--clickhouse", proxy_dsn, expect=1
    )
    assert "Cannot connect to ClickHouse" in result.stderr and "(2 attempts): connection refused" in " ".join(
        result.stderr.split()
    )
    assert committed_version(http_sink, database, str(target)) == first

    fault_proxy.up()
    result = cli.replicate("run", path, target, "--once", "--clickhouse", proxy_dsn)
    assert cli.events(result, "resuming_interrupted_range")
    assert_replicated(spark, http_sink, path, target)
    assert committed_version(http_sink, database, str(target)) == latest_version(spark, path)


def test_slow_responses_time_out_and_retry(
    built, spark, cli, http_sink, server, fault_proxy, database, tmp_path
):
    """A response slower than send_receive_timeout: the client gives up and retries while the first insert
    is still on its way; whichever arrives second is dropped by its deduplication token."""
    path = str(tmp_path / "slow")
    _history(built, path, versions=1)
    target = TargetName(database, "slow")
    _precreate(spark, http_sink, path, target)
    fault_proxy.add_fault("delay", match=_is_data_insert(target), seconds=3, times=1)
    result = cli.replicate(
        "run",
        path,
        target,
        "--once",
        "--batch-size",
        "50",
        "--clickhouse",
        fault_proxy.url_for() + "?send_receive_timeout=1",
    )
    assert len(cli.events(result, "clickhouse_retry")) == 1
    threading.Event().wait(3)  # let the delayed insert arrive too
    assert_replicated(spark, http_sink, path, target)
    assert _duplicates(http_sink, target) == 0


def test_bad_credentials_and_unreachable_server(
    built, spark, cli, clickhouse_http, monkeypatch, database, tmp_path
):
    path = str(tmp_path / "creds")
    _history(built, path, versions=1)
    target = TargetName(database, "creds")
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", "wr0ng-pa55")
    result = cli.replicate("run", path, target, "--once", "--clickhouse", clickhouse_http.dsn, expect=1)
    err = " ".join(result.stderr.split())
    assert "rejected the credentials for user 'default'" in err and "CDC2CH_CLICKHOUSE_PASSWORD" in err
    assert "wr0ng-pa55" not in result.stderr + result.stdout
    secret_file = tmp_path / "pw"
    secret_file.write_text("wr0ng-fi1e\n")
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD_FILE", str(secret_file))
    result = cli("status", "--clickhouse", clickhouse_http.dsn, expect=1)
    assert "rejected the credentials" in result.stderr and "wr0ng-fi1e" not in result.stderr + result.stdout

    monkeypatch.delenv("CDC2CH_CLICKHOUSE_PASSWORD_FILE")
    result = cli.replicate(
        "run",
        path,
        target,
        "--once",
        "--retries",
        "2",
        "--clickhouse",
        "http://default@127.0.0.1:1/",
        expect=1,
    )
    assert "Cannot connect to ClickHouse at http://default@127.0.0.1:1/" in result.stderr


# -- crashes of real processes ---------------------------------------------------------------------------
def test_kill_at_each_point_then_converge(
    built, spark, cli, http_sink, server, fault_proxy, database, tmp_path
):
    """kill -9 during the CDF read, between insert batches, and between the last insert and the offset
    commit; each restart resumes, and the final table equals Delta with no duplicate block."""
    path = str(tmp_path / "killed")
    _history(built, path)
    target = TargetName(database, "killed")
    _precreate(spark, http_sink, path, target)
    args = ["run", "--table", path, "--primary-key", "id", "--target", str(target), "--once",
            "--batch-size", "50", "--clickhouse", fault_proxy.url_for()]  # fmt: skip
    data = _is_data_insert(target)
    proc = None

    def kill(req):
        proc.kill_9()

    def writing(req):
        row = _state_insert(req)
        return row is not None and row["pending_version"] > row["committed_version"]

    def committing(req):
        row = _state_insert(req)
        return row is not None and row["committed_version"] == row["pending_version"] >= 0

    points = {
        # the offset says "writing"; the kill lands a moment later, inside the Spark read
        "cdf_read": dict(match=writing, fn=lambda req: threading.Timer(1.0, kill, [req]).start()),
        "between_batches": dict(match=lambda r, n=[0]: data(r) and (n.__setitem__(0, n[0] + 1) or n[0] == 3),
                                fn=kill, forward=False),
        "before_commit": dict(match=committing, fn=kill, forward=False),
    }  # fmt: skip
    # The pipeline has an offset (version 0, the empty table): a new one reads and checks its first range
    # before it records anything, so a kill during that read would leave nothing to resume.
    cli("snapshot", *args[1:7], "--version", "0", "--clickhouse", fault_proxy.url_for())
    for name, fault in points.items():
        fault_proxy.clear()
        rule = fault_proxy.add_fault("call", **fault)
        proc = Proc(*args, env=_env(server))
        assert proc.wait() == -signal.SIGKILL, f"{name}: not killed\n{proc.stderr[-2000:]}"
        assert rule.fired == 1, name
        assert committed_version(http_sink, database, str(target)) < latest_version(spark, path), name

    fault_proxy.clear()
    cli(*args)
    assert_replicated(spark, http_sink, path, target)
    assert committed_version(http_sink, database, str(target)) == latest_version(spark, path)
    assert _duplicates(http_sink, target) == 0


def test_the_jvm_killed_mid_run_ends_in_one_paragraph_and_the_run_resumes(
    built, spark, cli, http_sink, server, fault_proxy, database, tmp_path
):
    """Spark's JVM (not cdc2ch) is killed when the first batch reaches ClickHouse, while the next range is
    being read ahead: whichever call meets the gone JVM first, the process ends with exit code 1 and one
    paragraph (no traceback), the offset has not passed what landed, and the same command converges."""
    path, target, args = _small_ranges(built, http_sink, fault_proxy, database, tmp_path, "jvm_killed")
    proc = None
    killed = []

    def kill_the_jvm(req):
        jvm = descendant(proc.pid, "java")
        if jvm:
            killed.append(jvm)
            os.kill(jvm, signal.SIGKILL)

    fault_proxy.clear()
    fault_proxy.add_fault("call", match=_is_data_insert(target), fn=kill_the_jvm)
    proc = Proc(*args, env=_env(server))
    assert proc.wait() == 1, proc.stderr[-3000:]
    assert killed, "the JVM was not found"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = json.loads(proc.stderr_lines[-1])
    assert last["event"] == "error" and re.search("JVM stopped|ran out of memory", last["message"]), last
    recorded = recorded_version(http_sink, database, str(target))  # None: the first range did not complete
    assert recorded is None or recorded < latest_version(spark, path)

    fault_proxy.clear()
    cli(*args)
    assert_replicated(spark, http_sink, path, target)
    assert _duplicates(http_sink, target) == 0


def test_a_service_of_a_config_ends_when_the_jvm_is_killed(
    built, spark, cli, http_sink, server, fault_proxy, database, tmp_path
):
    """A config's pipelines are isolated from one another's failures, but not from Spark's JVM gone: no
    pipeline can read again in that process, so the service ends (exit 1, one paragraph) for its supervisor
    to restart it whole, instead of retrying every pipeline forever."""
    path, target, args = _small_ranges(built, http_sink, fault_proxy, database, tmp_path, "jvm_killed_config")
    config = tmp_path / "jvm_killed.toml"
    config.write_text(
        f'clickhouse = "{fault_proxy.url_for()}"\npoll-interval = 1\nbatch-size = 40\nmax-rows-per-read = 200\n'
        f'[[pipelines]]\ntable = "{path}"\nprimary-key = "id"\ntarget = "{target}"\n'
    )
    proc = None
    killed = []

    def kill_the_jvm(req):
        jvm = descendant(proc.pid, "java")
        if jvm and not killed:
            killed.append(jvm)
            os.kill(jvm, signal.SIGKILL)

    fault_proxy.clear()
    fault_proxy.add_fault("call", match=_is_data_insert(target), fn=kill_the_jvm)
    proc = Proc("run", "--config", str(config), env=_env(server))
    assert proc.wait(timeout=180) == 1, proc.stderr[-3000:]
    assert killed, "the JVM was not found"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = json.loads(proc.stderr_lines[-1])
    assert last["event"] == "error" and "JVM stopped" in last["message"], last

    fault_proxy.clear()
    cli(*args)
    assert_replicated(spark, http_sink, path, target)
    assert _duplicates(http_sink, target) == 0


def test_an_idle_service_of_two_pipelines_ends_when_the_jvm_is_killed(
    built, spark, cli, http_sink, server, database, tmp_path
):
    """The JVM killed while a config's pipelines wait for changes: the next turn meets it gone while it sets
    the pipeline's Spark job group, and the service ends (exit 1, one paragraph) instead of turning over
    and over without a word."""
    lines = [f'clickhouse = "{server.dsn}"', "poll-interval = 1"]
    for name in ("idle_a", "idle_b"):
        path = str(tmp_path / name)
        _history(built, path, versions=1)
        lines += ["[[pipelines]]", f'table = "{path}"', 'primary-key = "id"', f'target = "{database}.{name}"']
    config = tmp_path / "idle.toml"
    config.write_text("\n".join(lines) + "\n")
    proc = Proc("run", "--config", str(config), env=_env(server))
    try:
        proc.wait_for("committed")
        deadline = time.monotonic() + 120
        while len({e["pipeline"] for e in proc.events("committed")}) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        jvm = descendant(proc.pid, "java")
        assert jvm, "the JVM was not found"
        time.sleep(2)  # idle: both caught up
        os.kill(jvm, signal.SIGKILL)
        assert proc.wait(timeout=120) == 1, proc.stderr[-3000:]
    finally:
        if proc.proc.poll() is None:
            proc.kill_9()
            proc.wait()
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = json.loads(proc.stderr_lines[-1])
    assert last["event"] == "error" and "JVM stopped" in last["message"], last


def _small_ranges(built, sink, fault_proxy, database: str, tmp_path, name: str):
    """A table with a history, its precreated target, and `run --once` arguments (through the proxy) that
    read it in several small ranges of several batches each."""
    path = str(tmp_path / name)
    _history(built, path, versions=3)
    target = TargetName(database, name)
    _precreate(built.spark, sink, path, target)
    args = ["run", "--table", path, "--primary-key", "id", "--target", str(target), "--once",
            "--batch-size", "40", "--max-rows-per-read", "200", "--clickhouse", fault_proxy.url_for()]  # fmt: skip
    return path, target, args


def test_random_kills_converge(built, spark, cli, http_sink, server, fault_proxy, database, tmp_path):
    """kill -9 after a random number of ClickHouse requests, three times over, then finish."""
    rng = random.Random(20261122)
    path, target, args = _small_ranges(built, http_sink, fault_proxy, database, tmp_path, "random")
    for _ in range(3):
        after = rng.randint(3, 40)
        seen = [0]

        def count(req, seen=seen, after=after):
            seen[0] += 1
            return seen[0] == after

        victim: list[Proc] = []
        fault_proxy.clear()
        fault_proxy.add_fault("call", match=count, fn=lambda req, v=victim: v[0].kill_9(), forward=False)
        victim.append(Proc(*args, env=_env(server)))
        code = victim[0].wait()
        assert code in (0, -signal.SIGKILL), victim[0].stderr[-2000:]
    fault_proxy.clear()
    cli(*args)
    assert_replicated(spark, http_sink, path, target)
    assert _duplicates(http_sink, target) == 0


def test_sigterm_mid_range_stops_cleanly_and_leaks_no_secret(
    built, spark, cli, http_sink, server, fault_proxy, database, tmp_path
):
    import subprocess

    path = str(tmp_path / "term")
    _history(built, path, versions=2)
    target = TargetName(database, "term")
    _precreate(spark, http_sink, path, target)
    args = ["run", "--table", path, "--primary-key", "id", "--target", str(target), "--once",
            "--batch-size", "50", "--clickhouse", fault_proxy.url_for()]  # fmt: skip
    process_table = []
    proc = None

    def terminate(req):
        process_table.append(subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout)
        proc.signal(signal.SIGTERM)

    fault_proxy.add_fault("call", match=_is_data_insert(target), fn=terminate)
    proc = Proc(*args, env=_env(server))
    assert proc.wait() == 0, proc.stderr[-2000:]
    abandoned = proc.events("range_abandoned")
    assert abandoned and abandoned[0]["batches_written"] == 1  # the batch in flight finished, no other began
    assert committed_version(http_sink, database, str(target)) == -1  # the range did not complete
    assert [e["signal"] for e in proc.events("signal_received")] == ["SIGTERM"]

    # No secret in the process table (cdc2ch, its Spark JVM and workers), the logs or status output.
    assert str(proc.pid) in process_table[0]
    status = cli("status", "--clickhouse", server.dsn, "--json")
    for text in (process_table[0], proc.stderr, proc.stdout, status.stdout, status.stderr):
        assert server.password not in text

    fault_proxy.clear()
    result = cli(*args)
    assert cli.events(result, "resuming_interrupted_range")
    assert_replicated(spark, http_sink, path, target)
    assert _duplicates(http_sink, target) == 0  # the landed batch was not doubled


# -- one runner per pipeline --------------------------------------------------------------------------------
def test_one_runner_per_pipeline_on_a_server(built, spark, cli, http_sink, server, database, tmp_path):
    path = str(tmp_path / "locked")
    _history(built, path, versions=1)
    target = TargetName(database, "locked")
    args = [
        "run",
        "--table",
        path,
        "--primary-key",
        "id",
        "--target",
        str(target),
        "--clickhouse",
        server.dsn,
    ]
    holder = Proc(*args, "--poll-interval", "1", env=_env(server))
    try:
        holder.wait_for("committed")  # a new pipeline is claimed when its first range has been checked
        result = cli(*args, "--once", expect=75)
        err = " ".join(result.stderr.split())
        assert "is already being run by cdc2ch run on host" in err and f"(pid {holder.pid})" in err
    finally:
        holder.kill_9()
        holder.wait()
    # Killed on this host: its claim is released at once, not after the TTL.
    result = cli(*args, "--once")
    assert cli.events(result, "stale_claim_released")
    assert_replicated(spark, http_sink, path, target)

    # A claim from another host that stopped heartbeating blocks only until --lock-ttl has passed.
    http_sink.command(
        f"INSERT INTO {schema.quote(database)}.cdc2ch_locks SELECT {schema.literal(str(target))}, 'tok', "
        f"'cdc2ch run', 'elsewhere', 1, now64(3), now64(3), 0"
    )
    result = cli(*args, "--once", "--lock-ttl", "3", expect=75)
    assert "on host elsewhere (pid 1)" in result.stderr
    threading.Event().wait(3.5)
    cli(*args, "--once", "--lock-ttl", "3")

    # A claim of a process of this host that died long ago blocked no one, but it is released too: after
    # a restart the table holds no claim of a dead runner that this host can vouch for.
    gone = subprocess.Popen(["true"])
    gone.wait()
    http_sink.command(
        f"INSERT INTO {schema.quote(database)}.cdc2ch_locks SELECT {schema.literal(str(target))}, 'old', "
        f"'cdc2ch run', {schema.literal(socket.gethostname())}, {gone.pid}, now64(3) - INTERVAL 1 HOUR, "
        f"now64(3) - INTERVAL 1 HOUR, 0"
    )
    cli(*args, "--once", "--lock-ttl", "3")
    unreleased = http_sink.query_rows(
        f"SELECT token FROM {schema.quote(database)}.cdc2ch_locks FINAL "
        f"WHERE pipeline = {{p:String}} AND released = 0",
        {"p": str(target)},
    )
    assert unreleased == [("tok",)], unreleased  # only the other host's, which this host cannot judge


def test_one_process_per_embedded_database(built, spark, tmp_path):
    path = str(tmp_path / "emb")
    _history(built, path, versions=1)
    dsn = f"chdb://{tmp_path / 'emb-clickhouse'}"
    args = ["run", "--table", path, "--primary-key", "id", "--clickhouse", dsn]
    holder = Proc(*args, "--poll-interval", "1", cwd=str(tmp_path))
    holder.wait_for("committed")  # claimed: a new pipeline claims itself once its first range is checked
    second = Proc(*args, "--once", cwd=str(tmp_path))
    assert second.wait() == 75  # "in use", as for a claimed pipeline
    err = " ".join(second.stderr.split())
    assert "is in use by cdc2ch run (pid" in err and f"pid {holder.pid} on host" in err
    # SIGTERM while idle: a clean stop, exit 0, and the claim is released.
    holder.signal(signal.SIGTERM)
    assert holder.wait() == 0 and holder.events("stopped")
    query = Proc(
        "query", "SELECT released FROM cdc2ch.cdc2ch_locks FINAL", "--format", "TSV", "--clickhouse", dsn
    )
    assert query.wait() == 0 and query.stdout.split() == ["1"], query.stderr
