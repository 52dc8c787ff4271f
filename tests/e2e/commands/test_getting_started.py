"""Getting started (docs/getting-started.md) run as written: each shell block, in its order, in one directory
as a user's in the repository after `make demo` (the project's .venv, a fresh CDC2CH_HOME, the default
embedded database), and checked against the exit status and the output lines the page shows after it.
"Your own table" writes a Delta table with the project's Spark and the settings `cdc2ch spark-conf` prints,
replicates it with `run --once` and queries it (the README's walkthrough is the same steps:
tests/unit/test_docs.py); "The first service" starts `run --serve` in the background, asks `status` through
it and stops it. The one block not run here is `make demo`: its demo is tests/e2e/commands/test_cli.py's
test_demo_command, which checks the output the page shows of it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_examples import Example, disagreements, examples
from tests.support.helpers import without_cdc2ch

GETTING_STARTED = Path(__file__).resolve().parents[3] / "docs" / "getting-started.md"
INSTALL = "make demo"  # the block of the demo, run by test_demo_command
PORT = "127.0.0.1:8123"  # the page's --serve address: the test takes a free port instead


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(dumped: bytes) -> dict[str, str]:
    pairs = (entry.partition("=") for entry in dumped.decode().split("\0") if entry)
    return {name: value for name, _, value in pairs}


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> list[tuple[Example, subprocess.CompletedProcess]]:
    """Each block of the page after the install one, each in its own `bash -e` started from the
    environment the previous one left (`source .venv/bin/activate` carries on); up to the first that does
    not end as the page shows."""
    venv = Path(sys.executable).parent.parent  # the repository's .venv, where `make demo` installs
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"{sys.executable} is not in a virtualenv, which the steps activate")
    cwd = tmp_path_factory.mktemp("getting-started")
    (cwd / ".venv").symlink_to(venv)
    blocks = examples(GETTING_STARTED.read_text(encoding="utf-8"))
    assert blocks and blocks[0].script.split("#")[0].strip() == INSTALL, blocks[0]
    env = {**os.environ, "PATH": without_cdc2ch(os.environ["PATH"]), "CDC2CH_HOME": str(cwd / "home")}
    env.pop("CDC2CH_CLICKHOUSE_URL", None)  # the default embedded database, as a newcomer has it
    port, state = _free_port(), cwd / ".environment"
    results = []
    for block in blocks[1:]:
        script = block.script.replace(PORT, f"127.0.0.1:{port}") + f'\nenv -0 > "{state}"\n'
        ran = _bash(script, cwd, env)
        results.append((block, ran))
        if disagreements(block, ran.returncode, ran.stdout):
            break
        env = _environment(state.read_bytes())
    return results


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`script` in `bash -e`, in a process group of its own, ended after it: a block that stops early leaves
    no service of its own behind. Its output goes to files, which a background job cannot hold open."""
    out, err = cwd / ".stdout", cwd / ".stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=cwd,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text())


def test_each_block_ends_as_the_page_shows(ran):
    """Its exit status, and each output line the page shows, in every block up to the last."""
    for block, proc in ran:
        found = disagreements(block, proc.returncode, proc.stdout)
        assert found == [], f"{block.script}\n{found}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert len(ran) == len(examples(GETTING_STARTED.read_text(encoding="utf-8"))) - 1
