"""Per-pipeline replication status: stored offsets and health next to the Delta tables' latest versions.

Built to answer for hundreds of pipelines at once: each of cdc2ch's record tables is read with one query per
database (whatever the number of pipelines), and each Delta table's log once, several at a time, probing a
few of its files rather than reading it whole.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING

from cdc2ch.base.errors import Cdc2chError, ConfigError, SourceError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.compactlog import CompactStore
from cdc2ch.clickhouse.state.control import ControlStore
from cdc2ch.clickhouse.state.layout import LAYOUT_TABLE, Layout
from cdc2ch.clickhouse.state.lock import Claim, holders
from cdc2ch.clickhouse.state.statestore import (
    COMPACT_TABLE,
    CONTROL_TABLE,
    HEALTH_TABLE,
    STATE_TABLE,
    VERIFY_TABLE,
    Health,
    HealthStore,
    PipelineState,
    StateStore,
    VerifyStore,
    state_tables,
)
from cdc2ch.commands.selection import Selection
from cdc2ch.model.config import TargetName, parse_duration
from cdc2ch.model.objectstore import S3Settings
from cdc2ch.model.tableref import is_path, is_shared
from cdc2ch.source.deltalog.commitlog import LogChanged
from cdc2ch.source.deltalog.logfiles import python_log
from cdc2ch.source.spark.lazysession import s3_settings
from cdc2ch.source.storefaults import storage_error

if TYPE_CHECKING:
    from cdc2ch.commands.invocation.listing import Known

log = get_logger("cdc2ch.status")

# Delta logs read at once: a lookup is a few small reads, round trips on an object store.
LOG_READERS = 8

# Terminal columns of --wide: (heading, row key).
TABLE_COLUMNS = (
    ("pipeline", "pipeline"),
    ("target", "target"),
    ("committed", "committed_version"),
    ("latest", "latest_version"),
    ("behind", "versions_behind"),
    ("behind_s", "seconds_behind"),
    ("rows_written", "rows_written"),
    ("last_success", "last_success"),
    ("verified", "verified"),
    ("compacted", "compacted"),
    ("paused", "paused"),
    ("initial_load", "initial_load"),
    ("changes", "changes_from"),
    ("reader", "reader"),
    # Shown when some pipeline names its table through a catalog: the name and where it was found.
    ("source", "source"),
    ("location", "location"),
    ("error", "error"),
)
ERROR_CHARS_IN_TABLE = 160
NOT_RUN = "has not run yet"
# A service recorded the pipeline's health as it began its first turn (fleet/runner.py), and nothing since.
BEGUN = "starting: a service began it, nothing committed yet"
# The default table: what a glance needs, in TABLE_WIDTH terminal columns (the last one, `state`, is cut).
NARROW_COLUMNS = (
    ("pipeline", "pipeline"),
    ("target", "target"),
    ("committed", "committed_version"),
    ("behind", "versions_behind"),
    ("behind_s", "seconds_behind"),
    ("rows_written", "rows_written"),
    ("state", "state"),
)
TABLE_WIDTH = 120


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat(timespec="seconds") if ts is not None else None


def collect(
    sink: Sink,
    spark_factory: Callable[[], object],
    target: TargetName | None = None,
    pipelines: list[Known] | None = None,
    select: Selection | None = None,
) -> list[dict]:
    """One dict per pipeline: every pipeline with a record in ClickHouse, or just `pipelines` (from a config
    file: those that never ran are listed too) or those writing `target`; of these, those `select` keeps
    (its pattern and --failing apply before any Delta log is read)."""
    databases: set[str] | None
    if pipelines is not None:
        databases = {k.target.database for k in pipelines}
    else:
        databases = {target.database} if target else None
    records, verified, compacted, requests = _records(sink, databases)
    unrun: dict[tuple[str, str], Known] = {}  # a config's pipelines with no record yet
    if pipelines is not None:
        wanted = [(k.target.database, k.name) for k in pipelines]
        for key, k in zip(wanted, pipelines):
            if key not in records:
                records[key], unrun[key] = [None, Health(k.name, "", str(k.target))], k
        keys = wanted
    else:
        keys = sorted(records)
        if target:
            keys = [k for k in keys if (records[k][0] or records[k][1]).target == str(target)]
    rows = [_row(*records[k]) for k in keys]
    for key, row in zip(keys, rows):
        if key in unrun:  # claimed: a service is starting it (Spark, its first snapshot or range)
            with_claims(row, holders(sink, key[0], key[1], unrun[key].lock_ttl))
        with_verify(row, verified.get(key))
        with_compaction(row, compacted.get((key[0], row["target"])))
        with_request(row, requests.get(key))
    select = select or Selection()
    rows = [r for r in rows if select.before_lag(r)]
    add_lag(rows, spark_factory)
    return [r for r in rows if select(r)]


def _records(sink: Sink, databases: set[str] | None) -> tuple[dict, dict, dict, dict]:
    """({(database, pipeline): [offset, health]}, {(database, pipeline): last verify}, {(database, target):
    last compaction}, {(database, pipeline): latest pause/resume/resync request}) of every pipeline in
    `databases` (None: all): one query finds the record tables, then one query reads each."""
    records: dict[tuple[str, str], list] = {}
    verified, compacted, requests = {}, {}, {}
    for db, tables in state_tables(sink, databases).items():
        Layout(sink, db).check(exists=LAYOUT_TABLE in tables)  # a newer cdc2ch's records are not misread
        if STATE_TABLE in tables:
            for st in StateStore(sink, db).load_all(tables[STATE_TABLE]):
                records.setdefault((db, st.pipeline), [None, None])[0] = st
        if HEALTH_TABLE in tables:
            for name, health in HealthStore(sink, db).load_all(exists=True).items():
                records.setdefault((db, name), [None, None])[1] = health
        if VERIFY_TABLE in tables:
            verified.update({(db, n): v for n, v in VerifyStore(sink, db).load_all(exists=True).items()})
        if COMPACT_TABLE in tables:
            compacted.update({(db, t): c for t, c in CompactStore(sink, db).load_all(exists=True).items()})
        if CONTROL_TABLE in tables:
            requests.update({(db, p): r for p, r in ControlStore(sink, db).load_all(exists=True).items()})
    return records, verified, compacted, requests


def with_claims(row: dict, claims: list[Claim]) -> None:
    """A pipeline that never committed: starting when some process holds a live claim on it (its first
    snapshot or range on the way), else it has not run yet."""
    if claims and row["error"] in (NOT_RUN, BEGUN):
        c = claims[0]
        row["error"] = (
            f"starting: claimed by {c.holder} (pid {c.pid} on host {c.host}), nothing committed yet"
        )


def with_verify(row: dict, verified) -> None:
    """The pipeline's last `cdc2ch verify`: its summary and time; `verified` is ok/DIFFERS and when."""
    row["last_verify"] = verified.summary if verified else None
    row["last_verify_at"] = _iso(verified.finished_at) if verified else None
    row["verified"] = f"{'ok' if verified.ok else 'DIFFERS'} {row['last_verify_at']}" if verified else None


def with_compaction(row: dict, compacted) -> None:
    """The target's last compaction (by a service's --compact-every or `cdc2ch compact`): when, the tombstones
    it removed, and those every compaction recorded removed; `compacted` is when and how many, for the table."""
    row["last_compaction_at"] = _iso(compacted.finished_at) if compacted else None
    row["tombstones_removed"] = compacted.removed if compacted else None
    row["tombstones_removed_total"] = compacted.removed_total if compacted else None
    row["compacted"] = (
        f"{row['last_compaction_at']} ({_count(compacted.removed, 'tombstone')} removed)"
        if compacted
        else None
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def with_request(row: dict, request) -> None:
    """Whether `cdc2ch pause` holds the pipeline (who, when, why), or a `cdc2ch resync` is pending."""
    paused = request is not None and request.paused
    row["paused"] = paused
    row["paused_by"] = request.by if paused else None
    row["paused_at"] = _iso(request.at) if paused else None
    row["paused_reason"] = (request.reason or None) if paused else None
    row["resync_requested_at"] = _iso(request.at) if request is not None and request.resync_pending else None
    if paused:  # held on purpose: neither failing nor over --max-lag
        row["failing"], row["error"] = False, None


def _row(state: PipelineState | None, health: Health | None) -> dict:
    """A pipeline's row from its records; its lag is added by add_lag."""
    first = state or health
    assert first is not None  # a pipeline has a record of one kind or both
    failing = health is not None and health.failures > 0
    row = {
        "pipeline": first.pipeline,
        "target": first.target,
        "source": first.source or None,
        # A catalog name's full name and its location as last resolved (a path is its own location).
        "name": first.source
        if first.source and not is_path(first.source) and not is_shared(first.source)
        else None,
        "location": (state.recorded_location if state else "") or None,
        "committed_version": state.committed_version if state and state.committed_version >= 0 else None,
        "latest_version": None,
        "versions_behind": None,
        "seconds_behind": None,
        "rows_written": state.rows_written if state else 0,
        "initial_load": (state.initial_load or None) if state else None,  # how it began, and why
        "initial_reason": (state.initial_reason or None) if state else None,
        "changes_from": (state.changes_from or None) if state else None,
        "reader": (state.reader or None) if state else None,
        "last_success": _iso(health.last_success_at) if health else None,
        "last_commit": _iso(state.updated_at) if state else None,
        "failing": failing,
        "last_error": (health.last_error or None) if health else None,
        "last_error_kind": (health.last_error_kind or None) if health else None,
        "last_error_at": _iso(health.last_error_at) if health else None,
        "error": health.last_error if health is not None and failing else None,
    }
    if not first.source:
        row["error"] = row["error"] or NOT_RUN
    elif state is None and health is not None and health.last_success_at is None and not failing:
        row["error"] = BEGUN
    return row


def add_lag(rows: list[dict], spark_factory, readers: int | None = None) -> None:
    """Each row's latest version and lag, from its table's log, each table's once: first every log Python
    reads, `readers` (default LOG_READERS) at a time; then, one by one, those only Spark (started only then)
    or a sharing server can answer. A table that cannot be read leaves the lag unknown and says why in
    `error`."""
    tables: dict[str, list[dict]] = {}
    for row in rows:
        if row["source"]:
            uri = row["source"] if is_shared(row["source"]) else row["location"] or row["source"]
            tables.setdefault(uri, []).append(row)
    paths = [u for u in tables if is_path(u) and not is_shared(u)]
    later = [u for u in tables if u not in paths]
    if paths:
        readers = min(readers or LOG_READERS, len(paths))
        with ThreadPoolExecutor(readers, thread_name_prefix="cdc2ch-status") as pool:
            s3 = s3_settings(spark_factory)
            done = {u: pool.submit(_python_lags, u, [_committed(r) for r in tables[u]], s3) for u in paths}
        for uri, future in done.items():
            try:
                lags = future.result()
            except Cdc2chError as exc:
                _failed(tables[uri], exc)
                continue
            if lags is None:
                later.append(uri)
            for row, (latest, versions, seconds) in zip(tables[uri], lags or ()):
                row.update(latest_version=latest, versions_behind=versions, seconds_behind=seconds)
    for uri in later:
        try:
            source = _jvm_or_sharing_log(uri, spark_factory)
            latest = source.latest()
            for row in tables[uri]:
                versions, seconds = source.lag(_committed(row), latest)
                row.update(latest_version=latest.version, versions_behind=versions, seconds_behind=seconds)
        except Cdc2chError as exc:
            _failed(tables[uri], exc)


def _committed(row: dict) -> int:
    return row["committed_version"] if row["committed_version"] is not None else -1


def _failed(rows: list[dict], exc: Cdc2chError) -> None:
    for row in rows:
        row["error"] = row["error"] or str(exc)


def _python_lags(
    uri: str, committed: list[int], s3: S3Settings
) -> list[tuple[int, int, float | None]] | None:
    """(latest version, versions, seconds behind) for each of `committed`, from a log Python reads; None
    when Python cannot reach its storage (said so: Spark reads it)."""
    try:
        delta_log = python_log(uri, s3=s3)
    except (ValueError, OSError) as exc:
        refused = storage_error(str(exc), uri, "the Delta log")
        if refused is not None:  # Spark would be refused the same
            raise refused from None
        log.info("status_reads_log_with_spark", source=uri, reason=" ".join(str(exc).split()))
        return None
    try:
        return [delta_log.behind(c) for c in committed]
    except (ValueError, OSError, LogChanged) as exc:  # a log changing under the reader, a failing store
        raise SourceError(f"The Delta log of {uri} could not be read: {summarise(str(exc), 300)}") from None


def table_log(uri: str, spark_factory):
    """The table's log, read by Python where it can reach the storage (no JVM: status answers in a moment),
    through Spark otherwise (its connectors and credentials), saying so. A catalog name with no recorded
    location (a pipeline that failed before its first offset) is looked up through Spark's catalog. A Delta
    Sharing table answers from its server, without a JVM."""
    if is_path(uri) and not is_shared(uri):
        try:
            return python_log(uri, s3=s3_settings(spark_factory))
        except (ValueError, OSError) as exc:
            log.info("status_reads_log_with_spark", source=uri, reason=" ".join(str(exc).split()))
    return _jvm_or_sharing_log(uri, spark_factory)


def _jvm_or_sharing_log(uri: str, spark_factory):
    from cdc2ch.source import open_source

    if not is_shared(uri):
        return open_source(spark_factory, uri)
    source = open_source(None, uri)
    source.client.impatient()  # a report: a server that does not answer is this row's error, at once
    return source


def parse_lagging(text: str) -> float:
    """`--lagging 5m`: the seconds a pipeline must be behind to be listed."""
    return parse_duration(text, "--lagging").total_seconds()


def parse_max_lag(text: str) -> tuple[int | None, float | None]:
    """`--max-lag 10`: more than 10 versions behind; `--max-lag 15m` (s, m, h, d, w): more than 15 minutes
    between the latest Delta commit and the last replicated one."""
    if text.strip().isdigit():
        return int(text), None
    try:
        return None, parse_duration(text, "--max-lag").total_seconds()
    except ConfigError:
        raise ConfigError(
            f"--max-lag {text!r} is neither a number of versions (e.g. 10) nor a time such as 90s, 15m, 2h or 1d."
        ) from None


def over_limit(row: dict, max_versions: int | None, max_seconds: float | None) -> bool:
    """Behind by more than the limit, or lag unknown (the table cannot be read); never a paused pipeline."""
    if row.get("paused"):
        return False
    if row["versions_behind"] is None:
        return True
    if max_versions is not None:
        return row["versions_behind"] > max_versions
    return row["versions_behind"] > 0 and (
        row["seconds_behind"] is None or row["seconds_behind"] > max_seconds
    )


def behind_message(rows: list[dict], max_lag: str) -> str:
    """Which pipelines `--max-lag` found behind, and by how much (or why their lag is unknown)."""
    each = []
    for r in rows:
        if r["versions_behind"] is None:
            why = summarise(r["error"] or "its Delta table cannot be read", 200).rstrip(".")
            each.append(f"{r['pipeline']} (lag unknown: {why})")
        else:
            seconds = "" if r["seconds_behind"] is None else f", {r['seconds_behind']:.0f} s"
            each.append(f"{r['pipeline']} ({r['versions_behind']} versions{seconds} behind)")
    return (
        f"{len(rows)} pipeline(s) behind by more than --max-lag {max_lag}: {'; '.join(each)}. "
        f"`cdc2ch status --json` shows each one's committed and latest versions and last error."
    )


def aligned(header: list[str], rows: list[list], empty: str = "-") -> list[str]:
    """Rows as left-aligned text columns under a header line."""
    cells = [[empty if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header, *cells]]


def _cell(key: str, value, row: dict):
    if key == "paused":  # who, when and why
        why = f": {row['paused_reason']}" if row.get("paused_reason") else ""
        return f"by {row['paused_by']} at {row['paused_at']}{why}" if value else None
    if key == "seconds_behind" and value is not None:
        return f"{value:.0f}"
    if key == "error" and value:
        return summarise(value.splitlines()[0], ERROR_CHARS_IN_TABLE)  # --json has the whole error
    return value


def state(row: dict) -> str:
    """One word or phrase for the table's `state` column: why a pipeline is not simply replicating."""
    if row.get("paused"):  # when: --wide and --json
        why = f": {row['paused_reason']}" if row.get("paused_reason") else ""
        return f"paused by {row['paused_by']}{why}"
    if row.get("resync_requested_at"):
        return f"resync requested at {row['resync_requested_at']}"
    if row.get("error"):
        return ("failing: " if row.get("failing") else "") + row["error"].splitlines()[0]
    return "ok"


def render_table(rows: list[dict], empty: str = "No pipelines found.", wide: bool = False) -> str:
    """The rows as a terminal table: TABLE_WIDTH columns wide, the `state` column cut to fit; every column
    with `wide`."""
    if not rows:
        return empty
    if not wide:  # the target only where a pipeline is not named after it (the default name)
        named = any(r["pipeline"] != r["target"] for r in rows)
        cols = [(h, k) for h, k in NARROW_COLUMNS[:-1] if named or k != "target"]
        lines = aligned([h for h, _ in cols], [[_cell(k, r.get(k), r) for _, k in cols] for r in rows])
        width = max(map(len, lines))
        room = max(TABLE_WIDTH - width - 2, 16)
        last = ["state", *(summarise(state(r), room) for r in rows)]
        return "\n".join(f"{line.ljust(width)}  {end}" for line, end in zip(lines, last))
    named = any(r.get("name") for r in rows)
    shown = {"error": any(r.get("error") for r in rows), "source": named, "location": named}
    shown["verified"] = any(r.get("verified") for r in rows)
    shown["compacted"] = any(r.get("compacted") for r in rows)
    shown["paused"] = any(r.get("paused") for r in rows)
    cols = [(h, k) for h, k in TABLE_COLUMNS if shown.get(k, True)]
    return "\n".join(aligned([h for h, _ in cols], [[_cell(k, r.get(k), r) for _, k in cols] for r in rows]))
