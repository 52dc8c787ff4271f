"""The peer a Spark user would write by hand: a Structured Streaming query over Delta's change data feed
(`readChangeFeed`, Delta's DeltaSourceCDCSupport) with `Trigger.AvailableNow` and `foreachBatch`, each
micro-batch handed to ClickHouse as Arrow like the reference loop does (drop pre-images, metadata columns,
`insert_arrow` 80,000 rows at a time) into a ReplacingMergeTree of the same layout.

`python bench/streaming_peer.py PATH START DSN TABLE`: runs in its own process, as cdc2ch does, and prints
one JSON line {"seconds": S, "rows": N, "startup": s}: S from the moment its Spark session is up (its target
table and the query), s that start-up. The benchmark compares its whole process less s with cdc2ch's whole
process less its JVM's start.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.model import schema
from cdc2ch.model.config import SparkSettings, TargetName
from cdc2ch.model.design import TableDesign
from cdc2ch.source.spark.session import session

BATCH = 80_000


def main(path: str, start: int, dsn: str, table: str) -> None:
    t0 = time.monotonic()
    spark = session(SparkSettings())
    startup = time.monotonic() - t0
    t1 = time.monotonic()  # its work from here, as cdc2ch's after its Spark start: the target table included
    with connect(dsn) as sink, tempfile.TemporaryDirectory(prefix="cdc2ch-stream-") as checkpoint:
        target = TargetName("bench", table)
        shape = spark.read.format("delta").load(path).schema
        sink.ensure_database("bench")
        sink.command(f"DROP TABLE IF EXISTS {schema.qualified(target)}")
        sink.command(
            schema.target_table_ddl(
                target, schema.column_types(shape.jsonValue(), TableDesign(("id",))), TableDesign(("id",))
            )
        )
        table_sql, user = schema.qualified(target), [f.name for f in shape.fields]
        written = [0]

        def each(batch, batch_id: int) -> None:
            data = batch.where("_change_type != 'update_preimage'").toArrow()
            change = pc.cast(data["_change_type"], pa.string())
            version = pc.cast(data["_commit_version"], pa.uint64())
            out = pa.table(
                {
                    **{c: data[c] for c in user},
                    "_commit_version": version,
                    "_commit_timestamp": pc.cast(data["_commit_timestamp"], pa.timestamp("ms", tz="UTC")),
                    "_change_type": change,
                    "_is_deleted": pc.cast(pc.equal(change, "delete"), pa.uint8()),
                    "_version": version,
                }
            )
            with sink.clients.lease() as client:  # clickhouse-connect as is, deduplication off
                for offset in range(0, out.num_rows, BATCH):
                    client.insert_arrow(
                        table_sql, out.slice(offset, BATCH), settings={"insert_deduplicate": 0}
                    )
            written[0] += out.num_rows

        query = (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", start)
            .load(path)
            .writeStream.foreachBatch(each)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        print(
            json.dumps({"seconds": time.monotonic() - t1, "rows": written[0], "startup": startup}), flush=True
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
