"""What replicating from the log costs against the change data feed (issue: tables without a feed).

W1 (appends), W2 (MERGEs touching ~6% of a loaded table) and W5 (MERGEs changing 1% of a large table, a few
files each) are built on twins that differ only in their table properties: one records a feed, the others do
not (copy-on-write; with deletion vectors; with row tracking). `cdc2ch run --once` replicates each backlog, as a
pipeline that exists meets it (bench/workloads.py run_cdc2ch), with each reader, alternating the twins; the
median run of each counts, and each log twin's time is printed as a ratio to the feed's.

    python bench/log_changes.py [--quick] [--runs N]

A backlog read by ClickHouse takes seconds, and one run of it is as noisy as the machine: at full size each
twin runs at least CLICKHOUSE_RUNS times with that reader.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from workloads import FEED, build_w1, build_w2, build_w5, latest_version, run_cdc2ch

from cdc2ch.model.config import SparkSettings
from cdc2ch.source.spark.session import session

TWINS = {
    "feed": FEED,
    "log": "delta.enableChangeDataFeed = false",
    "log, deletion vectors": "delta.enableDeletionVectors = true",
    "log, row tracking": "delta.enableRowTracking = true",
}
SIZES = {
    "full": {"W1": (2_000_000, 20), "W2": (1_000_000, 20), "W5": (20_000_000, 10)},
    "quick": {"W1": (200_000, 5), "W2": (100_000, 3), "W5": (2_000_000, 10)},
}
BUILDS = {"W1": build_w1, "W2": build_w2, "W5": build_w5}
READERS = ("spark", "clickhouse")
CLICKHOUSE_RUNS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    size = "quick" if args.quick else "full"
    runs = args.runs or (1 if args.quick else 3)
    spark = session(SparkSettings())
    with tempfile.TemporaryDirectory(prefix="cdc2ch-bench-log-") as tmp:
        for name, (rows, versions) in SIZES[size].items():
            paths, start = {}, 0
            for twin, properties in TWINS.items():
                paths[twin] = str(Path(tmp) / f"{name}-{twin.replace(', ', '-').replace(' ', '-')}")
                t0 = time.monotonic()
                start = BUILDS[name](spark, paths[twin], rows, versions, properties)
                print(f"{name} {twin}: built versions {start}..{latest_version(spark, paths[twin])} in "
                      f"{time.monotonic() - t0:.1f} s", flush=True)  # fmt: skip
            for reader in READERS:
                each = max(runs, CLICKHOUSE_RUNS) if reader == "clickhouse" and size == "full" else runs
                _compare(name, reader, paths, start, each, Path(tmp))
            for path in paths.values():
                shutil.rmtree(path)
    spark.stop()


def _compare(name: str, reader: str, paths: dict[str, str], start: int, runs: int, tmp: Path) -> None:
    """Each twin's backlog replicated by `reader`, the twins alternating; the median of each against the
    feed's."""
    took: dict[str, list[float]] = {twin: [] for twin in TWINS}
    written: dict[str, int] = {}
    for i in range(runs):
        for twin, path in paths.items():
            own = tmp / f"ch-{name}-{reader}-{i}-{abs(hash(twin))}"
            r = run_cdc2ch(path, start, f"chdb://{own}", "t", "--reader", reader)
            took[twin].append(r["span"])
            written[twin] = r["rows"]
            shutil.rmtree(own)
    feed = statistics.median(took["feed"])
    for twin, spans in took.items():
        mid = statistics.median(spans)
        each = ", ".join(f"{s:.2f}" for s in spans)
        print(f"{name} {twin}, --reader {reader}: {mid:.2f} s ({each}; Spark start-up excluded), "
              f"{written[twin]:,} rows written, {mid / feed:.2f}x the feed", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
