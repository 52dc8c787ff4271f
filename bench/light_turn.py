"""The fixed cost of a light turn: `python bench/light_turn.py [--turns N] [--rows N] [--json]`.

One small Delta table (written by delta-rs, as bench/fleet.py's are), one pipeline on the embedded engine,
a warm Spark session (local[2]). Each turn commits one row, then runs one poll of the pipeline
(Replicator.step, what the fleet runner calls), timed. Prints the median and p95 wall per turn, the CPU the
whole process tree (Python and the JVM) spent per turn, and where a turn's wall goes: each phase's own
time (time spent in a nested phase is counted there), by wrapping the project's own functions.

A fleet of pipelines on one process can serve about (cores / CPU per turn) light turns a second: the
figure that decides whether 20 commits a second fit. Also printed: the wall of a poll that finds nothing
new, which every pipeline of a fleet pays once per poll interval.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads import cpu_seconds, descendants  # noqa: E402  (this script's own directory: bench/)

from cdc2ch.clickhouse.connection.dsn import connect  # noqa: E402
from cdc2ch.clickhouse.connection.transport import Sink  # noqa: E402
from cdc2ch.clickhouse.state import lock  # noqa: E402
from cdc2ch.clickhouse.state import statestore as state  # noqa: E402
from cdc2ch.clickhouse.tables import ddl  # noqa: E402
from cdc2ch.clickhouse.writers import changerows as changes  # noqa: E402
from cdc2ch.model import contract  # noqa: E402
from cdc2ch.model.config import RunConfig, SparkSettings, TargetName  # noqa: E402
from cdc2ch.replication.pipeline import Replicator  # noqa: E402
from cdc2ch.source.deltalog import commitlog as log  # noqa: E402
from cdc2ch.source.spark.session import session  # noqa: E402
from cdc2ch.source.spark.threads import jobs_of  # noqa: E402
from cdc2ch.source.sparkread import deltasource as delta  # noqa: E402

CDF = {"delta.enableChangeDataFeed": "true"}


class Phases:
    """Exclusive seconds per phase, per turn: a call inside another timed call counts for its own phase."""

    def __init__(self):
        self.local = threading.local()
        self.turn: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner, attr: str, phase: str, whole: bool = False) -> None:
        """Time owner.attr as `phase`; `whole`: calls made inside it count for it too (an offset write's
        insert is the offset write)."""
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if getattr(self.local, "whole", False):
                return original(*args, **kwargs)
            stack = self.local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # time spent in nested timed calls
            self.local.whole = whole
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.local.whole = False
                spent = time.perf_counter() - t0
                nested = stack.pop()
                self.turn[phase] += spent - nested
                self.calls[phase] += 1
                if stack:
                    stack[-1] += spent

        setattr(owner, attr, timed)

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        out, calls = dict(self.turn), dict(self.calls)
        self.turn.clear()
        self.calls.clear()
        return out, calls


def instrument(p: Phases) -> None:
    p.wrap(delta.DeltaSource, "latest", "log: latest version")
    p.wrap(delta.DeltaSource, "lag", "log: lag")
    p.wrap(delta.DeltaSource, "commits", "log: commits")
    p.wrap(log.DeltaLog, "versions", "log: listing")
    p.wrap(delta, "_scanned_changes", "plan: Delta snapshot + CDF plan")
    p.wrap(delta.SparkChanges, "__init__", "schema (frame.schema)")
    p.wrap(delta.DeltaSource, "collect", "Spark read (toArrow)")
    p.wrap(contract, "arrow_rows", "projection (Arrow)")
    p.wrap(changes, "prepare", "checks: outranked/duplicates")
    p.wrap(contract, "check_keys", "checks: null keys")
    p.wrap(contract, "driver_batch_token", "insert token (digest)")
    p.wrap(ddl.ClickHouseTables, "prepare", "target DDL check")
    p.wrap(Sink, "insert_arrow", "insert (ClickHouse)")
    p.wrap(state.StateStore, "save", "offset write", whole=True)
    p.wrap(lock.PipelineLock, "check", "lock check")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants (the Spark JVM is a child)."""
    total = 0.0
    for p in descendants(pid):
        try:
            total += cpu_seconds(f"/proc/{p}/stat")
        except (OSError, IndexError):
            pass
    return total


def one_row(i: int) -> pa.Table:
    return pa.table({"id": pa.array([i], pa.int64()), "name": pa.array([f"n{i}"])})


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--warm", type=int, default=5, help="turns run first and not counted")
    parser.add_argument("--rows", type=int, default=5_000, help="rows of the table before the turns")
    parser.add_argument("--reader", choices=("spark", "clickhouse"), default="spark")
    parser.add_argument("--json", action="store_true", help="one JSON line of figures instead of a table")
    args = parser.parse_args()
    spark = session(SparkSettings("local[2]"))
    with tempfile.TemporaryDirectory(prefix="cdc2ch-light-") as tmp:
        path = f"{tmp}/small"
        ids = pa.array(range(args.rows), pa.int64())
        write_deltalake(path, pa.table({"id": ids, "name": pa.array([f"n{i}" for i in range(args.rows)])}),
                        configuration=CDF)  # fmt: skip
        dsn = f"chdb://{tmp}/clickhouse"
        cfg = RunConfig(table=path, primary_key=("id",), target=TargetName("bench", "small"), clickhouse_dsn=dsn,
                        pipeline="bench.small", poll_interval=1.0, reader=args.reader)  # fmt: skip
        phases = Phases()
        walls, cpus, python, breakdown, counts = [], [], [], defaultdict(list), defaultdict(list)
        with connect(dsn) as sink:
            job = Replicator(cfg, delta.DeltaSource(spark, path), sink)
            with jobs_of(spark, cfg.pipeline):  # as a fleet worker runs it: a job group and a pool
                job.start()
                job.warm_up()
                job.step()  # the first load
                instrument(phases)
                for i in range(args.warm + args.turns):
                    write_deltalake(path, one_row(10_000_000 + i), mode="append")
                    phases.take()
                    c0, p0, t0 = tree_cpu(os.getpid()), time.process_time(), time.perf_counter()
                    assert job.step().committed, "the turn committed nothing"
                    wall, cpu = time.perf_counter() - t0, tree_cpu(os.getpid()) - c0
                    python.append(time.process_time() - p0)
                    spent, calls = phases.take()
                    if i < args.warm:
                        continue
                    walls.append(wall)
                    cpus.append(cpu)
                    for phase, seconds in spent.items():
                        breakdown[phase].append(seconds)
                    for phase, n in calls.items():
                        counts[phase].append(n)
                    breakdown["other (unwrapped)"].append(wall - sum(spent.values()))
                idle = []  # polls that find nothing new: a fleet pays one per pipeline and poll interval
                for _ in range(args.turns):
                    t0 = time.perf_counter()
                    assert not job.step().committed, "an idle poll committed something"
                    idle.append(time.perf_counter() - t0)
                job.close()
            (count,) = sink.query_rows("SELECT count() FROM bench.small FINAL")[0]
            assert count == args.rows + args.warm + args.turns, count
    figures = {
        "turns": len(walls),
        "wall_median_s": round(statistics.median(walls), 4),
        "wall_p95_s": round(quantile(walls, 0.95), 4),
        "cpu_per_turn_s": round(sum(cpus) / len(cpus), 4),
        "python_cpu_per_turn_s": round(sum(python[args.warm :]) / len(walls), 4),
        "idle_poll_median_s": round(statistics.median(idle), 4),
        "phases_median_s": {
            k: round(statistics.median(v + [0.0] * (len(walls) - len(v))), 4) for k, v in breakdown.items()
        },  # fmt: skip
        "calls_per_turn": {k: round(sum(v) / len(walls), 1) for k, v in counts.items()},
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"light turn ({figures['turns']} turns, one row each, {args.rows:,}-row table, local[2], chdb, "
        f"--reader {args.reader}):"
    )
    print(f"  wall per turn: median {figures['wall_median_s']:.3f} s, p95 {figures['wall_p95_s']:.3f} s")
    cores, cpu = os.cpu_count() or 1, figures["cpu_per_turn_s"]
    print(
        f"  CPU per turn (Python + JVM): {cpu:.3f} s (= {cores / max(cpu, 1e-9):.1f} turns/s on {cores} cores), "
        f"of which the Python process (chdb included) {figures['python_cpu_per_turn_s']:.3f} s"
    )
    print(f"  a poll that finds nothing new: median {figures['idle_poll_median_s'] * 1000:.1f} ms")
    print("  phase (own time, median per turn)         seconds  calls/turn")
    for phase, seconds in sorted(figures["phases_median_s"].items(), key=lambda kv: -kv[1]):
        print(f"    {phase:40s} {seconds:7.3f}  {figures['calls_per_turn'].get(phase, 0):6.1f}")


if __name__ == "__main__":
    main()
