"""The Makefile's two README commands, dry-run as on a fresh clone (a virtualenv that does not exist yet):
`make demo` installs what the demo needs and no more, saying what each step does and how long it took;
`make test` installs everything the tests need (CI runs it on a fresh clone)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What only the tests use: their extras, the S3 connector, the Delta Sharing client's virtualenv, Prometheus.
TEST_ONLY = (
    '".[test]"',
    "cdc2ch.source.spark.session s3",
    ".venv-sharing",
    "sharing-requirements.txt",
    "prometheus",
)


def dry_run(target: str, venv: Path, everything: bool = True) -> str:
    """The commands `make target` would run with its virtualenv at `venv`; `everything`: as if none of its
    files were there yet (make -B)."""
    argv = ["make", "--no-print-directory", "-n", *(["-B"] if everything else []), target, f"VENV={venv}"]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout


def test_make_demo_installs_what_the_demo_needs_and_says_so(tmp_path):
    venv = tmp_path / ".venv"
    demo = dry_run("demo", venv)
    assert f"{venv}/bin/pip --quiet --disable-pip-version-check install -e . " in demo, demo
    assert f"{venv}/bin/python -m cdc2ch.source.spark.session > /dev/null" in demo, (
        demo
    )  # the Delta jars alone
    assert [t for t in TEST_ONLY if t in demo] == [], demo
    # Every install step is announced with what it does and how long it takes, and timed.
    steps = [line for line in demo.splitlines() if "pip " in line or "spark.session" in line]
    announced = re.findall(r'^echo ".*\([^)]*\b(?:minutes?|s)\b[^)]*; once\)\.\.\."$', demo, re.M)
    assert len(steps) == len(announced) == 2, demo
    assert all("done in" in line for line in steps), demo
    assert demo.splitlines()[-1] == f"{venv}/bin/cdc2ch demo --dir ./cdc2ch-demo", demo


def test_make_test_installs_everything_the_tests_need(tmp_path):
    everything = dry_run("test", tmp_path / ".venv")
    assert [t for t in TEST_ONLY if t not in everything] == [], everything


def test_make_demo_uses_a_full_install_as_it_is(tmp_path):
    """A developer's full install (make install) has what the demo needs: nothing is installed again, and so
    nothing replaced by an older or narrower version."""
    venv = tmp_path / ".venv"
    venv.mkdir()
    (venv / ".installed").touch()  # newer than pyproject.toml
    demo = dry_run("demo", venv, everything=False)
    assert "pip" not in demo and "spark.session" not in demo, demo
    assert demo.splitlines()[-1] == f"{venv}/bin/cdc2ch demo --dir ./cdc2ch-demo", demo
