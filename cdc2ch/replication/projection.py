"""A change source seen through a table's design: only the Delta columns the target keeps, under the target's
names. Everything downstream (types, rows, identity, verify) then speaks the target's names."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import closing
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc2ch.model.changeset import FEED, Commit
from cdc2ch.model.design import TableDesign

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from cdc2ch.model.changeset import Changes
    from cdc2ch.replication.ports import ChangeSource


def designed_source(source: ChangeSource, design: TableDesign) -> DesignedSource:
    """`source` as the target sees it (once: a source already seen through a design is returned as is)."""
    return source if isinstance(source, DesignedSource) else DesignedSource(source, design)


def kept_columns(design: TableDesign, columns: list[str]) -> list[tuple[str, str]]:
    """(Delta name, target name) of the columns among `columns` that reach the target, in their order."""
    return [(c, design.target_name(c)) for c in columns if c not in design.exclude]


def arrow(rows: pa.Table, design: TableDesign) -> pa.Table:
    if not design.reshapes:
        return rows
    pairs = kept_columns(design, rows.column_names)
    return rows.select([old for old, _ in pairs]).rename_columns([new for _, new in pairs])


def spark(frame: DataFrame, design: TableDesign) -> DataFrame:
    if not design.reshapes:
        return frame
    from cdc2ch.model.contract import spark_col

    return frame.select(*[spark_col(old).alias(new) for old, new in kept_columns(design, frame.columns)])


class DesignedSource:
    """The ChangeSource port over another one: schemas, changes and snapshots in the target's columns; the
    rest passes through."""

    def __init__(self, source: ChangeSource, design: TableDesign) -> None:
        self.source, self.design = source, design

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def schema_at(self, version: int) -> dict[str, Any]:
        """The schema at `version` in the target's columns, the design's options checked against it."""
        return self.design.checked_schema(self.source.schema_at(version), self.source.uri)

    def changes(
        self, start: int, end: int, key: tuple[str, ...] = (), origin: str = FEED
    ) -> "DesignedChanges":
        """`key` in the target's columns, passed on in the source's."""
        key = tuple(self.design.source_name(c) for c in key)
        return DesignedChanges(self.source.changes(start, end, key, origin), self.design)

    def snapshot(self, version: int) -> DataFrame:
        return spark(self.source.snapshot(version), self.design)

    def duplicate_keys(
        self, columns: tuple[str, ...], version: int
    ) -> tuple[int, int, dict[str, str]] | None:
        """Delta rows sharing `columns` (target names) at `version`, the example named as the target does."""
        found = self.source.duplicate_keys(tuple(self.design.source_name(c) for c in columns), version)
        if found is None:
            return None
        keys, extra, example = found
        return keys, extra, {self.design.target_name(k): v for k, v in example.items()}


class DesignedChanges:
    """The Changes port over another one, in the target's columns."""

    def __init__(self, changes: Changes, design: TableDesign) -> None:
        self.changes, self.design = changes, design
        self.start, self.end, self.uri, self.location, self.origin = (
            changes.start,
            changes.end,
            changes.uri,
            changes.location,
            changes.origin,
        )
        self.schema = design.project_schema(changes.schema)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.changes, name)

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        return arrow(self.changes.arrow_rows(immutable_keys), self.design)

    def arrow_chunks(self, immutable_keys: bool, held_rows: int) -> Generator[pa.Table, None, None]:
        with closing(self.changes.arrow_chunks(immutable_keys, held_rows)) as chunks:  # closed with this one
            for rows in chunks:
                yield arrow(rows, self.design)

    def spark_rows(self, immutable_keys: bool) -> DataFrame:
        return spark(self.changes.spark_rows(immutable_keys), self.design)

    def read_error(self, exc: Exception) -> Exception:
        return self.changes.read_error(exc)

    def commits(self) -> list[Commit]:
        return self.changes.commits()

    def properties(self) -> dict[str, str]:
        return self.changes.properties()
