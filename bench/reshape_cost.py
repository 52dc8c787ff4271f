"""What `cdc2ch reshape` costs next to a plain snapshot of the same table: `python bench/reshape_cost.py [rows]`.

Builds a Delta table with Spark (default 2,000,000 rows), snapshots it into the embedded ClickHouse sorted by
its primary key, commits an update to 1% of it, then reshapes the replica to `ORDER BY (tenant, id)
PARTITION BY toYYYYMM(day)` (side-table snapshot, catch-up, swap) and prints both times. Spark start-up is
excluded; everything runs in one process.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.commands.reshape import Reshape
from cdc2ch.model.config import RunConfig, SparkSettings, TargetName
from cdc2ch.model.design import TableDesign
from cdc2ch.replication.target import clickhouse_snapshotter
from cdc2ch.source.spark.session import session
from cdc2ch.source.sparkread.deltasource import DeltaSource


def main(rows: int) -> None:
    spark = session(SparkSettings())
    with tempfile.TemporaryDirectory(prefix="cdc2ch-bench-") as tmp:
        path = str(Path(tmp) / "delta")
        (
            spark.range(0, rows, 1, 16)
            .selectExpr(
                "id",
                "id % 1000 AS tenant",
                "concat('name-', id) AS name",
                "rand(1) * 1000 AS amount",
                "date_add(DATE'2020-01-01', cast(id % 2000 AS INT)) AS day",
            )  # fmt: skip
            .write.format("delta")
            .option("delta.enableChangeDataFeed", "true")
            .save(path)
        )
        dsn = f"chdb://{Path(tmp) / 'clickhouse'}"
        cfg = RunConfig(table=path, primary_key=("id",), target=TargetName("bench", "orders"), clickhouse_dsn=dsn,
                        pipeline="bench", once=True, reader="spark")  # fmt: skip
        with connect(dsn) as sink:
            t0 = time.monotonic()
            clickhouse_snapshotter(cfg, DeltaSource(spark, path), sink).run()
            snapshot = time.monotonic() - t0
            print(f"snapshot          {rows:,} rows in {snapshot:6.1f} s = {rows / snapshot:,.0f} rows/s")
            spark.sql(f"UPDATE delta.`{path}` SET tenant = tenant + 1, amount = 0 WHERE id % 100 = 0")
            design = TableDesign(("id",), order_by=("tenant", "id"), partition_by="toYYYYMM(day)")
            t0 = time.monotonic()
            done = Reshape(replace(cfg, design=design), DeltaSource(spark, path), sink).run()
            seconds = time.monotonic() - t0
            (sorting,) = sink.query_rows("SELECT sorting_key FROM system.tables WHERE name = 'orders'")[0]
            assert done is not None and sorting == "tenant, id", (done, sorting)
            print(f"reshape           {rows:,} rows in {seconds:6.1f} s = {rows / seconds:,.0f} rows/s "
                  f"({seconds / snapshot:.2f}x the snapshot; at version {done.version})")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000)
