"""Shared fixtures: one real Spark session and one real embedded ClickHouse (chdb) per test run."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from click.testing import CliRunner

from cdc2ch.cli import main
from cdc2ch.config import SparkSettings
from cdc2ch.sink import connect
from cdc2ch.source.spark import session

_ids = itertools.count()


@pytest.fixture(scope="session")
def spark():
    s = session(SparkSettings("local[2]", (("spark.sql.shuffle.partitions", "2"),)))
    yield s
    s.stop()


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
        if argv[0] in ("run", "snapshot", "status", "query") and "--clickhouse" not in argv:
            argv += ["--clickhouse", self.dsn]
        if argv[0] in ("run", "snapshot", "status") and "--log-format" not in argv:
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
