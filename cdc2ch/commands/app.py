"""What each command does, once its options are parsed: resolve them, set up logging, open ClickHouse and
Spark, hand over to the module doing the work, and report. Heavy modules (Spark, ClickHouse clients) are
imported inside the functions so that `cdc2ch --help` stays fast."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import click

from cdc2ch.base import log as logsetup
from cdc2ch.base.errors import Cdc2chError, ConfigError, summarise
from cdc2ch.base.log import get_logger
from cdc2ch.base.stop import Stopped, stop_on_signals
from cdc2ch.commands import summary
from cdc2ch.commands.invocation.listing import (
    Known,
    clickhouse_of,
    compact_targets,
    configured,
    file_pipelines,
    pipelines,
    start_logging,
    wait_for_tables,
)
from cdc2ch.commands.invocation.options import Invocation, load_config, merge, process_options
from cdc2ch.model.config import ProcessOptions, RunConfig, TargetName, parse_duration

log = get_logger("cdc2ch")


@contextmanager
def _target(cfg: RunConfig, retries: int, check_lock: bool, reader: bool = False):
    """ClickHouse opened: yields the sink. With `check_lock`, refuses early, before Spark starts, if another
    runner has the pipeline; the job claims it itself once its inputs are checked, so bad input writes
    nothing. A `reader` of an embedded directory a `run --serve` holds goes through that service."""
    from cdc2ch.clickhouse.connection.dsn import connect
    from cdc2ch.replication.target import pipeline_lock

    with connect(cfg.clickhouse_dsn, retries, reader=reader, cluster=cfg.cluster) as sink:
        if check_lock:
            pipeline_lock(cfg, sink).check()
        yield sink


def run(invocation: Invocation) -> None:
    """`cdc2ch run`: replicate the pipelines of the flags or of the --config file."""
    # Signals are caught from the start: a stop while the pipelines are listed and checked (seconds on a busy
    # machine) is a stop before any work, exit 0, not a process killed by its signal.
    with stop_on_signals() as stop:
        listed = pipelines(invocation, stop)
        if listed.configs or not listed.waits:
            configured(invocation, listed)  # refuses a --once run of patterns matching nothing to follow
        process = listed.process
        check_serve(process)
        start_logging(process)
        if not listed.configs:
            listed = wait_for_tables(listed, stop)
        if listed.configs:
            run_pipelines(listed.configs, process, stop, discover=listed.again, skipped=listed.skipped)


def run_pipelines(
    configs: list[RunConfig], process: ProcessOptions, stop: threading.Event, discover=None, skipped=None
) -> None:
    """One ClickHouse connection and one Spark session for all pipelines, started when the first of them
    reads through Spark; see runner.Runner. With a config file a failing pipeline is one failure among
    others (`--once` then exits 1 with a summary)."""
    from cdc2ch.fleet.runner import Fleet, Runner
    from cdc2ch.fleet.scheduler import pool_size, spark_cores
    from cdc2ch.replication.budget import RowBudget
    from cdc2ch.replication.metrics import Metrics
    from cdc2ch.source.spark.session import jvm_pid, lazy_session

    began = time.monotonic()
    isolate = process.config_path is not None or discover is not None  # one table's failure stops no other
    first = configs[0]
    metrics = Metrics()
    spark_reads = any(c.reader == "spark" for c in configs)
    workers = pool_size(
        process.max_parallel, first.spark.master, len(configs), discover is not None, spark_reads
    )
    runner: Runner | None = None  # the pipelines it runs: `configs`, and those discovered since

    def running() -> list[RunConfig]:
        return configs if runner is None else runner.running()

    # A pipeline of a config that another runner holds is one failing pipeline, not a refusal of all.
    with (
        _target(first, max(c.retries for c in configs), check_lock=not isolate) as sink,
        _serving(process, sink, running),
    ):
        sink.widen(workers + 1)  # the pipelines' calls overlap; one more for claims' heartbeats
        budget = RowBudget(
            # two ranges per worker; with the extra workers of pipelines ClickHouse reads (whose ranges are
            # not held here), two per Spark core for those that `auto` leaves to Spark
            process.max_rows_in_memory
            or 2
            * (workers if spark_reads else min(workers, spark_cores(first.spark.master)))
            * max(c.max_rows_per_read for c in configs)
        )
        if process.metrics_port is not None:
            metrics.serve(process.metrics_port)
        try:
            spark = lazy_session(first.spark, lambda s: setattr(metrics, "jvm_pid", jvm_pid(s)), stop)
            fleet = Fleet(isolate=isolate, workers=workers, budget=budget, discover=discover,
                          discover_interval=process.discover_interval, skipped=tuple(skipped or ()))  # fmt: skip
            runner = Runner(configs, spark, sink, stop, metrics, fleet=fleet)
            failed = runner.run()
        finally:
            metrics.close()
    if first.once:  # what was written, at any log level (a service's ending is in its log)
        written = summary.of_slots(runner.slots)
        click.echo(summary.render("run", written, time.monotonic() - began, stop.is_set()))
    if failed and first.once:  # a service reports failures through status and metrics, and keeps going
        raise Cdc2chError(failure_summary(failed, len(configs)))


SUMMARY_CHARS = 300  # of each pipeline's error in the --once summary


def failure_summary(failed: list, total: int) -> str:
    """The message of a `--config --once` run in which some pipelines failed: each failure's first sentence
    (the whole error is in `cdc2ch status`)."""
    each = "; ".join(
        f"{s.cfg.pipeline} ({s.health.last_error_kind}): {summarise(s.health.last_error, SUMMARY_CHARS).rstrip('.')}"
        for s in failed
    )
    return (
        f"{len(failed)} of {total} pipelines failed, the others replicated: {each}. `cdc2ch status` shows "
        f"each pipeline's whole last error; fix the cause and run again."
    )


def check_serve(process: ProcessOptions) -> None:
    """Refuse --serve options that cannot work, before anything starts."""
    if process.serve is None:
        return
    # the HTTP service (and what it imports) only when asked
    from cdc2ch.clickhouse.serving.httpservice import parse_address, tls_context

    if not process.clickhouse_dsn.startswith("chdb:"):
        raise ConfigError(
            "--serve shares this process's embedded ClickHouse (--clickhouse chdb:///path); a ClickHouse server "
            "serves its readers itself: point them at it, or drop --serve."
        )
    parse_address(process.serve.address)
    tls_context(process.serve.tls_cert, process.serve.tls_key)


@contextmanager
def _serving(process: ProcessOptions, sink, running: Callable[[], list[RunConfig]]):
    """With --serve: the embedded engine over HTTP while the block runs, recorded in the data directory so
    that `status` and `query` on that directory find it. Pipeline requests that come to it (`cdc2ch pause`,
    ...) are recorded through this process's own connection, `sink`: the served data stays read-only.
    `running`: the pipelines this service runs now."""
    opts = process.serve
    if opts is None:
        yield
        return
    from cdc2ch.clickhouse.connection import embedded
    from cdc2ch.clickhouse.serving import endpoint
    from cdc2ch.commands.pipeline_requests import record

    def take(ask):
        return record(sink, ask, serving=True, known={c.pipeline: Known.of(c) for c in running()})

    path = embedded.data_path(process.clickhouse_dsn)
    server = endpoint.serve_engine(
        str(path),
        opts.address,
        opts.user,
        opts.writable,
        opts.tls_cert,
        opts.tls_key,
        requests=take,
    )
    try:
        embedded.announce_service(path, server.url, opts.tls_cert)
        log.info("serving", url=server.url, writable=opts.writable, tls=server.tls is not None)
        if not server.password:
            log.warning("serving_without_password", url=server.url, hint=f"set {endpoint.PASSWORD_ENV}")
        yield
    finally:
        embedded.withdraw_service(path)
        server.stop()


def snapshot(invocation: Invocation) -> None:
    """`cdc2ch snapshot`: load one table as of one version (each table of a --table pattern in turn)."""
    from cdc2ch.fleet.patterns import is_pattern

    configs, process = configured(invocation.with_values(once=True))
    if len(configs) > 1 and not is_pattern(invocation.values.get("table")):
        raise ConfigError(
            f"snapshot loads one table, but {process.config_path} lists {len(configs)} pipelines: choose one "
            f"with --pipeline NAME ({', '.join(c.pipeline for c in configs)})."
        )
    start_logging(process)
    began, written = time.monotonic(), []
    with stop_on_signals() as stop:
        for cfg in configs:
            if stop.is_set():
                break
            try:
                written.append(load_snapshot(cfg, stop))
            except Stopped:  # while Spark started: nothing loaded, nothing claimed after the signal
                written.append(summary.Written(cfg.pipeline, note="stopped before it began"))
    click.echo(summary.render("snapshot", written, time.monotonic() - began, stop.is_set()))


def load_snapshot(cfg: RunConfig, stop: threading.Event) -> summary.Written:
    """Load the pipeline's table as of cfg.snapshot_version (default: the latest), resumably."""
    from cdc2ch.replication.target import clickhouse_snapshotter
    from cdc2ch.source import open_source
    from cdc2ch.source.spark.session import lazy_session

    with _target(cfg, cfg.retries, check_lock=True) as sink:
        source = open_source(lazy_session(cfg.spark, stop=stop), cfg.table)
        job = clickhouse_snapshotter(cfg, source, sink, stop)
        job.run()
    if job.loaded is None:  # stopped between chunks: the same command resumes it
        return summary.Written(
            cfg.pipeline, note="snapshot stopped before it ended; the same command resumes it"
        )
    version, rows = job.loaded
    return summary.Written(cfg.pipeline, rows, after=version, snapshot=True)


def reshape(invocation: Invocation) -> None:
    """`cdc2ch reshape`: rebuild one pipeline's target with a new design and swap it in."""
    from cdc2ch.commands.reshape import Reshape
    from cdc2ch.source import open_source
    from cdc2ch.source.spark.session import lazy_session

    configs, process = configured(invocation)
    if len(configs) > 1:
        where = f"{process.config_path} lists" if process.config_path else "--table matches"
        raise ConfigError(
            f"reshape rebuilds one table, but {where} {len(configs)} pipelines: name one table with --table "
            f"(or --pipeline NAME with --config): {', '.join(c.pipeline for c in configs)}."
        )
    cfg = configs[0]
    start_logging(process)
    with stop_on_signals() as stop, _target(cfg, cfg.retries, check_lock=False) as sink:
        done = Reshape(cfg, open_source(lazy_session(cfg.spark, stop=stop), cfg.table), sink, stop).run()
    click.echo(summary.reshaped(cfg.pipeline, done))


def validate(invocation: Invocation) -> None:
    """`cdc2ch validate`: print one line per check (ok, WARN or FAIL); exit 2 if any failed."""
    from cdc2ch.commands.status import aligned
    from cdc2ch.commands.validate import Finding, check
    from cdc2ch.source.spark.session import lazy_session

    listed = pipelines(invocation, log_skipped=False)  # each skipped table is one finding below
    configs, process, skipped = listed.configs, listed.process, listed.skipped
    check_serve(process)  # refused by run before anything starts: so by validate too
    start_logging(process)
    findings = check(configs, lazy_session(configs[0].spark)) if configs else []
    # A table a pattern skips is no reason to refuse the others: run goes ahead without it.
    findings += [Finding(s.table, True, f"skipped: {s.reason}", warning=True) for s in skipped]
    click.echo("\n".join(aligned(["", "", ""], [[f.verdict, f.subject, f.detail] for f in findings])[1:]))
    if not all(f.ok for f in findings):
        sys.exit(ConfigError.exit_code)


def verify(invocation: Invocation) -> None:
    """`cdc2ch verify`: compare each pipeline's target with its Delta table at the committed version; with
    --repair, mend what differs and verify again. Exit 1 when a pipeline differs."""
    from cdc2ch.clickhouse.state.statestore import StateStore, VerifyStore
    from cdc2ch.commands.verify import Verifier, check_target, render
    from cdc2ch.source import open_source
    from cdc2ch.source.spark.session import lazy_session

    repair, as_json = invocation.values["repair"], invocation.values["as_json"]
    configs, process = configured(invocation.with_values(once=True))
    start_logging(process)
    reports = []
    retries = max(c.retries for c in configs)
    # without --repair verify only reads: a running `run --serve` of the embedded directory can answer it
    with stop_on_signals() as stop, _target(configs[0], retries, False, reader=not repair) as sink:
        spark = lazy_session(process.spark, stop=stop)
        for cfg in configs:
            check_target(sink, cfg)
            store = StateStore(sink, cfg.target.database)
            verifier = Verifier(cfg, open_source(spark, cfg.table), sink, store,
                                logsetup.get_logger("cdc2ch.verify").bind(pipeline=cfg.pipeline), stop)  # fmt: skip
            report = verifier.run(repair=repair)
            if repair and not report.ok:
                repaired = report.repaired
                report = Verifier(cfg, verifier.source, sink, store, verifier.log, stop).run()
                report = replace(report, repaired=repaired)
            _record(VerifyStore(sink, cfg.target.database), report)
            reports.append(report)
    click.echo(json.dumps([r.as_dict() for r in reports], indent=2) if as_json else render(reports, repair))
    if not all(r.ok for r in reports):
        sys.exit(1)


def _record(store, report) -> None:
    """Keep a verify's verdict for `status`; a read-only connection (a `run --serve`) keeps none, and says so."""
    from cdc2ch.base.errors import SinkError
    from cdc2ch.clickhouse import codes

    try:
        store.record(report)
    except SinkError as exc:
        if exc.code != codes.READONLY:
            raise
        log.warning(
            "verify_not_recorded",
            pipeline=report.pipeline,
            reason="the connection may only read: the verdict is printed here, not kept for cdc2ch status",
        )


def status(invocation: Invocation) -> None:
    """`cdc2ch status`: a table (or JSON) of the pipelines the filters keep; exit 2 when one of them is
    behind by more than --max-lag."""
    from cdc2ch.clickhouse.connection.dsn import connect
    from cdc2ch.commands import status as report
    from cdc2ch.commands.selection import Selection
    from cdc2ch.source.spark.session import lazy_session

    given = invocation.values
    as_json = _status_format(invocation)
    max_lag, target = given.get("max_lag"), given.get("target")
    limit = report.parse_max_lag(max_lag) if max_lag else None
    lagging = given.get("lagging")
    select = Selection(
        given.get("pattern"),
        bool(given.get("failing")),
        report.parse_lagging(lagging) if lagging is not None else None,
    )
    file = load_config(invocation)
    merged = merge(invocation, file)
    process = process_options(merged[0], [m.get("table") for m in merged])  # the same in every pipeline
    start_logging(process)
    listed = file_pipelines(invocation, file)  # a pattern's tables, as `run` names their pipelines
    with connect(process.clickhouse_dsn, create=False, reader=True) as sink:
        rows = report.collect(
            sink, lazy_session(process.spark), TargetName.parse(target) if target else None, listed, select
        )
    empty = f"No pipelines match {select.describe()}." if select else "No pipelines found."
    wide = bool(given.get("wide"))
    click.echo(json.dumps(rows, indent=2) if as_json else report.render_table(rows, empty, wide=wide))
    behind = [r for r in rows if report.over_limit(r, *limit)] if limit else []
    if behind:
        click.echo(f"cdc2ch: {report.behind_message(behind, str(max_lag))}", err=True)
        sys.exit(2)


def _status_format(invocation: Invocation) -> bool:
    """Whether status prints JSON: --format json, or --json (its older spelling)."""
    fmt, as_json = invocation.values.get("fmt") or "table", bool(invocation.values.get("as_json"))
    if as_json and fmt == "table" and "fmt" in invocation.explicit:
        raise ConfigError("--json asks for --format json, but --format table is given too. Give one of them.")
    return as_json or fmt == "json"


def compact(invocation: Invocation) -> None:
    """`cdc2ch compact`: drop old tombstones and superseded versions of one target table."""
    from cdc2ch.clickhouse.connection.dsn import connect
    from cdc2ch.clickhouse.tables import compaction
    from cdc2ch.commands.recorded import target_of

    v = invocation.values
    older_than, as_json = v["older_than"], v["as_json"]
    logsetup.configure(v["log_format"], v["log_level"])
    age = parse_duration(older_than, "--older-than") if older_than is not None else None
    targets = compact_targets(invocation)
    with connect(clickhouse_of(invocation), create=False) as sink:
        for name in targets or [target_of(sink, v["pipeline_name"])]:
            result = compaction.compact(sink, name, age)
            click.echo(json.dumps(result.as_dict()) if as_json else result.summary())


def lifecycle(invocation: Invocation) -> None:
    """`cdc2ch pause`, `resume`, `resync`: a request to the service running the pipeline."""
    from cdc2ch.commands.pipeline_requests import request

    v = invocation.values
    pipeline, target = v["pipeline_name"], v.get("target")
    listed = file_pipelines(invocation, named=pipeline) if not target else None
    # the file's pipeline of that name says where it is; another is looked for in ClickHouse
    known = next((k for k in listed or () if k.name == pipeline), None)
    target = str(known.target) if known else target
    said = request(invocation.command, pipeline, v.get("reason"), target, clickhouse_of(invocation), known)
    click.echo(said)


def query(invocation: Invocation) -> None:
    """`cdc2ch query`: print the result of one SQL statement in a ClickHouse output format."""
    from cdc2ch.clickhouse import query as statement
    from cdc2ch.clickhouse.connection.dsn import connect

    sql, fmt = invocation.values["sql"], invocation.values["fmt"]
    statement.output_format(sql, fmt)  # an empty statement is refused before ClickHouse is opened
    with connect(clickhouse_of(invocation), retries=1, create=False, reader=True) as sink:
        out = statement.run(sink, sql, fmt)
    if out:
        click.echo(out.decode("utf-8", errors="replace"), nl=not out.endswith(b"\n"))


def demo(invocation: Invocation) -> None:
    """`cdc2ch demo`: build a small Delta table, replicate it, and show both."""
    from cdc2ch.commands.demo import run_demo

    v = invocation.values
    logsetup.configure(v["log_format"], v["log_level"])
    run_demo(v["demo_dir"], click.echo)


def spark_conf(invocation: Invocation) -> None:
    """`cdc2ch spark-conf`: print the Delta settings of cdc2ch's Spark session for a Spark of one's own."""
    from cdc2ch.commands.sparkconf import render
    from cdc2ch.source.spark.jars import delta_jars_cached, jars_dir
    from cdc2ch.source.spark.session import delta_conf

    if not delta_jars_cached():  # stdout is the settings alone, for $(cdc2ch spark-conf)
        click.echo(f"Fetching the Delta jars from Maven Central into {jars_dir()} (once)...", err=True)
    click.echo(render(delta_conf(), invocation.values["fmt"]))
