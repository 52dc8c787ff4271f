"""The target table as the replication loop and snapshots see it (the TargetTables port) on ClickHouse."""

from __future__ import annotations

from cdc2ch import schema
from cdc2ch.config import TargetName
from cdc2ch.sink import Sink


class ClickHouseTables:
    def __init__(self, sink: Sink, target: TargetName, primary_key: tuple[str, ...]):
        self.sink = sink
        self.target = target
        self.primary_key = primary_key
        self.table_sql = schema.qualified(target)

    def _named(self, suffix: str) -> TargetName:
        return TargetName(self.target.database, self.target.table + suffix)

    def prepare(self, types: dict[str, str], comment: str | None = None) -> schema.SchemaDiff:
        existing = self.sink.table_columns(self.target)
        if existing is None:
            self.sink.create_target(self.target, types, self.primary_key, comment)
            return schema.diff(types, types, self.primary_key)
        change = schema.diff(existing, types, self.primary_key)
        if not change.breaking:
            self.sink.evolve_target(self.target, change)
        return change

    def comment(self, suffix: str = "") -> str | None:
        return self.sink.table_comment(self._named(suffix))

    def drop(self, suffix: str) -> None:
        self.sink.command(
            f"DROP TABLE IF EXISTS {schema.qualified(self._named(suffix))}",
            what=f"drop {self._named(suffix)}",
        )

    def exchange(self, suffix: str) -> None:
        self.sink.command(
            f"EXCHANGE TABLES {schema.qualified(self._named(suffix))} AND {self.table_sql}",
            what="swap in the rebuilt table",
        )
