"""The row contract (docs/design.md, "The row contract"): every rule about the rows cdc2ch writes, in one place.

Each change row becomes one target row versioned `_commit_version * 4 + rank`:

    insert, update_postimage, snapshot row  -> live row   (_is_deleted = 0), rank 3
    delete                                  -> tombstone  (_is_deleted = 1), rank 2
    update_preimage                         -> tombstone  (_is_deleted = 1), rank 1
    repair, repair_delete (verify --repair) -> live row / tombstone, rank 4: above every row of its
                                               commit, below every row of the next (ranks 1-3)

ReplacingMergeTree(_version, _is_deleted) then keeps, per key, the state after the last commit that
touched it: a key deleted and re-inserted in one commit is alive, the old key of a key-changing UPDATE
is gone, an ordinary UPDATE's pre-image is outranked by its post-image. No per-key work in Spark.

The rule is written once (RANK, DELETED, version()) and rendered in the three forms the writers need:
Spark columns (`spark_rows`, `spark_snapshot_rows`), ClickHouse SQL (`sql_change_meta`, `sql_fixed_meta`)
and Arrow (`arrow_rows`, `arrow_snapshot_rows`). The insert
deduplication tokens, which make replays harmless, and the settings of every insert into a target
(`target_insert`) are defined here too. pyarrow.compute is imported by the functions that compute on rows:
it costs a process about 8 MiB, which a poll that finds nothing new does not need.

Functions used inside Spark tasks (`digest`, `executor_batch_token`, `null_keys`) depend on nothing but
the standard library, pyarrow and (the digest, imported where it runs) xxhash, so Spark can ship them by value
to executors without cdc2ch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from cdc2ch.base.errors import SourceError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# Columns the Change Data Feed adds to every row.
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# The columns cdc2ch writes after the user columns, in this order (the target table also has _synced_at).
WRITTEN_META = ("_commit_version", "_commit_timestamp", "_change_type", "_is_deleted", "_version")
# Column names cdc2ch reserves in the target table, besides CDF_COLUMNS.
META_COLUMNS = ("_is_deleted", "_version", "_synced_at")

SNAPSHOT = "snapshot"  # the _change_type of rows written by a snapshot
# Rows `verify --repair` writes as of a committed version V: above every row of V (whatever its rank) and
# below every row of V + 1 (whose ranks start at 1), so later changes still win.
REPAIR, REPAIR_DELETE = "repair", "repair_delete"
SLOTS = 4  # ranks per commit version: _version = _commit_version * SLOTS + rank
RANK = {"insert": 3, "update_postimage": 3, SNAPSHOT: 3, "delete": 2, "update_preimage": 1}
REPAIR_RANK = SLOTS  # = rank 0 of the next commit, which no change type has
DELETED = ("delete", "update_preimage")
LIVE_RANK = RANK["insert"]  # the rank of any change type not listed (none today)
PREIMAGE = "update_preimage"  # dropped with --immutable-keys
POSTIMAGE = "update_postimage"


def version(commit_version: int, change_type: str) -> int:
    """The merge version of a row of `change_type` written at `commit_version`."""
    return int(commit_version) * SLOTS + _rank(change_type)


def _rank(change_type: str) -> int:
    return REPAIR_RANK if change_type in (REPAIR, REPAIR_DELETE) else RANK.get(change_type, LIVE_RANK)


def first_version(commit_version: int) -> int:
    """The lowest merge version any row of `commit_version` gets: rows below it are from earlier commits."""
    return int(commit_version) * SLOTS


def sql_before(commit_version: int) -> str:
    """Rows written for commits before `commit_version` (repair rows of earlier commits included)."""
    return f"_commit_version < {int(commit_version)}"


def sql_version() -> str:
    """The merge version a target row must have, from its _commit_version and _change_type."""
    return _sql_version({**RANK, REPAIR: REPAIR_RANK, REPAIR_DELETE: REPAIR_RANK})


def _sql_version(ranks: dict[str, int]) -> str:
    cases = ", ".join(f"_change_type = {sql_literal(t)}, {r}" for t, r in ranks.items() if r != LIVE_RANK)
    return f"toUInt64(_commit_version) * {SLOTS} + multiIf({cases}, {LIVE_RANK})"


def is_deleted(change_type: str) -> bool:
    return change_type in DELETED or change_type == REPAIR_DELETE


# -- Spark form ------------------------------------------------------------------------------------------
def spark_col(name: str) -> Column:
    """A top-level column by its exact name, even with dots or backticks in it."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _spark_rank(change: Column) -> Column:
    from pyspark.sql import functions as F

    expr: Column | None = None
    for change_type, rank in RANK.items():
        if rank != LIVE_RANK:
            test = change == change_type
            expr = F.when(test, rank) if expr is None else expr.when(test, rank)
    return F.lit(LIVE_RANK) if expr is None else expr.otherwise(LIVE_RANK)


def spark_changes(cdf: DataFrame, no_preimages: bool = False, needless: Collection[int] = ()) -> DataFrame:
    """The Spark CDF rows to write: all of them, or without update pre-images (`no_preimages`: the caller
    promises that updates never change key columns, --immutable-keys, or no commit of the range needs its
    own), or without those of the commits `needless` names (each outranked by another row of its key:
    source/deltalog/preimages.py)."""
    from pyspark.sql import functions as F

    preimage = F.col("_change_type") == F.lit(PREIMAGE)
    if no_preimages:
        return cdf.where(~preimage)
    if needless:
        return cdf.where(~(preimage & F.col("_commit_version").isin(sorted(needless))))
    return cdf


def spark_rows(cdf: DataFrame, no_preimages: bool = False, needless: Collection[int] = ()) -> DataFrame:
    """Spark DataFrame of CDF rows -> DataFrame in the target table's layout (user columns + metadata)."""
    from pyspark.sql import functions as F

    cdf = spark_changes(cdf, no_preimages, needless)
    change = F.col("_change_type")
    commit = F.col("_commit_version").cast("long")
    return cdf.select(
        *[spark_col(c) for c in cdf.columns if c not in CDF_COLUMNS],
        commit.alias("_commit_version"),
        F.col("_commit_timestamp"),
        change.alias("_change_type"),
        change.isin(*DELETED).cast("byte").alias("_is_deleted"),
        (commit * SLOTS + _spark_rank(change)).alias("_version"),
    )


def spark_snapshot_rows(
    snapshot: DataFrame, commit_version: int, timestamp_ms: int, change_type: str = SNAPSHOT
) -> DataFrame:
    """Spark DataFrame of a table at `commit_version` -> target layout: live rows at that version (written
    by a snapshot, or by a repair)."""
    from pyspark.sql import functions as F

    return snapshot.select(
        *[spark_col(c) for c in snapshot.columns],
        F.lit(int(commit_version)).cast("long").alias("_commit_version"),
        F.timestamp_millis(F.lit(int(timestamp_ms))).alias("_commit_timestamp"),
        F.lit(change_type).alias("_change_type"),
        F.lit(0).cast("byte").alias("_is_deleted"),
        F.lit(version(commit_version, change_type)).cast("long").alias("_version"),
    )


# -- SQL form (ClickHouse reads the lake itself) -----------------------------------------------------------
def sql_literal(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_change_meta() -> list[str]:
    """The WRITTEN_META expressions over a change data feed read by ClickHouse (columns _change_type,
    _commit_version, _commit_timestamp)."""
    deleted = ", ".join(sql_literal(t) for t in DELETED)
    return [
        "toUInt64(_commit_version)",
        "toDateTime64(_commit_timestamp, 3, 'UTC')",
        "_change_type",
        f"toUInt8(_change_type IN ({deleted}))",
        _sql_version(RANK),
    ]


def sql_change_filter(immutable_keys: bool) -> str:
    """The WHERE clause that drops pre-images under --immutable-keys (empty otherwise)."""
    return f" WHERE _change_type != {sql_literal(PREIMAGE)}" if immutable_keys else ""


def sql_fixed_meta(commit_version: int, timestamp_ms: int, change_type: str) -> list[str]:
    """The WRITTEN_META expressions of rows that all share one version and change type (snapshot rows,
    tombstones of keys a snapshot no longer has)."""
    return [
        f"toUInt64({int(commit_version)})",
        f"fromUnixTimestamp64Milli(toInt64({int(timestamp_ms)}), 'UTC')",
        sql_literal(change_type),
        f"toUInt8({int(is_deleted(change_type))})",
        f"toUInt64({version(commit_version, change_type)})",
    ]


def sql_files_meta(path: str, files: Iterable[tuple[str, int, int]], change_type: str) -> list[str]:
    """The WRITTEN_META expressions of rows of one change type read from the files of several commits (changes
    derived from the log): `files` = (file, commit version, commit time in ms) of each, told apart by the SQL
    expression `path` (each row's file); sql_fixed_meta where one commit wrote them all."""
    files = list(files)
    commits = {(v, ts) for _, v, ts in files}
    if len(commits) == 1:
        return sql_fixed_meta(*commits.pop(), change_type)
    commit = f"toUInt64({sql_by_file(path, [(f, v) for f, v, _ in files])})"
    return sql_versions_meta(commit, dict(commits), change_type)


def sql_by_file(path: str, files: Iterable[tuple[str, int]]) -> str:
    """The number each of `files` (file, number) is given, for a row of the file the SQL expression `path`
    names (0 for any other)."""
    files = list(files)
    names, values = ", ".join(sql_literal(f) for f, _ in files), ", ".join(str(int(n)) for _, n in files)
    return f"transform({path}, [{names}], [{values}], 0)"


def sql_versions_meta(commit: str, times: Mapping[int, int], change_type: str) -> list[str]:
    """The WRITTEN_META expressions of rows of one change type whose commit version is the SQL expression
    `commit` (a UInt64), one of `times` (commit version -> its time in ms)."""
    versions, stamps = ", ".join(str(int(v)) for v in times), ", ".join(str(int(t)) for t in times.values())
    return [
        commit,
        f"fromUnixTimestamp64Milli(toInt64(transform({commit}, [{versions}], [{stamps}], 0)), 'UTC')",
        sql_literal(change_type),
        f"toUInt8({int(is_deleted(change_type))})",
        f"{commit} * {SLOTS} + {_rank(change_type)}",
    ]


# -- Arrow form ----------------------------------------------------------------------------------------------
def arrow_rows(cdf: pa.Table, immutable_keys: bool = False) -> pa.Table:
    """Arrow CDF rows -> the target layout, the same rule and the same Arrow schema as `spark_rows` (for
    sources read without Spark, and for Spark's own collected change feed: computed here, vectorized, the
    metadata columns cost the JVM nothing)."""
    import pyarrow.compute as pc

    change = cdf.column("_change_type")
    if immutable_keys:
        cdf = cdf.filter(pc.not_equal(change, pa.scalar(PREIMAGE)))
        change = cdf.column("_change_type")
    rank = pa.scalar(LIVE_RANK, pa.int64())
    for change_type, r in RANK.items():
        if r != LIVE_RANK:
            rank = pc.if_else(pc.equal(change, pa.scalar(change_type)), pa.scalar(r, pa.int64()), rank)
    commit = pc.cast(cdf.column("_commit_version"), pa.int64())
    user = [c for c in cdf.column_names if c not in CDF_COLUMNS]
    # Fields as Spark's select gives them (a NOT NULL column stays so): the same batches, the same digests.
    field = cdf.schema.field
    commit_field, change_field = field("_commit_version").with_type(pa.int64()), field("_change_type")
    schema = pa.schema(
        [*(field(c) for c in user), commit_field, field("_commit_timestamp"), change_field,
         pa.field("_is_deleted", pa.int8(), change_field.nullable),
         pa.field("_version", pa.int64(), commit_field.nullable)]
    )  # fmt: skip
    return pa.table(
        [*(cdf.column(c) for c in user), commit, cdf.column("_commit_timestamp"), change,
         pc.cast(pc.is_in(change, pa.array(DELETED)), pa.int8()), pc.add(pc.multiply(commit, SLOTS), rank)],
        schema=schema,
    )  # fmt: skip


def arrow_snapshot_rows(
    rows: pa.Table, commit_version: int, timestamp_ms: int, meta: pa.Schema, change_type: str = SNAPSHOT
) -> pa.Table:
    """Arrow rows of a table at `commit_version` -> the target layout, as `spark_snapshot_rows` gives it: the
    metadata are constants, appended here instead of converted per row by the JVM. `meta`: the fields Spark
    gives them (time zone and NOT NULL included), so the batches have the same schema and bytes."""
    values = (
        int(commit_version),
        int(timestamp_ms) * 1000,  # microseconds, as Spark's timestamps
        change_type,
        int(is_deleted(change_type)),
        version(commit_version, change_type),
    )
    fields = [meta.field(name) for name in WRITTEN_META]
    columns = [pa.repeat(pa.scalar(v, f.type), rows.num_rows) for v, f in zip(values, fields)]
    return pa.table([*rows.columns, *columns], schema=pa.schema([*rows.schema, *fields]))


# -- keys ----------------------------------------------------------------------------------------------------
def null_keys(rows: pa.Table, primary_key: Iterable[str]) -> tuple[str, int, object] | None:
    """(key column, null count, first version) of the first key column holding nulls, else None.
    ClickHouse would silently turn a null key into 0 or '' and merge unrelated rows."""
    import pyarrow.compute as pc

    for key in primary_key:
        nulls = rows.column(key).null_count
        if nulls:
            first = "?"
            if "_commit_version" in rows.column_names:
                first = rows.filter(pc.is_null(rows.column(key))).column("_commit_version")[0].as_py()
            return key, nulls, first
    return None


def files_gone_error(uri: str, span: str) -> SourceError:
    """A range whose change or data files VACUUM or log retention removed, by either reader."""
    return SourceError(
        f"Files needed to read {span} of {uri} are gone (removed by VACUUM or log retention). "
        f"These changes can no longer be replayed: resync with `cdc2ch snapshot` at the latest "
        f"version, then `cdc2ch run` continues from there."
    )


def null_key_error(nulls: int, key: str, first_version: object, where: str) -> SourceError:
    return SourceError(
        f"{nulls} row(s) in {where} have a null in primary-key column {key!r} (first at version "
        f"{first_version}). A key must identify a row: choose non-null key columns for --primary-key, or fix "
        f"the rows in Delta and replicate from after that version."
    )


def check_keys(rows: pa.Table, primary_key: Iterable[str], where: str) -> None:
    found = null_keys(rows, primary_key)
    if found is not None:
        key, nulls, first = found
        raise null_key_error(nulls, key, first, where)


# -- insert deduplication tokens -----------------------------------------------------------------------------
# A replay sends the same rows with the same token and ClickHouse drops them. A token names the rows' place
# (pipeline, versions, batch) and, where the rows pass through cdc2ch, a digest of their content, so that
# different rows in the same place (another --batch-size, --immutable-keys) are never dropped.
def digest(batch: pa.Table) -> str:
    """A digest of the batch's content: XXH3-128 of its Arrow IPC stream, fed buffer by buffer as the writer
    makes it. The stream is never assembled (a 7 MB allocation per 80,000-row batch, which cost more than the
    insert's own serialization), and XXH3 runs at memory speed where SHA-1 took 5 ms of such a batch."""
    import xxhash

    hasher = xxhash.xxh3_128()
    sink = pa.PythonFile(_Feed(hasher.update), mode="w")  # type: ignore[arg-type]  # takes any file-like object
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_table(batch)
    return hasher.hexdigest()[:20]


class _Feed:
    """A write-only file that hands each block written to `take` (pyarrow.PythonFile wraps it)."""

    closed = False

    def __init__(self, take: Callable[[bytes], object]) -> None:
        self.write = take

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def range_token(pipeline: str, start: int, end: int) -> str:
    """The prefix shared by every token of one version range."""
    return f"{pipeline}:{start}-{end}"


def driver_batch_token(pipeline: str, start: int, end: int, index: int, batch: pa.Table) -> str:
    return f"{range_token(pipeline, start, end)}:{index}:{digest(batch)}"


def executor_batch_token(range_prefix: str, partition: int, index: int, batch: pa.Table) -> str:
    return f"{range_prefix}:p{partition}:{index}:{digest(batch)}"


def pushdown_range_token(pipeline: str, start: int, end: int) -> str:
    return f"{range_token(pipeline, start, end)}:clickhouse"


def pushdown_read_token(pipeline: str, start: int, end: int, change_type: str, at: int, part: int = 0) -> str:
    """One of the statements of a range derived from the log: its rows of `change_type` read at version `at`
    (part `part` of them, where they are cut into parts)."""
    return f"{pushdown_range_token(pipeline, start, end)}:{change_type}@{at}{f'.{part}' if part else ''}"


def snapshot_batch_token(
    pipeline: str, version_: int, plan: str, chunk: int, index: int, batch: pa.Table
) -> str:
    return f"{snapshot_chunk_token(pipeline, version_, plan, chunk)}:{index}:{digest(batch)}"


def snapshot_chunk_token(pipeline: str, version_: int, plan: str, chunk: int) -> str:
    return f"{pipeline}:snap{version_}:{plan}:{chunk}"


def sweep_token(pipeline: str, version_: int) -> str:
    return f"{pipeline}:sweep{version_}"


def repair_token(pipeline: str, version_: int, batch: pa.Table) -> str:
    return f"{pipeline}:repair{version_}:{digest(batch)}"


def target_insert(token: str | None) -> dict[str, int | str]:
    """ClickHouse settings of every insert into a target table. A replay with the same `token` is dropped
    (no token: deduplication off). The replacing pass ClickHouse would run over each inserted block
    (`optimize_on_insert`) is left to merges: FINAL replaces either way, and the pass cost 10-15% of a lake
    read's `INSERT ... SELECT` (W1, W2) while finding nothing to replace in rows cdc2ch ranked first. The
    setting exists on every server cdc2ch accepts (23.2 and later)."""
    dedup: dict[str, int | str] = (
        {"insert_deduplicate": 1, "insert_deduplication_token": token} if token else {"insert_deduplicate": 0}
    )
    return {**dedup, "optimize_on_insert": 0}


def batch_index(token: str) -> int | None:
    """The batch number of a driver, executor or snapshot batch token (None for other tokens)."""
    parts = token.split(":")
    if len(parts) < 4 or not parts[-2].isdigit() or len(parts[-1]) != 20:
        return None
    return int(parts[-2])
