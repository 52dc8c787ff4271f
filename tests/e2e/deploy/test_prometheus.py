"""deploy/prometheus (alert rules) and deploy/grafana (dashboard) against the real things: Prometheus's own
promtool, a running `cdc2ch run --metrics-port` and a real Prometheus scraping it with the rules loaded.

promtool and prometheus come from Debian's `prometheus` package, unpacked into build/prometheus by `make
install` (`make prometheus`) without root; where that could not be fetched, the tests needing them skip
naming the reason. The running cdc2ch is shared by the scrape and Prometheus tests (one JVM start): three
pipelines, `orders` replayed from its change feed, `customers` beginning with a snapshot, and `broken`
pointing at a directory that is no Delta table, so it fails again and again.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from tests.support.helpers import Proc

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "cdc2ch-alerts.yml"
RULE_TESTS = RULES.with_name("cdc2ch-alerts.test.yml")
BUILDER = ROOT / "deploy" / "grafana" / "build.py"
DASHBOARD = BUILDER.with_name("cdc2ch.json")
PROM_DIR = ROOT / "build" / "prometheus"

CUSTOMERS = 1000  # rows of the table that begins with a snapshot
# Made by Prometheus, not exported by cdc2ch: `up` (is the target reachable?).
PROMETHEUS_MADE = {"up"}
# The series an alert may be about that have no pipeline label.
PROCESS_WIDE = {"up", "cdc2ch_tables_skipped"}
# Panels that may rightly show nothing: no snapshot runs once the service has started.
MAY_BE_EMPTY = {"Snapshot running for"}


def _binary(name: str) -> str | None:
    unpacked = PROM_DIR / "root" / "usr" / "bin" / name
    return str(unpacked) if unpacked.is_file() else shutil.which(name)


def _needs(name: str):
    unavailable = PROM_DIR / "UNAVAILABLE"
    why = unavailable.read_text().strip() if unavailable.exists() else "`make prometheus` has not run"
    return pytest.mark.skipif(
        _binary(name) is None,
        reason=f"{name} (Debian package prometheus) not in build/prometheus nor on PATH: {why}",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _builder():
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk needs Python >= 3.11")
    spec = importlib.util.spec_from_file_location("cdc2ch_dashboard_build", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
}


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression selects: its identifiers that are not functions, keywords, label
    names (inside `{...}`, `by (...)`, `on (...)`), durations or the `le` of a histogram."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings first: they hold `$pipeline` and such
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    tokens = re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text)
    return {t.group(1) for t in tokens if t.group(1) not in KEYWORDS}


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


# -- promtool -----------------------------------------------------------------------------------------


@_needs("promtool")
def test_promtool_checks_the_rules():
    proc = subprocess.run([_binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


@_needs("promtool")
def test_promtool_unit_tests_of_the_rules_pass():
    proc = subprocess.run(
        [_binary("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    assert tested == {r["alert"] for r in _rules()}  # every alert has a test


@_needs("promtool")
def test_promtool_unit_tests_notice_a_changed_threshold_or_command(tmp_path):
    """The unit tests above would fail if a threshold or an annotation changed."""
    for old, new in (
        ("cdc2ch_seconds_behind > 900", "cdc2ch_seconds_behind > 1000"),
        ("--pattern '{{ $labels.pipeline }}' --format json`.", "--pipeline {{ $labels.pipeline }}`."),
    ):
        shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
        assert old in RULES.read_text()
        (tmp_path / RULES.name).write_text(RULES.read_text().replace(old, new))
        proc = subprocess.run(
            [_binary("promtool"), "test", "rules", RULE_TESTS.name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 1 and "FAILED" in proc.stderr, (old, proc.stdout + proc.stderr)


def test_every_alert_names_its_pipeline_and_real_commands():
    """Each alert has a summary and a description; those about a pipeline name it in both; every
    `cdc2ch <command> ...` they suggest uses options that command has."""
    from click.testing import CliRunner

    from cdc2ch.cli import main

    helps: dict[str, str] = {}
    for rule in _rules():
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description"}, rule["alert"]
        if metric_names(rule["expr"]) - PROCESS_WIDE:  # series per pipeline
            assert "{{ $labels.pipeline }}" in notes["summary"], rule["alert"]
            assert "{{ $labels.pipeline }}" in notes["description"], rule["alert"]
        commands = re.findall(r"`cdc2ch (\w+)([^`]*)`", notes["description"])
        assert commands, f"{rule['alert']} suggests no cdc2ch command"
        for command, args in commands:
            if command not in helps:
                result = CliRunner().invoke(main, [command, "--help"])
                assert result.exit_code == 0, result.output
                helps[command] = result.output
            for flag in re.findall(r"(--[a-z-]+)", args):
                assert re.search(rf"(^|\s){flag}\b", helps[command], re.M), (
                    f"{rule['alert']}: {command} {flag}"
                )
    assert {"status"} <= set(helps)


# -- the dashboard ------------------------------------------------------------------------------------


def test_dashboard_json_is_what_the_builder_builds():
    built = _builder().render()
    assert DASHBOARD.read_text() == built, (
        "deploy/grafana/cdc2ch.json is stale: run python deploy/grafana/build.py"
    )
    board = json.loads(built)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["pipeline"]["multi"] and variables["pipeline"]["includeAll"]
    for title, expr in _builder().panel_queries(board):
        names = metric_names(expr)
        assert names, f"{title}: {expr} selects no metric"
        assert 'instance=~"$instance"' in expr, f"{title}: {expr}"


# -- a running cdc2ch ---------------------------------------------------------------------------------


def _scrape_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def exported_names(text: str) -> set[str]:
    """Every series name the exposition holds, and the names a family declared without samples yet (a
    labelled metric none of whose label values occurred) would have: counters `_total`, histograms
    `_bucket`/`_sum`/`_count`."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + suffix for suffix in suffixes}
    return names


def _value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """`cdc2ch run --config ... --metrics-port P` on an embedded target, once every pipeline has done what
    the tests look at: orders replicated, customers' snapshot loaded, broken failed 3 times in a row."""
    from deltalake import write_deltalake

    root = tmp_path_factory.mktemp("prometheus")
    cdf = {"delta.enableChangeDataFeed": "true"}
    orders = str(root / "orders")
    write_deltalake(
        orders, pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}), configuration=cdf
    )
    write_deltalake(orders, pa.table({"id": pa.array([4], pa.int64()), "v": ["d"]}), mode="append")
    customers = str(root / "customers")
    ids = pa.array(range(CUSTOMERS), pa.int64())
    write_deltalake(
        customers, pa.table({"id": ids, "v": pa.array([str(i) for i in range(CUSTOMERS)])}), configuration=cdf
    )
    (root / "not-delta").mkdir()
    config = root / "cdc2ch.toml"
    config.write_text(
        f'clickhouse = "chdb://{root / "clickhouse"}"\n'
        'spark-master = "local[2]"\npoll-interval = 0.5\n'
        + "".join(
            f'[[pipelines]]\nname = "{name}"\ntable = "{path}"\nprimary-key = "id"\ntarget = "ops.{name}"\n{extra}'
            for name, path, extra in (
                ("orders", orders, 'initial-load = "changes"\n'),
                ("customers", customers, 'initial-load = "snapshot"\nreader = "spark"\n'),  # a JVM to watch
                ("broken", str(root / "not-delta"), ""),
            )
        )
    )
    port = _free_port()
    proc = Proc("run", "--config", str(config), "--metrics-port", str(port))
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.proc.poll() is None, f"cdc2ch exited {proc.proc.returncode}:\n{proc.stderr[-3000:]}"
            assert time.monotonic() < deadline, f"pipelines not under way in 180 s:\n{proc.stderr[-3000:]}"
            try:
                samples = _samples(_scrape_text(port))
            except OSError:
                samples = {}
            if (
                _value(samples, "cdc2ch_rows_written_total", pipeline="orders") == 4
                and _value(samples, "cdc2ch_snapshot_rows_loaded", pipeline="customers") == CUSTOMERS
                and (_value(samples, "cdc2ch_consecutive_failures", pipeline="broken") or 0) >= 3
                and _value(samples, "cdc2ch_last_success_timestamp_seconds", pipeline="customers")
            ):
                break
            time.sleep(0.5)
        yield {"port": port, "proc": proc, "orders": orders}
    finally:
        proc.signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, proc.stderr[-3000:]


def test_dashboard_and_alerts_query_only_metrics_cdc2ch_exports(service):
    text = _scrape_text(service["port"])
    exported = exported_names(text)
    samples = _samples(text)
    for title, expr in _builder().panel_queries(json.loads(DASHBOARD.read_text())):
        missing = metric_names(expr) - exported
        assert not missing, f"panel {title!r} queries {missing}, which cdc2ch does not export"
    for rule in _rules():
        missing = metric_names(rule["expr"]) - exported - PROMETHEUS_MADE
        assert not missing, f"alert {rule['alert']} needs {missing}, which cdc2ch does not export"
    # the values behind the panels are the pipelines' own
    assert _value(samples, "cdc2ch_snapshot_rows_expected", pipeline="customers") == CUSTOMERS
    assert _value(samples, "cdc2ch_consecutive_failures", pipeline="orders") == 0
    assert _value(samples, "cdc2ch_errors_total", pipeline="broken", kind="source") >= 3
    assert _value(samples, "cdc2ch_batch_seconds_count", pipeline="orders") >= 1
    assert (
        "cdc2ch_snapshot_started_timestamp_seconds",
        frozenset({("pipeline", "customers")}),
    ) not in samples
    assert _value(samples, "cdc2ch_jvm_process_resident_memory_bytes") > 100e6  # the Spark JVM
    assert (
        10e6
        < _value(samples, "process_resident_memory_bytes")
        < _value(samples, "process_virtual_memory_bytes")
    )


class Prometheus:
    def __init__(self, binary: str, config: Path, data: Path):
        self.port = _free_port()
        self.log = config.with_suffix(".log")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
        )  # fmt: skip

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success", body
        return body["data"]

    def wait(self, what: str, check, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()[-3000:]}"
            try:
                found = check()
            except OSError:
                found = None
            if found:
                return found
            assert time.monotonic() < deadline, (
                f"{what} not seen in {timeout} s:\n{self.log.read_text()[-2000:]}"
            )
            time.sleep(0.25)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


FOR = re.compile(r"^(\s+for:\s*)\S+$", re.M)


@_needs("prometheus")
def test_a_real_prometheus_scrapes_cdc2ch_and_raises_its_alerts(service, tmp_path):
    """Prometheus scrapes the service (1 s) and a port where nothing listens, with the alert rules loaded
    as they are but for shorter `for:` durations: the lag series carry the pipeline label, the failing
    pipeline's alert and the down process's alert go pending and then fire, the pipelines that replicate
    raise none, and every dashboard query answers."""
    rules = FOR.sub(r"\g<1>6s", RULES.read_text())
    assert rules.count("for: 6s") == RULES.read_text().count("for:") > 0
    (tmp_path / "rules.yml").write_text(rules)
    dead = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules.yml")],
            "scrape_configs": [{
                "job_name": "cdc2ch",
                "static_configs": [{"targets": [f"127.0.0.1:{service['port']}", f"127.0.0.1:{dead}"]}],
            }],
        })
    )  # fmt: skip
    prom = Prometheus(_binary("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data")
    try:
        lag = prom.wait(
            "cdc2ch_versions_behind of every pipeline",
            lambda: (
                len(r := prom.api("query", query='cdc2ch_versions_behind{job="cdc2ch"}')["result"]) >= 2 and r
            ),
        )
        by_pipeline = {s["metric"]["pipeline"]: s for s in lag}
        assert set(by_pipeline) == {"orders", "customers"}  # broken never reached its table
        assert by_pipeline["orders"]["metric"]["instance"] == f"127.0.0.1:{service['port']}"
        assert float(by_pipeline["orders"]["value"][1]) == 0
        assert set(by_pipeline["orders"]["metric"]) == {"__name__", "instance", "job", "pipeline"}
        seconds = prom.api("query", query='cdc2ch_seconds_behind{pipeline="orders"}')["result"]
        assert [s["metric"]["pipeline"] for s in seconds] == ["orders"]

        def alerts(state: str) -> dict[str, list[dict]]:
            found: dict[str, list[dict]] = {}
            for a in prom.api("alerts")["alerts"]:
                if a["state"] == state:
                    found.setdefault(a["labels"]["alertname"], []).append(a)
            return found

        pending = prom.wait(
            "Cdc2chPipelineFailing pending", lambda: "Cdc2chPipelineFailing" in (p := alerts("pending")) and p
        )
        (failing,) = pending["Cdc2chPipelineFailing"]
        assert failing["labels"]["pipeline"] == "broken"
        assert "cdc2ch status --pattern 'broken' --format json" in failing["annotations"]["description"]
        firing = prom.wait(
            "Cdc2chPipelineFailing and Cdc2chDown firing",
            lambda: {"Cdc2chPipelineFailing", "Cdc2chDown"} <= set(f := alerts("firing")) and f,
            timeout=30,
        )
        assert [a["labels"]["instance"] for a in firing["Cdc2chDown"]] == [f"127.0.0.1:{dead}"]
        everything = [a for a in prom.api("alerts")["alerts"]]
        assert {a["labels"].get("pipeline") for a in everything} <= {"broken", None}, everything

        for title, expr in _builder().panel_queries(json.loads(DASHBOARD.read_text())):
            concrete = (
                expr.replace("$instance", ".*").replace("$pipeline", ".*").replace("$__rate_interval", "1m")
            )
            result = prom.api("query", query=concrete)["result"]
            assert result or title in MAY_BE_EMPTY, f"panel {title!r}: {concrete} returned nothing"
    finally:
        prom.stop()
