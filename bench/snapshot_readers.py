"""Snapshot throughput of the two readers on the same Delta table: `python bench/snapshot_readers.py [rows]`.

Builds a Delta table with Spark in a temporary directory (default 2,000,000 rows, 8 columns), then loads it
into the embedded ClickHouse with `--reader spark` and with `--reader clickhouse`, and prints rows/s for each.
Spark start-up is excluded (measured separately); both readers run in the same process.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.model.config import RunConfig, SparkSettings, TargetName
from cdc2ch.replication.target import clickhouse_snapshotter
from cdc2ch.source.spark.session import session
from cdc2ch.source.sparkread.deltasource import DeltaSource


def main(rows: int) -> None:
    t0 = time.monotonic()
    spark = session(SparkSettings())
    startup = time.monotonic() - t0
    with tempfile.TemporaryDirectory(prefix="cdc2ch-bench-") as tmp:
        path = str(Path(tmp) / "delta")
        t0 = time.monotonic()
        (
            spark.range(0, rows, 1, 16)
            .selectExpr(
                "id",
                "id % 1000 AS tenant",
                "concat('name-', id) AS name",
                "rand(1) * 1000 AS amount",
                "cast(id % 97 AS decimal(12,2)) AS price",
                "timestamp_micros(id * 1000) AS at",
                "date_add(DATE'2020-01-01', cast(id % 2000 AS INT)) AS day",
                "id % 2 = 0 AS flag",
            )
            .write.format("delta")
            .option("delta.enableChangeDataFeed", "true")
            .save(path)
        )
        print(f"setup: spark start-up {startup:.1f} s, wrote {rows:,} rows in {time.monotonic() - t0:.1f} s")
        dsn = f"chdb://{Path(tmp) / 'clickhouse'}"
        with connect(dsn) as sink:
            results = {}
            for reader in ("spark", "clickhouse"):
                cfg = RunConfig(
                    table=path,
                    primary_key=("id",),
                    target=TargetName("bench", f"snap_{reader}"),
                    clickhouse_dsn=dsn,
                    pipeline=f"bench_{reader}",
                    reader=reader,
                )
                t0 = time.monotonic()
                clickhouse_snapshotter(cfg, DeltaSource(spark, path), sink).run()
                seconds = time.monotonic() - t0
                count = sink.query_rows(f"SELECT count() FROM bench.snap_{reader}")[0][0]
                assert count >= rows, (reader, count)
                results[reader] = rows / seconds
                print(
                    f"snapshot --reader {reader:<10} {rows:,} rows in {seconds:6.1f} s = {rows / seconds:,.0f} rows/s"
                )
            print(f"ratio spark/clickhouse: {results['spark'] / results['clickhouse']:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000)
