"""How the demo's closing lines call cdc2ch from the shell it ran in: `make demo` starts .venv/bin/cdc2ch,
which is on no PATH until the virtualenv is activated."""

from __future__ import annotations

import sys

import pytest

from cdc2ch.commands.demo import calling


@pytest.fixture
def venv(tmp_path, monkeypatch):
    bindir = tmp_path / "repo" / ".venv" / "bin"
    bindir.mkdir(parents=True)
    for name in ("python", "cdc2ch", "activate"):
        (bindir / name).write_text("")
        (bindir / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bindir / "python"))
    monkeypatch.setenv("PATH", "/nonexistent")
    return bindir


def test_a_virtualenv_not_on_path_is_activated_first(venv):
    assert calling(venv.parent.parent) == (
        ["source .venv/bin/activate    # puts cdc2ch on your PATH"],
        "cdc2ch",
    )
    # from outside the repository, by its whole path
    assert calling(venv.parent.parent.parent / "elsewhere")[0] == [
        f"source {venv / 'activate'}    # puts cdc2ch on your PATH"
    ]


def test_the_cdc2ch_on_path_is_called_by_name(venv, monkeypatch):
    monkeypatch.setenv("PATH", str(venv))
    assert calling(venv.parent.parent) == ([], "cdc2ch")


def test_without_activate_the_script_and_without_the_script_the_interpreter(venv):
    (venv / "activate").unlink()
    assert calling(venv.parent.parent) == ([], ".venv/bin/cdc2ch")
    (venv / "cdc2ch").unlink()
    assert calling(venv.parent.parent) == ([], f"{venv / 'python'} -m cdc2ch")
