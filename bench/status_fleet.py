"""How long `cdc2ch status` takes for a fleet: `python bench/status_fleet.py [pipelines]` (default 300; the
goal is under 2 s).

Builds the fleet of tests/e2e/commands/test_status_fleet.py in a fresh embedded ClickHouse, but with a Delta
table of its own per pipeline: `pipelines` pipelines in two databases over as many small Delta tables written by
delta-rs (1 to 7 commits, a quarter of them checkpointed), their offsets and health recorded through
cdc2ch's own stores. Then prints the wall time of `cdc2ch status` as a user runs it
(a new process: Python start-up, imports and opening the engine included), best of 5, and of the work
inside (status.collect: the ClickHouse queries and the Delta log lookups), with one log reader and with
the default pool.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL_SECONDS = 2.0


def timed(fn, repeat: int = 5) -> tuple[float, object]:
    """(best wall seconds of `repeat` calls, the last call's result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(pipelines: int) -> None:
    from cdc2ch.clickhouse.connection.dsn import connect
    from cdc2ch.commands import status
    from tests.support import fleet

    with tempfile.TemporaryDirectory(prefix="cdc2ch-status-bench-") as tmp:
        dsn = f"chdb://{Path(tmp) / 'clickhouse'}"
        t0 = time.perf_counter()
        with connect(dsn) as sink:
            fleet.build(sink, Path(tmp) / "lake", ("sales", "ops"), pipelines, tables=pipelines)
            print(f"built {pipelines} pipelines, one Delta table each, in {time.perf_counter() - t0:.1f} s")
            no_spark = lambda: sys.exit("status started Spark")  # noqa: E731
            for readers in (1, status.LOG_READERS):
                status.LOG_READERS = readers
                seconds, rows = timed(lambda: status.collect(sink, no_spark))
                assert len(rows) == pipelines, len(rows)
                print(f"status.collect, {readers} log reader(s): {seconds * 1000:.0f} ms")
        argv = [sys.executable, "-m", "cdc2ch", "status", "--clickhouse", dsn, "--format", "json"]
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True)
            runs.append(time.perf_counter() - t0)
            if done.returncode != 0 or len(json.loads(done.stdout)) != pipelines:
                raise SystemExit(f"cdc2ch status exited {done.returncode}:\n{done.stderr[-2000:]}")
        best = min(runs)
        verdict = "met" if best < GOAL_SECONDS else "MISSED"
        print(
            f"cdc2ch status (new process), {pipelines} pipelines: best {best:.2f} s, median "
            f"{statistics.median(runs):.2f} s (goal < {GOAL_SECONDS:.0f} s: {verdict})"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
