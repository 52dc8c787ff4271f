"""The Python API's keyword options and logging route: pure code, no Spark, no ClickHouse."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest
from structlog.testing import capture_logs

from cdc2ch import api
from cdc2ch.base.errors import ConfigError
from cdc2ch.base.log import api_call, get_logger, in_api_call
from cdc2ch.cli import main
from cdc2ch.commands.options import Invocation, build_config
from cdc2ch.model.config import RunConfig, TargetName, default_dsn


def _cfg(**keywords) -> RunConfig:
    return api._config("run", "replicate", {"table": "/d/orders", "primary_key": "id", **keywords}, once=True)


def _cli_cfg(*argv: str) -> RunConfig:
    ctx = main.commands["run"].make_context("run", ["--table", "/d/orders", "--primary-key", "id", *argv])
    return build_config(Invocation("run", dict(ctx.params)).values)


def test_defaults_and_conversions_are_the_command_lines():
    assert _cfg() == _cli_cfg("--once")
    assert _cfg().clickhouse_dsn == default_dsn() and _cfg().target == TargetName("cdc2ch", "orders")
    given = _cfg(
        primary_key=("tenant", "id"),
        batch_size="100",
        from_timestamp=datetime(2026, 1, 2, 3, 4, 5),
        reset=True,
        writer="driver",
        target="db.t",
        pipeline="p",
        max_rows_per_read=None,  # None: the default
    )
    assert given == _cli_cfg(
        "--once", "--primary-key", "tenant,id", "--batch-size", "100", "--from-timestamp",
        "2026-01-02T03:04:05", "--reset", "--writer", "driver", "--target", "db.t", "--pipeline", "p",
    )  # fmt: skip
    assert given.from_timestamp == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert (
        api._config(
            "snapshot", "snapshot", {"table": "/d", "primary_key": "id", "version": 3}, True
        ).snapshot_version
        == 3
    )


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"batchsize": 1}, r"cdc2ch.replicate\(\) has no option 'batchsize'\. .*batch_size, clickhouse,"),
        ({"spark_conf": ["a=b"]}, "uses your SparkSession as it is"),
        ({"metrics_port": 9464}, "is for `cdc2ch run`"),
        ({"batch_size": "many"}, r"replicate\(batch_size='many'\): 'many' is not a valid integer"),
        ({"on_schema_change": "ignore"}, "is not one of 'fail', 'resync'"),
        ({"from_timestamp": "yesterday"}, "is not an ISO-8601 timestamp"),
        ({"lock_ttl": 0}, r"--lock-ttl must be at least 1 second \(got 0.0\)"),
        ({"primary_key": ""}, "--primary-key is required"),
        ({"target": "a.b.c"}, "is not a ClickHouse table name"),
    ],
)
def test_bad_keywords_are_refused_as_the_command_line_refuses_flags(keywords, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(**keywords)


def test_events_are_stdlib_records_only_during_an_api_call(caplog):
    log = get_logger("cdc2ch.pipeline").bind(pipeline="db.t")
    caplog.set_level(logging.INFO, logger="cdc2ch")
    with capture_logs() as captured:
        log.info("committed", version=3)  # the CLI's route: structlog as configured
    assert captured == [{"event": "committed", "pipeline": "db.t", "version": 3, "log_level": "info"}]
    assert caplog.records == []
    with api_call():
        assert in_api_call()
        log.info("committed", version=4, error="two words")
        log.debug("hidden")  # below the logger's level: dropped before formatting
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("pipeline_failed")
    assert not in_api_call()
    committed, failed = caplog.records
    assert (committed.name, committed.levelno, committed.event) == (
        "cdc2ch.pipeline",
        logging.INFO,
        "committed",
    )
    assert committed.fields == {"pipeline": "db.t", "version": 4, "error": "two words"}
    assert committed.getMessage() == 'committed pipeline=db.t version=4 error="two words"'
    assert failed.levelno == logging.ERROR and failed.exc_info[0] is ValueError
