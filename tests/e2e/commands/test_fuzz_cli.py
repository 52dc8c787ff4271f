"""The command line and the config file fuzzed: refused input gets one paragraph, exit 2 or 1, and nothing else.

Hypothesis (derandomized: CI replays the same inputs) draws invocations of run, snapshot, validate, verify,
status and compact, each with one invalid part — a flag's value, a DSN, a table or pattern, a target, a
config file with wrong types, unknown keys, bad names or broken TOML — among valid options, with paths
holding spaces and unicode. Each must end with exit 2 (click's usage errors) or 1 and one error paragraph,
never a traceback, before Spark starts and without creating the embedded database. Most run in-process
(CliRunner, with Spark's entry point replaced by a tripwire); a few run as real processes with no java on
PATH.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from datetime import datetime

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc2ch.cli import main
from cdc2ch.commands.invocation.catalogue import options_of

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PIPELINE_COMMANDS = ("run", "snapshot", "validate", "verify")


class SparkWouldStart(Exception):
    """Raised by the tripwire: the input got past validation to Spark (cdc2ch translates no such error)."""


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A directory with a space and unicode in its path; the embedded database would go in `click house ü`."""
    root = tmp_path_factory.mktemp("fuzz cli ü")
    (root / "a dir").mkdir()
    return root


@pytest.fixture
def tripwire(monkeypatch, place):
    import cdc2ch.source.spark.session as spark

    def session(*_, **__):
        raise SparkWouldStart("Spark would start: the input passed validation")

    monkeypatch.setattr(spark, "session", session)
    monkeypatch.chdir(place)  # a relative path an input names lands here, where _check looks
    monkeypatch.setenv("CDC2CH_HOME", str(place / "home"))  # the default DSN's directory, never created
    for name in [k for k in os.environ if k.startswith("CDC2CH_") and k != "CDC2CH_HOME"]:
        monkeypatch.delenv(name)


def _fresh(place) -> None:
    """Before each example: no embedded database, so that one example's failure is not the next one's."""
    for path in place.iterdir():
        if path.name not in ("a dir", "empty bin"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _dsn(place) -> str:
    return f"chdb://{place / 'click house ü'}"


def _check(result, place) -> None:
    """The property every refused invocation holds."""
    assert not isinstance(result.exception, SparkWouldStart), result.stderr[-2000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception}\n{result.stderr[-2000:]}"
    )
    assert result.exit_code in (1, 2), (result.exit_code, result.stdout[-500:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = []
    for line in result.stderr.splitlines():
        if line.startswith(("Error: ", "cdc2ch: error: ")):
            errors.append(line)
        elif line.startswith("{") and json.loads(line).get("event") == "error":
            errors.append(json.loads(line)["message"])
    if not errors and result.exit_code == 2:  # validate reports its checks on stdout, a FAIL line each
        errors = [line for line in result.stdout.splitlines() if line.startswith("FAIL")][:1]
    assert len(errors) == 1, (result.stdout[-1000:], result.stderr[-2000:])  # one paragraph: what, what to do
    assert len(errors[0]) > 30, errors
    made = {p.name for p in place.iterdir()} - {"a dir", "empty bin"}
    assert not made, f"created {made}: an embedded database, or a file a refused input named"


# -- flags -------------------------------------------------------------------------------------------------
def _nasty_text() -> st.SearchStrategy[str]:
    return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


# (commands, flag, invalid values): each value is refused on its own, whatever else is given.
BAD_FLAGS = [
    (PIPELINE_COMMANDS, "--retries", ["x", "-1", "0", "1.5"]),
    (PIPELINE_COMMANDS, "--batch-size", ["0", "-5", "x", "1e3"]),
    (PIPELINE_COMMANDS, "--lock-ttl", ["nan", "inf", "0", "-1", "0.5", "x"]),
    (("run", "validate"), "--poll-interval", ["nan", "inf", "-inf", "0", "-1", "x"]),
    (("run", "validate"), "--discover-interval", ["nan", "inf", "-1", "x"]),
    (("run", "validate"), "--max-parallel", ["0", "-1"]),
    (("run", "validate"), "--max-rows-in-memory", ["0"]),
    (("run", "validate"), "--metrics-port", ["70000", "-1", "port"]),
    (("run", "validate"), "--from-version", ["-1", "x"]),
    (("run", "validate"), "--from-timestamp", ["yesterday", "2026-13-45", "12:00 tomorrow"]),
    (("run", "validate"), "--initial-load", ["never", ""]),
    (("run", "validate"), "--writer", ["everywhere"]),
    (("run", "validate"), "--on-schema-change", ["ignore"]),
    (("run", "validate"), "--serve", ["host:port", "127.0.0.1:99999", "", "::::"]),
    (("run", "validate"), "--serve-tls-cert", ["{place}/a dir/cert.pem"]),  # without --serve-tls-key
    (PIPELINE_COMMANDS, "--reader", ["duckdb"]),
    (PIPELINE_COMMANDS, "--target", ["a.b.c", "`unclosed", "db.", ".t", "``.t", "a.`b`c"]),
    (PIPELINE_COMMANDS, "--primary-key", ["", ",", " , ", "a,a", "id,ID,id"]),
    (PIPELINE_COMMANDS, "--primary-keys", ["x", "=id", "t="]),
    (PIPELINE_COMMANDS, "--table-settings", ["x", "=1"]),
    (PIPELINE_COMMANDS, "--rename-columns", ["a", "=b", "a="]),
    (PIPELINE_COMMANDS, "--column-types", ["=", "x"]),
    (PIPELINE_COMMANDS, "--column-codecs", ["a=", "codec"]),
    (PIPELINE_COMMANDS, "--exclude-columns", ["id"]),  # the primary key
    (PIPELINE_COMMANDS, "--spark-conf", ["noequals", "=x", " =x"]),
    (PIPELINE_COMMANDS, "--log-level", ["verbose"]),
    (PIPELINE_COMMANDS, "--log-format", ["xml"]),
    (("snapshot",), "--version", ["-1", "x"]),
    (("status",), "--lagging", ["5 parsecs", "-5m", "1.5h", "x"]),
    (("status",), "--max-lag", ["x", "1y"]),
    (("status",), "--format", ["xml"]),
    (("compact",), "--older-than", ["x", "-1d", "1.5d", "d"]),
    (("compact",), "--target", ["a.b.c", "", "`x"]),
    (PIPELINE_COMMANDS + ("status", "compact"), "--config", ["{place}/no such ü.toml", "{place}/a dir"]),
]
BAD_DSNS = [
    "mysql://x",
    "http://user:pw@127.0.0.1:8123/",  # a password inside the DSN
    "http://127.0.0.1:99999/",
    "http://127.0.0.1:port/",
    "http://[::1/",
    "http://user@127.0.0.1:-1/",
    "http:///db",
    "http://127.0.0.1:1/a/b/c",
    "http://127.0.0.1:1/?timeout=3",
    "http://127.0.0.1:1/?connect_timeout=soon",
    "ünï://x",
    "",
    " ",
]
BAD_TABLES = ["", "   ", "a.b.c.d", "one-word", "./p.share#", "s3a://", "file:/", "`unclosed.t", "x.`"]
# Options that are valid everywhere they apply: the noise around the one invalid part.
NOISE = [
    (PIPELINE_COMMANDS + ("status", "compact"), ["--log-level", "warning"]),
    (PIPELINE_COMMANDS + ("status", "compact"), ["--log-format", "json"]),
    (PIPELINE_COMMANDS, ["--batch-size", "1000"]),
    (PIPELINE_COMMANDS, ["--retries", "2"]),
    (PIPELINE_COMMANDS, ["--spark-master", "local[1]"]),
    (PIPELINE_COMMANDS, ["--spark-conf", "spark.ui.enabled=false"]),
    (PIPELINE_COMMANDS, ["--target", "db ü.`t x`"]),
    (("run", "validate"), ["--once"]),
    (("run", "validate"), ["--poll-interval", "0.5"]),
    (("run", "validate"), ["--column-types", "v=LowCardinality(String)"]),
    (("status",), ["--json"]),
    (("compact",), ["--json"]),
]


@st.composite
def bad_invocations(draw, place):
    """argv of one command with exactly one invalid part among valid options."""
    kind = draw(st.sampled_from(["flag", "flag", "flag", "dsn", "table", "text"]))
    commands = PIPELINE_COMMANDS + ("status", "compact")
    if kind == "flag":
        commands, flag, values = draw(st.sampled_from(BAD_FLAGS))
        poison = [flag, draw(st.sampled_from(values)).format(place=place)]
    elif kind == "dsn":
        poison = ["--clickhouse", draw(st.sampled_from(BAD_DSNS))]
    elif kind == "table":
        commands = PIPELINE_COMMANDS
        poison = ["--table", draw(st.sampled_from(BAD_TABLES))]
    else:  # any text as a value that has a syntax: a target name or a duration
        commands = ("compact",)
        poison = ["--older-than", draw(_nasty_text().filter(lambda t: t.strip() and not t.isdigit()))]
    command = draw(st.sampled_from(commands))
    argv = [command]
    if command in PIPELINE_COMMANDS and poison[0] != "--table":
        argv += ["--table", str(place / "no such table ü"), "--primary-key", "id"]
    if command == "compact" and poison[0] != "--target":
        argv += ["--target", "db.t"]
    if poison[0] != "--clickhouse":
        argv += ["--clickhouse", _dsn(place)]
    applicable = [extra for cmds, extra in NOISE if command in cmds and extra[0] != poison[0]]
    noise = (
        draw(st.lists(st.sampled_from(applicable), max_size=3, unique_by=lambda e: e[0]))
        if applicable
        else []
    )
    parts = [poison, *noise]
    order = draw(st.permutations(range(len(parts))))
    for i in order:
        argv += parts[i]
    return argv


@FUZZ
@given(data=st.data())
def test_bad_flags_get_one_paragraph_and_write_nothing(place, tripwire, data):
    argv = data.draw(bad_invocations(place))
    _fresh(place)
    result = CliRunner().invoke(main, argv)
    _check(result, place)


# -- config files ------------------------------------------------------------------------------------------
def toml_value(value) -> str:
    """A Python value as TOML (enough for the fuzzer: no tables of tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value, ensure_ascii=False)  # TOML basic strings take JSON's escapes


def toml_doc(top: dict, entries: list[dict]) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in top.items()]
    for entry in entries:
        lines += ["", "[[pipelines]]"] + [f"{json.dumps(k)} = {toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


_NOT_TEXT = [True, [1, [2]], {"a": 1}, [{"a": 1}]]
WRONG_TYPES = {
    "batch-size": [*_NOT_TEXT, -3.5, float("nan"), float("inf"), datetime(2026, 1, 1, 12), [], ""],
    "poll-interval": [*_NOT_TEXT, float("nan"), float("inf"), datetime(2026, 1, 1, 12), [], ""],
    "writer": [*_NOT_TEXT, 7, 1.5, datetime(2026, 1, 1, 12)],
    "reader": [*_NOT_TEXT, 7],
    "target": _NOT_TEXT,
    "order-by": [{"a": 1}, True, [["a"]]],
    "primary-key": [{"a": 1}, [["id"]], True],
}
# (where, key, invalid values): each refused on its own.
BAD_KEYS = [
    ("entry", "batch-size", ["many", 0, -1, True, 1.5, [1], {"a": 1}]),
    ("entry", "retries", [-1, 0, "x", 2.5]),
    ("top", "poll-interval", [float("nan"), float("inf"), 0, -1, "soon"]),
    ("top", "discover-interval", [float("nan"), -1, "x"]),
    ("entry", "lock-ttl", [float("nan"), float("inf"), 0, "x"]),
    ("entry", "target", ["a.b.c", "`x", ".t", True, ["a.b", "c.d"]]),
    ("entry", "primary-key", ["", ",", ["a", "a"], {"a": 1}]),
    ("entry", "table", ["", "a.b.c.d", "s3a://", "./p.share#", 5, True, datetime(2026, 1, 1)]),
    ("entry", "writer", ["everywhere", 1]),
    ("entry", "initial-load", ["never"]),
    ("entry", "on-schema-change", ["ignore", False]),
    ("entry", "from-version", [-1, "x", 1.5]),
    ("entry", "from-timestamp", ["yesterday", 5]),
    ("entry", "rename-columns", ["a", {"a": ""}, {"": "b"}]),
    ("entry", "column-types", ["=", {"": "String"}]),
    ("entry", "exclude-columns", ["id"]),
    ("top", "spark-conf", [["noequals"], {"": "x"}]),
    ("top", "clickhouse", BAD_DSNS[:8] + [5, ["chdb:///x"]]),
    ("top", "metrics-port", [70000, -1, "x"]),
    ("top", "serve", ["host:port", 99999]),
    ("top", "log-level", ["verbose", 3]),
    ("entry", "metrics-port", [9464]),  # process-wide: not in an entry
    ("entry", "no-such-option", ["x", 1]),
    ("top", "no_such_option", [True]),
    ("entry", "lagging", ["5m"]),  # a command's flag, never a file's key
    ("top", "pipelines", ["x", [], {"table": "/x"}]),
]


def _commands_taking(key: str) -> tuple[str, ...]:
    """The commands for which a config file's `key` matters: those with that option, or every one for a
    key no command has (refused as unknown)."""
    commands = PIPELINE_COMMANDS + ("status",)
    taking = tuple(c for c in commands if key in {o.name for o in options_of(c)})
    return taking or commands


@st.composite
def bad_configs(draw, place):
    """(file text, command): a config file with one invalid part among valid keys."""
    top = {"clickhouse": _dsn(place)}
    if draw(st.booleans()):
        top["poll-interval"] = 0.5
    if draw(st.booleans()):
        top["spark-master"] = "local[1]"
    n = draw(st.integers(1, 3))
    entries = [
        {"table": str(place / f"table {i} ü"), "primary-key": draw(st.sampled_from(["id", ["tenant", "id"]]))}
        for i in range(n)
    ]
    kind = draw(st.sampled_from(["key", "key", "key", "type", "duplicate", "missing", "syntax"]))
    command = draw(st.sampled_from(PIPELINE_COMMANDS + ("status",)))
    if kind == "key":
        where, key, values = draw(st.sampled_from(BAD_KEYS))
        command = draw(st.sampled_from(_commands_taking(key)))
        value = draw(st.sampled_from(values))
        if key == "pipelines":
            return toml_doc({**top, "pipelines": value}, []), command
        (top if where == "top" else entries[draw(st.integers(0, n - 1))])[key] = value
    elif kind == "type":  # a value of a type the key does not take
        key, values = draw(st.sampled_from(sorted(WRONG_TYPES.items())))
        command = draw(st.sampled_from(_commands_taking(key)))
        entries[0][key] = draw(st.sampled_from(values))
    elif kind == "duplicate":  # two pipelines, one target
        command = draw(st.sampled_from(PIPELINE_COMMANDS))
        entries.append(dict(entries[0]))
    elif kind == "missing":
        command = draw(st.sampled_from(PIPELINE_COMMANDS))
        del entries[draw(st.integers(0, n - 1))][draw(st.sampled_from(["table", "primary-key"]))]
    else:
        lines = toml_doc(top, entries).splitlines()
        cut = draw(st.integers(0, len(lines)))  # a line of its own: inside a string it could stay valid
        junk = draw(
            st.sampled_from(["= = =", "[[pipelines", '"unterminated', "\x00", "[x]\n[x]", "a = 1\na = 2"])
        )
        return "\n".join(lines[:cut] + [junk] + lines[cut:]) + "\n", command
    return toml_doc(top, entries), command


@FUZZ
@given(data=st.data())
def test_bad_config_files_get_one_paragraph_and_write_nothing(place, tripwire, data):
    text, command = data.draw(bad_configs(place))
    _fresh(place)
    path = place / "a dir" / "cdc2ch ü.toml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(main, [command, "--config", str(path)])
    _check(result, place)


# -- a few real processes ------------------------------------------------------------------------------------
_ONE_TABLE = ["--table", "{place}/t ü", "--primary-key", "id", "--clickhouse"]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", *_ONE_TABLE, "http://[::1/"],
        ["run", *_ONE_TABLE, "{dsn}", "--poll-interval", "nan"],
        ["snapshot", *_ONE_TABLE, "{dsn}", "--primary-keys", "x"],
        ["validate", "--config", "{place}/a dir/broken ü.toml"],
        ["status", "--clickhouse", "{dsn}", "--lagging", "5 parsecs"],
    ],
)
def test_a_real_process_refuses_without_java(place, argv):
    (place / "a dir" / "broken ü.toml").write_text('clickhouse = "chdb:///x"\n[[pipelines]\ntable = 1\n')
    argv = [a.format(place=place, dsn=_dsn(place)) for a in argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC2CH_", "JAVA", "SPARK", "PYSPARK"))}
    empty = place / "empty bin"
    empty.mkdir(exist_ok=True)
    env |= {
        "PATH": str(empty),
        "JAVA_HOME": str(empty),
        "CDC2CH_HOME": str(place / "home"),
    }  # no java anywhere
    proc = subprocess.run(
        [sys.executable, "-m", "cdc2ch", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode in (1, 2), proc.stderr
    assert "Traceback" not in proc.stderr and "JAVA" not in proc.stderr.upper(), proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(("Error: ", "cdc2ch: error: "))]
    assert len(lines) == 1, proc.stderr
    assert not (place / "click house ü").exists() and not (place / "home").exists()
