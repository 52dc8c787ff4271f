"""Command line: parse options, build one RunConfig, hand over. No replication logic here."""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from contextlib import contextmanager
from datetime import datetime, timezone

import click

from cdc2ch import __version__
from cdc2ch import log as logsetup
from cdc2ch.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_ROWS_PER_READ,
    RunConfig,
    SparkSettings,
    TargetName,
    default_dsn,
)
from cdc2ch.errors import Cdc2chError


def _fail(exc: Cdc2chError) -> None:
    click.echo(f"cdc2ch: error: {exc}", err=True)
    sys.exit(exc.exit_code)


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Cdc2chError as exc:
            _fail(exc)

    return wrapper


def clickhouse_option(fn):
    return click.option(
        "--clickhouse",
        "clickhouse_dsn",
        envvar="CDC2CH_CLICKHOUSE_URL",
        default=default_dsn,
        show_default="chdb://~/.local/share/cdc2ch/clickhouse (embedded)",
        help="Target ClickHouse: chdb:///path for the embedded engine, or http(s)://user@host:8123/db for a "
        "server (password from CDC2CH_CLICKHOUSE_PASSWORD or CDC2CH_CLICKHOUSE_PASSWORD_FILE). "
        "Env: CDC2CH_CLICKHOUSE_URL.",
    )(fn)


def logging_options(fn):
    fn = click.option(
        "--log-format",
        type=click.Choice(["console", "json"]),
        default="console",
        envvar="CDC2CH_LOG_FORMAT",
        show_default=True,
        help="console: readable lines; json: one JSON object per line (for journald, Loki...).",
    )(fn)
    fn = click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        envvar="CDC2CH_LOG_LEVEL",
        show_default=True,
        help="Minimum level of log lines.",
    )(fn)
    return fn


def spark_options(fn):
    fn = click.option(
        "--spark-master",
        envvar="CDC2CH_SPARK_MASTER",
        default=None,
        help="Spark master URL (local[*], spark://host:7077, yarn, k8s://...). Default: local[*], "
        "or what spark-submit set.",
    )(fn)
    fn = click.option(
        "--spark-conf",
        multiple=True,
        metavar="KEY=VALUE",
        help="A Spark setting, passed through as is; repeat for several "
        "(e.g. --spark-conf spark.executor.memory=4g).",
    )(fn)
    return fn


def _parse_timestamp(ctx, param, value):
    if value is None:
        return None
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO-8601 timestamp such as 2026-11-01T12:00:00Z."
        ) from None
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts


@contextmanager
def stop_on_signals(stop: threading.Event):
    """SIGTERM/SIGINT ask the loop to stop after the current batch instead of killing it mid-write."""

    def handler(signum, frame):
        if stop.is_set():  # a second signal means "now"
            raise KeyboardInterrupt
        click.echo(
            f"cdc2ch: {signal.Signals(signum).name} received, stopping after the current batch", err=True
        )
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="cdc2ch")
def main():
    """Keep ClickHouse tables in sync with Delta Lake tables through Delta's Change Data Feed.

    Changes are read with Spark, written in Arrow batches into ReplacingMergeTree tables (soft deletes,
    versioned by the Delta commit), and the offset is kept in ClickHouse so a restart resumes exactly.
    """


reader_option = click.option(
    "--reader",
    type=click.Choice(["spark", "clickhouse"]),
    default="spark",
    show_default=True,
    help="spark: Spark reads the Delta table (run: its change data feed) and cdc2ch inserts Arrow batches. "
    "clickhouse: ClickHouse reads the Delta files itself in one INSERT ... SELECT FROM deltaLakeLocal/deltaLake "
    "per range (run: with delta_lake_snapshot_start/end_version), several times faster; needs ClickHouse to "
    "reach the lake (local paths for the embedded target, S3/HTTP(S) with the server's credentials).",
)


def pipeline_options(fn):
    """Options shared by `run` and `snapshot`: which table goes where, and how to write it."""
    options = [
        click.option(
            "--table",
            required=True,
            envvar="CDC2CH_TABLE",
            help="The Delta table: a local path or a URI (s3a://, abfss://, gs://...). Env: CDC2CH_TABLE.",
        ),
        click.option(
            "--primary-key",
            required=True,
            envvar="CDC2CH_PRIMARY_KEY",
            help="Column(s) identifying a row, comma-separated: id or tenant,id. Becomes the ORDER BY key.",
        ),
        click.option(
            "--target",
            default=None,
            envvar="CDC2CH_TARGET",
            help="ClickHouse table as database.table. Default: cdc2ch.<last path segment of --table>.",
        ),
        click.option(
            "--pipeline",
            default=None,
            help="Name under which the offset is stored. Default: the target name.",
        ),
        click.option(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            show_default=True,
            help="Rows per ClickHouse insert.",
        ),
        click.option(
            "--max-rows-per-read",
            type=int,
            default=DEFAULT_MAX_ROWS_PER_READ,
            show_default=True,
            help="run: versions are read together until their estimated change rows reach this; "
            "snapshot --reader clickhouse: rows per chunk. Bounds memory.",
        ),
        click.option(
            "--retries",
            type=int,
            default=5,
            show_default=True,
            help="Attempts per ClickHouse call on transient errors (exponential backoff) before giving up.",
        ),
        click.option(
            "--lock-ttl",
            type=float,
            default=60.0,
            show_default=True,
            help="Seconds after its last heartbeat that a vanished runner stops blocking the pipeline (a dead "
            "process on this host is noticed at once). A second runner exits with code 75.",
        ),
    ]
    fn = logging_options(spark_options(clickhouse_option(fn)))
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_config(table, primary_key, target, pipeline, spark_master, spark_conf, **rest) -> RunConfig:
    target_name = TargetName.parse(target) if target else TargetName.for_source(table)
    return RunConfig(
        table=table,
        primary_key=tuple(k.strip() for k in primary_key.split(",") if k.strip()),
        target=target_name,
        pipeline=pipeline or str(target_name),
        spark=SparkSettings(spark_master, SparkSettings.parse_conf(spark_conf)),
        **rest,
    )


@main.command()
@pipeline_options
@click.option(
    "--from-version",
    type=int,
    default=None,
    help="First Delta version to replicate when the pipeline has no offset yet. Default: 0.",
)
@click.option(
    "--from-timestamp",
    callback=_parse_timestamp,
    default=None,
    help="Like --from-version, but the first version committed at or after this ISO-8601 time.",
)
@click.option(
    "--reset",
    is_flag=True,
    help="Forget the stored offset and start at --from-version/--from-timestamp (default 0).",
)
@click.option("--once", is_flag=True, help="Catch up to the latest version and exit (for cron).")
@click.option(
    "--poll-interval",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between polls of the Delta log when running continuously.",
)
@click.option(
    "--on-schema-change",
    type=click.Choice(["fail", "resync"]),
    default="fail",
    show_default=True,
    help="When Delta drops, renames or narrows a column (added columns and widened types are followed "
    "automatically): fail stops at that version; resync rebuilds the table from a snapshot and goes on.",
)
@click.option(
    "--writer",
    type=click.Choice(["auto", "driver", "executors"]),
    default="auto",
    show_default=True,
    help="driver: cdc2ch collects each version range and inserts it. executors: Spark tasks insert their own "
    "partitions straight into a ClickHouse server (task retries are deduplicated). auto: executors on a "
    "cluster with a server target, driver otherwise.",
)
@reader_option
@click.option(
    "--immutable-keys",
    is_flag=True,
    help="Promise that updates never change key columns: update pre-images are not written.",
)
@handle_errors
def run(log_format, log_level, **options):
    """Replicate a Delta table's changes into ClickHouse, continuously or --once.

    Resumes from the offset stored in ClickHouse; stops cleanly on SIGTERM/SIGINT after the current batch.
    """
    from cdc2ch.pipeline import Replicator

    logsetup.configure(log_format, log_level)
    _with_source(build_config(**options), Replicator)


@main.command()
@pipeline_options
@click.option(
    "--version",
    "snapshot_version",
    type=int,
    default=None,
    help="The Delta version to load. Default: the latest. `run` then continues at version + 1.",
)
@reader_option
@click.option(
    "--reset",
    is_flag=True,
    help="Point the pipeline at this snapshot's version even if its stored offset is further on or "
    "belongs to another source.",
)
@handle_errors
def snapshot(log_format, log_level, **options):
    """Load a Delta table as of one version (one-off backfill), resumably, then hand over to `run`.

    A snapshot killed midway, started again with the same arguments, continues with the chunks it had not
    finished. Keys alive in ClickHouse but absent from the snapshot are soft-deleted.
    """
    from cdc2ch.snapshot import Snapshotter

    logsetup.configure(log_format, log_level)
    _with_source(build_config(once=True, **options), Snapshotter)


def _with_source(cfg: RunConfig, worker) -> None:
    """Open ClickHouse and Spark, then run `worker(cfg, source, sink, stop)` with signal handling."""
    from cdc2ch.lock import PipelineLock
    from cdc2ch.sink import connect
    from cdc2ch.source.delta import DeltaSource
    from cdc2ch.source.spark import session

    stop = threading.Event()
    with stop_on_signals(stop), connect(cfg.clickhouse_dsn, cfg.retries) as sink:
        # Refuse early, before Spark starts, if another runner has the pipeline; the job claims it
        # itself once its inputs are checked, so bad input writes nothing.
        PipelineLock(sink, cfg.target.database, cfg.pipeline, cfg.lock_ttl).check()
        spark = session(cfg.spark)
        worker(cfg, DeltaSource(spark, cfg.table), sink, stop).run()


@main.command()
@click.option("--target", default=None, help="Only the pipelines writing to this database.table.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (one object per pipeline) instead of a table."
)
@clickhouse_option
@spark_options
@logging_options
@handle_errors
def status(target, as_json, clickhouse_dsn, spark_master, spark_conf, log_format, log_level):
    """Show each pipeline's committed version, the latest Delta version, how far behind it is, and when it
    last synced."""
    from cdc2ch import status as report
    from cdc2ch.sink import connect
    from cdc2ch.source.spark import session

    logsetup.configure(log_format, log_level)
    settings = SparkSettings(spark_master, SparkSettings.parse_conf(spark_conf))
    with connect(clickhouse_dsn) as sink:
        rows = report.collect(sink, lambda: session(settings), TargetName.parse(target) if target else None)
    click.echo(json.dumps(rows, indent=2) if as_json else report.render_table(rows))


@main.command()
@click.argument("sql")
@click.option(
    "--format",
    "fmt",
    default="PrettyCompactMonoBlock",
    show_default=True,
    help="Any ClickHouse output format: PrettyCompact, TSVWithNames, JSONEachRow, CSV...",
)
@clickhouse_option
@handle_errors
def query(sql, fmt, clickhouse_dsn):
    """Run SQL on the target ClickHouse and print the result (the way to look inside the embedded database)."""
    from cdc2ch.sink import connect

    with connect(clickhouse_dsn, retries=1) as sink:
        out = sink.raw_query(sql, fmt)
    click.echo(out.decode("utf-8", errors="replace"), nl=not out.endswith(b"\n"))


@main.command()
@click.option(
    "--dir",
    "demo_dir",
    default="./cdc2ch-demo",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the demo writes its Delta table and embedded ClickHouse (recreated on each run).",
)
@logging_options
@handle_errors
def demo(demo_dir, log_format, log_level):
    """Build a small Delta table with Spark (inserts, UPDATE, DELETE, MERGE), replicate it into the embedded
    ClickHouse, and print both side by side with the status."""
    from cdc2ch.demo import run_demo

    logsetup.configure(log_format, log_level)
    run_demo(demo_dir, click.echo)


if __name__ == "__main__":
    main()
