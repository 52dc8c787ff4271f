"""The Python API's keyword options and logging route: pure code, no Spark, no ClickHouse."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from structlog.testing import capture_logs

from cdc2ch import api
from cdc2ch.base.errors import ConfigError
from cdc2ch.base.log import api_call, get_logger, in_api_call
from cdc2ch.cli import main
from cdc2ch.commands.invocation.options import Invocation, build_config
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
    compacting = _cfg(compact_every="1d12h", compact_older_than="0")
    assert compacting == _cli_cfg("--once", "--compact-every", "1d12h", "--compact-older-than", "0")
    assert (compacting.compact_every, compacting.compact_older_than) == (timedelta(hours=36), timedelta(0))
    assert _cfg().compact_every is None  # off by default
    assert (
        api._config(
            "snapshot", "snapshot", {"table": "/d", "primary_key": "id", "version": 3}, True
        ).snapshot_version
        == 3
    )


@pytest.mark.parametrize(
    "keywords, message",
    [
        (
            {"batchsize": 1},
            r"cdc2ch.replicate\(\) has no option 'batchsize'\. .*batch_size, changes_from, clickhouse,",
        ),
        ({"spark_conf": ["a=b"]}, "uses your SparkSession as it is"),
        ({"metrics_port": 9464}, "is for `cdc2ch run`"),
        ({"batch_size": "many"}, r"replicate\(batch_size='many'\): 'many' is not a valid integer"),
        ({"on_schema_change": "ignore"}, "is not one of 'fail', 'resync'"),
        ({"from_timestamp": "yesterday"}, "is not an ISO-8601 timestamp"),
        ({"lock_ttl": 0}, r"--lock-ttl must be at least 1 second \(got 0.0\)"),
        # Found by tests/e2e/commands/test_fuzz_cli.py: these passed validation and reached ClickHouse and Spark.
        ({"lock_ttl": float("nan")}, r"--lock-ttl must be at least 1 second \(got nan\), and finite"),
        ({"poll_interval": float("inf")}, r"--poll-interval must be positive \(got inf\), and finite"),
        ({"poll_interval": float("nan")}, r"--poll-interval must be positive \(got nan\)"),
        ({"retries": 0}, r"--retries counts attempts per ClickHouse call: at least 1 \(got 0\)"),
        ({"batch_size": True}, r"True is a boolean; --batch-size takes a value"),
        ({"from_version": 1.5}, r"1.5 is not a whole number"),
        ({"batch_size": float("inf")}, r"inf is not a whole number"),
        ({"target": {"a": 1}}, r"--target takes a value or a list of values, not a table"),
        ({"primary_key": [["id"]]}, r"not a table or a nested list"),
        ({"table": "s3a://"}, r"is a scheme with no location after it"),
        ({"batch_size": [1]}, r"--batch-size takes a number, not a table or a list"),
        ({"target": ""}, None),
        (
            {"target": "db."},
            r"--target 'db\.' is not a ClickHouse table name \(a part of it is empty\)\. Use",
        ),
        ({"primary_key": ""}, "--primary-key is required"),
        ({"target": "a.b.c"}, "is not a ClickHouse table name"),
        ({"compact_every": "soon"}, r"--compact-every 'soon' is not a duration cdc2ch understands"),
        ({"compact_every": "0"}, r"--compact-every must be a positive duration"),
        ({"compact_older_than": "7d"}, r"no --compact-every schedules one"),
        ({"compact_every": "1d", "cluster": "c"}, r"a target on --cluster c is a Distributed table"),
    ],
)
def test_bad_keywords_are_refused_as_the_command_line_refuses_flags(keywords, message):
    if message is None:  # accepted: the default
        _cfg(**keywords)
        return
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


def test_refusals_found_by_fuzzing_the_command_line(tmp_path):
    """tests/e2e/commands/test_fuzz_cli.py found these: a traceback instead of a usage error, a DSN that could not be
    parsed, a database path of several names, a negative discovery interval; each now one paragraph."""
    from click.testing import CliRunner

    dsn = f"chdb://{tmp_path / 'ch'}"
    base = ["run", "--table", "/d/orders", "--primary-key", "id", "--clickhouse", dsn]
    result = CliRunner().invoke(main, [*base, "--primary-keys", "x"])
    assert result.exit_code == 2 and "is not of the form column=value" in result.stderr, result.stderr
    result = CliRunner().invoke(main, [*base, "--discover-interval", "-1", "--once"])
    assert result.exit_code == 2 and "--discover-interval must be a positive" in result.stderr, result.stderr
    # validate checks what run checks: a --serve address run would refuse.
    result = CliRunner().invoke(main, ["validate", *base[1:], "--serve", "host:port"])
    assert result.exit_code == 2 and "is not an address to listen on" in result.stderr, result.stderr
    result = CliRunner().invoke(main, [*base, "--serve-tls-cert", str(tmp_path / "c.pem")])
    assert result.exit_code == 2 and "--serve-tls-cert configure what --serve" in result.stderr, result.stderr
    assert not (tmp_path / "ch").exists()
    from cdc2ch.clickhouse.connection import remote as server

    with pytest.raises(ConfigError, match=r"cannot be parsed .*Invalid IPv6 URL.*in brackets"):
        server.connect("http://[::1/", 1)
    with pytest.raises(ConfigError, match=r"names 'a/b' as its database: the path after the host is one"):
        server.connect("http://127.0.0.1:1/a/b", 1)
