"""The statements that write a range with `--reader clickhouse`: one read of its change data feed; where its
changes come from the log, the range at once where that pays (logreads.net_reads), else each commit's files
read as they are where they alone tell (commitreads.py), else the fewest reads at versions (logreads.py); a
range that only appends, its files as they are."""

from __future__ import annotations

from dataclasses import dataclass

from cdc2ch.clickhouse.writers.commitreads import VERSIONS_PROPERTY, CommitRead, commit_reads
from cdc2ch.clickhouse.writers.lakesql import (
    DIRECT_FILES,
    VERSION_SETTING,
    cdf_settings,
    files_function,
    files_where,
    lake_access,
    lake_function,
)
from cdc2ch.clickhouse.writers.logreads import DELETE, INSERT, FileRead, appends_only, file_reads, net_reads
from cdc2ch.model import contract, schema
from cdc2ch.model.changeset import LOG, Changes, Commit, table_file
from cdc2ch.model.config import RunConfig

# Statements a range of commits read one by one may take (two a commit); a range of more is read in the
# fewest statements of logreads.py
COMMIT_READS = 64


@dataclass(frozen=True)
class LakeRead:
    """One `INSERT ... SELECT` of a range: the WRITTEN_META expressions of its rows, what it reads of the lake
    (a WHERE clause, settings) and its deduplication token."""

    meta: list[str]
    where: str
    settings: dict[str, int]
    token: str
    # read at a version before the range whose first commit changes the schema: read the columns it has
    older_schema: bool = False
    # what the statement reads (files as they are, or a join of reads at versions), where not the lake
    # function with `settings`
    source: str | None = None


def lake_reads(cfg: RunConfig, rng: Changes, local_files: bool = False) -> list[LakeRead]:
    """The statements that write the range: one read of its change data feed, or the reads of the files its
    commits add and remove (commitreads.py or logreads.py; none where no commit changes data). A range that
    only appends is read from the files its commits add, as they are, where ClickHouse can read them so: the
    lake function would read the Delta log again (dozens of requests to an object store for one small commit)
    to find what the log already says."""
    commits = rng.commits()
    if appends_only(rng.start, rng.end, commits, schema.user_fields(rng.schema)):
        reads = _file_reads(cfg, rng, commits, local_files)
        if all(read.source for read in reads):
            return reads
    if rng.origin != LOG:
        token = contract.pushdown_range_token(cfg.pipeline, rng.start, rng.end)
        where = contract.sql_change_filter(cfg.immutable_keys)
        return [LakeRead(contract.sql_change_meta(), where, cdf_settings(rng.start, rng.end), token)]
    return (
        _net_reads(cfg, rng, commits)
        or _commit_reads(cfg, rng, commits, local_files)
        or _file_reads(cfg, rng, commits, None)
    )


def _net_reads(cfg: RunConfig, rng: Changes, commits: list[Commit]) -> list[LakeRead]:
    """The range derived at once, where that pays (logreads.net_reads): the rows of the files there at its
    end, each at the version that added its file; and the rows of the files it found whose key none of those
    holds, each at the last version that removed a file holding its key (its own file's removal, or a later
    one of a file it added and removed again). Through the table at versions: each file as it was there."""
    net = net_reads(rng.location, rng.start, rng.end, commits)
    if net is None:
        return []
    lake = lake_function(rng.location, lake_access(cfg))

    def at(read: FileRead, columns: str = "*") -> str:
        where = files_where([path for path, _, _ in read.files])
        return f"(SELECT {columns} FROM {lake}{where} SETTINGS {VERSION_SETTING} = {int(read.version)})"

    def removed_at(read: FileRead, name: str) -> str:  # (each file's removal version)
        return f"toUInt64({contract.sql_by_file('_path', [(p, v) for p, v, _ in read.files])}) AS {name}"

    def token(kind: str) -> str:
        return contract.pushdown_read_token(cfg.pipeline, rng.start, rng.end, f"{kind}-net", rng.end)

    reads = []
    if net.after is not None:
        meta = contract.sql_files_meta("_path", net.after.files, INSERT)
        where = files_where([path for path, _, _ in net.after.files])
        reads.append(LakeRead(meta, where, {VERSION_SETTING: net.after.version}, token(INSERT)))
    if net.before is not None:
        held = at(net.after) if net.after is not None else None
        source = _unheld(cfg, at(net.before, f"*, {removed_at(net.before, '_gone_at')}"), held)
        gone_at = "_gone_at"
        if net.between:  # (a file's keys only, and the latest removal of each)
            keys, same = _identity(cfg, "_later")
            # (each read a subquery of its own: a union of reads with SETTINGS applies the last one to all)
            reads_between = [at(r, f"{keys}, {removed_at(r, '_later_at')}") for r in net.between]
            later = " UNION ALL ".join(f"SELECT * FROM {read}" for read in reads_between)
            grouped = ", ".join(f"_later_{i}" for i in range(len(cfg.identity.columns)))
            last = f"SELECT {grouped}, max(_later_at) AS _last FROM ({later}) GROUP BY {grouped}"
            source += f" LEFT JOIN ({last}) AS _later ON {same}"
            gone_at = "greatest(_removed._gone_at, _later._last)"
        times = {c.version: c.timestamp_ms for c in commits}
        meta = contract.sql_versions_meta(gone_at, times, DELETE)
        reads.append(LakeRead(meta, "", {}, token(DELETE), source=source))
    return reads


def _commit_reads(cfg: RunConfig, rng: Changes, commits: list[Commit], local_files: bool) -> list[LakeRead]:
    """The reads of commitreads.py: of files as they are where the range allows it and ClickHouse can, else
    of the files through the table at versions; none where the range cannot be read so."""
    fields, properties = schema.user_fields(rng.schema), rng.properties()
    plan = commit_reads(rng.start, rng.end, commits, fields, properties)
    if plan is None or not plan.reads or len(plan.reads) > COMMIT_READS:
        return []
    if plan.as_files:
        reads = _as_files(cfg, rng, plan.reads, fields, properties, local_files)
        if reads:
            return reads
    return _at_versions(cfg, rng, plan.reads)


def _as_files(
    cfg: RunConfig,
    rng: Changes,
    planned: list[CommitRead],
    fields: list[dict],
    properties: dict[str, str],
    local_files: bool,
) -> list[LakeRead]:
    """Each read of files as they are (names at the table's root), with the table's types; none where one of
    them names files ClickHouse cannot read so."""
    access = lake_access(cfg)
    structure = ", ".join(
        f"{schema.quote(f['name'])} {schema.clickhouse_type(f['type'], f.get('nullable', True), f['name'])}"
        for f in fields
    )

    def files(paths: tuple[str, ...], shape: str = structure) -> str | None:
        return files_function(rng.location, list(paths), access, local_files, shape)

    reads = []
    for read in planned:
        where = ""
        if read.change_type == INSERT and read.own_rows:
            versions = schema.quote(properties[VERSIONS_PROPERTY])
            source = files(read.files, f"{structure}, {versions} Nullable(Int64)")
            where = f" WHERE coalesce({versions}, {read.version}) = {read.version}"
        elif read.change_type == INSERT:
            source = files(read.files)
        else:
            removed, added = files(read.files), files(read.against)
            if read.against and added is None:
                return []
            source = None if removed is None else _unheld(cfg, removed, added)
        if source is None:
            return []
        reads.append(LakeRead(_commit_meta(read), where, {}, _commit_token(cfg, rng, read), source=source))
    return reads


def _at_versions(cfg: RunConfig, rng: Changes, planned: list[CommitRead]) -> list[LakeRead]:
    """Each read of files through the table as of the commit (its adds) or the version before it (its
    removes), deletion vectors applied; none where a read names more files than a statement should."""
    if any(len(read.files) + len(read.against) > DIRECT_FILES for read in planned):
        return []
    lake = lake_function(rng.location, lake_access(cfg))

    def at(paths: tuple[str, ...], version: int) -> str:
        where = files_where([table_file(rng.location, p) for p in paths])
        return f"(SELECT * FROM {lake}{where} SETTINGS {VERSION_SETTING} = {int(version)})"

    reads = []
    for read in planned:
        if read.change_type == INSERT:
            where = files_where([table_file(rng.location, p) for p in read.files])
            reads.append(LakeRead(_commit_meta(read), where, {VERSION_SETTING: read.version},
                                  _commit_token(cfg, rng, read)))  # fmt: skip
        else:
            added = at(read.against, read.version) if read.against else None
            source = _unheld(cfg, at(read.files, read.version - 1), added)
            reads.append(LakeRead(_commit_meta(read), "", {}, _commit_token(cfg, rng, read), source=source))
    return reads


def _commit_meta(read: CommitRead) -> list[str]:
    return contract.sql_fixed_meta(read.version, read.ts_ms, read.change_type)


def _commit_token(cfg: RunConfig, rng: Changes, read: CommitRead) -> str:
    return contract.pushdown_read_token(
        cfg.pipeline, rng.start, rng.end, f"{read.change_type}-commit", read.version
    )


def _unheld(cfg: RunConfig, removed: str, added: str | None) -> str:
    """The rows of `removed` whose key no row of `added` holds (all of them without `added`): an anti-join,
    which ClickHouse runs in about half the time of a NOT IN over the same keys. A key's columns beyond the
    primary key may be NULL, and NULL matches NULL there, as a row's identity in the target."""
    if added is None:
        return f"{removed} AS _removed"
    held, same = _identity(cfg, "_held")
    return f"{removed} AS _removed LEFT ANTI JOIN (SELECT {held} FROM {added}) AS _held ON {same}"


def _identity(cfg: RunConfig, prefix: str) -> tuple[str, str]:
    """A row's identity columns named `prefix`_0, ... (a SELECT list), and each equal to its own (an ON)."""
    identity = cfg.identity
    named = ", ".join(
        f"{schema.quote(cfg.design.source_name(c))} AS {prefix}_{i}" for i, c in enumerate(identity.columns)
    )
    same = " AND ".join(
        f"{schema.quote(cfg.design.source_name(c))} = {prefix}_{i}"
        if c in identity.primary_key
        else f"isNotDistinctFrom({schema.quote(cfg.design.source_name(c))}, {prefix}_{i})"
        for i, c in enumerate(identity.columns)
    )
    return named, same


def _file_reads(
    cfg: RunConfig, rng: Changes, commits: list[Commit], local_files: bool | None
) -> list[LakeRead]:
    """The reads of logreads.py, each of files named at a version of the lake function; with `local_files`
    given (a range of appends), each with the function that reads its files as they are, where there is one."""
    access = lake_access(cfg)
    schema_changed = any(c.version == rng.start and c.metadata for c in commits)
    reads = []
    for read in file_reads(rng.location, rng.start, rng.end, commits, rng.uri):
        # (each a plain name at the table's root: its `_path`'s last part)
        names = [p.rsplit("/", 1)[-1] for p, _, _ in read.files]
        source = None if local_files is None else files_function(rng.location, names, access, local_files)
        reads.append(
            LakeRead(
                contract.sql_files_meta("_path", read.files, read.change_type),
                files_where([path for path, _, _ in read.files]),
                {VERSION_SETTING: read.version},
                contract.pushdown_read_token(
                    cfg.pipeline, rng.start, rng.end, read.change_type, read.version, read.part
                ),
                schema_changed and read.version < rng.start,
                source,
            )
        )
    return reads
