"""Ctrl-C and JSON logs in real `cdc2ch` processes.

SIGINT goes to the whole process group, as a terminal's Ctrl-C does, at each stage of a run: while Spark
starts, while the change data feed is read, between inserts, and idle. Each time: exit 0, a `stopped` line,
no traceback, nothing recorded as an error, and the next `run --once` converges. The processes log with
--log-format json, and every line they print must be JSON (the JVM's start-up lines included).
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

from cdc2ch.model.config import TargetName
from tests.support.helpers import (
    Proc,
    assert_replicated,
    committed_version,
    create_table,
    java_home_that_waits,
    latest_version,
)
from tests.support.processes import descendants


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ignores_sigint(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def _until(condition, timeout: float, what: str, proc: Proc) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.proc.poll() is None, (
            f"exited {proc.proc.returncode} before {what}:\n{proc.stderr[-3000:]}"
        )
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{proc.stderr[-3000:]}"
        time.sleep(0.05)


@contextmanager
def _killed_at_the_end(*procs: Proc):
    """Whatever happens, no process is left behind (they have process groups of their own)."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _env(endpoint) -> dict:
    return {"CDC2CH_CLICKHOUSE_PASSWORD": endpoint.password}


def _run(path: str, target: TargetName, endpoint, *extra: str) -> list[str]:
    return ["run", "--table", path, "--primary-key", "id", "--target", str(target),
            "--clickhouse", endpoint.dsn, *extra]  # fmt: skip


def _stopped_cleanly(proc: Proc) -> None:
    """Exit 0 after SIGINT, a `stopped` line, no traceback, and JSON on every line of stdout and stderr."""
    code = proc.wait()
    out = proc.stderr + proc.stdout
    assert code == 0, f"exit {code}:\n{out[-3000:]}"
    assert [e["signal"] for e in proc.events("signal_received")] == ["SIGINT"], out[-3000:]
    assert proc.events("stopped"), out[-3000:]
    assert "Traceback" not in out and "Aborted" not in out, out[-3000:]
    for line in proc.stderr_lines + proc.stdout.splitlines():
        assert isinstance(json.loads(line), dict), line  # raises on any line that is not JSON


def _no_error_recorded(cli, endpoint, database: str) -> None:
    rows = json.loads(cli("status", "--clickhouse", endpoint.dsn, "--json").stdout)
    mine = [r for r in rows if r["target"].startswith(f"{database}.")]
    assert mine and all(r["last_error"] is None for r in mine), mine


def test_ctrl_c_while_spark_starts_and_while_idle(spark, cli, http_sink, clickhouse_http, database, tmp_path):
    path = str(tmp_path / "t")
    create_table(spark, path, "id BIGINT, v STRING")
    for v in range(2):
        spark.createDataFrame([(v * 10 + i, f"v{i}") for i in range(10)], "id BIGINT, v STRING").write.format(
            "delta"
        ).mode("append").save(path)
    latest = latest_version(spark, path)
    starting, idle = TargetName(database, "starting"), TargetName(database, "idle")
    env = _env(clickhouse_http)
    early = Proc(*_run(path, starting, clickhouse_http, "--poll-interval", "1"), env=env, group=True)
    late = Proc(*_run(path, idle, clickhouse_http, "--poll-interval", "1"), env=env, group=True)

    with _killed_at_the_end(early, late):
        # While Spark starts: as soon as its JVM exists.
        _until(lambda: any("java" in _cmdline(c.pid) for c in descendants(early.pid)), 300, "the JVM", early)
        early.interrupt()

        # Idle: caught up to the latest version, then nothing to do.
        caught_up = lambda: any(e["version"] == latest for e in late.events("committed"))  # noqa: E731
        _until(caught_up, 300, "the catch-up", late)
        # What Ctrl-C reaches besides cdc2ch ignores it (the JVM); PySpark's workers have their own group.
        group = [c.pid for c in descendants(late.pid) if c.group == late.pid]
        assert group and all(_ignores_sigint(p) for p in group), [(p, _cmdline(p)[:80]) for p in group]
        time.sleep(1.5)
        late.interrupt()

        _stopped_cleanly(early)
        # Spark starts at the pipeline's first read: stopped then, it committed nothing.
        stopped = early.events("stopped")[0]
        assert stopped.get("started") is False or stopped.get("committed") == -1, stopped
        _stopped_cleanly(late)
    assert committed_version(http_sink, database, str(idle)) == latest
    _no_error_recorded(cli, clickhouse_http, database)
    for target in (starting, idle):
        cli(*_run(path, target, clickhouse_http, "--once"))
        assert_replicated(spark, http_sink, path, target)


def test_ctrl_c_while_reading_and_while_inserting(spark, cli, http_sink, clickhouse_http, database, tmp_path):
    path = str(tmp_path / "big")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.range(100_000).selectExpr("id", "cast(id * 7 as string) as v").write.format("delta").mode(
        "append"
    ).save(path)
    reading, inserting = TargetName(database, "reading"), TargetName(database, "inserting")
    env = _env(clickhouse_http)
    read = Proc(*_run(path, reading, clickhouse_http, "--once"), env=env, group=True)
    insert = Proc(
        *_run(path, inserting, clickhouse_http, "--once", "--batch-size", "10000"), env=env, group=True
    )

    with _killed_at_the_end(read, insert):
        read.wait_for("start", 300)  # next: the Delta log and the change data feed, read through py4j
        read.interrupt()
        insert.wait_for("batch", 300)  # the first insert is done; more follow
        insert.interrupt()

        _stopped_cleanly(read)
        _stopped_cleanly(insert)
    # Stopped inside the reads (the Delta log, then the feed: py4j calls): nothing written, nothing committed.
    assert not read.events("batch") and not read.events("committed"), read.stderr[-3000:]
    abandoned = insert.events("range_abandoned")
    assert abandoned and 1 <= abandoned[0]["batches_written"] <= 2, insert.stderr[-3000:]  # the one in flight
    # A new pipeline records its offset (-1) once its first range passed the checks: the one stopped while
    # reading has none yet or -1, as the signal fell before or after that; the one stopped while inserting
    # is at -1, its range not complete.
    state = f"SELECT committed_version FROM `{database}`.cdc2ch_state FINAL WHERE pipeline = {{p:String}}"
    assert http_sink.query_rows(state, {"p": str(reading)}) in ([], [(-1,)])
    assert committed_version(http_sink, database, str(inserting)) == -1
    _no_error_recorded(cli, clickhouse_http, database)
    for target in (reading, inserting):
        cli(*_run(path, target, clickhouse_http, "--once"))
        assert_replicated(spark, http_sink, path, target)


STOP_WHILE_LISTING = """
import os, signal, sys
from cdc2ch.commands import app
real = app.pipelines

def listing_then_a_stop(invocation, *rest):
    listed = real(invocation, *rest)
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the pipelines are listed and checked
    return listed

app.pipelines = listing_then_a_stop
sys.argv = ["cdc2ch", *sys.argv[1:]]
from cdc2ch.cli import main
main()
"""


def test_a_stop_while_the_pipelines_are_listed_is_a_clean_stop(spark, tmp_path):
    """A signal that comes before any work (while the tables are listed and the options checked, seconds
    on a busy machine) stops the run cleanly, exit 0, instead of killing it by the signal."""
    import subprocess
    import sys

    path = str(tmp_path / "listed")
    create_table(spark, path, "id BIGINT, name STRING")
    dsn = f"chdb://{tmp_path / 'ch'}"
    done = subprocess.run(
        [sys.executable, "-c", STOP_WHILE_LISTING, "run", "--table", path, "--primary-key", "id",
         "--clickhouse", dsn, "--log-format", "json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert any('"signal_received"' in line for line in done.stderr.splitlines()), done.stderr[-3000:]


def _running_under(path: Path) -> list[int]:
    """Processes of this host whose command line names `path` (the slow java and what it runs)."""
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if str(path) in _cmdline(int(p.name))]


def test_a_stop_while_spark_starts_slowly_ends_at_once_and_begins_nothing(
    spark, http_sink, clickhouse_http, database, tmp_path
):
    """SIGTERM to a service, and Ctrl-C to a snapshot, while their JVM is still starting (here a java that
    takes two minutes to begin, as on a loaded machine): each ends within seconds, exit 0, ends the JVM being
    started, and creates no table and takes no claim after the signal."""
    path = str(tmp_path / "t")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    home = java_home_that_waits(tmp_path / "slow-jdk", "sleep 120")  # as on a loaded machine
    env = {**_env(clickhouse_http), "JAVA_HOME": str(home), "CDC2CH_CLASS_ARCHIVE": "off"}
    service, loaded = TargetName(database, "service"), TargetName(database, "loaded")
    run = Proc(*_run(path, service, clickhouse_http, "--reader", "spark"), env=env, group=True)
    snapshot = Proc(
        "snapshot", "--table", path, "--primary-key", "id", "--target", str(loaded),
        "--clickhouse", clickhouse_http.dsn, "--reader", "spark", env=env, group=True,
    )  # fmt: skip

    with _killed_at_the_end(run, snapshot):
        for proc in (run, snapshot):  # the slow java runs: the JVM is starting
            _until(
                lambda p=proc: any(str(home) in _cmdline(c.pid) for c in descendants(p.pid)),
                300,
                "java",
                proc,
            )
        run.signal(signal.SIGTERM)
        sent = time.monotonic()
        snapshot.interrupt()
        codes = [proc.wait(15) for proc in (run, snapshot)]
        took = time.monotonic() - sent
    for proc, code in zip((run, snapshot), codes):
        out = proc.stderr + proc.stdout
        assert code == 0, f"exit {code}:\n{out[-3000:]}"
        assert "Traceback" not in out, out[-3000:]
        assert proc.events("starting_spark"), out[-3000:]
        assert not proc.events("spark_started") and not proc.events("target_created"), out[-3000:]
    assert run.events("stopped"), run.stderr[-3000:]
    ended = json.loads(snapshot.stdout)  # the line a snapshot ends with, stopped or not
    assert ended["event"] == "summary" and ended["stopped"] and ended["rows"] == 0, ended
    assert took < 10, took
    assert _running_under(home) == []  # the JVM being started was ended with its launcher
    for target in (service, loaded):
        assert not http_sink.query_rows(
            "SELECT name FROM system.tables WHERE database = {d:String} AND name = {t:String}",
            {"d": database, "t": target.table},
        )
    # The snapshot claimed its pipeline before Spark started, and let it go; the service, whose new pipeline
    # claims itself with its first range, never claimed. Neither recorded an offset.
    tables = {t for (t,) in http_sink.query_rows("SHOW TABLES FROM {d:Identifier}", {"d": database})}
    if "cdc2ch_state" in tables:
        assert not http_sink.query_rows(f"SELECT pipeline FROM `{database}`.cdc2ch_state")
    claims = (
        http_sink.query_rows(
            f"SELECT pipeline, min(released) FROM `{database}`.cdc2ch_locks FINAL GROUP BY pipeline"
        )
        if "cdc2ch_locks" in tables
        else []
    )
    assert claims in ([], [(str(loaded), 1)]), claims
