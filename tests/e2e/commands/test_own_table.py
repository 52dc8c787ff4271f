"""Getting started's "Your own table" (docs/getting-started.md; the README's are the same steps), run as
written: a Delta table written by the project's own Spark with the settings `cdc2ch spark-conf` prints,
replicated by `cdc2ch run --once`, shown by `cdc2ch query`. One shell,
as a user's in the repository after `make demo`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import without_cdc2ch

GETTING_STARTED = Path(__file__).resolve().parents[3] / "docs" / "getting-started.md"


def own_table_steps() -> str:
    """The shell blocks of Getting started's "Your own table", in their order (the README's are the same:
    tests/unit/test_docs.py)."""
    section = GETTING_STARTED.read_text().split("\n## Your own table\n", 1)[1]
    section = re.split(r"\n#{2,4} ", section, maxsplit=1)[0]
    return "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))


def test_the_readmes_own_table_steps_run_as_written(tmp_path):
    venv = Path(sys.executable).parent.parent  # the repository's .venv, where `make demo` installs
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"{sys.executable} is not in a virtualenv, which the steps activate")
    (tmp_path / ".venv").symlink_to(venv)
    steps = own_table_steps()
    assert "spark-submit $(cdc2ch spark-conf)" in steps and "cdc2ch run" in steps and "cdc2ch query" in steps
    env = {**os.environ, "PATH": without_cdc2ch(os.environ["PATH"]), "CDC2CH_HOME": str(tmp_path / "home")}
    env.pop("CDC2CH_CLICKHOUSE_URL", None)  # the default embedded database, as a newcomer has it
    proc = subprocess.run(
        ["bash", "-e", "-c", steps], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = re.findall(r"│\s*(\d+)\s*│\s*(\w+)\s*│\s*([\d.]+)\s*│", proc.stdout)  # the query's table
    assert rows == [("1", "Oslo", "12.5"), ("2", "Lima", "45"), ("3", "Pune", "7.25")], proc.stdout
