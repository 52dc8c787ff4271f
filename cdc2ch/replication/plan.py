"""The replication loop's decisions, as pure functions: where to start, which writer, how to cut ranges.

Nothing here reads or writes anything; the loop (pipeline.py) gathers the facts and acts on the answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass

from cdc2ch.base.errors import ConfigError, SourceError, StateError, summarise
from cdc2ch.model.changeset import FEED, LOG, Commit, FileSpan, records_feed
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState

MAX_VERSIONS_PER_READ = 1000


@dataclass(frozen=True)
class LogReads:
    """How the versions whose changes are derived from the log are read, as far as a range's cost goes:
    `scanned`, those Spark reads scanning whole each file they re-add with another deletion vector;
    `netted`, those a range of which may be derived at once (FileSpan). log_reads tells both."""

    scanned: frozenset[int] = frozenset()
    netted: frozenset[int] = frozenset()


def plan_ranges(
    commits: list[Commit],
    max_rows: int,
    max_versions: int = MAX_VERSIONS_PER_READ,
    breaks: Collection[int] = (),
    reads: LogReads = LogReads(),
) -> list[tuple[int, int]]:
    """Group consecutive versions into read ranges of at most ~max_rows estimated change rows.

    A version is never split; one larger than max_rows gets a range of its own. A version in `breaks`
    (a schema or metadata change) always starts a range: a CDF read may not span one. A version in
    `reads.scanned` counts the rows of the files it adds and removes where they are more: Spark reads them
    all, one scan a version, and one plan of many such scans costs more than several plans of fewer. From a
    version in `reads.netted`, a range reaches as far as deriving it at once pays and reads at most max_rows
    (FileSpan): copy-on-write rewrites of the same files, each counted whole, would cut it short.
    """

    def opens(c: Commit, first: Commit) -> bool:  # a version that must begin a range of its own
        return c.version - first.version >= max_versions or c.version in breaks

    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(commits):
        end = _summed_end(commits, i, max_rows, opens, reads.scanned)
        if commits[i].version in reads.netted:
            end = max(end, _at_once_end(commits, i, max_rows, opens, reads.netted))
        ranges.append((commits[i].version, commits[end].version))
        i = end + 1
    return ranges


def _summed_end(
    commits: list[Commit],
    i: int,
    max_rows: int,
    opens: Callable[[Commit, Commit], bool],
    scanned: Collection[int],
) -> int:
    """The last commit (its index) of the range from commit i whose commits' estimates sum to max_rows."""
    rows = 0
    for j in range(i, len(commits)):
        c = commits[j]
        cost = max(c.estimated_rows, c.file_rows) if c.version in scanned else c.estimated_rows
        if j > i and (rows + cost > max_rows or opens(c, commits[i])):
            return j - 1
        rows += cost
    return len(commits) - 1


def _at_once_end(
    commits: list[Commit],
    i: int,
    max_rows: int,
    opens: Callable[[Commit, Commit], bool],
    netted: Collection[int],
) -> int:
    """The last commit (its index) of the longest range from commit i its reader derives at once: every
    commit netted, deriving it pays, and it reads at most max_rows; i where no longer one does."""
    span, end = FileSpan(), i
    for j in range(i, len(commits)):
        c = commits[j]
        if c.version not in netted or (j > i and opens(c, commits[i])):
            break
        span.take(c.files)
        if not span.derivable or span.read_rows() > max_rows:
            break
        if span.pays():
            end = j
    return end


def at_once_rows(commits: list[Commit], netted: Collection[int]) -> int | None:
    """The rows its reader reads whole to derive `commits` (a range) at once, None where it does not (not every
    commit netted, or it does not pay): an upper bound of the change rows it yields."""
    if not all(c.version in netted for c in commits):
        return None
    span = FileSpan.of(commits)
    return span.read_rows() if span.pays() else None


def schema_breaks(commits: list[Commit]) -> set[int]:
    """Versions that change the schema or table properties: a CDF read may not span one."""
    return {c.version for c in commits if c.metadata}


def catch_up_ranges(
    commits: list[Commit],
    max_rows: int,
    interrupted: tuple[int, int] | None,
    first_rows: int | None = None,
    reads: LogReads = LogReads(),
) -> list[tuple[int, int]]:
    """The ranges of a catch-up. An interrupted range is replayed first exactly as it was (same batches,
    same tokens); the rest is planned after it. `first_rows`: a lower bound for the first range (a new
    pipeline's, which is read whole and checked before anything is written). `reads`: as plan_ranges."""
    breaks = schema_breaks(commits)

    def cut(some: list[Commit], rows: int) -> list[tuple[int, int]]:
        return plan_ranges(some, rows, breaks=breaks, reads=reads)

    if interrupted is not None:
        return [interrupted] + cut([c for c in commits if c.version > interrupted[1]], max_rows)
    if first_rows is None or not commits:
        return cut(commits, max_rows)
    first = cut(commits, first_rows)[0]
    return [first] + cut([c for c in commits if c.version > first[1]], max_rows)


def range_estimates(
    commits: list[Commit], ranges: list[tuple[int, int]], netted: Collection[int] = ()
) -> list[int]:
    """The estimated change rows of each range, from its commits' log entries: their estimates summed, or the
    rows read where its reader derives it at once (`netted`: LogReads), when fewer."""
    by_version, estimates = {c.version: c for c in commits}, []
    for s, e in ranges:
        some = [by_version[v] for v in range(s, e + 1) if v in by_version]
        summed = sum(c.estimated_rows for c in some)
        at_once = at_once_rows(some, netted)
        estimates.append(summed if at_once is None else min(summed, at_once))
    return estimates


def streamed(estimate: int, max_rows_per_read: int, streams: bool) -> bool:
    """Whether a range's rows go from the source into inserts a chunk at a time, each chunk ranked on its
    own: a source that streams (ChangeSource.streams), a range above --max-rows-per-read. Other ranges are
    collected whole and ranked together. A replay of a range is the same range, with the same estimate: it
    is read the same way and cuts the same batches."""
    return streams and estimate > max_rows_per_read


def held_rows(estimate: int, max_rows_per_read: int, collects: bool, streams: bool, whole: bool) -> int:
    """The rows this process holds while it reads and writes a range of `estimate` rows: none when ClickHouse
    or Spark's executors write it (not `collects`); --max-rows-per-read for a streamed range (the rest waits
    on disk), unless it is read `whole` (a new pipeline's first, for its check)."""
    if not collects:
        return 0
    if streamed(estimate, max_rows_per_read, streams) and not whole:
        return max_rows_per_read
    return estimate


@dataclass(frozen=True)
class RangePlan:
    """A catch-up cut into ranges: each range's estimated rows and the rows this process holds while it reads
    and writes it, and the versions that change the schema (a range begins there)."""

    ranges: list[tuple[int, int]]
    estimates: list[int]
    held: list[int]
    breaks: set[int]


def schedule(
    commits: list[Commit],
    interrupted: tuple[int, int] | None,
    max_rows_per_read: int,
    range_factor: int,
    collects: bool,
    streams: bool,
    checks_first: bool,
    reads: LogReads = LogReads(),
) -> RangePlan:
    """The ranges of a catch-up over `commits`, up to --max-rows-per-read times the writer's `range_factor`
    each; a new pipeline's first range (`checks_first`) is read whole and checked before its claim, so it
    stays within the plain bound. `reads`: as plan_ranges."""
    first = max_rows_per_read if checks_first else None
    ranges = catch_up_ranges(commits, max_rows_per_read * range_factor, interrupted, first, reads)
    estimates = range_estimates(commits, ranges, reads.netted)
    held = [
        held_rows(n, max_rows_per_read, collects, streams, whole=checks_first and i == 0)
        for i, n in enumerate(estimates)
    ]
    return RangePlan(ranges, estimates, held, schema_breaks(commits))


def reads_ahead(estimates: list[int], i: int, max_rows: int) -> bool:
    """Whether range i+1 is read while range i is written (readahead.py): only when both are within the row
    bound, so that at most two bounded ranges are held at once; a single larger version is read alone."""
    return i + 1 < len(estimates) and max(estimates[i], estimates[i + 1]) <= max_rows


def missing_versions(start: int, commits: list[Commit]) -> list[int]:
    """Versions from `start` to the last commit that the log no longer holds (removed by log retention)."""
    if not commits:
        return []
    have = {c.version for c in commits}
    return [v for v in range(start, commits[-1].version + 1) if v not in have]


def cdf_enabled_at(commits: list[Commit]) -> int | None:
    """The version whose commit last switched delta.enableChangeDataFeed on, None when the last switch among
    `commits` turned it off or none switched it (what DESCRIBE HISTORY's operation parameters record)."""
    since = None
    for commit in commits:
        props = commit.parameters.get("properties") or {}
        try:
            props = json.loads(props) if isinstance(props, str) else props
        except ValueError:
            continue
        value = str(props.get("delta.enableChangeDataFeed", "")).lower() if isinstance(props, dict) else ""
        if value in ("true", "false"):
            since = commit.version if value == "true" else None
    return since


def feed_versions(recorded_before: bool, commits: list[Commit]) -> frozenset[int]:
    """The versions among `commits` whose changes the Change Data Feed records: those from a metaData action
    that sets delta.enableChangeDataFeed to true up to one that does not. `recorded_before`: whether the
    version before the first commit records it (what the table's properties said there)."""
    on, found = recorded_before, set()
    for commit in commits:
        if commit.properties is not None:
            on = records_feed(commit.properties)
        if on:
            found.add(commit.version)
    return frozenset(found)


def origin(changes_from: str, fed: Collection[int], start: int, end: int) -> str:
    """Where the changes of versions [start, end] come from (model/changeset.py): what --changes-from forces,
    else (auto) the feed when it records every version of the range, the log otherwise. A range never spans
    a metaData commit (schema_breaks), so the feed covers all of it or none."""
    if changes_from in (FEED, LOG):
        return changes_from
    return FEED if all(v in fed for v in range(start, end + 1)) else LOG


def log_reads(changes_from: str, fed: Collection[int], commits: list[Commit], writer: str) -> LogReads:
    """How the versions among `commits` whose changes are derived from the log are read (LogReads): through
    Spark, those with deletion vectors scan whole each file they re-add (plan_ranges bounds their ranges by
    those rows), and the others may be derived at once, a range of them together; through ClickHouse, any
    (FileSpan.vectors)."""
    logged = frozenset(c.version for c in commits if origin(changes_from, fed, c.version, c.version) == LOG)
    if writer == "clickhouse":
        return LogReads(netted=logged)
    vectors = frozenset(c.version for c in commits if c.version in logged and c.files and c.files.vectors)
    return LogReads(vectors, logged - vectors)


def origins_text(changes_from: str, fed: Collection[int], start: int, latest: int, fed_now: bool) -> str:
    """Where the changes of versions [start, latest] come from, and why (what `validate` shows); `fed_now`:
    whether the latest version records a feed (what decides once the range is empty)."""
    if changes_from == FEED:
        return "changes from the change data feed (--changes-from cdf)"
    if changes_from == LOG:
        return "changes derived from the Delta log's file actions (--changes-from log)"
    versions = range(start, latest + 1)
    logged = [v for v in versions if v not in fed]
    if not versions:
        logged = [] if fed_now else [start]
    if not logged:
        return "changes from the change data feed (the table records one)"
    if len(logged) == len(versions) or not versions:
        return "changes derived from the Delta log's file actions (the table records no change data feed)"
    first_fed = min(v for v in versions if v in fed)
    return (
        f"changes derived from the Delta log's file actions up to version {first_fed - 1} and from the change "
        f"data feed from version {first_fed} on (when it was enabled)"
    )


def check_commits(start: int, commits: list[Commit], uri: str, cfg: RunConfig) -> None:
    """Refuse to replicate `commits` (from `start` on) when some of them cannot be read: the feed was
    switched on after `start` (where only the feed may be read), or log retention removed versions."""
    since = cdf_enabled_at(commits)
    primary_key, target = cfg.primary_key, str(cfg.target)
    if cfg.changes_from == FEED and since is not None and since > start:
        raise cdf_gap_error(since, start, uri, primary_key, target)
    missing = missing_versions(start, commits)
    if missing:
        raise log_gap_error(missing, uri, primary_key, target)


def start_version(
    uri: str,
    target: str,
    stored: PipelineState | None,
    requested: int | None,
    latest: int,
    reset: bool,
    location: str = "",
    table_id: str = "",
) -> int:
    """The first version to replicate: after the stored offset, else --from-version (default 0). Refuses a
    request beyond the latest version, a stored offset of another table or target, a request that
    disagrees with the stored offset (unless --reset), and an offset past the latest version."""
    if requested is not None and requested > latest:
        raise StateError(
            f"--from-version {requested} is beyond the latest version of {uri}, which is "
            f"{latest}. Pass a version between 0 and {latest}."
        )
    if stored is None or reset:
        return requested or 0
    stored.check_matches(uri, target, location, table_id)
    if requested is not None and requested != stored.committed_version + 1:
        raise StateError(
            f"Pipeline {stored.pipeline!r} has already replicated up to version {stored.committed_version} "
            f"and would continue at {stored.committed_version + 1}, but {requested} was asked for. Drop "
            f"--from-version/--from-timestamp to resume, or add --reset to start over at {requested}."
        )
    if stored.committed_version > latest:
        raise StateError(
            f"Pipeline {stored.pipeline!r} has replicated up to version {stored.committed_version}, but the "
            f"latest version of {uri} is {latest}: the table was recreated. Resync with "
            f"`cdc2ch snapshot --reset` or start over with --reset --from-version 0."
        )
    return stored.committed_version + 1


def check_owner(pipeline: str, target: str, states: list[PipelineState]) -> None:
    """A target table belongs to one pipeline: refuse a new pipeline `pipeline` writing `target` when another
    pipeline's offset already records that target (a flag run names its pipeline after the target, e.g.
    `cdc2ch.orders`; a config entry naming it `orders` would otherwise write the same table under a second
    offset, starting over)."""
    owners = [s for s in states if s.target == target and s.pipeline != pipeline]
    if not owners:
        return
    owner = owners[0]
    raise StateError(
        f"ClickHouse table {target} is already replicated by pipeline {owner.pipeline!r} (from {owner.source}, "
        f"committed up to version {owner.committed_version}), and a target table belongs to one pipeline. To "
        f"take that pipeline over from here, give it the same name: `name = {json.dumps(owner.pipeline)}` in "
        f"its [[pipelines]] entry of the config file, or --pipeline {owner.pipeline} with flags; it then "
        f"resumes at version {owner.committed_version + 1}. To replicate into a separate table, choose "
        f"another target."
    )


def choose_writer(reader: str, wanted: str, remote_target: bool, local_master: bool) -> str:
    """driver: collect each range and insert from this process. executors: Spark tasks insert their own
    partitions (server targets only). clickhouse: ClickHouse reads the range itself (--reader clickhouse).
    auto: executors on a cluster with a server target, driver otherwise."""
    if reader == "clickhouse":
        if wanted == "executors":
            raise ConfigError(
                "--reader clickhouse has ClickHouse read and insert the changes itself, so Spark tasks have "
                "nothing to write: drop --writer executors, or use --reader spark."
            )
        return "clickhouse"
    if wanted == "executors" and not remote_target:
        raise ConfigError(
            "--writer executors needs a ClickHouse server target: the embedded engine lives inside this "
            "process, out of the Spark tasks' reach. Use --writer driver (the default for embedded) or an "
            "http(s):// --clickhouse."
        )
    if wanted == "auto":
        return "executors" if remote_target and not local_master else "driver"
    return wanted


def describe(commit: Commit) -> str:
    """A commit as a user would name it: the operation and, for schema changes, its columns."""
    p = commit.parameters
    if commit.operation == "RENAME COLUMN":
        return f"RENAME COLUMN {p.get('oldColumnPath')} TO {p.get('newColumnPath')}"
    for key in ("columns", "column"):
        if p.get(key):
            return f"{commit.operation} {summarise(str(p[key]), 200)}"
    return commit.operation


def log_gap_error(missing: list[int], uri: str, primary_key: tuple[str, ...], target: str) -> SourceError:
    return SourceError(
        f"Versions {missing[0]}..{missing[-1]} of {uri} are no longer in the Delta log "
        f"(log retention removed them), so their changes cannot be replayed. Resync with `cdc2ch snapshot "
        f"--table {uri} --primary-key {','.join(primary_key)} --target "
        f"{target} --reset`, then `cdc2ch run` continues after the snapshot."
    )


def cdf_gap_error(since: int, start: int, uri: str, primary_key: tuple[str, ...], target: str) -> SourceError:
    return SourceError(
        f"The Change Data Feed of {uri} was enabled at version {since}; versions before it have no "
        f"change data, so replication cannot start at {start}. Load the table first with "
        f"`cdc2ch snapshot --table {uri} --primary-key {','.join(primary_key)} --target {target} "
        f"--version {since}` (or a later version); `cdc2ch run` then continues after the snapshot."
    )


def cannot_derive_error(uri: str) -> ConfigError:
    return ConfigError(
        f"--changes-from log derives changes from the data files each version of a Delta table adds and "
        f"removes, and the server of {uri} does not serve them (a Delta Sharing table shared without "
        f"history). `cdc2ch snapshot` loads it as it is now; ask the data provider to share it WITH HISTORY "
        f"to replicate its changes."
    )


def cdf_disabled_error(uri: str) -> SourceError:
    return SourceError(
        f"The Change Data Feed is not enabled on {uri}. Enable it with ALTER TABLE delta.`{uri}` "
        f"SET TBLPROPERTIES (delta.enableChangeDataFeed = true); changes are recorded from the next "
        f"version on, so load the table first with `cdc2ch snapshot` and let `cdc2ch run` continue."
    )


def state_pointed_at(
    base: PipelineState | None,
    pipeline: str,
    uri: str,
    target: str,
    version: int,
    rows: int = 0,
    location: str = "",
    table_id: str = "",
) -> PipelineState:
    """The state of a pipeline (re)pointed at `version`: a new pipeline, a --reset, or a snapshot handing
    over. Keeps the rows written so far, how the pipeline began, and a stamp newer than the last saved one."""
    return PipelineState(
        pipeline,
        uri,
        target,
        version,
        version,
        (base.rows_written if base else 0) + rows,
        base.updated_at if base else PipelineState.epoch(),
        location,
        table_id,
        base.initial_load if base else "",
        base.initial_reason if base else "",
    ).advanced(version, 0)
