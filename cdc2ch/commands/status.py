"""Per-pipeline replication status: stored offsets and health next to the Delta tables' latest versions."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from cdc2ch.base.errors import Cdc2chError, ConfigError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.state import (
    Health,
    HealthStore,
    PipelineState,
    StateStore,
    VerifyStore,
    databases_with_state,
)
from cdc2ch.clickhouse.transport import Sink
from cdc2ch.model.config import TargetName, parse_duration
from cdc2ch.model.tableref import is_path, is_shared
from cdc2ch.source.log import python_log

log = get_logger("cdc2ch.status")

# Terminal columns: (heading, row key).
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
    ("initial_load", "initial_load"),
    # Shown when some pipeline names its table through a catalog: the name and where it was found.
    ("source", "source"),
    ("location", "location"),
    ("error", "error"),
)
ERROR_CHARS_IN_TABLE = 160


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat(timespec="seconds") if ts is not None else None


def collect(
    sink: Sink,
    spark_factory: Callable[[], object],
    target: TargetName | None = None,
    pipelines: list[tuple[str, TargetName]] | None = None,
) -> list[dict]:
    """One dict per pipeline: every pipeline with a record in ClickHouse, or just `pipelines` (from a config
    file: those that never ran are listed too) or those writing `target`."""
    if pipelines is not None:
        databases = sorted({t.database for _, t in pipelines})
    else:
        databases = [target.database] if target else databases_with_state(sink)
    records: dict[tuple[str, str], list] = {}
    for db in databases:
        for st in StateStore(sink, db).load_all():
            records.setdefault((db, st.pipeline), [None, None])[0] = st
        for name, health in HealthStore(sink, db).load_all().items():
            records.setdefault((db, name), [None, None])[1] = health
    if pipelines is not None:
        wanted = [(t.database, name) for name, t in pipelines]
        for key, (_, t) in zip(wanted, pipelines):
            records.setdefault(key, [None, Health(key[1], "", str(t))])
        keys = wanted
    else:
        keys = sorted(records)
        if target:
            keys = [k for k in keys if (records[k][0] or records[k][1]).target == str(target)]
    rows = [_row(records[k][0], records[k][1], spark_factory) for k in keys]
    verified = {(db, name): v for db in databases for name, v in VerifyStore(sink, db).load_all().items()}
    for key, row in zip(keys, rows):
        with_verify(row, verified.get(key))
    return rows


def with_verify(row: dict, verified) -> None:
    """The pipeline's last `cdc2ch verify`: its summary and time; `verified` is ok/DIFFERS and when."""
    row["last_verify"] = verified.summary if verified else None
    row["last_verify_at"] = _iso(verified.finished_at) if verified else None
    row["verified"] = f"{'ok' if verified.ok else 'DIFFERS'} {row['last_verify_at']}" if verified else None


def _row(state: PipelineState | None, health: Health | None, spark_factory) -> dict:
    first = state or health
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
        "last_success": _iso(health.last_success_at) if health else None,
        "last_commit": _iso(state.updated_at) if state else None,
        "failing": failing,
        "last_error": (health.last_error or None) if health else None,
        "last_error_kind": (health.last_error_kind or None) if health else None,
        "last_error_at": _iso(health.last_error_at) if health else None,
        "error": health.last_error if failing else None,
    }
    if not first.source:
        row["error"] = row["error"] or "has not run yet"
        return row
    try:
        log = table_log(
            first.source if is_shared(first.source) else row["location"] or first.source, spark_factory
        )
        latest = log.latest()
        versions, seconds = log.lag(state.committed_version if state else -1, latest)
        row.update(latest_version=latest.version, versions_behind=versions, seconds_behind=seconds)
    except Cdc2chError as exc:
        row["error"] = row["error"] or str(exc)
    return row


def table_log(uri: str, spark_factory):
    """The table's log, read by Python where it can reach the storage (no JVM: status answers in a moment),
    through Spark otherwise (its connectors and credentials), saying so. A catalog name with no recorded
    location (a pipeline that failed before its first offset) is looked up through Spark's catalog. A Delta
    Sharing table answers from its server, without a JVM."""
    from cdc2ch.source import open_source

    if is_shared(uri):
        return open_source(None, uri)
    if not is_path(uri):
        return open_source(spark_factory, uri)
    try:
        return python_log(uri)
    except (ValueError, OSError) as exc:
        log.info("status_reads_log_with_spark", source=uri, reason=" ".join(str(exc).split()))
        return open_source(spark_factory, uri)


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
    """Behind by more than the limit, or lag unknown (the table cannot be read)."""
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


def _cell(key: str, value):
    if key == "seconds_behind" and value is not None:
        return f"{value:.0f}"
    if key == "error" and value:
        return summarise(value.splitlines()[0], ERROR_CHARS_IN_TABLE)  # --json has the whole error
    return value


def render_table(rows: list[dict]) -> str:
    if not rows:
        return "No pipelines found."
    named = any(r.get("name") for r in rows)
    shown = {"error": any(r.get("error") for r in rows), "source": named, "location": named}
    shown["verified"] = any(r.get("verified") for r in rows)
    cols = [(h, k) for h, k in TABLE_COLUMNS if shown.get(k, True)]
    return "\n".join(aligned([h for h, _ in cols], [[_cell(k, r.get(k)) for _, k in cols] for r in rows]))
