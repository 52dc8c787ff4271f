"""The Python API: cdc2ch inside an existing Spark application (a Databricks job, a notebook, an Airflow or
Dagster task, spark-submit).

The same work as `cdc2ch run`, `cdc2ch snapshot` and `cdc2ch status`, with these differences: the Spark
session is the caller's and is left as it was (cdc2ch's read settings are applied only while each read is
planned, then restored); events are records of the stdlib `logging` loggers `cdc2ch.*` (the caller's
handlers and levels apply; cdc2ch configures and prints nothing); failures raise the CLI's Cdc2chError
subclasses with the same messages, and nothing exits the process or installs signal handlers. Options are
keyword arguments named like the command's flags (`--batch-size` is `batch_size=`), converted and checked
by the same option catalogue and RunConfig as the command line; the API reads no CDC2CH_* option variables
(the ClickHouse password still comes from CDC2CH_CLICKHOUSE_PASSWORD or CDC2CH_CLICKHOUSE_PASSWORD_FILE).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.base.log import api_call
from cdc2ch.commands.invocation import options as catalogue
from cdc2ch.fleet.patterns import is_pattern
from cdc2ch.model.config import RunConfig, TargetName

if TYPE_CHECKING:
    from cdc2ch.model.records import PipelineState

__all__ = [
    "Discovered",
    "PipelineStatus",
    "ReplicateResult",
    "SnapshotResult",
    "TableMatch",
    "discover",
    "replicate",
    "snapshot",
    "status",
]

# Flags the caller's process owns, with what to do instead.
NOT_IN_API = {
    "config": "call the function once per table",
    "log-level": "cdc2ch logs through the stdlib logger `cdc2ch`: set its level with logging",
    "log-format": "cdc2ch logs through the stdlib logger `cdc2ch`: your handlers format the records",
    "spark-conf": "cdc2ch uses your SparkSession as it is: configure it when you build it",
    "spark-master": "cdc2ch uses your SparkSession as it is: configure it when you build it",
    "metrics-port": "serving metrics is for `cdc2ch run`; the result value has the figures",
    "serve": "serving the embedded ClickHouse is for `cdc2ch run`",
    "serve-user": "serving the embedded ClickHouse is for `cdc2ch run`",
    "serve-writable": "serving the embedded ClickHouse is for `cdc2ch run`",
    "serve-tls-cert": "serving the embedded ClickHouse is for `cdc2ch run`",
    "serve-tls-key": "serving the embedded ClickHouse is for `cdc2ch run`",
    "json": "the function returns values",
    "max-lag": "compare `versions_behind` or `seconds_behind` yourself",
}


@dataclass(frozen=True)
class ReplicateResult:
    """What one `replicate` call committed."""

    pipeline: str
    target: str
    source: str
    start_version: int | None  # the first Delta version this call committed; None when nothing was new
    end_version: int | None  # the last one
    committed_version: int  # the pipeline's offset afterwards (-1: no version yet)
    rows: int  # rows written into ClickHouse by this call
    seconds: float

    @property
    def versions(self) -> int:
        """How many Delta versions this call committed."""
        if self.start_version is None or self.end_version is None:  # (both or neither)
            return 0
        return self.end_version - self.start_version + 1


@dataclass(frozen=True)
class SnapshotResult:
    """What one `snapshot` call loaded; `completed` is False when `stop` ended it between chunks (the same
    call again resumes it)."""

    pipeline: str
    target: str
    source: str
    completed: bool
    version: int | None  # the Delta version loaded
    rows: int | None  # rows of that version written
    committed_version: int | None  # the pipeline's offset afterwards (`replicate` continues after it)
    seconds: float


@dataclass(frozen=True)
class PipelineStatus:
    """One pipeline, as `cdc2ch status --json` shows it (times as ISO-8601 text)."""

    pipeline: str
    target: str
    source: str | None
    committed_version: int | None
    latest_version: int | None
    versions_behind: int | None
    seconds_behind: float | None
    rows_written: int
    last_success: str | None
    last_commit: str | None
    failing: bool
    last_error: str | None
    last_error_kind: str | None
    last_error_at: str | None
    error: str | None  # why the pipeline is failing or cannot be read now
    name: str | None = None  # the catalog name, for a table named through a catalog
    location: str | None = None  # where the table was found
    last_verify: str | None = None  # the summary of the last `cdc2ch verify`
    last_verify_at: str | None = None
    verified: str | None = None  # ok/DIFFERS and when
    last_compaction_at: str | None = None  # the target's last compaction (--compact-every, `cdc2ch compact`)
    tombstones_removed: int | None = None  # by that compaction
    tombstones_removed_total: int | None = None  # by every compaction recorded
    compacted: str | None = None  # when, and the tombstones removed
    paused: bool = False  # `cdc2ch pause` holds it (not a failure)
    paused_by: str | None = None  # user@host
    paused_at: str | None = None
    paused_reason: str | None = None
    resync_requested_at: str | None = None  # a `cdc2ch resync` the service has not done yet
    initial_load: str | None = None  # how it began: "snapshot at version 12", "changes from version 0"
    initial_reason: str | None = None  # why
    changes_from: str | None = None  # where its last range's changes came from: cdf (the feed) or log
    reader: str | None = None  # what read its last range: spark or clickhouse (what `auto` chose)


def replicate(
    spark,
    *,
    table: str,
    primary_key: str | list[str] | tuple[str, ...],
    clickhouse: str | None = None,
    target: str | None = None,
    once: bool = True,
    stop: threading.Event | None = None,
    **options: Any,
) -> ReplicateResult:
    """Replicate `table` into ClickHouse from the pipeline's stored offset, as `cdc2ch run --once` (or, with
    once=False, until `stop` is set: the range in flight is finished first). Records the pipeline's health
    (last success or error) as `run` does. `spark`: your SparkSession (None: the active one)."""
    from cdc2ch.clickhouse.connection.dsn import connect
    from cdc2ch.clickhouse.state.statestore import StateStore
    from cdc2ch.fleet.runner import Runner
    from cdc2ch.replication.metrics import Metrics
    from cdc2ch.replication.target import pipeline_lock

    with api_call():
        t0 = time.monotonic()
        spark = _session(spark, "replicate")
        given = dict(table=table, primary_key=primary_key, clickhouse=clickhouse, target=target)
        cfg = _config("run", "replicate", {**given, **options}, once=bool(once))
        with connect(cfg.clickhouse_dsn, cfg.retries, cluster=cfg.cluster) as sink:
            pipeline_lock(cfg, sink).check()
            runner = Runner([cfg], spark, sink, stop or threading.Event(), Metrics())
            runner.run()  # raises what failed, as the command would report it
            job = runner.slots[0].job
            before: PipelineState | None
            if job is not None and job.started is not None:
                before, after = job.started, job.state
            else:  # stopped before it started
                before = after = StateStore(sink, cfg.target.database).load(cfg.pipeline)
        committed = after.committed_version if after else -1
        start_version = end_version = None
        rows = 0
        if before is not None and after is not None and committed > before.committed_version:  # moved
            start_version, end_version = before.committed_version + 1, committed
            rows = after.rows_written - before.rows_written
        return ReplicateResult(
            pipeline=cfg.pipeline,
            target=str(cfg.target),
            source=after.source if after else cfg.table,
            start_version=start_version,
            end_version=end_version,
            committed_version=committed,
            rows=rows,
            seconds=round(time.monotonic() - t0, 3),
        )


def snapshot(
    spark,
    *,
    table: str,
    primary_key: str | list[str] | tuple[str, ...],
    clickhouse: str | None = None,
    target: str | None = None,
    version: int | None = None,
    stop: threading.Event | None = None,
    **options: Any,
) -> SnapshotResult:
    """Load `table` as of `version` (default: the latest), resumably, as `cdc2ch snapshot`; `replicate`
    then continues at version + 1."""
    from cdc2ch.clickhouse.connection.dsn import connect
    from cdc2ch.replication.target import clickhouse_snapshotter, pipeline_lock
    from cdc2ch.source import open_source

    with api_call():
        t0 = time.monotonic()
        spark = _session(spark, "snapshot")
        given = dict(
            table=table, primary_key=primary_key, clickhouse=clickhouse, target=target, version=version
        )
        cfg = _config("snapshot", "snapshot", {**given, **options}, once=True)
        with connect(cfg.clickhouse_dsn, cfg.retries, cluster=cfg.cluster) as sink:
            pipeline_lock(cfg, sink).check()
            job = clickhouse_snapshotter(cfg, open_source(spark, cfg.table), sink, stop)
            state = job.run()
        loaded_version, rows = job.loaded or (None, None)
        return SnapshotResult(
            pipeline=cfg.pipeline,
            target=str(cfg.target),
            source=job.source.uri,
            completed=state is not None,
            version=loaded_version,
            rows=rows,
            committed_version=state.committed_version if state else None,
            seconds=round(time.monotonic() - t0, 3),
        )


def status(
    spark=None,
    *,
    clickhouse: str | None = None,
    target: str | None = None,
    pattern: str | None = None,
    failing: bool = False,
    lagging: str | None = None,
) -> list[PipelineStatus]:
    """Every pipeline with a record in ClickHouse (or those writing `target`), as `cdc2ch status --json`;
    `pattern`, `failing` and `lagging` ("5m") select some as `--pattern`, `--failing` and `--lagging` do.
    Delta logs Python cannot reach are read through `spark` (None: the active session, if any)."""
    from cdc2ch.clickhouse.connection.dsn import connect
    from cdc2ch.commands import status as report
    from cdc2ch.commands.selection import Selection

    with api_call():
        given = dict(clickhouse=clickhouse, target=target, pattern=pattern, failing=failing, lagging=lagging)
        values = _values("status", "status", given)
        seconds = report.parse_lagging(values["lagging"]) if values.get("lagging") is not None else None
        select = Selection(values.get("pattern"), bool(values.get("failing")), seconds)

        def spark_factory():
            session = spark if spark is not None else _active_session()
            if session is None:
                raise SourceError(
                    "This table's Delta log is on storage only Spark can reach here: pass your SparkSession "
                    "to cdc2ch.commands.status(spark, ...)."
                )
            return session

        wanted = TargetName.parse(values["target"]) if values.get("target") else None
        with connect(values["clickhouse_dsn"], create=False, reader=True) as sink:
            rows = report.collect(sink, spark_factory, wanted, select=select)
        names = [f.name for f in fields(PipelineStatus)]
        found: list[dict[str, Any]] = [{n: row.get(n) for n in names} for row in rows]
        return [PipelineStatus(**values) for values in found]


# -- options ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TableMatch:
    """One table a pattern matches, with what to pass to `replicate` or `snapshot` for it."""

    table: str
    primary_key: tuple[str, ...]
    target: str


@dataclass(frozen=True)
class Discovered:
    tables: list[TableMatch]  # the tables that can be replicated
    skipped: list[dict]  # {"table", "reason"} of those that cannot


def discover(spark, *, table: str, primary_key=None, target: str | None = None, **options: Any) -> Discovered:
    """The tables a pattern in `table` matches now, as `cdc2ch validate` lists them: each one that can be
    replicated, with the primary key (`primary_key`, or its own in `primary_keys`) and target (`target` as a
    template) to pass to `replicate`/`snapshot`, and those skipped with why."""
    from cdc2ch.fleet import discovery
    from cdc2ch.source import open_source
    from cdc2ch.source.tablelisting import LakeTables

    with api_call():
        if not is_pattern(table):
            raise ConfigError(f"cdc2ch.discover() lists a pattern of tables, and {table!r} names one table.")
        spark = _session(spark, "discover")
        given = dict(table=table, primary_key=primary_key, target=target)
        found = discovery.expand(_values("run", "discover", {**given, **options}), LakeTables(spark),
                                 catalogue.build_config, partial(open_source, spark))  # fmt: skip
        return Discovered(
            [TableMatch(c.table, c.primary_key, str(c.target)) for c in found.configs],
            [{"table": s.table, "target": str(s.target), "reason": s.reason} for s in found.skipped],
        )


def _config(command: str, function: str, keywords: dict[str, Any], once: bool) -> RunConfig:
    values = _values(command, function, keywords)
    values["once"] = once
    if is_pattern(values.get("table")):
        raise ConfigError(
            f"cdc2ch.{function}() works on one table, and {values['table']!r} is a pattern of tables. "
            f"cdc2ch.api.discover(spark, table=...) lists them, each with its primary key and target: call "
            f"{function}() for each."
        )
    return catalogue.build_config(values)


def _values(command: str, function: str, keywords: dict[str, Any]) -> dict[str, Any]:
    """The command's option values by parameter name: the catalogue's defaults, then the keywords given
    (None: the default), each converted as the command line would."""
    accepted = {
        o.name.replace("-", "_"): o
        for o in catalogue.options_of(command)
        if o.name not in NOT_IN_API and o.name != "once"
    }
    values: dict[str, Any] = {}
    option: catalogue.Option | None
    for option in accepted.values():
        default = option.default() if callable(option.default) else option.default
        values[option.param] = False if option.flag and default is None else default
    for key, value in keywords.items():
        option = accepted.get(key)
        if option is None:
            flag = key.replace("_", "-")
            why = f" ({NOT_IN_API[flag]})" if flag in NOT_IN_API else ""
            raise ConfigError(
                f"cdc2ch.{function}() has no option {key!r}{why}. Its options are `cdc2ch {command}`'s flags "
                f"with underscores for dashes: {', '.join(sorted(accepted))}."
            )
        if value is None:
            continue
        try:
            values[option.param] = catalogue.convert(option, value)
        except click.BadParameter as exc:
            raise ConfigError(
                f"cdc2ch.{function}({key}={value!r}): {exc.message} It takes what "
                f"--{option.name} takes on the command line."
            ) from None
    return values


def _session(spark, function: str):
    """The caller's session (None: the active one), which must be a classic one: cdc2ch reads the Delta log
    through the JVM."""
    if spark is None:
        spark = _active_session()
    if spark is None or not hasattr(spark, "_jsparkSession"):
        what = (
            "no SparkSession is active" if spark is None else f"{type(spark).__module__} sessions have no JVM"
        )
        raise ConfigError(
            f"cdc2ch.{function}() reads Delta through a classic SparkSession (driver JVM), but {what}. Pass "
            f"your session as the first argument (with the Delta Lake jars on its classpath); Spark Connect "
            f"sessions are not supported: use a cluster with a classic driver, or run `cdc2ch run` as a job."
        )
    return spark


def _active_session():
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()
