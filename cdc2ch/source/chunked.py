"""Read a Spark DataFrame to the driver one Spark partition at a time, as Arrow.

A snapshot is too large to collect at once. Its scan partitions (file splits) are a natural chunk:
`SparkContext.runJob` computes just the partitions asked for, and `mapInArrow` ships them as Arrow IPC,
so there is no per-row Python work. A chunk is as many partitions as Spark has cores (computed in
parallel), so memory is bounded by that many partitions.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from cdc2ch.source.spark import positional_columns


class ChunkedFrame:
    def __init__(self, df):
        def to_ipc(batches):  # runs on executors; nested so it ships by value (no cdc2ch install there)
            import pyarrow as pa

            for batch in batches:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_batch(batch)
                yield pa.RecordBatch.from_arrays(
                    [pa.array([sink.getvalue().to_pybytes()], pa.binary())], ["ipc"]
                )

        self._spark = df.sparkSession
        safe, self.names = positional_columns(df)
        self._rdd = safe.mapInArrow(to_ipc, "ipc binary").rdd
        self.partitions = self._rdd.getNumPartitions()
        self.per_chunk = max(1, self._spark.sparkContext.defaultParallelism)
        self.count = -(-self.partitions // self.per_chunk)
        self.files = sorted(df.inputFiles())

    def fingerprint(self) -> str:
        """Identifies the chunking: the same files split the same way. Resuming needs a match."""
        conf = self._spark.conf
        digest = hashlib.sha1()
        for part in (
            f"{self.partitions}/{self.per_chunk}",
            conf.get("spark.sql.files.maxPartitionBytes"),
            conf.get("spark.sql.files.openCostInBytes"),
            *self.files,
        ):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:16]

    def read(self, index: int) -> pa.Table | None:
        """Chunk `index` as one Arrow table (None when it holds no rows)."""
        first = index * self.per_chunk
        parts = list(range(first, min(first + self.per_chunk, self.partitions)))
        blobs = self._spark.sparkContext.runJob(self._rdd, lambda rows: [bytes(r.ipc) for r in rows], parts)
        tables = [pa.ipc.open_stream(b).read_all() for b in blobs]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return None
        return pa.concat_tables(tables).rename_columns(self.names)
