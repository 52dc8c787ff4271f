"""`cdc2ch status` reads the Delta log with Python where it can reach the storage: no JVM, an answer in a
moment. Proven by a real `cdc2ch status` process that has no Java to start."""

from __future__ import annotations

import json
import shutil

from cdc2ch.model.config import TargetName
from cdc2ch.source.sparkread.deltasource import DeltaSource
from tests.support.helpers import Proc, create_table


def test_status_reads_the_delta_log_without_a_jvm(
    spark, cli, http_sink, clickhouse_http, database, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    path = str(tmp_path / "nojvm")
    create_table(spark, path, "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    target = TargetName(database, "nojvm")
    cli.replicate("run", path, target, "--once", "--clickhouse", clickhouse_http.dsn)
    for i in (3, 4):
        spark.sql(f"INSERT INTO delta.`{path}` VALUES ({i}, 'x')")

    # No Java anywhere: starting Spark would fail this process.
    env = {
        "CDC2CH_CLICKHOUSE_PASSWORD": clickhouse_http.password,
        "JAVA_HOME": "/nonexistent",
        "PATH": "/nonexistent",
    }
    proc = Proc("status", "--target", str(target), "--json", "--clickhouse", clickhouse_http.dsn, env=env)
    assert proc.wait(120) == 0, proc.stderr[-2000:]  # also waits for its output to be read
    (row,) = json.loads(proc.stdout)
    source = DeltaSource(spark, path)
    latest = source.latest()
    versions, seconds = source.lag(1, latest)
    assert (row["committed_version"], row["latest_version"], row["versions_behind"]) == (
        1,
        latest.version,
        versions,
    )
    assert row["seconds_behind"] == seconds and versions == 2 and row["error"] is None
    assert not proc.events("status_reads_log_with_spark")

    # A table removed since is named the same way as when Spark looks.
    shutil.rmtree(path)
    proc = Proc("status", "--target", str(target), "--json", "--clickhouse", clickhouse_http.dsn, env=env)
    assert proc.wait(120) == 0, proc.stderr[-2000:]  # also waits for its output to be read
    (row,) = json.loads(proc.stdout)
    assert f"The Delta table path {path} does not exist" in row["error"], row


def test_a_share_whose_server_does_not_answer_is_reported_at_once(cli, sink, database, tmp_path):
    """`status` is a report: a sharing server that takes connections and never answers is that row's error
    after one short attempt, not minutes of retries that hold back every row after it."""
    import socket
    import time
    from datetime import datetime, timezone

    from cdc2ch.clickhouse.state.statestore import StateStore
    from cdc2ch.model.records import PipelineState

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections wait in the backlog; nothing ever reads them
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}/sharing"
        profile = tmp_path / "silent.share"
        profile.write_text(
            json.dumps({"shareCredentialsVersion": 1, "endpoint": endpoint, "bearerToken": "t"})
        )
        name = f"{database}.silent"
        store = StateStore(sink, database)
        store.ensure()
        store.save(PipelineState(name, f"{profile}#s.sc.t", name, 3, 3, 1, datetime.now(timezone.utc)))
        started = time.monotonic()
        (row,) = json.loads(cli("status", "--json", "--pattern", name).stdout)
        waited = time.monotonic() - started
    assert row["pipeline"] == name and "could not be reached after 1 attempt" in json.dumps(row), row
    assert waited < 30, f"status took {waited:.0f} s"  # 6 attempts of 60 s each before
