"""Whether an existing target table can be kept equal to Delta under the pipeline's design: its engine,
version and is-deleted columns, sorting and partition keys and column types, read from ClickHouse's system
tables. Read-only; a refusal names what is wrong and prints the CREATE TABLE that would work."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.contract import WRITTEN_META
from cdc2ch.model.design import TableDesign
from cdc2ch.model.identity import expression_columns

ENGINES = ("ReplacingMergeTree", "ReplicatedReplacingMergeTree", "SharedReplacingMergeTree")


@dataclass(frozen=True)
class Existing:
    """A table as ClickHouse describes it."""

    engine: str
    engine_full: str
    sorting_key: str
    partition_key: str
    columns: dict[str, str]  # name -> type, in table order

    @property
    def version_args(self) -> tuple[str, ...]:
        """The engine's version and is-deleted arguments (the last two for a Replicated engine's path ones)."""
        inner = self.engine_full.partition("(")[2].partition(")")[0]
        args = tuple(a.strip().strip("`") for a in inner.split(",") if a.strip())
        return args[-2:] if self.engine != "ReplacingMergeTree" else args


def describe(sink: Sink, target: TargetName) -> Existing | None:
    """The table `target` as ClickHouse describes it, or None when it does not exist."""
    params = {"db": target.database, "t": target.table}
    # One query: the columns (in table order) come with the table's row.
    tables = sink.query_rows(
        "SELECT engine, engine_full, sorting_key, partition_key, "
        "(SELECT arraySort(groupArray((position, name, type))) FROM system.columns "
        "WHERE database = {db:String} AND table = {t:String}) "
        "FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        params,
        what="describe the target table",
    )
    if not tables:
        return None
    engine, engine_full, sorting_key, partition_key, columns = tables[0]
    ordered = {name: type_ for _, name, type_ in columns or ()}
    return Existing(engine, engine_full or "", sorting_key or "", partition_key or "", ordered)


def problems(table: Existing, design: TableDesign, types: dict[str, str], new: bool) -> list[str]:
    """What keeps `table` from holding rows of `types` under `design`. The column types are checked when
    the pipeline is `new` (adopting the table); afterwards schema evolution (ddl.prepare_target) follows them."""
    found = []
    if table.engine not in ENGINES or table.version_args != ("_version", "_is_deleted"):
        found.append(
            f"its engine is {table.engine_full.split(' ORDER BY')[0].split(' PARTITION BY')[0] or table.engine}, "
            f"but cdc2ch versions rows by `_version` and marks deletes in `_is_deleted`: it needs "
            f"ReplacingMergeTree(_version, _is_deleted)"
        )
    missing = [c for c in WRITTEN_META if c not in table.columns]
    if missing:
        found.append(f"it has no column {', '.join(missing)} (cdc2ch's bookkeeping)")
    identity = design.identity
    sorted_by = expression_columns(table.sorting_key)
    if sorted_by != identity.order_by:
        found.append(
            f"it is sorted by ({table.sorting_key or 'nothing'}), the pipeline's design by "
            f"({', '.join(identity.order_by)}); a row's identity is its sorting key, so the two must agree"
        )
    if set(expression_columns(table.partition_key)) != set(identity.partition_columns):
        found.append(
            f"it is partitioned by {table.partition_key or 'nothing'}, the pipeline's design by "
            f"{design.partition_by or 'nothing'}; rows are collapsed within a partition, so the two must agree"
        )
    for column, needed in types.items():
        have = table.columns.get(column)
        if new and have is not None and not schema.takes(have, needed):
            found.append(
                f"column {column!r} is {have}, which does not take Delta's {needed} as it is (it must be "
                f"{needed}, or LowCardinality of it; --column-types chooses another type)"
            )
    if new:
        extra = [
            c for c in table.columns if c not in types and c not in (*WRITTEN_META, *schema.META_COLUMNS)
        ]
        if extra:
            found.append(f"column(s) {', '.join(extra)} are not among the Delta columns replicated into it")
    return found


def its_design(table: Existing, design: TableDesign) -> TableDesign:
    """The design the table seems made for: its sorting key (with any primary-key column it lacks) and
    partition expression, where they can hold the primary key; else the pipeline's."""
    sorted_by = tuple(design.source_name(c) for c in expression_columns(table.sorting_key))
    order_by = sorted_by + tuple(k for k in design.primary_key if k not in sorted_by)
    try:
        return replace(design, order_by=order_by, partition_by=table.partition_key or None)
    except ConfigError:
        return design


def where_problems(sink: Sink, target: TargetName, table: Existing) -> list[str]:
    """What makes `target` (described as `table`) the wrong kind for where cdc2ch writes: a Distributed
    table without --cluster, or with --cluster anything but a Distributed table over existing shard tables."""
    cluster, stored = sink.placement.cluster, sink.placement.stored(target)
    if cluster is None:
        if table.engine == "Distributed":
            return [
                "it is a Distributed table, whose rows live in a cluster's shard tables: pass --cluster with the "
                "cluster's name, and cdc2ch writes through it and checks the shard tables behind it"
            ]
        return []
    if table.engine != "Distributed":
        return [
            f"it is a {table.engine} table, but with --cluster {cluster} the target is a Distributed table over "
            f"{stored} on every node"
        ]
    if describe(sink, stored) is None:
        return [f"the shard table {stored} behind it does not exist on this node"]
    return []


def check(sink: Sink, target: TargetName, design: TableDesign, types: dict[str, str], new: bool) -> None:
    """Refuse an existing `target` that cdc2ch cannot keep equal to Delta; nothing is written either way.
    On a cluster the Distributed table's shard tables (placement.stored) are the ones checked."""
    table = describe(sink, target)
    if table is None:
        return
    found = where_problems(sink, target, table)
    stored = sink.placement.stored(target)
    if not found:
        table = describe(sink, stored) if stored != target else table
        assert table is not None  # where_problems found the shard table
        found = problems(table, design, types, new)
    if not found:
        return
    suggested = its_design(table, design)
    flags = []
    if suggested.identity.order_by != suggested.identity.primary_key:
        flags.append(f"--order-by {','.join(suggested.order_by)}")
    if suggested.partition_by:
        flags.append(f"--partition-by '{suggested.partition_by}'")
    options = f" (with {' '.join(flags)})" if flags and suggested != design else ""
    ddl = ";\n\n".join(sink.placement.target(target, types, suggested))
    raise ConfigError(
        f"ClickHouse table {target} already exists, but cdc2ch cannot keep it equal to the Delta table: "
        f"{'; '.join(found)}. Nothing was written and no offset was recorded. Drop or rename the table and let "
        f"cdc2ch create it{options}, replicate into another --target, or create it by hand like this:\n\n{ddl}"
    )
