"""Operations: many pipelines from one config file, option precedence, validate, status, metrics, retries."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from dataclasses import asdict

import pytest

from cdc2ch.cli import invocation, run
from cdc2ch.commands.invocation.options import load_config, resolve
from cdc2ch.model.config import TargetName
from tests.support.helpers import Proc, assert_replicated, committed_version, create_table

COLS = "id BIGINT, name STRING"


def _table(spark, path: str, *statements: str) -> str:
    create_table(spark, path, COLS)
    for sql in statements:
        spark.sql(sql.format(t=f"delta.`{path}`"))
    return path


def _pipeline(database: str, name: str, table: str, **extra) -> str:
    """A [[pipelines]] entry named `name` writing `database.name`, keyed by id; extra keys verbatim."""
    lines = [f'name = "{name}"', f'table = "{table}"', 'primary-key = "id"', f'target = "{database}.{name}"']
    lines += [f"{k.replace('_', '-')} = {v}" for k, v in extra.items()]
    return "\n[[pipelines]]\n" + "\n".join(lines) + "\n"


def _write_config(tmp_path, text: str) -> str:
    path = tmp_path / "cdc2ch.toml"
    path.write_text(text)
    return str(path)


def test_config_replicates_the_good_pipelines_and_reports_the_bad_one(spark, cli, sink, database, tmp_path):
    a = _table(
        spark, str(tmp_path / "a"), "INSERT INTO {t} VALUES (1,'x'),(2,'y')", "DELETE FROM {t} WHERE id = 1"
    )
    b = _table(spark, str(tmp_path / "b"), "INSERT INTO {t} VALUES (7,'q')", "UPDATE {t} SET name = 'Q'")
    missing = str(tmp_path / "nowhere")
    config = _write_config(
        tmp_path,
        "batch-size = 1  # every row its own insert, for all pipelines but b\n"
        + _pipeline(database, "a", a, reader='"spark"')
        + _pipeline(database, "b", b, reader='"clickhouse"', batch_size=1000)
        + _pipeline(database, "missing", missing),
    )
    result = cli("run", "--config", config, "--once", expect=1)
    assert "1 of 3 pipelines failed" in result.stderr and "missing (source)" in result.stderr, result.stderr[
        -1500:
    ]
    assert_replicated(spark, sink, a, TargetName(database, "a"))
    assert_replicated(spark, sink, b, TargetName(database, "b"))
    # a: its rows one by one (3 change rows; the insert of key 1 is outranked by its delete); b: one statement
    assert len(cli.events(result, "batch")) == 2 + 1
    failed = cli.events(result, "pipeline_failed")
    assert [(e["pipeline"], e["kind"]) for e in failed] == [("missing", "source")]

    rows = {r["pipeline"]: r for r in json.loads(cli("status", "--config", config, "--json").stdout)}
    assert list(rows) == ["a", "b", "missing"]
    for name in ("a", "b"):
        assert rows[name]["committed_version"] == rows[name]["latest_version"] == 2, rows[name]
        assert (rows[name]["versions_behind"], rows[name]["seconds_behind"]) == (0, 0.0)
        assert not rows[name]["failing"] and rows[name]["error"] is None and rows[name]["last_success"]
    bad = rows["missing"]
    assert bad["failing"] and bad["last_error_kind"] == "source" and bad["last_error_at"]
    assert "does not exist" in bad["error"] and missing in bad["error"]
    assert bad["committed_version"] is None and bad["last_success"] is None
    table = cli("status", "--config", config).stdout
    assert "The Delta table path" in table.splitlines()[3]

    # All good now (the table appears): the same command succeeds and the error is no longer current.
    _table(spark, missing, "INSERT INTO {t} VALUES (5,'m')")
    cli("run", "--config", config, "--once")
    assert_replicated(spark, sink, missing, TargetName(database, "missing"))
    bad = {r["pipeline"]: r for r in json.loads(cli("status", "--config", config, "--json").stdout)}[
        "missing"
    ]
    assert not bad["failing"] and bad["error"] is None and "does not exist" in bad["last_error"]


def _resolve(argv: list[str]):
    given = invocation(run.make_context("run", argv))
    configs, process = resolve(given, load_config(given))
    return configs, asdict(process)


def test_option_precedence_flag_env_file_default(tmp_path, monkeypatch):
    config = _write_config(
        tmp_path,
        """
clickhouse = "chdb:///tmp/from-file"
poll-interval = 7
batch-size = 100
retries = 9
spark-conf = { "spark.driver.memory" = "2g" }

[[pipelines]]
table = "/lake/orders"
primary-key = ["tenant", "id"]
batch-size = 50
from-timestamp = 2026-11-01T00:00:00Z

[[pipelines]]
name = "customers"
table = "/lake/customers"
primary-key = "id"
target = "crm.customers"
""",
    )
    for var in ("CDC2CH_BATCH_SIZE", "CDC2CH_RETRIES", "CDC2CH_CLICKHOUSE_URL", "CDC2CH_POLL_INTERVAL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CDC2CH_RETRIES", "3")
    (orders, customers), process = _resolve(["--config", config, "--batch-size", "10"])
    assert orders.batch_size == customers.batch_size == 10  # flag beats env, entry and top level
    assert orders.retries == customers.retries == 3  # env beats the file
    assert (
        orders.poll_interval == 7 and orders.clickhouse_dsn == "chdb:///tmp/from-file"
    )  # file beats default
    assert orders.lock_ttl == 60.0 and orders.reader == "auto"  # defaults
    assert orders.primary_key == ("tenant", "id") and orders.target == TargetName("cdc2ch", "orders")
    assert orders.from_timestamp.isoformat() == "2026-11-01T00:00:00+00:00"
    assert orders.spark.conf == (("spark.driver.memory", "2g"),)
    assert (customers.pipeline, str(customers.target)) == ("customers", "crm.customers")
    assert process["config_path"] == config

    (orders, _), _ = _resolve(["--config", config])
    assert orders.batch_size == 50  # the entry beats the top level
    (only,), _ = _resolve(["--config", config, "--pipeline", "customers"])
    assert only.pipeline == "customers"

    from cdc2ch.base.errors import ConfigError

    bad_cases = [
        (["--config", config, "--table", "/x"], "set `table` in the file's [[pipelines]] entries"),
        (["--config", config, "--pipeline", "nope"], "its pipelines are: cdc2ch.orders, customers"),
        (["--config", str(tmp_path / "absent.toml")], "does not exist"),
    ]
    for argv, message in bad_cases:
        with pytest.raises(ConfigError, match=None) as err:
            _resolve(argv)
        assert message in str(err.value), str(err.value)
    for text, message in (
        ("[[pipelines]]\ntable = '/t'\nprimary-key = 'id'\nbatch_sise = 5\n", "unknown key 'batch_sise'"),
        ("[[pipelines]]\ntable = '/t'\nprimary-key = 'id'\nclickhouse = 'chdb:///x'\n", "whole process"),
        ("[[pipelines]]\ntable = '/t'\nprimary-key = 'id'\nreader = 'duckdb'\n", "'duckdb' is not one of"),
        (
            "[[pipelines]]\ntable = '/t'\nprimary-key = 'id'\n[[pipelines]]\ntable = '/u/t'\nprimary-key = 'id'\n",
            "target table 'cdc2ch.t' is used by more than one pipeline",
        ),
        ("batch-size = = 3", "not valid TOML"),
    ):
        path = _write_config(tmp_path, text)
        with pytest.raises(ConfigError) as err:
            _resolve(["--config", path])
        assert message in str(err.value), str(err.value)


def test_validate_checks_everything_and_writes_nothing(spark, cli, sink, database, tmp_path):
    good = _table(spark, str(tmp_path / "good"), "INSERT INTO {t} VALUES (1,'x')")
    config = _write_config(
        tmp_path,
        f"""
[[pipelines]]
table = "{good}"
primary-key = "id"
target = "{database}.good"

[[pipelines]]
table = "{good}"
primary-key = "nope"
target = "{database}.badkey"

[[pipelines]]
table = "{tmp_path / "missing"}"
primary-key = "id"
target = "{database}.missing"
""",
    )
    result = cli("validate", "--config", config, expect=2)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ok") and "ClickHouse" in lines[0] and "reachable" in lines[0]
    assert (
        lines[1].split()[:2] == ["ok", f"{database}.good"]
        and "latest version 1, starts at version 0" in lines[1]
    )
    assert lines[2].startswith("FAIL") and "'nope' are not in the Delta table" in lines[2]
    assert lines[3].startswith("FAIL") and "does not exist" in lines[3]
    assert sink.query_rows(f"SELECT count() FROM system.databases WHERE name = '{database}'")[0][0] == 0

    cli("validate", "--config", config, "--pipeline", f"{database}.good")  # exit 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Prometheus text format -> {(metric, sorted labels): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        pairs = tuple(
            sorted(
                p.split("=", 1)[0] + "=" + p.split("=", 1)[1].strip('"')
                for p in labels.rstrip("}").split(",")
                if p
            )
        )
        out[(name, pairs)] = float(value)
    return out


def _wait(check, timeout: float, proc: Proc, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert proc.proc.poll() is None, f"cdc2ch exited {proc.proc.returncode}:\n{proc.stderr[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s:\n{proc.stderr[-3000:]}"
        time.sleep(0.5)


def test_service_metrics_and_a_failing_pipeline_retried_without_stopping_the_other(
    spark, http_sink, clickhouse_http, database, tmp_path
):
    """A continuous run over HTTP: the good pipeline replicates and its counters match the rows written;
    another fails (no table yet), is retried with its errors counted, and catches up once the table exists;
    a third keeps failing (not a Delta table) without holding the others up."""
    good = _table(spark, str(tmp_path / "good"), "INSERT INTO {t} VALUES (1,'a'),(2,'b'),(3,'c')")
    late = str(tmp_path / "late")
    config = _write_config(
        tmp_path,
        f'clickhouse = "{clickhouse_http.dsn}"\npoll-interval = 0.5\nbatch-size = 2\n'
        + _pipeline(database, "good", good)
        + _pipeline(database, "late", late)
        + _pipeline(database, "never", str(tmp_path)),
    )
    port = _free_port()
    proc = Proc(
        "run",
        "--config",
        config,
        "--metrics-port",
        str(port),
        env={"CDC2CH_CLICKHOUSE_PASSWORD": clickhouse_http.password},
    )
    try:
        good_rows = ("cdc2ch_rows_written_total", ("pipeline=good",))
        late_errors = ("cdc2ch_errors_total", ("kind=source", "pipeline=late"))
        m = _wait(
            lambda: (
                (s := _scrape_or_none(port))
                and s.get(good_rows) == 3
                and s.get(("cdc2ch_versions_behind", ("pipeline=good",))) == 0
                # (set as its turn ends, after the lag: a scrape may fall between the two)
                and s.get(("cdc2ch_last_success_timestamp_seconds", ("pipeline=good",)))
                and s.get(late_errors, 0) >= 2
                and s
            ),
            240,
            proc,
            "3 rows for good (its offset committed) and 2 failed attempts for late",
        )
        assert m[("cdc2ch_batches_written_total", ("pipeline=good",))] == 2  # batches of 2 and 1
        assert m[("cdc2ch_batch_seconds_count", ("pipeline=good",))] == 2
        assert m[("cdc2ch_bytes_written_total", ("pipeline=good",))] > 0
        assert m[("cdc2ch_last_success_timestamp_seconds", ("pipeline=good",))] > time.time() - 120
        assert ("cdc2ch_last_success_timestamp_seconds", ("pipeline=late",)) not in m

        spark.sql(f"INSERT INTO delta.`{good}` VALUES (4,'d')")
        _table(spark, late, "INSERT INTO {t} VALUES (9,'z')", "INSERT INTO {t} VALUES (10,'y')")
        late_rows = ("cdc2ch_rows_written_total", ("pipeline=late",))
        m = _wait(
            lambda: (s := _scrape_or_none(port)) and s.get(good_rows) == 4 and s.get(late_rows) == 2 and s,
            240,
            proc,
            "late catching up",
        )
    finally:
        proc.signal(signal.SIGTERM)
        code = proc.wait()
    assert code == 0, proc.stderr[-3000:]  # a service exits 0 on SIGTERM, even with a pipeline failing
    assert m[("cdc2ch_errors_total", ("kind=source", "pipeline=never"))] >= 2
    for name, path in (("good", good), ("late", late)):
        target = TargetName(database, name)
        assert_replicated(spark, http_sink, path, target)
        stored = http_sink.query_rows(
            f"SELECT rows_written FROM `{database}`.cdc2ch_state FINAL WHERE pipeline = {{p:String}}",
            {"p": name},
        )[0][0]
        assert m[("cdc2ch_rows_written_total", (f"pipeline={name}",))] == stored
        logged = sum(e["rows"] for e in proc.events("batch") if e["pipeline"] == name)
        assert logged == stored
    assert committed_version(http_sink, database, "late") == 2


def _scrape_or_none(port: int):
    try:
        return _scrape(port)
    except OSError:
        return None


def test_long_catch_up_reports_progress(spark, cli, database, tmp_path):
    path = _table(
        spark, str(tmp_path / "long"), *[f"INSERT INTO {{t}} VALUES ({i}, 'r{i}')" for i in range(12)]
    )  # a new pipeline's first range within the bound, then streamed ranges of up to 8 versions
    result = cli.replicate(
        "run", path, TargetName(database, "long"), "--once", "--batch-size", "1", "--max-rows-per-read", "1"
    )
    done = cli.events(result, "progress_done")
    assert len(done) == 1, done
    assert done[0]["what"] == f"catch-up {database}.long"
    assert done[0]["ranges"] == done[0]["total_ranges"] >= 3 and done[0]["rows"] == 12
    assert done[0]["rows_per_s"] > 0 and done[0]["eta_s"] == 0
