"""Command line: the commands and their options (declared in options.py); each hands over to app.py."""

from __future__ import annotations

import functools
import sys

import click
from click.core import ParameterSource

from cdc2ch import __version__
from cdc2ch.base import log, stop
from cdc2ch.base.errors import Cdc2chError, jvm_stopped
from cdc2ch.commands import app
from cdc2ch.commands.invocation.options import Commands, Invocation, click_options

# The commands that stop after the current batch on SIGTERM/SIGINT (app's stop_on_signals): a signal that
# came while the command line was imported stops them cleanly too. The others get the usual handlers back.
CLEAN_STOPS = frozenset({"run", "snapshot", "reshape", "verify"})


def _fail(exc: Cdc2chError) -> None:
    click.echo(log.final(str(exc), exc.exit_code), err=True)
    sys.exit(exc.exit_code)


def handle_errors(fn):
    """A Cdc2chError ends the command with its message and exit code instead of a traceback; so do an
    interruption (exit 130) and Spark's JVM going away. A stop that came while Spark started ends it, exit 0."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Cdc2chError as exc:
            _fail(exc)
        except Exception as exc:  # where Spark's JVM went away outside a translated call, say so
            stopped = jvm_stopped(exc)
            if stopped is None:
                raise
            _fail(stopped)
        except stop.Stopped as exc:  # a stop while Spark started: nothing begun, exit 0
            log.get_logger("cdc2ch").info("stopped", before=str(exc))
            return None
        except KeyboardInterrupt:  # a second SIGTERM/SIGINT while stopping (the first one stops cleanly)
            message = "the range in flight will be replayed by the next run."
            click.echo(log.final(message, 130, kind="interrupted"), err=True)
            sys.exit(130)

    return wrapper


def invocation(ctx: click.Context) -> Invocation:
    """The command's option values, and which of them came from a flag or an environment variable."""
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    explicit = frozenset(name for name in ctx.params if ctx.get_parameter_source(name) in given)
    command = ctx.command.name
    assert command is not None  # every cdc2ch command has one
    return Invocation(command, dict(ctx.params), explicit)


def _current() -> Invocation:
    return invocation(click.get_current_context())


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="cdc2ch")
def main():
    """Keep ClickHouse tables in sync with Delta Lake tables through Delta's Change Data Feed.

    Changes are read with Spark, written in Arrow batches into ReplacingMergeTree tables (soft deletes,
    versioned by the Delta commit), and the offset is kept in ClickHouse so a restart resumes exactly.
    """
    if click.get_current_context().invoked_subcommand not in CLEAN_STOPS:
        stop.release()


@main.command()
@click_options("run")
@handle_errors
def run(**_):
    """Replicate Delta tables' changes into ClickHouse, continuously or --once.

    One table from flags, or every pipeline of a --config file in one process (one Spark session; a failing
    pipeline is reported and retried while the others go on; --once exits 1 if any failed). Resumes from
    the offsets stored in ClickHouse; stops cleanly on SIGTERM/SIGINT after the current batch.
    """
    app.run(_current())


@main.command()
@click_options("snapshot")
@handle_errors
def snapshot(**_):
    """Load a Delta table as of one version (one-off backfill), resumably, then hand over to `run`.

    A snapshot killed midway, started again with the same arguments, continues with the chunks it had not
    finished. Keys alive in ClickHouse but absent from the snapshot are soft-deleted.
    """
    app.snapshot(_current())


@main.command()
@click_options("reshape")
@handle_errors
def reshape(**_):
    """Give a live replica a new design (--order-by, --partition-by, columns, settings) without stopping its
    readers: a side table with the new design is loaded from the committed version and caught up while `run`
    serves the old one, then the two are swapped atomically (EXCHANGE TABLES).

    Pass the pipeline's table, key and target with the complete new design; afterwards run `run` with the same
    design options. Killed at any point, the same command finishes or starts over; the last catch-up and the
    swap wait for a running `run` of the pipeline to stop.
    """
    app.reshape(_current())


@main.command()
@click_options("validate")
@handle_errors
def validate(**_):
    """Check what `run` would do, without writing: the config file, ClickHouse reachability, and for each
    pipeline its Delta table, primary key, change data feed, stored offset and options.

    Exits 0 when everything is ready (WARN lines, such as duplicate keys in a table, included), 2 otherwise.
    """
    app.validate(_current())


@main.command()
@click_options("verify")
@handle_errors
def verify(**_):
    """Prove the target equals its Delta table at the pipeline's committed version: both sides reduced to
    per-bucket row counts and content digests (Spark over Delta, ClickHouse over FINAL), differing buckets
    narrowed down to keys. Prints ok, or the missing, extra and differing keys with the columns that differ.

    Exits 0 when equal, 1 when not. Exact while `run` keeps replicating. --repair re-sends exactly the keys
    that differ, then verifies again.
    """
    app.verify(_current())


@main.command()
@click_options("status")
@handle_errors
def status(**_):
    """Show each pipeline's replication status, one line each in 120 columns (--wide: every column; --format
    json: every field). With --config: the pipelines of that file, each pattern's tables as `run` lists them,
    including any that never ran. --pattern, --failing and --lagging narrow the list down.

    \b
    pipeline, target  the pipeline's name and its ClickHouse table
    committed         the last Delta version written and committed to the target
    behind            versions from it to the Delta table's latest (--wide: latest)
    behind_s          seconds between their commit times
    rows_written      rows written since the pipeline began
    state             ok; paused (by whom, when, why); resync requested; failing: its last error;
                      starting (begun by a service, or claimed; nothing committed yet); has not run yet
    --wide adds       last_success (its last successful turn), verified (the last `cdc2ch verify`: ok or
                      DIFFERS, and when), compacted (the last compaction: when, and the tombstones it
                      removed), paused, initial_load (how it began: snapshot or changes), changes (where
                      its last range's changes came from: cdf, the table's change data feed; log, derived
                      from the data files its commits add and remove), reader (what read it: spark, or
                      clickhouse; what --reader auto chose), source and location (a catalog table's name
                      and where it was found), error
    """
    app.status(_current())


@main.command()
@click_options("compact")
@handle_errors
def compact(**_):
    """Physically remove old tombstones (deleted keys) and superseded row versions from a target table, with
    OPTIMIZE TABLE ... FINAL CLEANUP.

    SELECT ... FINAL returns the same rows before and after; tombstones younger than --older-than are kept
    so that incremental readers still see those deletes. Safe while `cdc2ch run` keeps replicating; an
    interrupted compaction is finished by the next one.
    """
    app.compact(_current())


@main.command()
@click.argument("sql")
@click_options("query")
@handle_errors
def query(**_):
    """Run one SQL statement on the target ClickHouse, as written, and print the result (the way to look
    inside the embedded database). A FORMAT clause in the statement wins over --format."""
    app.query(_current())


@main.command()
@click_options("pause")
@handle_errors
def pause(**_):
    """Pause one pipeline of a running service: within one poll the service stops it after the batch in
    flight (its offset exact) while its other pipelines go on; `cdc2ch status` shows who paused it, when and
    why. A pipeline stays paused across restarts until `cdc2ch resume`."""
    app.lifecycle(_current())


@main.command()
@click_options("resume")
@handle_errors
def resume(**_):
    """Resume a paused pipeline: the service running it goes on from its offset within one poll."""
    app.lifecycle(_current())


@main.command()
@click_options("resync")
@handle_errors
def resync(**_):
    """Rebuild one pipeline's target from a snapshot of the latest Delta version, in a running service: the
    snapshot goes into a side table while the target keeps serving, is swapped in, and replication goes on;
    the service's other pipelines go on meanwhile."""
    app.lifecycle(_current())


@main.command()
@click_options("demo")
@handle_errors
def demo(**_):
    """Build a small Delta table with Spark (inserts, UPDATE, DELETE, MERGE), replicate it into the embedded
    ClickHouse, and print both side by side with the status."""
    app.demo(_current())


@main.command("spark-conf")
@click_options("spark-conf")
@handle_errors
def spark_conf(**_):
    """Print the settings with which cdc2ch's own Spark reads and writes Delta tables (its Delta jars, fetched
    once, and Delta's SQL extension and catalog), for a Spark of your own that writes the tables cdc2ch
    replicates:

    \b
    spark-submit $(cdc2ch spark-conf) write_table.py
    pyspark $(cdc2ch spark-conf)
    cdc2ch spark-conf --format python    # a SparkSession.builder for a script or notebook
    """
    app.spark_conf(_current())


if __name__ == "__main__":
    main()
