"""Shared fixtures: one real Spark session and one real embedded ClickHouse (chdb) per test run."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdc2ch.cli import main
from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.model.config import SparkSettings
from cdc2ch.source.spark.session import session

_ids = itertools.count()

# The files whose tests take longest (pytest --durations), handed to the workers first: the last minutes of a
# run then spread small files over all the workers instead of waiting on one long file. xdist's loadfile
# deals each worker a first batch of files in turn, so this order also decides how that batch is split.
LONGEST_FIRST = (
    "e2e/replication/test_snapshot.py",
    "e2e/clickhouse/test_faults.py",
    "e2e/replication/test_table_features.py",
    "e2e/replication/test_changes_from_log.py",
    "e2e/replication/test_replication.py",
    "e2e/sharing/test_sharing.py",
    "e2e/fleet/test_soak.py",
    "e2e/replication/test_generated_histories.py",
    "e2e/storage/test_object_storage.py",
    "e2e/fleet/test_patterns.py",
    "e2e/replication/test_executors.py",
    "e2e/clickhouse/test_serve.py",
    "e2e/commands/test_getting_started.py",
    "e2e/commands/test_verify.py",
    "e2e/fleet/test_catalog.py",
    "e2e/commands/test_cli.py",
    "e2e/replication/test_design.py",
    "e2e/deploy/test_class_archive.py",
    "e2e/commands/test_no_java.py",
    "e2e/fleet/test_lifecycle.py",
    "e2e/replication/test_follow.py",
    "e2e/fleet/test_fleet.py",
    "e2e/replication/test_initial_load.py",
    "e2e/replication/test_table_history.py",
)


# The Spark JVMs of the cdc2ch processes the suite starts live for seconds: compiled by C1 alone they cost a
# third less CPU, and the suite is bound by CPU. This process's own session lives for the whole run and
# keeps the full JIT (see `spark`). spark-submit puts SPARK_SUBMIT_OPTS before cdc2ch's own JVM options.
SHORT_JVM = "-XX:TieredStopAtLevel=1"
_short_jvm = "SPARK_SUBMIT_OPTS" not in os.environ
if _short_jvm:
    os.environ["SPARK_SUBMIT_OPTS"] = SHORT_JVM


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests = Path(__file__).parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(tests).as_posix(), len(rank)))  # stable


# The worker's own session writes the suite's Delta tables and reads for the in-process commands: queries
# on a few hundred rows, each planned once, cheaper interpreted than compiled to Java per plan (figures in
# docs/development.md). cdc2ch processes the suite starts keep Spark's defaults.
TEST_SESSION_CONF = (
    ("spark.sql.shuffle.partitions", "2"),
    ("spark.sql.codegen.wholeStage", "false"),
    ("spark.sql.codegen.factoryMode", "NO_CODEGEN"),
)


@pytest.fixture(scope="session")
def spark():
    if _short_jvm:
        del os.environ["SPARK_SUBMIT_OPTS"]
    try:
        s = session(SparkSettings("local[2]", TEST_SESSION_CONF, frozenset({"s3"})))  # tests/e2e/storage
    finally:
        if _short_jvm:
            os.environ["SPARK_SUBMIT_OPTS"] = SHORT_JVM
    yield s
    s.stop()


@pytest.fixture(scope="session")
def built(spark, tmp_path_factory):
    """Delta histories written once per test run; each test gets its own copy (tests/support/helpers.py)."""
    from tests.support.helpers import BuiltTables

    base = tmp_path_factory.getbasetemp()
    run = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base  # the workers' folders share a parent
    return BuiltTables(spark, run / "built")


@pytest.fixture(scope="session")
def chdb_dsn(tmp_path_factory):
    # chdb runs one engine per process: every test shares it and isolates itself by database.
    return f"chdb://{tmp_path_factory.mktemp('clickhouse')}"


@pytest.fixture(scope="session")
def sink(chdb_dsn):
    s = connect(chdb_dsn)
    yield s
    s.close()


@pytest.fixture
def database():
    return f"t{os.getpid()}_{next(_ids)}"


class Cli:
    """Runs the real `cdc2ch` command in-process (sharing the Spark session) and parses its JSON logs."""

    def __init__(self, dsn: str):
        self.dsn = dsn

    def __call__(self, *args: str, expect: int = 0):
        argv = list(args)
        if (
            argv[0] in ("run", "snapshot", "status", "query", "validate", "compact", "verify", "reshape")
            and "--clickhouse" not in argv
        ):
            argv += ["--clickhouse", self.dsn]
        if (
            argv[0] in ("run", "snapshot", "status", "validate", "verify", "reshape")
            and "--log-format" not in argv
        ):
            argv += ["--log-format", "json"]
        result = CliRunner().invoke(main, argv, catch_exceptions=False)
        assert result.exit_code == expect, (
            f"cdc2ch {' '.join(argv)} exited {result.exit_code}, expected {expect}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
        return result

    def replicate(self, command: str, path: str, target, *extra: str, key: str = "id", expect: int = 0):
        """`cdc2ch run|snapshot --table path --primary-key key --target target [extra]`."""
        return self(
            command, "--table", path, "--primary-key", key, "--target", str(target), *extra, expect=expect
        )

    @staticmethod
    def events(result, name: str | None = None) -> list[dict]:
        out = []
        for line in result.stderr.splitlines():
            if line.startswith("{"):
                ev = json.loads(line)
                if name is None or ev.get("event") == name:
                    out.append(ev)
        return out


@pytest.fixture(scope="session")
def cli(chdb_dsn):
    return Cli(chdb_dsn)


# -- ClickHouse over HTTP ---------------------------------------------------------------------------------
# Server-target tests talk HTTP to `clickhouse_http`: the session's chdb engine behind tests/support/chserver.py, or a
# real server when CDC2CH_TEST_CLICKHOUSE_URL (http://user@host:8123/, password in
# CDC2CH_TEST_CLICKHOUSE_PASSWORD) is set.
CHSERVER_PASSWORD = "s3cr3t-test"


@pytest.fixture(scope="session")
def chserver(chdb_dsn, sink):
    from tests.support.chserver import ChServer

    # `sink` first: the embedded client opens the engine; ChServer adds its own handles to it.
    with ChServer(chdb_dsn[len("chdb://") :], user="default", password=CHSERVER_PASSWORD) as server:
        yield server


@pytest.fixture(scope="session")
def clickhouse_http(request):
    from urllib.parse import unquote, urlsplit

    from tests.support.chserver import Endpoint

    url = os.environ.get("CDC2CH_TEST_CLICKHOUSE_URL")
    if url:
        parts = urlsplit(url)
        password = os.environ.get("CDC2CH_TEST_CLICKHOUSE_PASSWORD", "")
        return Endpoint(parts.hostname, parts.port or 8123, unquote(parts.username or "default"), password)
    server = request.getfixturevalue("chserver")  # started only when no real server is configured
    return Endpoint("127.0.0.1", server.port, server.user, server.password)


@pytest.fixture
def fault_proxy(clickhouse_http):
    from tests.support.chserver import FaultProxy

    with FaultProxy(clickhouse_http.host, clickhouse_http.port) as proxy:
        yield proxy


@pytest.fixture
def http_sink(clickhouse_http, monkeypatch):
    monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", clickhouse_http.password)
    monkeypatch.delenv("CDC2CH_CLICKHOUSE_PASSWORD_FILE", raising=False)
    s = connect(clickhouse_http.dsn)
    yield s
    s.close()
