"""The Python API, from this test session's own Spark: results, errors, the session and logging left as they
were, continuous runs stopped by an event."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
import time

import pytest
import structlog

import cdc2ch
from cdc2ch.api import replicate, snapshot, status
from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.model.config import TargetName
from cdc2ch.source.sparkread.deltasource import CDF_SCHEMA_CONF, session_conf
from tests.support.helpers import assert_replicated, create_table, latest_version

COLS = "id BIGINT, name STRING"
CONF_KEYS = sorted(CDF_SCHEMA_CONF)


def _log_level(spark) -> str:
    return str(spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())


def _tables(sink, database: str) -> list:
    return sink.query_rows(f"SELECT name FROM system.tables WHERE database = '{database}'")


@pytest.fixture
def caller_conf(spark):
    """One of cdc2ch's read settings set by the caller to its own value, the other unset; put back after."""
    before = {k: spark.conf.get(k, None) for k in CONF_KEYS}
    spark.conf.unset(CONF_KEYS[0])
    spark.conf.set(CONF_KEYS[1], "latest")
    yield
    for key, value in before.items():
        spark.conf.unset(key) if value is None else spark.conf.set(key, value)


def test_replicate_uses_the_session_as_it_is_and_logs_through_logging(
    spark, sink, chdb_dsn, cli, database, tmp_path, caplog, capsys, caller_conf
):
    path = str(tmp_path / "t")
    target = TargetName(database, "t")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, concat('n', id) FROM range(50)")
    spark.sql(f"UPDATE delta.`{path}` SET name = 'u' WHERE id % 5 = 0")
    first_latest = latest_version(spark, path)

    conf, level, logging_set_up = spark.conf.getAll, _log_level(spark), structlog.get_config()
    handlers = list(logging.getLogger().handlers)
    caplog.set_level(logging.INFO, logger="cdc2ch")
    first = cdc2ch.replicate(spark, table=path, primary_key=["id"], clickhouse=chdb_dsn, target=str(target),
                             reader="spark")  # fmt: skip  # through the session, whose ranking counts rows below

    assert first.pipeline == first.target == str(target)
    assert (first.start_version, first.end_version, first.committed_version) == (
        0,
        first_latest,
        first_latest,
    )
    assert first.rows == 50  # 50 inserts, 10 of them updated since: each key's newest row
    assert first.versions == first_latest + 1 and first.seconds > 0
    assert_replicated(spark, sink, path, target)

    # The session, its log level, structlog and the root logger's handlers are as the caller left them.
    assert spark.conf.getAll == conf and spark.conf.get(CONF_KEYS[1]) == "latest"
    assert spark.conf.get(CONF_KEYS[0], None) is None
    assert _log_level(spark) == level
    assert structlog.get_config() == logging_set_up
    assert logging.getLogger().handlers == handlers
    # Events are records of the `cdc2ch` loggers; nothing printed on its own.
    committed = [r for r in caplog.records if r.name.startswith("cdc2ch") and r.event == "committed"]
    assert committed and committed[-1].fields["version"] == first_latest
    assert committed[-1].getMessage().startswith("committed ") and f"pipeline={target}" in committed[-1].msg
    out = capsys.readouterr()
    assert "committed" not in out.out + out.err

    spark.sql(f"INSERT INTO delta.`{path}` VALUES (100, 'x'), (101, 'y')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 3")
    second = replicate(spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target))
    assert (second.start_version, second.end_version) == (first_latest + 1, first_latest + 2)
    assert second.rows == 5  # 2 inserts, 3 deletes
    assert_replicated(spark, sink, path, target)
    again = replicate(spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target))
    assert (again.start_version, again.versions, again.rows) == (None, 0, 0)
    assert again.committed_version == second.end_version

    # status: what `cdc2ch status --json` shows, the API's runs' last success included.
    found = status(spark, clickhouse=chdb_dsn, target=str(target))
    assert [dataclasses.asdict(s) for s in found] == json.loads(
        cli("status", "--json", "--target", str(target)).stdout
    )
    (row,) = found
    assert (row.committed_version, row.versions_behind, row.failing) == (second.end_version, 0, False)
    assert row.last_success is not None


def test_snapshot_then_replicate(spark, sink, chdb_dsn, database, tmp_path):
    path = str(tmp_path / "s")
    target = TargetName(database, "s")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, 'a' FROM range(20)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id >= 15")
    at = latest_version(spark, path)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (50, 'late')")

    loaded = snapshot(
        spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target), version=at
    )
    assert (loaded.completed, loaded.version, loaded.rows, loaded.committed_version) == (True, at, 15, at)
    assert_replicated(spark, sink, path, target, at)
    result = replicate(spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target))
    assert (result.start_version, result.end_version, result.rows) == (at + 1, at + 1, 1)
    assert_replicated(spark, sink, path, target)


def test_every_read_runs_in_the_callers_job_group_also_those_read_ahead(
    spark, sink, chdb_dsn, database, tmp_path
):
    path = str(tmp_path / "g")
    target = TargetName(database, "g")
    create_table(spark, path, COLS)
    # Versions of 10 rows and a column added at version 3: with a bound of 10, the ranges are 0..1 and 2
    # (collected; 2 is read while 0..1 is written) and 3..5 (20 rows, streamed).
    for v in range(4):
        if v == 2:
            spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (note STRING)")
        extra = ", 'n'" if v >= 2 else ""
        spark.sql(f"INSERT INTO delta.`{path}` SELECT id, 'x'{extra} FROM range({v * 10}, {v * 10 + 10})")
    sc, group = spark.sparkContext, f"cdc2ch-api-{database}"
    ungrouped = set(sc.statusTracker().getJobIdsForGroup(None))
    sc.setJobGroup(group, "replicate from the API")
    try:
        result = replicate(
            spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target),
            batch_size=10, max_rows_per_read=10, reader="spark",
        )  # fmt: skip
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)
    assert set(sc.statusTracker().getJobIdsForGroup(None)) - ungrouped == set()
    assert len(sc.statusTracker().getJobIdsForGroup(group)) >= 3  # one read per range at least
    assert result.rows == 40 and result.committed_version == latest_version(spark, path)
    assert_replicated(spark, sink, path, target)


def test_read_settings_hold_while_another_thread_still_plans_a_read(spark, tmp_path, caller_conf):
    """Threads sharing the session (the API called from threads, a verify beside a run) plan reads at once:
    the first to leave its block must not put the settings back under the other's `load`, which Delta then
    refuses (a CDF read at a version, allowed only by those settings)."""
    path = str(tmp_path / "s")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    spark.sql(f"UPDATE delta.`{path}` SET name = 'b'")
    first_in, first_out = threading.Event(), threading.Event()

    def first() -> None:
        with session_conf(spark, CDF_SCHEMA_CONF):
            first_in.set()
            first_out.wait(30)

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(30)
    with session_conf(spark, CDF_SCHEMA_CONF):
        first_out.set()
        thread.join(30)
        cdf = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1)
        frame = cdf.option("endingVersion", 2).option("versionAsOf", 2).load(path)
    assert frame.count() == 3  # the insert, and the update's pre- and post-image
    # Both blocks left: the caller's settings are as it set them.
    assert spark.conf.get(CONF_KEYS[1]) == "latest" and spark.conf.get(CONF_KEYS[0], None) is None


def test_bad_input_raises_the_commands_error_and_creates_nothing(
    spark, sink, chdb_dsn, cli, database, tmp_path
):
    target = f"{database}.t"
    missing = str(tmp_path / "nowhere")
    with pytest.raises(SourceError) as refused:
        replicate(spark, table=missing, primary_key="id", clickhouse=chdb_dsn, target=target)
    result = cli.replicate("run", missing, target, "--once", expect=1)
    assert [e["message"] for e in cli.events(result, "error")] == [str(refused.value)]  # the same paragraph

    path = str(tmp_path / "nullkey")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (NULL, 'b')")
    with pytest.raises(
        SourceError, match=r"1 row\(s\) in versions 0..1 of .* have a null in primary-key column 'id'"
    ):
        replicate(spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=target)
    assert _tables(sink, database) == []  # no target, no offset, no lock or health table

    for options, message in (
        ({"batchsize": 5}, r"replicate\(\) has no option 'batchsize'.* batch_size,"),
        ({"log_level": "debug"}, "set its level with logging"),
        ({"batch_size": 0}, r"--batch-size must be at least 1 \(got 0\)"),
        ({"writer": "nope"}, "replicate\\(writer='nope'\\): 'nope' is not one of"),
        ({"primary_key": None}, "--primary-key is required"),
    ):
        kwargs = {"table": path, "primary_key": "id", "clickhouse": chdb_dsn, "target": target, **options}
        with pytest.raises(ConfigError, match=message):
            replicate(spark, **kwargs)
    with pytest.raises(ConfigError, match="version='x'"):
        snapshot(spark, table=path, primary_key="id", clickhouse=chdb_dsn, version="x")
    assert _tables(sink, database) == []


def test_continuous_until_stopped(spark, sink, chdb_dsn, database, tmp_path, caplog):
    path = str(tmp_path / "c")
    target = TargetName(database, "c")
    create_table(spark, path, COLS)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    caplog.set_level(logging.INFO, logger="cdc2ch")
    stop, outcome = threading.Event(), {}

    def work():
        outcome["result"] = replicate(
            spark, table=path, primary_key="id", clickhouse=chdb_dsn, target=str(target), once=False,
            stop=stop, poll_interval=0.2,
        )  # fmt: skip

    def committed(version: int) -> bool:  # the worker's own log records (ClickHouse is its own meanwhile)
        return any(
            getattr(r, "event", None) == "committed" and r.fields["version"] == version
            for r in caplog.records
        )

    worker = threading.Thread(target=work)
    worker.start()
    try:
        _wait_for(lambda: committed(1) or not worker.is_alive())
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (2, 'b')")
        _wait_for(lambda: committed(2) or not worker.is_alive())
    finally:
        stop.set()
        worker.join(60)
    result = outcome["result"]
    assert (result.start_version, result.end_version, result.rows) == (0, 2, 2)
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert_replicated(spark, sink, path, target)


def _wait_for(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
