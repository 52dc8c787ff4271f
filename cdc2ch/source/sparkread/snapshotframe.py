"""A version of a table as Spark reads it for a snapshot (the loop's SnapshotFrame port,
replication/ports.py): its schema, the data files ClickHouse's reader would read instead, and its rows in
chunks, each in the target layout."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cdc2ch.model import contract
from cdc2ch.source.sparkread.chunked import ChunkedFrame, arrow_schema
from cdc2ch.source.sparkread.variants import variants_as_json


def file_path(spark_file: str) -> str:
    """Spark's inputFiles() entry -> the _path ClickHouse reports for it. The entry is a Hadoop path, not
    a URI: a partition directory keeps its own escapes (`p=2024-01-01 10%3A00%3A00`), which ClickHouse
    reports as they are, so nothing is decoded here."""
    scheme, sep, rest = spark_file.partition(":")
    if not sep or "/" in scheme:  # no scheme at all
        return spark_file
    if scheme == "file":  # file:/x, file:///x
        return "/" + rest.lstrip("/")
    return rest[2:] if rest.startswith("//") else rest  # s3a://bucket/key -> bucket/key


class FrameSnapshot:
    """A lazy Spark DataFrame of the table at one version (ChangeSource.snapshot)."""

    def __init__(self, frame: Any):
        self.frame = frame

    def schema(self) -> dict[str, Any]:
        return self.frame.schema.jsonValue()

    def files(self) -> tuple[list[str], int]:
        return sorted(file_path(f) for f in self.frame.inputFiles()), self.frame.count()

    def chunks(self, version: int, ts_ms: int, max_rows: int) -> FrameChunks:
        return FrameChunks(self.frame, version, ts_ms, max_rows)


class FrameChunks:
    """The rows in chunks of at most about `max_rows`: Spark reads the table's own columns; the metadata,
    constants of the snapshot, are added in Arrow with the fields Spark would give them."""

    def __init__(self, frame: Any, version: int, ts_ms: int, max_rows: int):
        self.total = frame.count()
        user = variants_as_json(frame)
        self._at = (version, ts_ms)
        self._meta = arrow_schema(contract.spark_snapshot_rows(user, version, ts_ms))
        self._frame = ChunkedFrame(user, self.total, max_rows)
        self.count, self.files = self._frame.count, self._frame.files

    def fingerprint(self) -> str:
        return self._frame.fingerprint()

    def read(self, index: int) -> pa.Table | None:
        data = self._frame.read(index)
        return None if data is None else contract.arrow_snapshot_rows(data, *self._at, self._meta)
