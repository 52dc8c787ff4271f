"""Executor-side writes (`--writer executors`): Spark tasks insert their own partitions into a ClickHouse
server over HTTP; a retried insert is dropped by its token; the offset moves only after the whole job."""

from __future__ import annotations

from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from tests.e2e.clickhouse.test_faults import _duplicates, _history, _precreate
from tests.support.helpers import assert_replicated, committed_version, create_table, latest_version


def test_tasks_insert_their_partitions(
    built, spark, cli, http_sink, clickhouse_http, fault_proxy, database, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    path = str(tmp_path / "exec")
    _history(built, path, versions=3, rows=200)
    target = TargetName(database, "exec")
    _precreate(spark, http_sink, path, target)
    data = lambda r: r.is_insert and "`exec`" in r.sql and "cdc2ch_" not in r.sql  # noqa: E731
    fault_proxy.add_fault("reset_after", match=data, times=2)  # landed, answer lost: the task retries
    fault_proxy.add_fault("error", match=data, code=252, times=1)  # TOO_MANY_PARTS
    args = ["run", "--table", path, "--primary-key", "id", "--target", str(target), "--once",
            "--writer", "executors", "--batch-size", "100", "--clickhouse", fault_proxy.url_for()]  # fmt: skip
    result = cli(*args)
    (written,) = cli.events(result, "range_written")
    assert written["writer"] == "executors" and written["partitions"] > 1
    assert written["batches"] >= written["partitions"]  # no partition exceeds --batch-size per insert
    # Each key's newest row only: its older states and update pre-images are outranked (no key changed).
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(path)
    assert feed.count() > written["rows"] == feed.select("id").distinct().count()
    assert fault_proxy.hits() == 3
    assert_replicated(spark, http_sink, path, target)
    assert _duplicates(http_sink, target) == 0
    assert committed_version(http_sink, database, str(target)) == latest_version(spark, path)

    spark.sql(f"UPDATE delta.`{path}` SET amount = -1 WHERE id < 50")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id BETWEEN 50 AND 60")
    cli(*args)
    assert_replicated(spark, http_sink, path, target)


def test_executor_writer_refusals(spark, sink, cli, clickhouse_http, database, tmp_path, monkeypatch):
    path = str(tmp_path / "refuse")
    create_table(spark, path, "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (NULL, 'b')")
    base = ["run", "--table", path, "--primary-key", "id", "--once", "--writer", "executors"]
    result = cli(*base, "--target", f"{database}.refuse", expect=2)
    assert "needs a ClickHouse server target" in result.stderr
    assert (
        sink.query_rows(f"SELECT count() FROM system.tables WHERE database = {schema.literal(database)}")[0][
            0
        ]
        == 0
    )

    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    result = cli(*base, "--target", f"{database}.refuse", "--clickhouse", clickhouse_http.dsn, expect=1)
    assert "1 row(s) in versions 0..1" in result.stderr and "null in primary-key column 'id'" in result.stderr


def _process_with_local_port(port: int) -> int | None:
    """The pid owning the TCP socket bound to 127.0.0.1:`port` (Linux /proc)."""
    import os

    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes}:
                    return int(pid)
        except OSError:
            continue
    return None


class StandaloneCluster:
    """A Spark standalone master and one worker: separate JVMs, started with pyspark's own spark-class."""

    def __init__(self, tmp_path):
        import socket
        import subprocess
        import sys
        from pathlib import Path

        import pyspark

        self.home = Path(pyspark.__file__).parent
        spark_class = str(self.home / "bin" / "spark-class")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"spark://127.0.0.1:{port}"
        env = {**__import__("os").environ, "SPARK_HOME": str(self.home), "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "work")}  # fmt: skip
        logs = tmp_path / "cluster.log"
        self.log = logs
        out = open(logs, "w")

        def daemon(cls: str, *args: str) -> subprocess.Popen:
            return subprocess.Popen(
                [spark_class, cls, *args, "--webui-port", "0"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

        self.procs = [
            daemon("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)),
            daemon("org.apache.spark.deploy.worker.Worker", self.url, "--cores", "2", "--memory", "2g"),
        ]
        # An application may register once the master leads (its jobs wait for the worker): the driver's JVM
        # starts beside the worker's instead of after it.
        self._wait_for("I have been elected leader", 180)

    def wait_for_worker(self) -> None:
        self._wait_for("Successfully registered with master", 180)

    def _wait_for(self, text: str, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while text not in self.log.read_text():
            assert all(p.poll() is None for p in self.procs), self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"cluster did not start:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.1)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(60)


def test_on_a_standalone_cluster_with_a_killed_task(
    built, spark, cli, http_sink, clickhouse_http, fault_proxy, database, tmp_path
):
    """`cdc2ch run --spark-master spark://…` with executor writes; the first attempt of one task dies in the
    middle of its inserts (its Python worker is killed from the proxy), Spark retries the task, and FINAL is
    right with no duplicate block."""
    import os
    import signal
    import sys

    from tests.support.helpers import Proc

    path = str(tmp_path / "cluster")
    _history(built, path, versions=3, rows=200)
    target = TargetName(database, "cluster")
    _precreate(spark, http_sink, path, target)
    killed = []

    def kill_the_task(req):
        # The insert comes from a Python worker of the executor: find it by its TCP connection and kill it,
        # after letting this (second) insert of the task land.
        victim = _process_with_local_port(req.client_port)
        if victim:
            killed.append(victim)
            os.kill(victim, signal.SIGKILL)

    data = lambda r: r.is_insert and "`cluster`" in r.sql and "cdc2ch_" not in r.sql  # noqa: E731
    seen = [0]
    fault_proxy.add_fault(
        "call",
        match=lambda r: data(r) and (seen.__setitem__(0, seen[0] + 1) or seen[0] == 3),
        fn=kill_the_task,
    )
    cluster = StandaloneCluster(tmp_path)
    try:
        proc = Proc(
            "run", "--table", path, "--primary-key", "id", "--target", str(target), "--once", "--batch-size", "100",
            "--spark-master", cluster.url, "--clickhouse", fault_proxy.url_for(),
            env={"CDC2CH_CLICKHOUSE_PASSWORD": clickhouse_http.password, "PYSPARK_PYTHON": sys.executable},
        )  # fmt: skip
        cluster.wait_for_worker()
        assert proc.wait() == 0, proc.stderr[-3000:]
    finally:
        cluster.stop()
    (written,) = proc.events("range_written")
    assert written["writer"] == "executors"  # chosen automatically: a cluster and a server target
    assert killed, "no task was killed"
    assert_replicated(spark, http_sink, path, target)
    assert _duplicates(http_sink, target) == 0
    assert committed_version(http_sink, database, str(target)) == latest_version(spark, path)
