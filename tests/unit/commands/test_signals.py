"""SIGTERM and SIGINT ask for a stop after the current batch; a second one means now; one that came while
the command line was still imported counts as the first. In this process, no JVM: the real processes are
in tests/e2e/commands/test_interrupt.py and bench/soak.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from cdc2ch.base import stop


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_stops_second_interrupts(sig):
    before = signal.getsignal(sig)
    with stop.stop_on_signals() as stopped:
        assert not stopped.is_set()
        os.kill(os.getpid(), sig)  # the handler runs here, in the main thread, and raises nothing
        assert stopped.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
            stopped.wait(5)  # any bytecode after the signal runs the handler
    assert signal.getsignal(sig) is before  # restored


def test_the_stop_is_seen_as_soon_as_the_handler_ran():
    # The watcher thread that sets the event may not run before the current batch ends; the check between
    # batches must not depend on it.
    with stop.stop_on_signals() as stopped:
        switch = sys.getswitchinterval()
        sys.setswitchinterval(10)  # the watcher does not take the interpreter from this thread meanwhile
        try:
            signal.raise_signal(signal.SIGTERM)
            seen = stopped.is_set()
        finally:
            sys.setswitchinterval(switch)
        assert seen
        assert stopped.wait(5)


def test_no_signal_no_stop():
    with stop.stop_on_signals() as stopped:
        pass
    assert not stopped.is_set()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_caught_before_the_command_took_over_is_its_first(sig):
    before = {s: signal.getsignal(s) for s in stop.STOP_SIGNALS}
    stop.catch_early()
    try:
        os.kill(os.getpid(), sig)  # recorded, nothing else
        with stop.stop_on_signals() as stopped:
            assert stopped.wait(5)
            with pytest.raises(KeyboardInterrupt):  # the next one is the second
                os.kill(os.getpid(), sig)
                stopped.wait(5)
        with stop.stop_on_signals() as again:  # taken over once, not twice
            pass
        assert not again.is_set()
        assert {s: signal.getsignal(s) for s in stop.STOP_SIGNALS} == before  # not catch_early's recorders
    finally:
        stop.release()
    assert {s: signal.getsignal(s) for s in stop.STOP_SIGNALS} == before


def test_a_command_that_does_not_stop_cleanly_gets_the_signal_back():
    stop.catch_early()
    os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        stop.release()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    stop.release()  # nothing caught any more: nothing to do


def _early_signal(args: list[str], sig: str, tmp_path) -> subprocess.CompletedProcess:
    script = (
        "import os, signal, sys\n"
        "from cdc2ch.base import stop\n"
        "stop.catch_early()\n"
        f"os.kill(os.getpid(), signal.{sig})  # as if sent while the imports below ran\n"
        "from cdc2ch.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)  # fmt: skip


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_run_signalled_while_starting_stops_before_any_work_with_exit_0(sig, tmp_path):
    args = ["run", "--once", "--table", str(tmp_path / "lake"), "--primary-key", "id",
            "--clickhouse", f"chdb://{tmp_path / 'ch'}", "--log-format", "json"]  # fmt: skip
    done = _early_signal(args, sig, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f'"signal": "{sig}"' in done.stderr and '"started": false' in done.stderr


def test_other_commands_signalled_while_starting_end_as_they_always_did(tmp_path):
    done = _early_signal(
        ["query", "SELECT 1", "--clickhouse", f"chdb://{tmp_path / 'ch'}"], "SIGTERM", tmp_path
    )
    assert done.returncode == -signal.SIGTERM and "1" not in done.stdout


def test_the_commands_that_keep_early_signals_are_those_that_take_them_over():
    """cli keeps the signals caught while it loaded for CLEAN_STOPS and hands them back for every other
    command: a command of the list that never entered stop_on_signals would swallow Ctrl-C, and one off the
    list that enters it would let an early signal kill it instead of stopping it cleanly."""
    import inspect

    from cdc2ch import cli
    from cdc2ch.commands import app

    commands = set(cli.main.commands)
    assert cli.CLEAN_STOPS <= commands
    functions = {
        name: getattr(app, name) for name in commands if inspect.isfunction(getattr(app, name, None))
    }
    entering = {name for name, fn in functions.items() if "stop_on_signals()" in inspect.getsource(fn)}
    assert entering == cli.CLEAN_STOPS and len(functions) > len(entering)
