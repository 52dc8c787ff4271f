"""How the `cdc2ch` process ends (__main__.leave): at once, without the interpreter's teardown, yet with its
exit code, its whole output and its exit handlers, as a normal exit; and normally while a thread runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_a_command_s_output_through_a_pipe_is_whole_and_its_code_kept():
    shown = subprocess.run(
        [sys.executable, "-m", "cdc2ch", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert (
        shown.returncode == 0
        and "Commands:" in shown.stdout
        and "verify" in shown.stdout.split("Commands:")[1]
    )
    refused = subprocess.run(
        [sys.executable, "-m", "cdc2ch", "run", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert refused.returncode == 2 and "No such option '--no-such-flag'" in refused.stderr


def test_exit_handlers_run_and_buffered_output_is_flushed_but_the_teardown_is_skipped(tmp_path):
    ran, torn = tmp_path / "ran", tmp_path / "torn"
    done = python(
        f"""
        import atexit, sys
        from cdc2ch.__main__ import leave

        class Teardown:  # freed only when the interpreter tears its modules down
            def __del__(self):
                open({str(torn)!r}, "w").close()

        kept = Teardown()
        atexit.register(lambda: open({str(ran)!r}, "w").close())
        sys.stdout.write("no newline, still in the buffer")
        leave(3)
        """
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "no newline, still in the buffer"
    assert ran.exists() and not torn.exists()


def test_a_message_exits_1_on_stderr_and_a_running_thread_is_waited_for(tmp_path):
    late = tmp_path / "late"
    said = python("from cdc2ch.__main__ import leave\nleave('cdc2ch: error: said so')")
    assert said.returncode == 1 and said.stderr.strip() == "cdc2ch: error: said so"
    waited = python(
        f"""
        import threading, time
        from cdc2ch.__main__ import leave

        def finish():
            time.sleep(0.3)
            open({str(late)!r}, "w").close()

        threading.Thread(target=finish).start()
        leave(0)
        """
    )
    assert waited.returncode == 0, waited.stderr
    assert late.exists()
