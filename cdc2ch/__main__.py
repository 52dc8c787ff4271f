"""`python -m cdc2ch` and the `cdc2ch` command: stop signals are caught before the command line is
imported, so that one sent to a service still starting is a clean stop, not a traceback; and the process
ends without the interpreter's teardown once the command is done."""

import atexit
import os
import sys
import threading

from cdc2ch.base import deferred, stop


def main() -> None:
    stop.catch_early()
    deferred.defer("pyarrow")
    from cdc2ch.cli import main as command_line

    try:
        command_line()
    except SystemExit as exc:
        leave(exc.code)
    leave(0)


def leave(code: str | int | None) -> None:
    """End the process with `code` (as SystemExit reads it). Tearing down the interpreter frees ~570 modules
    and the embedded engine's globals one by one, 0.1-0.2 s of a cron poll that lasts about a second, for a
    process that is about to end anyway. So, once nothing else runs, the exit handlers run and the output is
    flushed as at a normal exit, and the process ends at once; with another thread still running, the
    normal exit waits for it."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    status = 0 if code is None else code
    if not isinstance(status, int) or any(
        t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()
    ):
        sys.exit(code)
    atexit._run_exitfuncs()  # logging's shutdown among them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (`| head`) or a stream closed: nothing to keep
            pass
    os._exit(status)


if __name__ == "__main__":
    main()
