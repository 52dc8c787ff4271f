"""Many pipelines in one process, side by side: a small table's change is not held back by another table's
load, and a kill -9 while several tables load leaves nothing lost or doubled. Real Spark, Delta and
ClickHouse."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from cdc2ch.fleet.runner import Fleet, Runner
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.replication.metrics import Metrics
from tests.support.helpers import (
    Proc,
    assert_replicated,
    committed_version,
    create_table,
    job_config,
    latest_version,
)


def _append(path: str, start: int, rows: int) -> None:
    """A commit of `rows` new rows, written by delta-rs: the loads are what these tests are about, and Spark
    takes about twenty times the CPU to write the same rows."""
    ids = pa.array(range(start, start + rows), pa.int64())
    names = pc.binary_join_element_wise("n", pc.cast(ids, pa.string()), "")
    write_deltalake(path, pa.table({"id": ids, "name": names}), mode="append")


def _live(sink, target: TargetName) -> tuple[int, int]:
    """(live rows, sum of their ids) as FINAL shows them; (0, 0) before the table exists."""
    if not sink.table_exists(target):
        return 0, 0
    count, total = sink.query_rows(
        f"SELECT count(), sum(id) FROM {schema.qualified(target)} FINAL WHERE _is_deleted = 0"
    )[0]
    return int(count), int(total or 0)


def _doubled(sink, target: TargetName) -> int:
    """Rows stored more than once for the same key and version (insert deduplication keeps this 0)."""
    return sink.query_rows(f"SELECT count() - uniqExact(id, _version) FROM {schema.qualified(target)}")[0][0]


def _big_table(spark, path: str, versions: int, rows: int) -> tuple[int, int]:
    create_table(spark, path, "id BIGINT, name STRING")
    for v in range(versions):
        _append(path, v * rows, rows)
    n = versions * rows
    return n, n * (n - 1) // 2


def test_a_small_tables_change_is_not_held_back_by_another_tables_load(
    spark, sink, chdb_dsn, database, tmp_path
):
    """While one pipeline loads 4M rows, a commit to a small table reaches ClickHouse within a few seconds,
    before the load ends (one thread taking turns would hold it for the whole load)."""
    big, small = str(tmp_path / "big"), str(tmp_path / "small")
    expected_big = _big_table(spark, big, versions=10, rows=400_000)  # long enough to stream beside a commit
    create_table(spark, small, "id BIGINT, name STRING")
    _append(small, 0, 5)
    targets = {big: TargetName(database, "big"), small: TargetName(database, "small")}
    configs = [
        replace(job_config(path, target, chdb_dsn, max_rows_per_read=400_000), once=False, poll_interval=1.0)
        for path, target in targets.items()
    ]
    sink.widen(3)
    stop, failed = threading.Event(), []
    runner = Runner(configs, spark, sink, stop, Metrics(), fleet=Fleet(isolate=True, workers=2))
    thread = threading.Thread(target=lambda: failed.extend(runner.run()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while _live(sink, targets[small])[0] < 5:  # the small table's first load
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.2)
        _append(small, 100, 1)
        committed = time.monotonic()
        while _live(sink, targets[small])[0] < 6:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.1)
        latency = time.monotonic() - committed
        big_done = (
            committed_version(sink, database, str(targets[big])) if _live(sink, targets[big])[0] else -1
        )
        print(f"small table's change in ClickHouse {latency:.2f}s after its commit, during the big load")
        assert big_done < latest_version(spark, big), "the big load ended first: nothing was shown"
        assert latency < 1.0 + 10.0  # poll + 2 s is the benchmark's goal; a loaded CI machine gets slack
        while _live(sink, targets[big]) != expected_big:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(300)
    assert not thread.is_alive() and failed == []
    assert_replicated(spark, sink, small, targets[small])
    assert _doubled(sink, targets[big]) == 0


def test_kill_9_while_several_tables_load_then_rerun(
    spark, cli, http_sink, clickhouse_http, database, tmp_path
):
    """A service loading four tables at once is killed with -9 once some have committed and others have
    not finished; `run --once` afterwards leaves every table equal to Delta, no row stored twice."""
    lake = tmp_path / "lake"
    expected = {name: _big_table(spark, str(lake / name), versions=3, rows=150_000) for name in "abcd"}
    args = [
        "--table", f"{lake}/*", "--primary-key", "id", "--target", f"{database}.{{table}}",
        "--max-rows-per-read", "150000", "--max-parallel", "3", "--clickhouse", clickhouse_http.dsn,
    ]  # fmt: skip
    env = {"CDC2CH_CLICKHOUSE_PASSWORD": clickhouse_http.password}
    proc = Proc("run", *args, "--poll-interval", "1", env=env)
    try:
        deadline = time.monotonic() + 300
        while len({e["pipeline"] for e in proc.events("committed")}) < 2:
            assert time.monotonic() < deadline, proc.stderr[-3000:]
            assert proc.proc.poll() is None, proc.stderr[-3000:]
            time.sleep(0.1)
    finally:
        proc.kill_9()
        proc.wait(60)
    targets = {name: TargetName(database, name) for name in expected}
    at_kill = {name: _live(http_sink, t) for name, t in targets.items()}
    assert any(at_kill[n] != expected[n] for n in expected), "every table had finished: no load was cut"
    cli("run", *args, "--once", "--lock-ttl", "2")
    for name, target in targets.items():
        assert _live(http_sink, target) == expected[name], name
        assert _doubled(http_sink, target) == 0, name
        assert committed_version(http_sink, database, str(target)) == latest_version(spark, str(lake / name))
    assert_replicated(spark, http_sink, str(lake / "a"), targets["a"])
