"""Executor writes: each Spark task inserts its own partition into a ClickHouse server.

The rows are hash-partitioned by key into a fixed number of partitions and sorted inside each, so a task
retry (or a speculative copy) produces the same batches and the same deduplication tokens, and ClickHouse
drops whatever had already landed. A partition holds every row of its keys, so a task leaves out the rows a
later one of their key outranks, as the driver writer does. Each task reports what it did as a value (rows,
batches, or the null key or insert failure that stopped it); the driver turns a failure into the same error
the other writers raise, and the offset moves only after the whole job succeeded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc2ch.base import retry
from cdc2ch.base.errors import SinkError
from cdc2ch.clickhouse.faults import scrubbed
from cdc2ch.clickhouse.writers import Destination, SparkTasks
from cdc2ch.model import contract
from cdc2ch.model.changeset import Changes, RangeResult
from cdc2ch.model.records import PipelineState

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

MAX_TASK_PARTITIONS = 256
RESULT_SCHEMA = "rows long, batches long, null_key string, nulls long, null_version string, error string"


def partitions_for(estimate: int, batch_size: int) -> int:
    """Partitions of a range: its estimated rows over the batch size (the same on a replay, so the same
    batches and tokens), at least 1 and at most MAX_TASK_PARTITIONS."""
    return max(1, min(MAX_TASK_PARTITIONS, -(-max(estimate, 1) // batch_size)))


@dataclass(frozen=True)
class TaskInserts:
    """What each Spark task needs to insert its partition: plain values, which ship to the tasks by value."""

    client_kwargs: dict[str, Any]  # clickhouse_connect.get_client arguments
    table_sql: str
    primary_key: tuple[str, ...]
    key: tuple[str, ...]  # the identity columns
    batch_size: int
    token_prefix: str
    attempts: int


def write_partitions(
    df: DataFrame, partitions: int, job: TaskInserts, tasks: SparkTasks
) -> list[dict[str, Any]]:
    """Insert `df` (rows in the target layout) from the executors. Returns one result per partition."""
    from pyspark.sql import functions as F

    from cdc2ch.clickhouse.writers import changerows as changes

    safe, names = tasks.positional(df)
    client_kwargs, table_sql, batch_size, token_prefix, attempts = (
        job.client_kwargs,
        job.table_sql,
        job.batch_size,
        job.token_prefix,
        job.attempts,
    )
    primary_key, key = job.primary_key, job.key
    keys = [f"_c{names.index(k)}" for k in key]
    version = f"_c{names.index('_version')}"
    safe = safe.repartition(partitions, *[F.col(k) for k in keys]).sortWithinPartitions(version, *keys)
    null_keys, batch_token, call = contract.null_keys, contract.executor_batch_token, retry.call
    insert_settings = contract.target_insert
    latest, cut = changes.latest_in_place, changes.batches

    def write(
        batches: Iterable[pa.RecordBatch],
    ) -> Iterator[pa.RecordBatch]:  # runs in a Spark task; nested so it ships by value
        import functools

        import clickhouse_connect
        import pyarrow as pa
        from pyspark import TaskContext

        def result(
            rows: int = 0,
            count: int = 0,
            null: tuple[str, int, object] | None = None,
            error: str | None = None,
        ) -> pa.RecordBatch:
            key, nulls, first = null or (None, 0, None)
            return pa.RecordBatch.from_pydict(
                {"rows": [rows], "batches": [count], "null_key": [key], "nulls": [nulls],
                 "null_version": [None if first is None else str(first)], "error": [error]},
            )  # fmt: skip

        task = TaskContext.get()
        assert task is not None  # (in a Spark task)
        part = task.partitionId()
        batches = list(batches)
        table = pa.Table.from_batches(batches).rename_columns(names) if batches else None
        if table is None or table.num_rows == 0:
            yield result()
            return
        null = null_keys(table, primary_key)
        if null is not None:
            yield result(null=null)
            return
        table = latest(table, key)  # a partition holds every row of its keys
        client = clickhouse_connect.get_client(**client_kwargs)
        written = count = 0
        try:
            for batch in cut(table, batch_size):
                settings = insert_settings(batch_token(token_prefix, part, count, batch))
                insert = functools.partial(client.insert_arrow, table_sql, batch, settings=settings)
                call(insert, attempts, lambda exc: True)  # any failure: the same token makes a retry safe
                written += batch.num_rows
                count += 1
        except Exception as exc:  # after `attempts` tries: reported, not raised (Spark would only repeat it)
            yield result(written, count, error=" ".join(f"{type(exc).__name__}: {exc}".split()))
            return
        finally:
            client.close()
        yield result(written, count)

    # The task calls changes, contract and retry: shipped by value, executors need not have cdc2ch installed.
    with tasks.shipped(changes, contract, retry):
        return [r.asDict() for r in safe.mapInArrow(write, RESULT_SCHEMA).collect()]


class ExecutorWriter:
    kind = "executors"
    range_factor = 1
    collects = False  # Spark tasks read the rows

    def __init__(self, to: Destination):
        self.to, self.cfg = to, to.cfg

    def check(self, rng: Changes, estimate: int) -> None:
        """One Spark aggregate counting the range's null keys (a new pipeline's first range only)."""
        from pyspark.sql import functions as F

        rows = rng.spark_rows(self.cfg.immutable_keys)
        for key in self.cfg.identity.primary_key:
            nulls, first = (
                rows.where(contract.spark_col(key).isNull())
                .agg(F.count(F.lit(1)), F.min("_commit_version"))
                .collect()[0]
            )
            if nulls:
                raise contract.null_key_error(
                    nulls, key, first, f"versions {rng.start}..{rng.end} of {rng.uri}"
                )

    def write(self, rng: Changes, state: PipelineState, estimate: int) -> RangeResult:
        cfg, start, end = self.cfg, rng.start, rng.end
        t0 = time.monotonic()
        partitions = partitions_for(estimate, cfg.batch_size)
        client_kwargs, tasks = self.to.sink.task_client, self.to.tasks
        assert (
            client_kwargs is not None and tasks is not None
        )  # chosen for a server target only (plan.choose_writer)
        job = TaskInserts(
            client_kwargs,
            self.to.table_sql,
            cfg.identity.primary_key,
            cfg.identity.columns,
            cfg.batch_size,
            contract.range_token(cfg.pipeline, start, end),
            cfg.retries,
        )
        try:
            results = write_partitions(rng.spark_rows(cfg.immutable_keys), partitions, job, tasks)
        except Exception as exc:  # the read failed in Spark
            raise rng.read_error(exc) from exc
        where = f"versions {start}..{end} of {rng.uri}"
        nulls = [r for r in results if r["null_key"]]
        if nulls:
            first = min(nulls, key=lambda r: int(r["null_version"]))
            total = sum(r["nulls"] for r in nulls if r["null_key"] == first["null_key"])
            raise contract.null_key_error(total, first["null_key"], first["null_version"], where)
        failed = [r["error"] for r in results if r["error"]]
        if failed:
            raise SinkError(
                f"Spark tasks failed to insert versions {start}..{end} into {self.to.table_sql} after "
                f"{retry.attempts(cfg.retries)} each: {scrubbed(failed[0])}. The offset was not moved; run again once "
                f"ClickHouse is healthy."
            )
        rows, batches = sum(r["rows"] for r in results), sum(r["batches"] for r in results)
        # Tasks insert on the executors: their bytes are not seen here, and one observation covers the range.
        self.to.metrics.batch(rows, 0, time.monotonic() - t0, batches)
        self.to.log.info(
            "range_written",
            start=start,
            end=end,
            rows=rows,
            batches=batches,
            partitions=partitions,
            writer="executors",
            seconds=round(time.monotonic() - t0, 3),
        )
        return RangeResult(start, end, rows, True)
