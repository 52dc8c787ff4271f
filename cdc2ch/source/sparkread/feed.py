"""A version range's changes read through Spark, from the Change Data Feed or derived from the log: planned on
first use, the pre-images no target row needs left out of the scan, brought to this process as Arrow whole or a
Spark batch at a time."""

from __future__ import annotations

from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc2ch.base import phases
from cdc2ch.base.errors import CHANGE_FEED
from cdc2ch.base.log import get_logger
from cdc2ch.model import contract
from cdc2ch.model.changeset import FEED, LOG, Commit
from cdc2ch.source.deltalog import preimages
from cdc2ch.source.deltalog.logstate import cdf_schema
from cdc2ch.source.spark.threads import arrow_batches
from cdc2ch.source.sparkread.variants import variants_as_json

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = get_logger("cdc2ch.source")


class SparkChanges:
    """A version range's changes, read through Spark (the Changes port)."""

    def __init__(self, source, start: int, end: int, key: tuple[str, ...] = (), origin: str = FEED):
        self.source, self.start, self.end, self.key, self.origin = source, start, end, key, origin
        self.uri, self.location = source.uri, source.location
        self._frame: DataFrame | None = None
        self._schema: dict[str, Any] | None = None

    @property
    def frame(self):
        """The Spark read, planned on first use (starting Spark if need be)."""
        if self._frame is None:
            with phases.timed("plan"):  # (a JVM started for it counts as its own phase)
                self._frame = self.source._plan_changes(self.start, self.end, self.origin, self.key)
        return self._frame

    @property
    def schema(self) -> dict[str, Any]:
        """The rows' schema: the table's at `end` and the feed's columns; from the log for a local table."""
        if self._schema is None:
            if self._frame is None and self.source.logged_by_python():
                self._schema = cdf_schema(self.source.schema_at(self.end))
            else:
                self._schema = self.frame.schema.jsonValue()
        return self._schema

    def spark_rows(self, immutable_keys: bool):
        frame, every, needless = self._planned(immutable_keys)
        return contract.spark_rows(variants_as_json(frame), every, needless)

    def feed(self, immutable_keys: bool):
        """The Spark frame arrow_rows collects: Spark only scans (and drops pre-images); the metadata
        columns are computed on the Arrow rows, which took a fifth off a warm read of W1's and W2's ranges."""
        frame, every, needless = self._planned(immutable_keys)
        return contract.spark_changes(variants_as_json(frame), every, needless)

    def _planned(self, immutable_keys: bool):
        """The planned frame, whether it leaves out every pre-image, and else the versions whose pre-images it
        need not read (preimages.left_out), told from their change files on another thread while Spark plans
        (and starts, the first time)."""
        if immutable_keys or not self.key or self.origin == LOG:  # (changes from the log have no pre-images)
            return self.frame, immutable_keys, frozenset()
        with ThreadPoolExecutor(1, thread_name_prefix="cdc2ch-preimages") as pool:
            told = pool.submit(self._needless)
            frame, needless = self.frame, told.result()
        return (frame, *preimages.left_out(self.start, self.end, needless))

    def _needless(self) -> frozenset[int]:
        try:
            source, state = self.source, self.source.table_state(self.end)
            return preimages.needless(source.location, state, source.commits(self.start, self.end), self.key)
        except Exception as exc:  # only a slower read: every pre-image is read, as without a key
            log.debug(
                "preimages_all_read", start=self.start, end=self.end, reason=f"{type(exc).__name__}: {exc}"
            )
            return frozenset()

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        rows = self.source.collect(self.feed(immutable_keys), CHANGE_FEED, self.start, self.end)
        with phases.timed("arrow"):
            return contract.arrow_rows(rows)

    def arrow_chunks(self, immutable_keys: bool, held_rows: int) -> Generator[pa.Table, None, None]:
        """The rows of arrow_rows, one Spark Arrow batch at a time, as the scan's tasks end."""
        feed = self.feed(immutable_keys)  # planning translates its own failures
        try:
            with closing(arrow_batches(feed, held_rows)) as batches:  # closed with this generator, not later
                for batch in batches:
                    with phases.timed("arrow"):
                        rows = contract.arrow_rows(pa.Table.from_batches([batch]))
                    yield rows
        except Exception as exc:  # py4j / pyspark errors carry the Java message
            raise self.read_error(exc) from exc

    def read_error(self, exc: Exception) -> Exception:
        return self.source.translate(exc, CHANGE_FEED, self.start, self.end)

    def commits(self) -> list[Commit]:
        return self.source.commits(self.start, self.end)

    def properties(self) -> dict[str, str]:
        return self.source.properties(self.end)
