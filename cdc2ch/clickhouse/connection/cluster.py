"""The DDL of a --cluster target: which tables are replicated or sharded, where, and under which names."""

from __future__ import annotations

import re

from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.contract import sql_literal
from cdc2ch.model.design import TableDesign, setting_sql

# A target `db.t` on a cluster is two tables, both created ON CLUSTER on every node: `db.t_local`, one
# shard's rows in a ReplicatedReplacingMergeTree with the single-node table's columns, sorting key,
# partition and settings (schema.target_table_ddl, rewritten here); and `db.t`, a Distributed table over
# them under the name users query and cdc2ch writes to. The state tables (offsets, snapshot progress,
# health, verify, locks) are small and not sharded: replicated to every node, so whichever node cdc2ch
# connects to reads the same offsets and claims.

# Suffix of the per-shard table behind a target's Distributed table (ClickHouse's usual convention).
LOCAL_SUFFIX = "_local"
# ZooKeeper/Keeper paths, expanded by each node's macros. Target tables: one replica group per shard.
# State tables: one replica group across the whole cluster (no {shard}), so every node holds all of it.
TARGET_PATH = "/clickhouse/tables/{shard}/{database}/{table}"
STATE_PATH = "/clickhouse/tables/all/{database}/{table}"
REPLICA = "{replica}"

# non_replicated_deduplication_window applies only to non-replicated tables; on a replicated one the
# same replay protection (inserts with the same insert_deduplication_token dropped) is this setting.
PLAIN_WINDOW = "non_replicated_deduplication_window"
REPLICATED_WINDOW = "replicated_deduplication_window"

_ENGINE = re.compile(r"^ENGINE = ReplacingMergeTree\((.*)\)$", re.MULTILINE)


def local_name(target: TargetName) -> TargetName:
    """The per-shard table behind the Distributed table `target`: same database, `<table>_local`."""
    return TargetName(target.database, target.table + LOCAL_SUFFIX)


def database_ddl(database: str, cluster: str) -> str:
    return f"CREATE DATABASE IF NOT EXISTS {schema.quote(database)} ON CLUSTER {schema.quote(cluster)}"


def local_table_ddl(
    target: TargetName,
    types: dict[str, str],
    design: TableDesign,
    cluster: str,
    comment: str | None = None,
) -> str:
    """The shard-local table of `target`: the single-node DDL (same columns, ORDER BY, PARTITION BY and
    settings), created ON CLUSTER, with the Replicated engine and the replicated deduplication window."""
    local = local_name(target)
    ddl = schema.target_table_ddl(local, types, design)  # no comment: the DDL then ends with its settings
    ddl = _on_cluster(ddl, schema.qualified(local), cluster)
    ddl = _replicated(ddl, TARGET_PATH)
    # The settings schema rendered (same inputs as schema.target_table_ddl), swapped for the cluster's.
    plain = design.table_settings(schema.nullable_key(types, design))
    ddl = _replace_suffix(ddl, _settings(plain), _settings(cluster_settings(plain)))
    return ddl + (f"\nCOMMENT {sql_literal(comment)}" if comment else "")


def cluster_settings(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """A target's settings on a cluster: the non-replicated deduplication window (the default's or the
    user's) becomes the replicated one, unless the user gave the replicated one, which then wins."""
    given = {key for key, _ in pairs}
    out = []
    for key, value in pairs:
        if key == PLAIN_WINDOW:
            if REPLICATED_WINDOW in given:
                continue
            key = REPLICATED_WINDOW
        out.append((key, value))
    return tuple(out)


def distributed_table_ddl(target: TargetName, design: TableDesign, cluster: str) -> str:
    """The Distributed table `target` over the cluster's `<table>_local` tables, sharded by the primary key.

    Sharded by a hash of the primary key only, not the sorting key: an update that changes a sorting (or
    partition) column moves the row to another identity, writing a tombstone under the old sorting values
    and the new row under the new ones. Hashing the primary key, which never changes, puts both on the shard
    holding the row they replace, so every version of a key lives on one shard: each shard's FINAL sees a
    key's whole history and per-key reads and checks need no other shard. A sorting-key hash would split
    one key's versions across shards whenever such an update moves it.
    """
    local = local_name(target)
    key = ", ".join(schema.quote(c) for c in design.identity.primary_key)
    return (
        f"CREATE TABLE IF NOT EXISTS {schema.qualified(target)} ON CLUSTER {schema.quote(cluster)} "
        f"AS {schema.qualified(local)}\n"
        f"ENGINE = Distributed({schema.quote(cluster)}, {schema.quote(local.database)}, "
        f"{schema.quote(local.table)}, cityHash64({key}))"
    )


def state_table_ddl_on_cluster(database: str, table: str, template: str, cluster: str) -> str:
    """A state table from its sql/ template (schema.state_table_ddl), created ON CLUSTER and replicated to
    every node (STATE_PATH); its ORDER BY and version column stay the template's."""
    ddl = schema.state_table_ddl(database, table, template)
    ddl = _on_cluster(ddl, f"{schema.quote(database)}.{schema.quote(table)}", cluster)
    return _replicated(ddl, STATE_PATH)


# -- rewriting the single-node DDL ------------------------------------------------------------------------
# Each rewrite must apply exactly once: a template that no longer has the expected shape fails loudly here
# (and in tests/e2e/clickhouse/test_cluster_ddl.py) instead of yielding a table that is not replicated.


def _on_cluster(ddl: str, table: str, cluster: str) -> str:
    head = f"CREATE TABLE IF NOT EXISTS {table}"
    if not ddl.startswith(head):
        raise RuntimeError(f"Cannot add ON CLUSTER: the DDL does not start with {head!r}:\n{ddl}")
    return f"{head} ON CLUSTER {schema.quote(cluster)}{ddl[len(head) :]}"


def _replicated(ddl: str, path: str) -> str:
    """ReplacingMergeTree(args) -> ReplicatedReplacingMergeTree(path, replica, args): same version (and
    is-deleted) columns, so replicas collapse rows exactly as a single node does."""

    def engine(m: re.Match) -> str:
        args = [sql_literal(path), sql_literal(REPLICA)] + ([m.group(1)] if m.group(1).strip() else [])
        return f"ENGINE = ReplicatedReplacingMergeTree({', '.join(args)})"

    out, count = _ENGINE.subn(engine, ddl)
    if count != 1:
        raise RuntimeError(f"Expected one ReplacingMergeTree engine line, found {count}:\n{ddl}")
    return out


def _settings(pairs) -> str:
    return "SETTINGS " + ", ".join(setting_sql(k, v) for k, v in pairs)


def _replace_suffix(ddl: str, old: str, new: str) -> str:
    if not ddl.endswith(old):
        raise RuntimeError(f"Cannot rewrite the settings: the DDL does not end with {old!r}:\n{ddl}")
    return ddl[: len(ddl) - len(old)] + new
