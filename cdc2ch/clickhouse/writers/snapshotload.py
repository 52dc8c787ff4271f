"""A snapshot's writes into the target table (the loop's SnapshotTarget port, replication/ports.py): a
chunk's rows inserted from this process, a group of files ClickHouse reads itself, and the sweep that
tombstones keys the snapshot no longer has. Each is idempotent by its deduplication token
(model/contract.py), so a chunk replayed after a crash lands once."""

from __future__ import annotations

import functools

import pyarrow as pa

from cdc2ch.base.log import Logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.writers.driver import InsertInto, insert_rows
from cdc2ch.clickhouse.writers.lakesql import (
    VERSION_SETTING,
    files_where,
    insert_from_lake,
    lake_access,
    lake_function,
)
from cdc2ch.clickhouse.writers.pushdown import insert_settings
from cdc2ch.model import contract, schema
from cdc2ch.model.config import RunConfig


class SnapshotTable:
    """The target table of one pipeline's snapshot."""

    def __init__(self, sink: Sink, table_sql: str, log: Logger):
        self.sink, self.table_sql, self.log = sink, table_sql, log

    def insert(self, rows: pa.Table, cfg: RunConfig, where: str, chunk: tuple[int, str, int]) -> int:
        """Insert chunk `chunk` = (version, plan, index) of the snapshot, its rows in the target layout; the
        rows written."""
        version, plan, index = chunk
        token = functools.partial(contract.snapshot_batch_token, cfg.pipeline, version, plan, index)
        n, _, _ = insert_rows(
            InsertInto(self.sink, self.table_sql, self.log), rows, cfg, where, token, chunk=index
        )
        return n

    def load_files(
        self,
        cfg: RunConfig,
        location: str,
        files: list[str],
        columns: tuple[list[str], list[str]],
        chunk: tuple[int, str, int],
    ) -> int:
        """Have ClickHouse read `files` of the table at `location` as of the chunk's version and insert them:
        `columns` = (the user columns, target names; the expressions of contract.WRITTEN_META). The rows it
        added."""
        version, plan, index = chunk
        names, meta = columns
        before = self.sink.row_count(self.table_sql)
        with self.sink.reads_files():
            self.sink.command(
                insert_from_lake(
                    self.table_sql,
                    lake_function(location, lake_access(cfg)),
                    names,
                    meta,
                    files_where(files),
                    cfg.design,
                ),
                what=f"load snapshot chunk {index}",
                settings={
                    VERSION_SETTING: version,
                    **insert_settings(contract.snapshot_chunk_token(cfg.pipeline, version, plan, index)),
                },
            )
        return max(self.sink.row_count(self.table_sql) - before, 0)

    def sweep(self, pipeline: str, version: int, ts_ms: int, columns: list[str]) -> None:
        """Tombstone keys alive from before `version` that the snapshot did not write (gone by then)."""
        cols = ", ".join(schema.quote(c) for c in columns)
        meta = contract.sql_fixed_meta(version, ts_ms, "delete")
        self.sink.command(
            f"INSERT INTO {self.table_sql} ({cols}, {', '.join(contract.WRITTEN_META)}) SELECT {cols}, "
            f"{', '.join(meta)} FROM {self.table_sql} FINAL WHERE {contract.sql_before(version)}",
            what="tombstone keys missing from the snapshot",
            settings=contract.target_insert(contract.sweep_token(pipeline, version)),
        )
