"""What `cdc2ch verify` costs next to a full `cdc2ch snapshot` of the same table:
`python bench/verify_cost.py [rows]` (default 5,000,000).

Writes a Delta table with Spark, then runs `cdc2ch snapshot` (with each reader, into two tables) and
`cdc2ch verify` as separate processes on the embedded ClickHouse and prints each one's wall time and the peak
RSS of its process tree (cdc2ch and its JVM), sampled from /proc every 0.25 s. All include Spark start-up, as
a user sees them.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workloads import PeakRss  # this folder: the same sampler as the workloads


def measured(argv: list[str]) -> tuple[float, int, str]:
    """(seconds, peak tree RSS in bytes, stdout) of one cdc2ch command."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cdc2ch", *argv], stdout=subprocess.PIPE, text=True)
    rss = PeakRss(proc.pid)
    out = proc.stdout.read()
    code = proc.wait()
    peak = rss.stop()
    if code not in (0, 1):
        raise SystemExit(f"cdc2ch {argv[0]} exited {code}")
    return time.monotonic() - t0, peak, out


def main(rows: int) -> None:
    from cdc2ch.model.config import SparkSettings
    from cdc2ch.source.spark.session import session

    with tempfile.TemporaryDirectory(prefix="cdc2ch-verify-bench-") as tmp:
        path = str(Path(tmp) / "delta")
        spark = session(SparkSettings())
        t0 = time.monotonic()
        spark.range(0, rows, 1, 16).selectExpr(
            "id", "id % 1000 AS tenant", "concat('name-', id) AS name", "rand(1) * 1000 AS amount",
            "cast(id % 97 AS decimal(12,2)) AS price", "timestamp_micros(id * 1000) AS at",
            "date_add(DATE'2020-01-01', cast(id % 2000 AS INT)) AS day", "id % 2 = 0 AS flag",
        ).write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)  # fmt: skip
        print(f"wrote {rows:,} rows in {time.monotonic() - t0:.1f} s")
        spark.stop()
        common = [
            "--table",
            path,
            "--primary-key",
            "id",
            "--clickhouse",
            f"chdb://{Path(tmp) / 'clickhouse'}",
        ]
        # The snapshot through ClickHouse's own reader is the fastest full load cdc2ch has, so the fairest
        # peer of verify; the default (Spark) reader's load of the same table is shown beside it.
        steps = (
            ("snapshot (--reader spark)", ["snapshot", *common, "--target", "bench.s"]),
            (
                "snapshot (--reader clickhouse)",
                ["snapshot", *common, "--target", "bench.t", "--reader", "clickhouse"],
            ),
            ("verify", ["verify", *common, "--target", "bench.t", "--json"]),
        )
        for name, argv in steps:
            seconds, peak, out = measured(argv)
            print(f"{name:<30} {rows:,} rows: {seconds:6.1f} s, peak RSS {peak / 2**20:,.0f} MiB")
        print(out.strip())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5_000_000)
