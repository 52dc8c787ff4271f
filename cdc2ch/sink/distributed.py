"""Executor-side writes: each Spark task inserts its own partition into a ClickHouse server.

The rows are hash-partitioned by key into a fixed number of partitions and sorted inside each, so a task
retry (or a speculative copy) produces the same batches and the same deduplication tokens
(`<range>:p<partition>:<batch>:<digest>`), and ClickHouse drops whatever had already landed. The driver
moves the offset only after the whole job succeeded.
"""

from __future__ import annotations

NULL_KEY_MARK = "cdc2ch-null-key"


def write_partitions(
    df,
    client_kwargs: dict,
    table_sql: str,
    primary_key: tuple[str, ...],
    partitions: int,
    batch_size: int,
    token_prefix: str,
    attempts: int,
) -> tuple[int, int]:
    """Insert `df` (rows in the target layout) from the executors. Returns (rows, batches)."""
    from pyspark.sql import functions as F

    from cdc2ch.source.spark import positional_columns

    safe, names = positional_columns(df)
    keys = [f"_c{names.index(k)}" for k in primary_key]
    version = f"_c{names.index('_version')}"
    safe = safe.repartition(partitions, *[F.col(k) for k in keys]).sortWithinPartitions(version, *keys)

    def write(batches):  # runs in a Spark task; nested so it ships by value
        import hashlib
        import time

        import clickhouse_connect
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        batches = list(batches)
        table = pa.Table.from_batches(batches).rename_columns(names) if batches else None
        if table is None or table.num_rows == 0:
            yield pa.RecordBatch.from_pydict({"rows": [0], "batches": [0]})
            return
        for k in primary_key:
            nulls = table.column(k).null_count
            if nulls:
                first = table.filter(pc.is_null(table.column(k))).column("_commit_version")[0].as_py()
                raise ValueError(f"{NULL_KEY_MARK}:{k}:{nulls}:{first}")
        client = clickhouse_connect.get_client(**client_kwargs)
        written = count = 0
        try:
            for offset in range(0, table.num_rows, batch_size):
                batch = table.slice(offset, batch_size)
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_table(batch)
                digest = hashlib.sha1(sink.getvalue()).hexdigest()[:20]
                settings = {
                    "insert_deduplicate": 1,
                    "insert_deduplication_token": f"{token_prefix}:p{part}:{count}:{digest}",
                }
                for attempt in range(attempts):
                    try:
                        client.insert_arrow(table_sql, batch, settings=settings)
                        break
                    except Exception:
                        if attempt + 1 == attempts:
                            raise  # the task fails; Spark retries it, the same tokens drop what landed
                        time.sleep(min(0.5 * 2**attempt, 10))
                written += batch.num_rows
                count += 1
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict({"rows": [written], "batches": [count]})

    done = safe.mapInArrow(write, "rows long, batches long").collect()
    return sum(r["rows"] for r in done), sum(r["batches"] for r in done)
