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
from click.core import ParameterSource

from cdc2ch import __version__
from cdc2ch import log as logsetup
from cdc2ch.config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_ROWS_PER_READ,
    ConfigFile,
    RunConfig,
    SparkSettings,
    TargetName,
    default_dsn,
)
from cdc2ch.errors import Cdc2chError, ConfigError


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
        "server (password from CDC2CH_CLICKHOUSE_PASSWORD or CDC2CH_CLICKHOUSE_PASSWORD_FILE, never the URL).",
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
            help="The Delta table: a local path or a URI (s3a://, abfss://, gs://...). Required unless a "
            "--config file names the tables.",
        ),
        click.option(
            "--primary-key",
            help="Column(s) identifying a row, comma-separated: id or tenant,id. Becomes the ORDER BY key. "
            "Required with --table.",
        ),
        click.option(
            "--target",
            default=None,
            help="ClickHouse table as database.table. Default: cdc2ch.<last path segment of --table>.",
        ),
        click.option(
            "--pipeline",
            default=None,
            help="Name under which the offset is stored. Default: the target name. With --config: run only "
            "the pipeline of that name.",
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


# Options that concern the process rather than a pipeline; not part of RunConfig.
PROCESS_KEYS = ("config_path", "metrics_port", "log_format", "log_level")
# Options that describe one table: with --config they belong in the file's [[pipelines]] entries.
TABLE_KEYS = ("table", "primary-key", "target", "from-version", "from-timestamp")


def option_key(param: click.Parameter) -> str:
    """The name an option has in a config file: its long flag without dashes."""
    return max((o for o in param.opts if o.startswith("--")), key=len)[2:]


def _explicit(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def resolve_options(ctx: click.Context, options: dict) -> tuple[list[dict], ConfigFile | None]:
    """One dict of option values per pipeline, each value from the first of: flag, environment variable,
    the pipeline's [[pipelines]] entry, the config file's top level, the option's default."""
    path = options.get("config_path")
    if not path:
        return [dict(options)], None
    params = {
        option_key(p): p for p in ctx.command.params if isinstance(p, click.Option) and p.name in options
    }
    known = {option_key(p) for p in run.params if isinstance(p, click.Option)} - {"config", "help"}
    file = ConfigFile.load(path, known)
    for key in TABLE_KEYS:
        if key in params and _explicit(ctx, params[key].name):
            raise ConfigError(
                f"--{key} (or CDC2CH_{key.upper().replace('-', '_')}) sets one table's {key}, but --config {path} "
                f"lists the pipelines: set `{key}` in the file's [[pipelines]] entries instead, or drop --config."
            )
    out = []
    for i, entry in enumerate(file.pipelines):
        merged = dict(options, pipeline=None)
        for key, value in {**file.common, **entry}.items():
            key = "pipeline" if key == "name" else key
            param = params.get(key)
            if param is None or (key != "pipeline" and _explicit(ctx, param.name)):
                continue  # another command's option, or given as a flag or variable
            merged[param.name] = _file_value(ctx, param, value, f"{path}, [[pipelines]] entry {i + 1}, {key}")
        out.append(merged)
    return out, file


def _file_value(ctx: click.Context, param: click.Option, value, where: str):
    """A TOML value as the option would have parsed it from the command line."""
    if isinstance(value, dict) and param.multiple:  # [spark-conf] table
        value = [f"{k}={v}" for k, v in value.items()]
    elif isinstance(value, list) and not param.multiple:  # primary-key = ["tenant", "id"]
        value = ",".join(str(v) for v in value)
    elif isinstance(value, str) and param.multiple:
        value = [value]
    elif isinstance(value, datetime):
        value = value.isoformat()
    try:
        return param.process_value(ctx, value)
    except click.BadParameter as exc:
        raise ConfigError(f"Config file {where}: {value!r} is not valid: {exc.format_message()}") from None


def resolve_configs(ctx: click.Context, options: dict) -> tuple[list[RunConfig], dict]:
    """RunConfigs of the pipelines to run, and the process-wide options."""
    merged, file = resolve_options(ctx, options)
    process = {k: merged[0].get(k) for k in PROCESS_KEYS}
    configs = [build_config(**{k: v for k, v in m.items() if k not in PROCESS_KEYS}) for m in merged]
    if file is None:
        return configs, process
    names = [c.pipeline for c in configs]
    for attr, what in (("target", "target table"), ("pipeline", "pipeline name")):
        values = [str(getattr(c, attr)) for c in configs]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ConfigError(
                f"Config file {file.path}: {what} {twice[0]!r} is used by more than one pipeline; each pipeline "
                f"needs its own (set `name` and `target` in its [[pipelines]] entry)."
            )
    if _explicit(ctx, "pipeline"):
        configs = [c for c in configs if c.pipeline == options["pipeline"]]
        if not configs:
            raise ConfigError(
                f"--pipeline {options['pipeline']!r} is not in {file.path}; its pipelines are: {', '.join(names)}."
            )
    return configs, process


def build_config(table, primary_key, target, pipeline, spark_master, spark_conf, **rest) -> RunConfig:
    if not table or not primary_key:
        missing = "--table" if not table else "--primary-key"
        raise ConfigError(
            f"{missing} is required: name the Delta table with --table and the column(s) identifying a row "
            f"with --primary-key (e.g. --table s3a://lake/orders --primary-key id), or pass --config with a "
            f"cdc2ch.toml that lists pipelines."
        )
    target_name = TargetName.parse(target) if target else TargetName.for_source(table)
    return RunConfig(
        table=table,
        primary_key=tuple(k.strip() for k in primary_key.split(",") if k.strip()),
        target=target_name,
        pipeline=pipeline or str(target_name),
        spark=SparkSettings(spark_master, SparkSettings.parse_conf(spark_conf)),
        **rest,
    )


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A cdc2ch.toml listing pipelines (table, primary key, target, options) to run in this process. "
    "Any option can be set in it; a flag or environment variable given too takes precedence.",
)


def run_options(fn):
    """Options of `run`, which `validate` shares so that it checks exactly what `run` would do."""
    options = [
        config_option,
        click.option(
            "--from-version",
            type=int,
            default=None,
            help="First Delta version to replicate when the pipeline has no offset yet. Default: 0.",
        ),
        click.option(
            "--from-timestamp",
            callback=_parse_timestamp,
            default=None,
            help="Like --from-version, but the first version committed at or after this ISO-8601 time.",
        ),
        click.option(
            "--reset",
            is_flag=True,
            help="Forget the stored offset and start at --from-version/--from-timestamp (default 0).",
        ),
        click.option("--once", is_flag=True, help="Catch up to the latest version and exit (for cron)."),
        click.option(
            "--poll-interval",
            type=float,
            default=5.0,
            show_default=True,
            help="Seconds between polls of the Delta log when running continuously; also the first pause "
            "before retrying a failed pipeline (doubling up to 5 minutes).",
        ),
        click.option(
            "--on-schema-change",
            type=click.Choice(["fail", "resync"]),
            default="fail",
            show_default=True,
            help="When Delta drops, renames or narrows a column (added columns and widened types are followed "
            "automatically): fail stops at that version; resync rebuilds the table from a snapshot and goes on.",
        ),
        click.option(
            "--writer",
            type=click.Choice(["auto", "driver", "executors"]),
            default="auto",
            show_default=True,
            help="driver: cdc2ch collects each version range and inserts it. executors: Spark tasks insert "
            "their own partitions straight into a ClickHouse server (task retries are deduplicated). auto: "
            "executors on a cluster with a server target, driver otherwise.",
        ),
        reader_option,
        click.option(
            "--immutable-keys",
            is_flag=True,
            help="Promise that updates never change key columns: update pre-images are not written.",
        ),
        click.option(
            "--metrics-port",
            type=click.IntRange(0, 65535),
            default=None,
            help="Serve Prometheus metrics on this port (path /metrics): rows, batches, bytes, batch seconds, "
            "versions and seconds behind, errors by kind, last success, per pipeline.",
        ),
    ]
    fn = pipeline_options(fn)
    for option in reversed(options):
        fn = option(fn)
    return fn


@main.command()
@run_options
@handle_errors
def run(**options):
    """Replicate Delta tables' changes into ClickHouse, continuously or --once.

    One table from flags, or every pipeline of a --config file in one process (one Spark session; a failing
    pipeline is reported and retried while the others go on; --once exits 1 if any failed). Resumes from
    the offsets stored in ClickHouse; stops cleanly on SIGTERM/SIGINT after the current batch.
    """
    configs, process = resolve_configs(click.get_current_context(), options)
    logsetup.configure(process["log_format"], process["log_level"])
    _run_pipelines(configs, process["metrics_port"], isolate=process["config_path"] is not None)


@main.command()
@pipeline_options
@config_option
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
def snapshot(**options):
    """Load a Delta table as of one version (one-off backfill), resumably, then hand over to `run`.

    A snapshot killed midway, started again with the same arguments, continues with the chunks it had not
    finished. Keys alive in ClickHouse but absent from the snapshot are soft-deleted.
    """
    from cdc2ch.snapshot import Snapshotter
    from cdc2ch.source.delta import DeltaSource
    from cdc2ch.source.spark import session

    configs, process = resolve_configs(click.get_current_context(), dict(options, once=True))
    if len(configs) > 1:
        raise ConfigError(
            f"snapshot loads one table, but {process['config_path']} lists {len(configs)} pipelines: choose one "
            f"with --pipeline NAME ({', '.join(c.pipeline for c in configs)})."
        )
    logsetup.configure(process["log_format"], process["log_level"])
    cfg = configs[0]
    with _target(cfg, cfg.retries, check_lock=True) as (sink, stop):
        Snapshotter(cfg, DeltaSource(session(cfg.spark), cfg.table), sink, stop).run()


@contextmanager
def _target(cfg: RunConfig, retries: int, check_lock: bool):
    """ClickHouse opened and signals handled: yields (sink, stop event). With `check_lock`, refuses early,
    before Spark starts, if another runner has the pipeline; the job claims it itself once its inputs are
    checked, so bad input writes nothing."""
    from cdc2ch.clickhouse.dsn import connect
    from cdc2ch.clickhouse.lock import PipelineLock

    stop = threading.Event()
    with stop_on_signals(stop), connect(cfg.clickhouse_dsn, retries) as sink:
        if check_lock:
            PipelineLock(sink, cfg.target.database, cfg.pipeline, cfg.lock_ttl).check()
        yield sink, stop


def _run_pipelines(configs: list[RunConfig], metrics_port: int | None, isolate: bool) -> None:
    """One ClickHouse connection and one Spark session for all pipelines; see runner.Runner."""
    from cdc2ch.metrics import Metrics
    from cdc2ch.runner import Runner
    from cdc2ch.source.spark import session

    first = configs[0]
    metrics = Metrics()
    # A pipeline of a config that another runner holds is one failing pipeline, not a refusal of all.
    with _target(first, max(c.retries for c in configs), check_lock=not isolate) as (sink, stop):
        if metrics_port is not None:
            metrics.serve(metrics_port)
        try:
            failed = Runner(configs, session(first.spark), sink, stop, metrics, isolate).run()
        finally:
            metrics.close()
    if failed and first.once:  # a service reports failures through status and metrics, and keeps going
        summary = "; ".join(
            f"{s.cfg.pipeline} ({s.health.last_error_kind}): {s.health.last_error[:300].rstrip('.')}"
            for s in failed
        )
        raise Cdc2chError(
            f"{len(failed)} of {len(configs)} pipelines failed, the others replicated: {summary}. "
            f"`cdc2ch status` shows each pipeline's last error; fix the cause and run again."
        )


@main.command()
@run_options
@handle_errors
def validate(**options):
    """Check what `run` would do, without writing: the config file, ClickHouse reachability, and for each
    pipeline its Delta table, primary key, change data feed, stored offset and options.

    Exits 0 when everything is ready, 2 otherwise.
    """
    from cdc2ch.source.spark import session
    from cdc2ch.status import aligned
    from cdc2ch.validate import check

    configs, process = resolve_configs(click.get_current_context(), options)
    logsetup.configure(process["log_format"], process["log_level"])
    findings = check(configs, lambda: session(configs[0].spark))
    click.echo(
        "\n".join(
            aligned(["", "", ""], [["ok" if f.ok else "FAIL", f.subject, f.detail] for f in findings])[1:]
        )
    )
    if not all(f.ok for f in findings):
        sys.exit(ConfigError.exit_code)


@main.command()
@click.option("--target", default=None, help="Only the pipelines writing to this database.table.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (one object per pipeline) instead of a table."
)
@click.option(
    "--max-lag",
    default=None,
    help="Exit with code 2 when any pipeline is behind by more than this: a number of versions (10) or a "
    "time between the latest Delta commit and the last replicated one (90s, 15m, 2h, 1d). A pipeline whose "
    "table cannot be read counts as behind. For monitoring checks.",
)
@config_option
@clickhouse_option
@spark_options
@logging_options
@handle_errors
def status(target, as_json, max_lag, **options):
    """Show each pipeline's committed version, the latest Delta version, versions and seconds behind, rows
    written, last success and last error. With --config: the pipelines of that file, including any that
    never ran."""
    from cdc2ch import status as report
    from cdc2ch.clickhouse.dsn import connect
    from cdc2ch.source.spark import session

    merged, file = resolve_options(click.get_current_context(), options)
    o = merged[0]
    limit = report.parse_max_lag(max_lag) if max_lag else None
    logsetup.configure(o["log_format"], o["log_level"])
    settings = SparkSettings(o["spark_master"], SparkSettings.parse_conf(o["spark_conf"]))
    with connect(o["clickhouse_dsn"]) as sink:
        rows = report.collect(
            sink,
            lambda: session(settings),
            TargetName.parse(target) if target else None,
            file.pipeline_ids() if file else None,
        )
    click.echo(json.dumps(rows, indent=2) if as_json else report.render_table(rows))
    if limit and any(report.over_limit(r, *limit) for r in rows):
        sys.exit(2)


@main.command()
@click.option("--target", required=True, help="The cdc2ch target table to compact, as database.table.")
@click.option(
    "--older-than",
    default=None,
    metavar="DURATION",
    help="Drop only tombstones committed longer ago than this: 30s, 15m, 12h, 7d, 2w (or combined, 1d12h); "
    "younger ones stay for incremental readers. Default (or 0): drop every tombstone.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the counts as one JSON object instead of a summary line."
)
@clickhouse_option
@logging_options
@handle_errors
def compact(target, older_than, as_json, clickhouse_dsn, log_format, log_level):
    """Physically remove old tombstones (deleted keys) and superseded row versions from a target table, with
    OPTIMIZE TABLE ... FINAL CLEANUP.

    SELECT ... FINAL returns the same rows before and after; tombstones younger than --older-than are kept
    so that incremental readers still see those deletes. Safe while `cdc2ch run` keeps replicating; an
    interrupted compaction is finished by the next one.
    """
    from cdc2ch import compact as compaction
    from cdc2ch.clickhouse.dsn import connect
    from cdc2ch.config import parse_duration

    logsetup.configure(log_format, log_level)
    name = TargetName.parse(target)
    age = parse_duration(older_than, "--older-than") if older_than is not None else None
    with connect(clickhouse_dsn) as sink:
        result = compaction.compact(sink, name, age)
    click.echo(json.dumps(result.as_dict()) if as_json else result.summary())


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
    from cdc2ch.clickhouse.dsn import connect

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


# Names that would be ambiguous without the command in them.
_ENV_NAMES = {
    ("snapshot", "version"): "CDC2CH_SNAPSHOT_VERSION",
    ("demo", "dir"): "CDC2CH_DEMO_DIR",
    ("query", "format"): "CDC2CH_QUERY_FORMAT",
}


def _environment_variables(group: click.Group) -> None:
    """Every option can also be set as CDC2CH_<OPTION NAME>; precedence: flag > environment > config file
    > default."""
    for name, command in group.commands.items():
        for p in command.params:
            if isinstance(p, click.Option) and "--help" not in p.opts:
                key = option_key(p)
                if p.envvar is None:
                    p.envvar = _ENV_NAMES.get((name, key), f"CDC2CH_{key.upper().replace('-', '_')}")
                p.show_envvar = True


_environment_variables(main)

if __name__ == "__main__":
    main()
