"""Where cdc2ch's tables live, on one server or across a --cluster's shards and replicas, and so which
statements create, alter, swap and drop them and which table holds a target's rows."""

from __future__ import annotations

from cdc2ch.clickhouse.connection import cluster as on_cluster
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign


class OneServer:
    """Every table is an ordinary table of the server (or embedded engine) cdc2ch talks to."""

    cluster: str | None = None
    # Settings of every statement on the connection (none: a single server needs nothing special).
    client_settings: dict = {}

    def database(self, database: str) -> list[str]:
        return [f"CREATE DATABASE IF NOT EXISTS {schema.quote(database)}"]

    def state_table(self, database: str, table: str, template: str) -> str:
        return schema.state_table_ddl(database, table, template)

    def target(
        self, target: TargetName, types: dict[str, str], design: TableDesign, comment: str | None = None
    ) -> list[str]:
        return [schema.target_table_ddl(target, types, design, comment)]

    def stored(self, target: TargetName) -> TargetName:
        """The table whose engine holds the target's rows (and whose comment marks it)."""
        return target

    def alter_columns(self, target: TargetName, clause: str) -> list[str]:
        """`ALTER TABLE <target> <clause>` for a change of columns, wherever the target's columns are."""
        return [f"ALTER TABLE {schema.qualified(target)} {clause}"]

    def view(self, view: TargetName, select: str) -> list[str]:
        """Create or atomically replace the view `view` showing `select`."""
        return [f"CREATE OR REPLACE VIEW {schema.qualified(view)} AS {select}"]

    def swap(self, side: TargetName, target: TargetName, design: TableDesign) -> list[str]:
        """Put the table built as `side` (with `design`) in the target's place, and the target in the side's."""
        return [f"EXCHANGE TABLES {schema.qualified(side)} AND {schema.qualified(target)}"]

    def settle(self, target: TargetName, design: TableDesign) -> list[str]:
        """What makes a swap whole after it ran, again after a crash right after it (idempotent)."""
        return []

    def drop(self, target: TargetName) -> list[str]:
        return [f"DROP TABLE IF EXISTS {schema.qualified(target)}"]

    def drop_database(self, database: str) -> list[str]:
        return [f"DROP DATABASE IF EXISTS {schema.quote(database)}"]

    def drop_view(self, view: TargetName) -> list[str]:
        return [f"DROP VIEW IF EXISTS {schema.qualified(view)}"]


class Cluster(OneServer):
    """A target is `<table>_local` on every node (ReplicatedReplacingMergeTree, one replica group per shard)
    behind a Distributed table `<table>` sharded by the primary key; state tables are replicated to every
    node (cluster.py renders the DDL). Every statement is ON CLUSTER, so each node gets the same tables."""

    # An insert into a Distributed table returns once every shard has its rows (not once they are queued on
    # the node cdc2ch talks to): the offset must never move past rows that could still be lost in a queue.
    client_settings = {"insert_distributed_sync": 1}
    cluster: str

    def __init__(self, name: str):
        self.cluster = name
        self._on = f"ON CLUSTER {schema.quote(name)}"

    def database(self, database: str) -> list[str]:
        return [on_cluster.database_ddl(database, self.cluster)]

    def state_table(self, database: str, table: str, template: str) -> str:
        return on_cluster.state_table_ddl_on_cluster(database, table, template, self.cluster)

    def target(self, target, types, design, comment=None) -> list[str]:
        return [
            on_cluster.local_table_ddl(target, types, design, self.cluster, comment),
            on_cluster.distributed_table_ddl(target, design, self.cluster),
        ]

    def stored(self, target: TargetName) -> TargetName:
        return on_cluster.local_name(target)

    def alter_columns(self, target: TargetName, clause: str) -> list[str]:
        # The shards' tables first: the Distributed table then never shows a column they lack.
        return [
            f"ALTER TABLE {schema.qualified(t)} {self._on} {clause}" for t in (self.stored(target), target)
        ]

    def view(self, view: TargetName, select: str) -> list[str]:
        # Over the Distributed table: each shard's FINAL sees every version of its keys (cluster.py).
        return [f"CREATE OR REPLACE VIEW {schema.qualified(view)} {self._on} AS {select}"]

    def swap(self, side: TargetName, target: TargetName, design: TableDesign) -> list[str]:
        # Only the shards' tables trade places: the target's Distributed table reads `<table>_local` by name,
        # so from then on it reads the rebuilt rows; settle() gives it the rebuilt table's columns.
        local, side_local = self.stored(target), self.stored(side)
        return [f"EXCHANGE TABLES {schema.qualified(side_local)} AND {schema.qualified(local)} {self._on}"]

    def settle(self, target: TargetName, design: TableDesign) -> list[str]:
        ddl = on_cluster.distributed_table_ddl(target, design, self.cluster)
        return [ddl.replace("CREATE TABLE IF NOT EXISTS", "CREATE OR REPLACE TABLE", 1)]

    def drop(self, target: TargetName) -> list[str]:
        # SYNC: the replicas' Keeper metadata goes now, so a table of the same name can be created again.
        return [
            f"DROP TABLE IF EXISTS {schema.qualified(t)} {self._on} SYNC"
            for t in (target, self.stored(target))
        ]

    def drop_database(self, database: str) -> list[str]:
        return [f"DROP DATABASE IF EXISTS {schema.quote(database)} {self._on} SYNC"]

    def drop_view(self, view: TargetName) -> list[str]:
        return [f"DROP VIEW IF EXISTS {schema.qualified(view)} {self._on} SYNC"]


def placement(cluster: str | None) -> OneServer:
    return Cluster(cluster) if cluster else OneServer()
