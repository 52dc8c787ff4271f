"""The option catalogue and the resolution of options: pure code, no Spark, no ClickHouse."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType, SimpleNamespace

import click
import pytest
from click.testing import CliRunner

from cdc2ch.base.errors import Cdc2chError, ConfigError
from cdc2ch.cli import invocation, main
from cdc2ch.commands import app
from cdc2ch.commands.invocation.catalogue import FILTERS, GROUPS
from cdc2ch.commands.invocation.listing import file_pipelines
from cdc2ch.commands.invocation.options import (
    CATALOGUE,
    COMMAND,
    ENTRY_KEYS,
    FILE_KEYS,
    PROCESS,
    TABLE,
    Invocation,
    from_toml,
    load_config,
    merge,
    options_of,
    process_options,
    resolve,
)
from cdc2ch.fleet.runner import Fleet
from cdc2ch.model.config import ConfigFile, RunConfig, TargetName

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_option_variables(monkeypatch):
    """Options set in the environment of whoever runs the tests would change the results."""
    for option in CATALOGUE:
        monkeypatch.delenv(option.env, raising=False)


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "cdc2ch.toml"
    path.write_text(text)
    return str(path)


def _parse(command: str, argv: list[str]) -> Invocation:
    """What cli.py hands over: the values click parsed, and which the user gave."""
    return invocation(main.commands[command].make_context(command, argv))


def _resolve(argv: list[str], command: str = "run"):
    given = _parse(command, argv)
    return resolve(given, load_config(given))


def _error(argv: list[str], command: str = "run") -> str:
    with pytest.raises(ConfigError) as err:
        _resolve(argv, command)
    return str(err.value)


TWO = """
[[pipelines]]
name = "a"
table = "/lake/a"
primary-key = "id"

[[pipelines]]
name = "b"
table = "/lake/b"
primary-key = "id"
target = "crm.b"
"""


# -- the catalogue and the commands ----------------------------------------------------------------


def test_every_click_option_is_in_the_catalogue_and_back():
    declared = {
        (name, p.opts[0][2:], p.name)
        for name, command in main.commands.items()
        for p in command.params
        if isinstance(p, click.Option) and "--help" not in p.opts
    }
    catalogued = {(c, o.name, o.param) for o in CATALOGUE for c in o.commands}
    assert declared == catalogued
    for name in main.commands:  # one option per name and per parameter in each command
        options = options_of(name)
        assert len({o.name for o in options}) == len({o.param for o in options}) == len(options), name


def test_validate_has_exactly_the_options_of_run():
    def described(name):
        return [(p.name, p.opts, p.help, p.envvar, repr(p.type)) for p in main.commands[name].params]

    assert described("validate") == described("run")


def test_environment_variables_are_derived_from_option_names():
    envvars = {
        (name, p.opts[0]): p.envvar
        for name, command in main.commands.items()
        for p in command.params
        if isinstance(p, click.Option) and "--help" not in p.opts
    }
    # The exceptions: a name that says what the value is, and names that would be ambiguous without the
    # command in them.
    special = {
        ("snapshot", "--version"): "CDC2CH_SNAPSHOT_VERSION",
        ("demo", "--dir"): "CDC2CH_DEMO_DIR",
        ("query", "--format"): "CDC2CH_QUERY_FORMAT",
        ("status", "--format"): "CDC2CH_STATUS_FORMAT",
        ("spark-conf", "--format"): "CDC2CH_SPARK_CONF_FORMAT",
    }
    for (command, flag), envvar in envvars.items():
        expected = "CDC2CH_" + flag[2:].upper().replace("-", "_")
        expected = (
            "CDC2CH_CLICKHOUSE_URL" if flag == "--clickhouse" else special.get((command, flag), expected)
        )
        assert envvar == expected, (command, flag)
    assert envvars[("run", "--max-rows-per-read")] == "CDC2CH_MAX_ROWS_PER_READ"
    # --help states the rule once and shows only the exceptions.
    shown = {
        (name, p.opts[0])
        for name, command in main.commands.items()
        for p in command.params
        if isinstance(p, click.Option) and p.show_envvar
    }
    assert shown == set(special) | {(c, "--clickhouse") for c, _ in envvars if _ == "--clickhouse"}
    for name in ("run", "pause", "demo"):
        assert "unless another is shown above" in CliRunner().invoke(main, [name, "--help"]).output, name


def test_config_file_keys_by_section():
    run_keys = {p.opts[0][2:] for p in main.commands["run"].params if isinstance(p, click.Option)}
    assert FILE_KEYS == run_keys - {"config", "help"}
    process = {o.name for o in CATALOGUE if o.scope == PROCESS}
    assert process == {
        "clickhouse",
        "cluster",
        "discover-interval",
        "max-parallel",
        "max-rows-in-memory",
        "spark-master",
        "spark-conf",
        "log-format",
        "log-level",
        "metrics-port",
        "once",
        "poll-interval",
        "serve",
        "serve-user",
        "serve-writable",
        "serve-tls-cert",
        "serve-tls-key",
    }
    assert ENTRY_KEYS == (FILE_KEYS - process) | {"name"}
    table = {o.name for o in CATALOGUE if o.scope == TABLE}
    assert table == {"from-version", "from-timestamp", "table", "primary-key", "primary-keys", "target"}
    # An option name means the same in every command where it is a file key.
    for name in FILE_KEYS:
        assert len({o.scope for o in CATALOGUE if o.name == name and o.scope != COMMAND}) == 1, name


def test_help_leads_with_what_a_first_run_needs_and_groups_the_rest():
    help_text = CliRunner().invoke(main, ["run", "--help"], terminal_width=100).output
    flags = re.findall(r"^  (--[a-z-]+)", help_text, re.MULTILINE)
    assert flags[:6] == ["--table", "--primary-key", "--target", "--clickhouse", "--once", "--config"]
    headings = [line[:-1] for line in help_text.splitlines() if line.endswith(":") and line[0] != " "]
    assert headings == [g for g in GROUPS if g != FILTERS], headings  # status alone filters
    assert help_text.index("Basic options:") < help_text.index("--table") < help_text.index("--from-version")
    # Every command starts with its basics: what it acts on and where.
    for name in main.commands:
        text = CliRunner().invoke(main, [name, "--help"]).output
        assert re.search(r"^Basic options:\n  --", text, re.MULTILINE), name
        assert "\nOptions:" not in text, name


def test_every_option_belongs_to_a_group_in_help_order():
    assert [o.name for o in CATALOGUE if o.group not in GROUPS] == []
    for name in main.commands:
        order = [GROUPS.index(o.group) for o in options_of(name)]
        assert order == sorted(order), name
        flags = [p.opts[0] for p in main.commands[name].params if isinstance(p, click.Option)]
        assert flags == [o.long_flag for o in options_of(name)], name


def test_help_does_not_import_spark_or_clickhouse():
    code = (
        "import sys; from click.testing import CliRunner; from cdc2ch.cli import main\n"
        "for name in main.commands: assert CliRunner().invoke(main, [name, '--help']).exit_code == 0\n"
        "heavy = ('pyspark', 'pyarrow', 'chdb', 'clickhouse_connect', 'delta',\n"
        "         'cdc2ch.clickhouse.connection.transport')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# -- precedence ------------------------------------------------------------------------------------------


def test_precedence_flag_environment_entry_top_level_default(tmp_path, monkeypatch):
    config = _config(
        tmp_path,
        'clickhouse = "chdb:///from-file"\nretries = 9\nbatch-size = 100\nlock-ttl = 30\n'
        + TWO.replace('primary-key = "id"\n', 'primary-key = "id"\nbatch-size = 50\nretries = 8\n', 1),
    )
    monkeypatch.setenv("CDC2CH_RETRIES", "3")
    monkeypatch.setenv("CDC2CH_MAX_ROWS_PER_READ", "7000")
    (a, b), process = _resolve(["--config", config, "--max-rows-per-read", "2000"])
    assert a.max_rows_per_read == b.max_rows_per_read == 2000  # flag over environment
    assert a.retries == b.retries == 3  # environment over entry and top level
    assert (a.batch_size, b.batch_size) == (50, 100)  # entry over top level
    assert a.lock_ttl == b.lock_ttl == 30.0  # top level over default
    assert a.poll_interval == 5.0 and a.reader == "auto"  # defaults
    assert a.clickhouse_dsn == b.clickhouse_dsn == process.clickhouse_dsn == "chdb:///from-file"
    assert (a.pipeline, b.pipeline, str(a.target), str(b.target)) == ("a", "b", "cdc2ch.a", "crm.b")
    assert process.config_path == config and process.log_level == "info"


def test_resolution_needs_no_click(tmp_path):
    """resolve() takes plain values and the names the user set; a value left at its default yields."""
    defaults = dict(_parse("run", []).values)
    file = ConfigFile.load(_config(tmp_path, "batch-size = 100\n" + TWO), FILE_KEYS, ENTRY_KEYS)
    (a, _), _ = resolve(Invocation("run", {**defaults, "batch_size": 10}), file)
    assert a.batch_size == 100  # 10 is taken for a default: the file wins
    (a, _), _ = resolve(Invocation("run", {**defaults, "batch_size": 10}, frozenset({"batch_size"})), file)
    assert a.batch_size == 10
    (only,), process = resolve(Invocation("run", {**defaults, "table": "/t", "primary_key": "k"}), None)
    assert (only.table, only.primary_key, only.pipeline, process.config_path) == (
        "/t",
        ("k",),
        "cdc2ch.t",
        None,
    )


def test_status_takes_only_process_options_from_the_file(tmp_path):
    config = _config(tmp_path, 'clickhouse = "chdb:///q"\nlog-level = "error"\n[spark-conf]\nx = "1"\n' + TWO)
    given = _parse("status", ["--config", config, "--target", "other.t"])
    file = load_config(given)
    values = merge(given, file)[0]
    assert values["target"] == "other.t"  # status's own --target, not the pipelines' target
    process = process_options(values)
    assert (process.clickhouse_dsn, process.log_level, process.spark.conf) == (
        "chdb:///q",
        "error",
        (("x", "1"),),
    )
    # its pipelines named as `run` names them
    assert [(k.name, k.target) for k in file_pipelines(given) or ()] == [
        ("a", TargetName("cdc2ch", "a")),
        ("b", TargetName("crm", "b")),
    ]


# -- TOML values -----------------------------------------------------------------------------------------


def _option(name: str, command: str = "run"):
    return next(o for o in options_of(command) if o.name == name)


def test_toml_values_become_what_the_flags_would_give():
    where = "f.toml, [[pipelines]] entry 1, x"
    assert from_toml(_option("primary-key"), ["tenant", "id"], where) == "tenant,id"
    assert from_toml(_option("spark-conf"), {"spark.a": "1", "b": 2}, where) == ("spark.a=1", "b=2")
    assert from_toml(_option("spark-conf"), "a=b", where) == ("a=b",)
    assert from_toml(_option("batch-size"), 7, where) == 7
    assert from_toml(_option("lock-ttl"), 7, where) == 7.0
    assert from_toml(_option("once"), True, where) is True
    noon = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
    assert from_toml(_option("from-timestamp"), noon, where) == noon
    assert from_toml(_option("from-timestamp"), datetime(2026, 11, 1, 12), where) == noon  # UTC by default
    assert from_toml(_option("from-timestamp"), "2026-11-01T12:00:00Z", where) == noon


def test_bad_toml_values_name_their_place(tmp_path):
    base = '[[pipelines]]\ntable = "/t"\nprimary-key = "id"\n'
    for text, message in (
        (
            base + 'reader = "duckdb"\n',
            "entry 1, reader: 'duckdb' is not valid: Invalid value for '--reader'",
        ),
        (base + 'batch-size = "many"\n', "'many' is not a valid integer."),
        ("metrics-port = 70000\n" + base, "70000 is not in the range 0<=x<=65535."),
        (base + 'from-timestamp = "soon"\n', "'soon' is not an ISO-8601 timestamp"),
        (base + "batch-size = = 3", "is not valid TOML"),
    ):
        assert message in _error(["--config", _config(tmp_path, text)]), text


def test_unknown_and_misplaced_keys(tmp_path):
    base = '[[pipelines]]\ntable = "/t"\nprimary-key = "id"\n'
    err = _error(["--config", _config(tmp_path, base + "batch_sise = 5\n")])
    assert "unknown key 'batch_sise' in [[pipelines]] entry 1 (did you mean 'batch-size'?)." in err
    err = _error(["--config", _config(tmp_path, base + 'clickhouse = "chdb:///x"\n')])
    assert "unknown key 'clickhouse' in [[pipelines]] entry 1 (it concerns the whole process" in err
    err = _error(["--config", _config(tmp_path, "version = 3\n" + base)], "snapshot")
    assert "unknown key 'version' in the top level (did you mean 'from-version'?)." in err
    err = _error(["--config", _config(tmp_path, base + "zzz = 3\n")])
    assert "unknown key 'zzz' in [[pipelines]] entry 1. Keys are `cdc2ch run` option names" in err
    assert "does not exist" in _error(["--config", str(tmp_path / "absent.toml")])
    (cfg,), _ = _resolve(["--config", _config(tmp_path, "batch_size = 7\n" + base)])
    assert cfg.batch_size == 7  # underscores work too


def test_every_unknown_key_of_a_file_at_once_with_the_closest_valid_key(tmp_path):
    text = 'clickhous = "chdb:///x"\n[[pipelines]]\ntable = "/a"\nprimary-key = "id"\n'
    text += '[[pipelines]]\ntable = "/b"\nprimay-key = "id"\nspark-mastr = "local[1]"\n'
    err = _error(["--config", _config(tmp_path, text)])
    assert err == (
        f"Config file {tmp_path / 'cdc2ch.toml'}: unknown key 'clickhous' in the top level (did you mean "
        "'clickhouse'?); unknown key 'primay-key' in [[pipelines]] entry 2 (did you mean 'primary-key' or "
        "'primary-keys'?); unknown key 'spark-mastr' in [[pipelines]] entry 2 (did you mean 'spark-master'? It "
        "concerns the whole process: set it at the top level). Keys are `cdc2ch run` option names without the "
        "leading dashes (`cdc2ch run --help` lists them): fix the file and run again."
    )


@pytest.mark.parametrize("option", [o for o in options_of("run") if o.scope == TABLE], ids=lambda o: o.name)
def test_table_options_are_refused_with_a_config_file(option, tmp_path, monkeypatch):
    config = _config(tmp_path, TWO)
    value = {"from-timestamp": "2026-01-01", "primary-keys": "t=id"}.get(option.name, "1")
    expected = f"--{option.name} (or {option.env}) sets one table's {option.name}, but --config {config}"
    assert expected in _error(["--config", config, f"--{option.name}", value])
    monkeypatch.setenv(option.env, value)
    assert f"set `{option.name}` in the file's [[pipelines]] entries" in _error(["--config", config])


def test_each_pipeline_needs_its_own_target_and_name(tmp_path):
    same_target = TWO.replace('target = "crm.b"', 'target = "cdc2ch.a"')
    err = _error(["--config", _config(tmp_path, same_target)])
    assert "target table 'cdc2ch.a' is used by more than one pipeline" in err
    same_name = TWO.replace('name = "b"', 'name = "a"')
    assert "pipeline name 'a' is used by more than one pipeline" in _error(
        ["--config", _config(tmp_path, same_name)]
    )


def test_pipeline_selects_one_of_the_file(tmp_path, monkeypatch):
    config = _config(tmp_path, TWO)
    (only,), _ = _resolve(["--config", config, "--pipeline", "b"])
    assert (only.pipeline, only.table) == ("b", "/lake/b")
    monkeypatch.setenv("CDC2CH_PIPELINE", "a")
    (only,), _ = _resolve(["--config", config])
    assert only.pipeline == "a"
    assert "--pipeline 'c' is not in" in _error(["--config", config, "--pipeline", "c"])
    assert "its pipelines are: a, b." in _error(["--config", config, "--pipeline", "c"])


def test_flags_alone_name_one_pipeline():
    (cfg,), process = _resolve(
        ["--table", "s3a://lake/orders/", "--primary-key", "tenant, id", "--spark-conf", "a=b"]
    )
    assert (cfg.primary_key, str(cfg.target), cfg.pipeline) == (
        ("tenant", "id"),
        "cdc2ch.orders",
        "cdc2ch.orders",
    )
    assert cfg.spark.conf == process.spark.conf == (("a", "b"),)
    assert "--table is required" in _error(["--primary-key", "id"])
    assert "--primary-key is required" in _error(["--table", "/t"])


def test_run_config_checks_choices_with_the_flag_names():
    cfg = RunConfig(
        table="/t", primary_key=("id",), target=TargetName("d", "t"), clickhouse_dsn="", pipeline="p"
    )
    for field, message in (
        ("reader", "--reader must be spark, clickhouse or auto (got 'x')."),
        ("writer", "--writer must be auto, driver or executors (got 'x')."),
        ("on_schema_change", "--on-schema-change must be fail, resync or follow (got 'x')."),
    ):
        with pytest.raises(ConfigError) as err:
            replace(cfg, **{field: "x"})
        assert str(err.value) == message


# -- commands --------------------------------------------------------------------------------------------


def test_snapshot_loads_one_table(tmp_path, monkeypatch):
    config = _config(tmp_path, TWO)
    with pytest.raises(ConfigError) as err:
        app.snapshot(_parse("snapshot", ["--config", config]))
    assert f"snapshot loads one table, but {config} lists 2 pipelines: choose one" in str(err.value)
    assert "with --pipeline NAME (a, b)." in str(err.value)
    monkeypatch.setenv("CDC2CH_SNAPSHOT_VERSION", "3")
    monkeypatch.setenv("CDC2CH_VERSION", "4")
    (cfg,), _ = _resolve(["--table", "/t", "--primary-key", "id"], "snapshot")
    assert cfg.snapshot_version == 3


def test_run_once_sums_up_the_failed_pipelines(monkeypatch, capsys):
    """The failure summary of app.run_pipelines, and its line of what was written, with the runner, Spark
    and ClickHouse faked."""
    calls = {}
    health = SimpleNamespace(last_error_kind="source", last_error="The table is gone.")
    state = lambda version, rows: SimpleNamespace(committed_version=version, rows_written=rows)  # noqa: E731
    replicated = SimpleNamespace(started=state(1, 10), state=state(4, 25))
    slots = [
        SimpleNamespace(cfg=SimpleNamespace(pipeline="a"), job=replicated, error=None, health=None),
        SimpleNamespace(cfg=SimpleNamespace(pipeline="b"), job=None, error=ValueError(), health=health),
    ]

    class Runner:
        def __init__(self, configs, spark, sink, stop, metrics, *, fleet):
            calls["isolate"] = fleet.isolate
            self.slots = slots

        def run(self):
            return slots[1:]

    def target(cfg, retries, check_lock):
        calls["check_lock"] = check_lock
        return nullcontext(SimpleNamespace(widen=lambda calls: None))

    fakes = {
        "cdc2ch.fleet.runner": {"Runner": Runner, "Fleet": Fleet},
        "cdc2ch.replication.metrics": {"Metrics": lambda: SimpleNamespace(serve=print, close=lambda: None)},
        "cdc2ch.source.spark.session": {
            "lazy_session": lambda settings, on_start=None, stop=None: None,
            "jvm_pid": lambda spark: None,
        },
    }
    for name, attrs in fakes.items():
        module = ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(app, "_target", target)
    configs, process = _resolve(["--table", "/a", "--primary-key", "id", "--once"])
    configs = [configs[0], replace(configs[0], table="/b", pipeline="b")]
    with pytest.raises(Cdc2chError) as err:
        app.run_pipelines(configs, replace(process, config_path="cdc2ch.toml"), threading.Event())
    assert str(err.value) == (
        "1 of 2 pipelines failed, the others replicated: b (source): The table is gone. `cdc2ch status` shows "
        "each pipeline's whole last error; fix the cause and run again."
    )
    assert calls == {"isolate": True, "check_lock": False}
    assert re.fullmatch(
        r"2 pipelines, 15 rows written in \d+\.\ds: a versions 2\.\.4 replicated, 15 rows written; "
        r"b failed \(source; `cdc2ch status` has the whole error\)\n",
        capsys.readouterr().out,
    )
