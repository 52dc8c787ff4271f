"""Replication through Delta Sharing next to the same table read as Delta: `python bench/sharing_rate.py [rows]`
(default 1,000,000).

Writes a Delta table with Spark (an insert of `rows` rows, then an UPDATE of a tenth of them: change files),
shares it through the test server (tests/support/sharing_server.py, HTTP on localhost, files served by the same
server), and runs `cdc2ch run --once` on each into a fresh embedded ClickHouse as separate processes. Prints
each one's rows/s from its `start` event to its last `committed` event (Spark start-up excluded) and its wall
time (included).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def replicate(table: str, clickhouse: str) -> tuple[int, float, float]:
    """(rows written, seconds from start to the last commit, wall seconds) of one `cdc2ch run --once`."""
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "cdc2ch", "run", "--table", table, "--primary-key", "id", "--target",
            "bench.t", "--clickhouse", clickhouse, "--once", "--log-format", "json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"cdc2ch run exited {done.returncode}:\n{done.stderr[-3000:]}")
    events = [json.loads(ln) for ln in done.stderr.splitlines() if ln.startswith("{")]
    start = next(e for e in events if e["event"] == "start")
    last = [e for e in events if e["event"] == "committed"][-1]
    seconds = (
        datetime.fromisoformat(last["timestamp"]) - datetime.fromisoformat(start["timestamp"])
    ).total_seconds()
    return int(last["total_rows"]), seconds, wall


def main(rows: int) -> None:
    from cdc2ch.model.config import SparkSettings
    from cdc2ch.source.spark.session import session
    from tests.support.sharing_server import SharingServer

    with tempfile.TemporaryDirectory(prefix="cdc2ch-sharing-bench-") as tmp:
        path = str(Path(tmp) / "delta")
        spark = session(SparkSettings())
        spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, tenant BIGINT, name STRING, amount DOUBLE, day DATE) "
                  f"USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")  # fmt: skip
        spark.range(0, rows, 1, 8).selectExpr(
            "id", "id % 1000 AS tenant", "concat('name-', id) AS name", "rand(1) * 1000 AS amount",
            "date_add(DATE'2020-01-01', cast(id % 2000 AS INT)) AS day",
        ).write.format("delta").mode("append").save(path)  # fmt: skip
        spark.sql(f"UPDATE delta.`{path}` SET amount = -amount WHERE id % 10 = 0")
        spark.stop()
        with SharingServer() as server:
            server.share("bench.sales.t", path)
            url = server.url(server.profile(tmp), "bench.sales.t")
            results = {
                "Delta (path)": replicate(path, f"chdb://{Path(tmp) / 'ch-delta'}"),
                "Delta Sharing": replicate(url, f"chdb://{Path(tmp) / 'ch-share'}"),
            }
        print(f"{'source':<14} {'rows':>10} {'rows/s':>10} {'read+write s':>13} {'wall s':>8}")
        for name, (n, seconds, wall) in results.items():
            print(f"{name:<14} {n:>10,} {n / seconds:>10,.0f} {seconds:>13.1f} {wall:>8.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
