"""Read a Spark DataFrame to the driver a few Spark partitions at a time, as Arrow.

A snapshot is too large to collect at once. Its scan partitions (file splits) are a natural chunk: the JVM
turns them into Arrow record batches, as `DataFrame.toArrow` does, and `PythonRDD.runJob` computes just the
partitions asked for and serves their batches to this process. No Python worker and no per-row work.

Memory is bounded by a chunk, so a chunk is bounded by rows: partitions are split from the table's bytes per
row to hold at most `max_rows` / cores rows. Parquet splits only between row groups, and a row group of a
narrow table can hold millions of rows (Spark writes them up to 128 MB): where one holds more than a
partition should (SHUFFLE_BEYOND times), the rows are spread over partitions of the right size by a
shuffle instead, which Spark streams through its local disk. A chunk is as many partitions as Spark has
cores, or fewer when larger partitions would not fit.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from cdc2ch.source.spark.sessionconf import session_conf

SPLIT = "spark.sql.files.maxPartitionBytes"
OPEN_COST = "spark.sql.files.openCostInBytes"
MIN_SPLIT = 1 << 20  # smaller splits only add tasks: a row group is read whole anyway
# A row group up to this many partitions' rows is read whole, a chunk holding it beside the others; beyond,
# its rows are spread by a shuffle, which the load pays for in time (docs/benchmarks.md).
SHUFFLE_BEYOND = 4


class ChunkedFrame:
    def __init__(self, df, rows: int, max_rows: int):
        spark = self._spark = df.sparkSession
        cores = max(1, spark.sparkContext.defaultParallelism)
        current = spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes()
        bound = max(1, max_rows // cores)
        self.files = sorted(df.inputFiles())
        limit = SHUFFLE_BEYOND * bound
        self.shuffled = rows > bound and largest_row_group(spark, self.files, limit) > limit
        if self.shuffled:
            df, split = df.repartition(-(-rows // bound)), None
        else:
            split = _split_bytes(df, rows, bound, current)
        # Spark splits the files when the plan is executed: the setting counts only while the RDD is built.
        with session_conf(spark, {SPLIT: str(split)} if split else {}):
            self._rdd = df._jdf.toArrowBatchRdd().toJavaRDD()
            self.partitions = self._rdd.getNumPartitions()
            self._splits = (spark.conf.get(SPLIT), spark.conf.get(OPEN_COST))
        self.schema = arrow_schema(df)
        per_partition = -(-rows // max(1, self.partitions))
        self.per_chunk = max(1, min(cores, max_rows // max(1, per_partition)))
        self.count = -(-self.partitions // self.per_chunk)

    def fingerprint(self) -> str:
        """Identifies the chunking: the same files split the same way. Resuming needs a match."""
        digest = hashlib.sha1()
        shape = f"{self.partitions}/{self.per_chunk}" + ("/shuffled" if self.shuffled else "")
        for part in (shape, *self._splits, *self.files):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:16]

    def read(self, index: int) -> pa.Table | None:
        """Chunk `index` as one Arrow table (None when it holds no rows)."""
        from pyspark.serializers import NoOpSerializer
        from pyspark.util import _load_from_socket

        first = index * self.per_chunk
        parts = list(range(first, min(first + self.per_chunk, self.partitions)))
        sc = self._spark.sparkContext
        served = sc._jvm.PythonRDD.runJob(sc._jsc.sc(), self._rdd, parts)
        batches = [
            pa.ipc.read_record_batch(pa.py_buffer(b), self.schema)
            for b in _load_from_socket(served, NoOpSerializer())
        ]
        if not any(b.num_rows for b in batches):
            return None
        return pa.Table.from_batches(batches, self.schema)


def arrow_schema(df) -> pa.Schema:
    """The Arrow schema the JVM gives `df`'s batches (its batches carry none): Spark's own conversion, with
    the session's time zone and string types, passed over as an IPC schema message."""
    jvm = df.sparkSession._jvm
    conf = df.sparkSession._jsparkSession.sessionState().conf()
    schema = jvm.org.apache.spark.sql.util.ArrowUtils.toArrowSchema(
        df._jdf.schema(), conf.sessionLocalTimeZone(), True, conf.arrowUseLargeVarTypes()
    )
    out = jvm.java.io.ByteArrayOutputStream()
    channel = jvm.org.apache.arrow.vector.ipc.WriteChannel(jvm.java.nio.channels.Channels.newChannel(out))
    jvm.org.apache.arrow.vector.ipc.message.MessageSerializer.serialize(channel, schema)
    return pa.ipc.read_schema(pa.py_buffer(bytes(out.toByteArray())))


def _split_bytes(df, rows: int, per_partition: int, current: int) -> int | None:
    """The split size for partitions of about `per_partition` rows, from the bytes Spark will scan (the
    plan's leaves: the table's files); None when Spark's current split is already that small."""
    if rows <= per_partition:
        return None
    leaves = df._jdf.queryExecution().optimizedPlan().collectLeaves()
    size = sum(int(str(leaves.apply(i).stats().sizeInBytes())) for i in range(leaves.size()))
    split = max(MIN_SPLIT, size * per_partition // rows)
    return split if split < current else None


def largest_row_group(spark, files: list[str], enough: int | None = None) -> int:
    """The most rows a row group of the Parquet `files` holds, from their footers (read through the session's
    Hadoop configuration, so from any store Spark reads); the first count above `enough`, where given, without
    reading the other footers."""
    jvm = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    largest = 0
    for name in files:
        if enough is not None and largest > enough:
            break
        source = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(
            jvm.org.apache.hadoop.fs.Path(name), conf
        )
        reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(source)
        try:
            groups = reader.getRowGroups()
            largest = max([largest, *(groups.get(i).getRowCount() for i in range(groups.size()))])
        finally:
            reader.close()
    return largest
