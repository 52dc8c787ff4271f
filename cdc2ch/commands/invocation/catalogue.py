"""Every option of every command, declared once: its flag, commands, scope, help and parsing.

From this catalogue come each command's click options and environment variables and the keys a cdc2ch.toml
may hold and where (options.py resolves them into configurations).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import KW_ONLY, dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any

import click

from cdc2ch.base.errors import ConfigError
from cdc2ch.model.config import (
    CHANGES_FROM,
    INITIAL_LOADS,
    READERS,
    SCHEMA_CHANGES,
    SWITCH,
    WRITERS,
    RunConfig,
    default_dsn,
    parse_duration,
)
from cdc2ch.model.design import names, pairs

# Where an option may be set besides the command line and the environment.
PROCESS = "process"  # concerns the whole process: a config file's top level only
PIPELINE = "pipeline"  # each pipeline's own: the top level or a [[pipelines]] entry
TABLE = "table"  # one table's identity: in the file, never a flag or variable together with --config
COMMAND = "command"  # one command's invocation: never in a config file

RUN = frozenset({"run", "validate"})  # validate checks exactly what run would do, so it has run's options
PIPELINES = RUN | {"snapshot", "verify", "reshape"}
WITH_CONFIG = PIPELINES | {"status"}
WITH_LOGS = WITH_CONFIG | {"compact", "demo"}
LIFECYCLE = frozenset({"pause", "resume", "resync"})  # requests to a running service (pipeline_requests.py)
WITH_CLICKHOUSE = WITH_CONFIG | LIFECYCLE | {"compact", "query"}

# The headings of --help, in order: what a first run needs, then the rest by what it is about.
BASICS = "Basic options"
FILTERS = "Which pipelines"
START = "Pipeline names and where they start"
MANY = "Many tables (table patterns, config files)"
DESIGN = "The target table's design"
READING = "Reading and writing"
SERVICE = "Running as a service"
SPARK = "Spark"
OUTPUT = "Output and logging"
GROUPS = (BASICS, FILTERS, START, MANY, DESIGN, READING, SERVICE, SPARK, OUTPUT)

# RunConfig's field defaults are the options' defaults.
_DEFAULT = {f.name: f.default for f in fields(RunConfig)}


def parse_timestamp(value: str | None) -> datetime | None:
    """An ISO-8601 time; one without a time zone is UTC."""
    if value is None:
        return None
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO-8601 timestamp such as 2026-11-01T12:00:00Z."
        ) from None
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts


def duration(flag: str) -> Callable[[str | None], timedelta | None]:
    """The parse step of a DURATION option (30s, 15m, 12h, 7d, 2w, 1d12h)."""
    return lambda value: None if value is None else parse_duration(value, flag)


def table_keys(items) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """--primary-keys items (orders=tenant,id) as ((table, key columns), ...)."""
    return tuple(
        (table, names(columns)) for table, columns in pairs(items, "--primary-keys", "orders=tenant,id")
    )


@dataclass(frozen=True)
class Option:
    """One option of one or more commands. `name` is its long flag without dashes, which is also its key
    in a config file; `param` the Python parameter name (default: `name` with underscores); `env` its
    environment variable (default: CDC2CH_<NAME>); `group` its heading in --help (one of GROUPS); `parse` a last
    step after type conversion."""

    name: str
    commands: AbstractSet[str]  # a frozenset once made
    scope: str
    _: KW_ONLY
    help: str
    group: str = ""
    param: str = ""
    type: click.ParamType | None = None
    choices: tuple[str, ...] = ()
    default: Any = None
    flag: bool = False
    multiple: bool = False
    required: bool = False
    show_default: bool | str | None = None
    metavar: str | None = None
    env: str = ""
    parse: Callable[[Any], Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "commands", frozenset(self.commands))
        object.__setattr__(self, "param", self.param or self.name.replace("-", "_"))
        object.__setattr__(self, "env", self.env or self.derived_env)

    @property
    def derived_env(self) -> str:
        return f"CDC2CH_{self.name.upper().replace('-', '_')}"

    @property
    def long_flag(self) -> str:
        return f"--{self.name}"

    def parse_flag(self, value: Any) -> Any:
        """`parse` as click calls it while reading the command line: a refusal is a usage error (exit 2),
        not an exception escaping click."""
        assert self.parse is not None  # the callback click_attrs sets only then
        try:
            return self.parse(value)
        except ConfigError as exc:
            raise click.BadParameter(str(exc)) from None

    def click_attrs(self) -> dict[str, Any]:
        """Keyword arguments of click.Option."""
        # --help states the rule for variables once; only a name that departs from it is shown.
        attrs: dict[str, Any] = dict(
            help=self.help, envvar=self.env, show_envvar=self.env != self.derived_env
        )
        if self.flag:
            attrs["is_flag"] = True
        elif self.choices:
            attrs["type"] = click.Choice(self.choices)
        elif self.type is not None:
            attrs["type"] = self.type
        if self.default is not None:
            attrs["default"] = self.default
        for key in ("multiple", "required", "show_default", "metavar"):
            if getattr(self, key):
                attrs[key] = getattr(self, key)
        if self.parse is not None:
            attrs["callback"] = lambda ctx, param, value: self.parse_flag(value)
        return attrs


# One entry per option; a command's --help lists them by group (GROUPS), each group in this order. A table,
# so laid out by hand.
# fmt: off
CATALOGUE: tuple[Option, ...] = (
    # -- what a first run needs
    Option("table", PIPELINES, TABLE,
           help="The Delta table: a path or URI (./orders, /lake/orders, s3a://...) or a catalog name "
           "(schema.table, catalog.schema.table). Required unless a --config file names the tables. A glob in "
           "its last part names many tables, one pipeline each: /lake/sales/*, sales.orders_*.", group=BASICS),
    Option("primary-key", PIPELINES, TABLE,
           help="Column(s) identifying a row, comma-separated: id or tenant,id. Becomes the ORDER BY key. "
           "Required with --table.", group=BASICS),
    Option("target", PIPELINES, TABLE,
           help="ClickHouse table as database.table. Default: cdc2ch.<last path segment, or name part, of --table>. "
           "With a pattern in --table, a template with {table} and {schema} (default cdc2ch.{table}).",
           group=BASICS),
    # -- options of a single command
    Option("target", {"status"}, COMMAND, help="Only the pipelines writing to this database.table.",
           group=FILTERS),
    Option("pattern", {"status"}, COMMAND, metavar="GLOB",
           help="Only the pipelines whose name, target (database.table) or Delta table matches this glob "
           "(*, ?, [abc]; case-sensitive): 'sales.*', '*orders*', '/lake/eu/*'.", group=FILTERS),
    Option("failing", {"status"}, COMMAND, flag=True,
           help="Only the pipelines whose last attempt failed, tables a --table pattern skipped included.",
           group=FILTERS),
    Option("lagging", {"status"}, COMMAND, metavar="DURATION",
           help="Only the pipelines behind by more than this (30s, 5m, 2h, 1d) between the latest Delta commit "
           "and the last replicated one, or versions behind with no commit time to compare.", group=FILTERS),
    Option("format", {"status"}, COMMAND, param="fmt", choices=("table", "json"), default="table",
           show_default=True, env="CDC2CH_STATUS_FORMAT",
           help="table: aligned columns for a terminal; json: one object per pipeline, with every field.",
           group=OUTPUT),
    Option("json", {"status"}, COMMAND, param="as_json", flag=True, help="The same as --format json.",
           group=OUTPUT),
    Option("wide", {"status"}, COMMAND, flag=True,
           help="Every column (when it last verified and compacted, how it began, the whole source), "
           "however wide; by default the table fits 120 columns.", group=OUTPUT),
    Option("max-lag", {"status"}, COMMAND,
           help="Exit with code 2 when a pipeline listed is behind by more than this (stderr names them): "
           "versions (10) or a time between the latest Delta commit and the last replicated one (90s, 15m, 2h, "
           "1d). A table that cannot be read counts as behind. For monitoring checks.", group=OUTPUT),
    Option("repair", {"verify"}, COMMAND, flag=True,
           help="Re-send the keys found different as of the committed version (rows, or tombstones for keys "
           "Delta does not have), versioned so later changes still win; then verify again. Safe while `run` "
           "replicates.", group=BASICS),
    Option("json", {"verify"}, COMMAND, param="as_json", flag=True,
           help="Print one JSON object per pipeline instead of a summary.", group=OUTPUT),
    Option("target", {"compact"}, COMMAND,
           help="The cdc2ch target table to compact, as database.table.", group=BASICS),
    Option("pipeline", {"compact"}, COMMAND, param="pipeline_name",
           help="The pipeline whose target to compact, by the name `cdc2ch status` shows. With --config and "
           "neither this nor --target: the target of every pipeline of the file.", group=BASICS),
    Option("older-than", {"compact"}, COMMAND, metavar="DURATION",
           help="Drop only tombstones committed longer ago than this: 30s, 15m, 12h, 7d, 2w (or combined, "
           "1d12h); younger ones stay for incremental readers. Default (or 0): drop every tombstone.",
           group=BASICS),
    Option("json", {"compact"}, COMMAND, param="as_json", flag=True,
           help="Print the counts as one JSON object instead of a summary line.", group=OUTPUT),
    Option("pipeline", LIFECYCLE, COMMAND, required=True, param="pipeline_name",
           help="The pipeline, by the name `cdc2ch status` shows (a table pattern's pipelines too).",
           group=BASICS),
    Option("target", LIFECYCLE, COMMAND,
           help="The pipeline's target table (database.table), where pipelines of that name are in several "
           "databases.", group=BASICS),
    Option("reason", {"pause", "resync"}, COMMAND, help="Why: `cdc2ch status` shows it with who asked and when.",
           group=BASICS),
    Option("dir", {"demo"}, COMMAND, param="demo_dir", type=click.Path(file_okay=False),
           default="./cdc2ch-demo", show_default=True, env="CDC2CH_DEMO_DIR",
           help="Where the demo writes its Delta table and embedded ClickHouse (recreated on each run).",
           group=BASICS),
    Option("format", {"query"}, COMMAND, param="fmt", default="PrettyCompactMonoBlock", show_default=True,
           env="CDC2CH_QUERY_FORMAT",
           help="Any ClickHouse output format: PrettyCompact, TSVWithNames, JSONEachRow, CSV... Used for "
           "statements that return rows and name no FORMAT of their own.", group=OUTPUT),
    Option("clickhouse", WITH_CLICKHOUSE, PROCESS, param="clickhouse_dsn", default=default_dsn,
           show_default="chdb://~/.local/share/cdc2ch/clickhouse", env="CDC2CH_CLICKHOUSE_URL",
           help="Target ClickHouse: chdb:///path for the embedded engine, or http(s)://user@host:8123/db for "
           "a server (password from CDC2CH_CLICKHOUSE_PASSWORD or CDC2CH_CLICKHOUSE_PASSWORD_FILE, never "
           "the URL).", group=BASICS),
    Option("once", RUN, PROCESS, flag=True, help="Catch up to the latest version and exit (for cron).",
           group=BASICS),
    Option("format", {"spark-conf"}, COMMAND, param="fmt", choices=("flags", "python"), default="flags",
           show_default=True, env="CDC2CH_SPARK_CONF_FORMAT",
           help="flags: spark-submit/pyspark arguments on one line, for $(cdc2ch spark-conf); python: a "
           "SparkSession.builder with the same settings, for a script run by python or a notebook.", group=BASICS),
    # -- which pipelines, and where each starts
    Option("config", WITH_CLICKHOUSE, COMMAND, param="config_path", type=click.Path(dir_okay=False),
           help="A cdc2ch.toml listing pipelines (table, primary key, target, options): the pipelines `run` "
           "replicates, and where every other command finds them and their ClickHouse. Any option can be set "
           "in it; a flag or environment variable given too takes precedence.", group=BASICS),
    Option("version", {"snapshot"}, COMMAND, param="snapshot_version", type=click.INT,
           env="CDC2CH_SNAPSHOT_VERSION",
           help="The Delta version to load. Default: the latest. `run` then continues at version + 1.",
           group=START),
    Option("from-version", RUN, TABLE, type=click.INT,
           help="First Delta version to replicate when the pipeline has no offset yet. Default: 0.",
           group=START),
    Option("from-timestamp", RUN, TABLE, parse=parse_timestamp,
           help="Like --from-version, but the first version committed at or after this ISO-8601 time.",
           group=START),
    Option("reset", RUN, PIPELINE, flag=True,
           help="Forget the stored offset and start at --from-version/--from-timestamp (default 0).",
           group=START),
    Option("initial-load", RUN, PIPELINE, choices=INITIAL_LOADS, default=_DEFAULT["initial_load"],
           show_default=True,
           help="How a new pipeline (no stored offset) begins. snapshot: load the latest version, then follow "
           "the change feed. changes: replay the change feed from version 0 (refused where it cannot). auto: a "
           "snapshot where the feed cannot replay the whole history or would write over twice the rows the "
           "table holds (and a million more), else changes. --from-version/--from-timestamp mean changes.",
           group=START),
    Option("changes-from", RUN, PIPELINE, choices=CHANGES_FROM, default=_DEFAULT["changes_from"],
           show_default=True,
           help="Where each range's changes come from. cdf: the table's Change Data Feed (refused where it was "
           "not recorded). log: derived from the data files each commit of the Delta log adds and removes, "
           "with their deletion vectors: for tables without a feed. auto: the feed for the versions it covers, "
           "the log for the others (before the feed was enabled, or a table without one).",
           group=START),
    Option("reset", {"snapshot"}, PIPELINE, flag=True,
           help="Point the pipeline at this snapshot's version even if its stored offset is further on or "
           "belongs to another source.", group=START),
    Option("poll-interval", RUN, PROCESS, type=click.FLOAT, default=_DEFAULT["poll_interval"],
           show_default=True,
           help="Seconds between polls of the Delta log when running continuously; also the first pause "
           "before retrying a failed pipeline (doubling up to 5 minutes).", group=SERVICE),
    Option("discover-interval", RUN, PROCESS, type=click.FLOAT, default=300.0, show_default=True,
           metavar="SECONDS",
           help="With a pattern in --table, seconds between listings of the tables it matches while running: "
           "new tables get their pipeline, tables gone are let go of (their targets stay).", group=MANY),
    Option("max-parallel", RUN, PROCESS, type=click.IntRange(min=1), metavar="N",
           help="How many pipelines replicate at once, on the one Spark session and ClickHouse target. "
           "Default: the cores Spark runs on locally (at least 2); four times as many when every pipeline has "
           "--reader clickhouse or auto. Long loads never take them all.", group=MANY),
    Option("max-rows-in-memory", RUN, PROCESS, type=click.IntRange(min=1), metavar="ROWS",
           help="Rows all pipelines together may hold in memory (each range or snapshot chunk counts its "
           "estimated rows until written). Default: two ranges of --max-rows-per-read per --max-parallel worker "
           "(with --reader clickhouse or auto: per core).", group=READING),
    # -- how each pipeline replicates
    Option("on-schema-change", RUN, PIPELINE, choices=SCHEMA_CHANGES, default=_DEFAULT["on_schema_change"],
           show_default=True,
           help="When Delta drops, renames or narrows a column (added columns and widened types are always "
           "followed). fail: stop at that version; resync: rebuild the table from a snapshot and go on; "
           "follow: rename or drop the column in place (tables with column mapping), else stop as fail.",
           group=READING),
    Option("writer", RUN, PIPELINE, choices=WRITERS, default=_DEFAULT["writer"], show_default=True,
           help="driver: cdc2ch inserts each version range. executors: Spark tasks insert their own "
           "partitions straight into a ClickHouse server. auto: executors on a cluster with a server target, "
           "driver otherwise.", group=READING),
    Option("reader", PIPELINES, PIPELINE, choices=READERS, default=_DEFAULT["reader"], show_default=True,
           help="spark: Spark reads the Delta table and cdc2ch inserts Arrow batches. clickhouse: ClickHouse "
           "reads the Delta files itself, several times faster, where it reaches them (local paths on the "
           "embedded engine, S3/HTTP(S) on a server). auto: clickhouse for a table it reads exactly as "
           "Spark does, local on the embedded engine or on S3 with credentials it holds (--lake-collection on a "
           "server) once a probe shows it reads the table's rows; spark otherwise.", group=READING),
    Option("lake-collection", PIPELINES, PIPELINE, metavar="NAME",
           help="With --reader clickhouse or auto on a ClickHouse server: the server's named collection holding the "
           "object-storage credentials (CREATE NAMED COLLECTION NAME AS access_key_id = ..., "
           "secret_access_key = ...). Default: the server's own S3 settings.", group=READING),
    Option("immutable-keys", RUN, PIPELINE, flag=True,
           help="Promise that updates never change key columns: update pre-images are not written.",
           group=READING),
    Option("metrics-port", RUN, PROCESS, type=click.IntRange(0, 65535),
           help="Serve Prometheus metrics on this port (path /metrics): rows, batches, lag, errors by kind, "
           "last success, per pipeline.", group=SERVICE),
    Option("serve", RUN, PROCESS, metavar="HOST:PORT",
           help="Serve the embedded ClickHouse over HTTP while replicating (127.0.0.1:8123: this host only), "
           "read-only unless --serve-writable, for `cdc2ch status/query`, clickhouse-client or Grafana. "
           "Password from CDC2CH_SERVE_PASSWORD.", group=SERVICE),
    Option("serve-user", RUN, PROCESS, default="default", show_default=True,
           help="The user name --serve accepts (with the password from CDC2CH_SERVE_PASSWORD).", group=SERVICE),
    Option("serve-writable", RUN, PROCESS, flag=True,
           help="Let --serve clients write (INSERT, DDL, SET) too; by default every statement runs with "
           "ClickHouse's readonly=1.", group=SERVICE),
    Option("serve-tls-cert", RUN, PROCESS, type=click.Path(dir_okay=False), metavar="PEM",
           help="Serve HTTPS with this certificate (chain) and --serve-tls-key.", group=SERVICE),
    Option("serve-tls-key", RUN, PROCESS, type=click.Path(dir_okay=False), metavar="PEM",
           help="The private key of --serve-tls-cert.", group=SERVICE),
    Option("primary-keys", PIPELINES, TABLE, multiple=True, metavar="TABLE=COLUMNS", parse=table_keys,
           help="With a pattern in --table: one table's own primary key, orders=tenant,id (repeat for "
           "several; in a config file primary-keys = { orders = [\"tenant\", \"id\"] }). Tables not named take "
           "--primary-key; a table with neither is skipped and reported.", group=MANY),
    # -- the target table's design (design.py)
    Option("order-by", PIPELINES, PIPELINE, metavar="COLUMNS",
           help="The target's sorting key (ORDER BY), comma-separated Delta columns that hold every "
           "primary-key column: city,id puts rows of a city together. Default: the primary key.", group=DESIGN),
    Option("partition-by", PIPELINES, PIPELINE, metavar="EXPR",
           help="A ClickHouse PARTITION BY expression over the target's columns, e.g. toYYYYMM(created_at).",
           group=DESIGN),
    Option("table-settings", PIPELINES, PIPELINE, multiple=True, metavar="KEY=VALUE",
           help="A ClickHouse table setting of the target (index_granularity=4096, storage_policy=hot); "
           "repeat for several.", group=DESIGN),
    Option("exclude-columns", PIPELINES, PIPELINE, metavar="COLUMNS",
           help="Delta columns never written to ClickHouse, not even in tombstones (PII), comma-separated. "
           "Key, sorting and partition columns cannot be excluded.", group=DESIGN),
    Option("rename-columns", PIPELINES, PIPELINE, multiple=True, metavar="OLD=NEW",
           help="Target names for Delta columns: email=contact_email (comma-separated or repeated).",
           group=DESIGN),
    Option("column-types", PIPELINES, PIPELINE, multiple=True, metavar="COLUMN=TYPE",
           help="A ClickHouse type to store a column as, where it holds every Delta value: "
           "city=LowCardinality(Nullable(String)), n=Int64. A type that would lose values (or NULLs) is refused.",
           group=DESIGN),
    Option("column-codecs", PIPELINES, PIPELINE, multiple=True, metavar="COLUMN=CODEC",
           help="Compression codecs of a column: payload=ZSTD(3), ts=Delta, ZSTD (repeat per column).",
           group=DESIGN),
    Option("current-view", PIPELINES, PIPELINE, metavar="NAME",
           help="The view cdc2ch keeps over the target showing its current rows, without FINAL to remember: "
           "point BI tools at it. NAME, or database.NAME; none for no view. Default: <target>_current.",
           group=DESIGN),
    Option("compact-every", RUN, PIPELINE, metavar="DURATION", parse=duration("--compact-every"),
           help="While running, compact the target this often (30m, 6h, 1d...) as `cdc2ch compact` does, "
           "between two turns of its pipeline. Default: never.", group=SERVICE),
    Option("compact-older-than", RUN, PIPELINE, metavar="DURATION", parse=duration("--compact-older-than"),
           help="With --compact-every: drop only tombstones committed longer ago than this (7d); younger ones "
           "stay for incremental readers. Default (or 0): every tombstone.", group=SERVICE),
    Option("final-merges", RUN, PIPELINE, choices=SWITCH, default=_DEFAULT["final_merges"], show_default=True,
           help="While running, merge the target's parts that SELECT ... FINAL (and the current view) would "
           "otherwise collapse at each query: a partition at a time, between two turns of its pipeline once "
           "it is caught up, one merge at a time per process. off: never.", group=SERVICE),
    Option("final-merge-every", RUN, PIPELINE, metavar="DURATION", parse=duration("--final-merge-every"),
           help="With --final-merges on: merge each partition at most this often (30s, 5m...); merges also "
           "take at most a tenth of a pipeline's time. Default: 1m.", group=SERVICE),
    Option("pipeline", PIPELINES, PIPELINE,
           help="Name under which the offset is stored. Default: the target name. With --config: run only "
           "the pipeline of that name.", group=START),
    Option("batch-size", PIPELINES, PIPELINE, type=click.INT, default=_DEFAULT["batch_size"],
           show_default=True, help="Rows per ClickHouse insert, about (equal inserts of 0.5-1.5 times it).",
           group=READING),
    Option("max-rows-per-read", PIPELINES, PIPELINE, type=click.INT, default=_DEFAULT["max_rows_per_read"],
           show_default=True,
           help="run: versions are read together until their estimated change rows reach this; "
           "snapshot: rows per chunk (with Spark, as far as Parquet row groups allow). Bounds memory.",
           group=READING),
    Option("retries", PIPELINES, PIPELINE, type=click.INT, default=_DEFAULT["retries"], show_default=True,
           help="Attempts per ClickHouse call on transient errors (exponential backoff) before giving up.",
           group=READING),
    Option("lock-ttl", PIPELINES, PIPELINE, type=click.FLOAT, default=_DEFAULT["lock_ttl"],
           show_default=True,
           help="Seconds after its last heartbeat that a vanished runner stops blocking the pipeline (a "
           "dead process on this host is noticed at once). A second runner exits with code 75.", group=SERVICE),
    # -- the process: logs, Spark, ClickHouse
    Option("log-level", WITH_LOGS, PROCESS, choices=("debug", "info", "warning", "error"), default="info",
           show_default=True, help="Minimum level of log lines.", group=OUTPUT),
    Option("log-format", WITH_LOGS, PROCESS, choices=("console", "json"), default="console",
           show_default=True,
           help="console: readable lines; json: one JSON object per line (for journald, Loki...).", group=OUTPUT),
    Option("spark-conf", WITH_CONFIG, PROCESS, multiple=True, metavar="KEY=VALUE",
           help="A Spark setting, passed through as is; repeat for several "
           "(e.g. --spark-conf spark.executor.memory=4g).", group=SPARK),
    Option("spark-master", WITH_CONFIG, PROCESS,
           help="Spark master URL (local[*], spark://host:7077, yarn, k8s://...). Default: local[*], "
           "or what spark-submit set.", group=SPARK),
    Option("cluster", PIPELINES, PROCESS, metavar="NAME",
           help="The ClickHouse cluster (of the server's remote_servers) to put the targets on: replicated "
           "tables behind a Distributed table sharded by the primary key, DDL ON CLUSTER. Not for the embedded "
           "engine, nor for ClickHouse Cloud (its tables replicate as they are).", group=DESIGN),
)
# fmt: on

# Keys of a config file: every option that is not one command's (that is, `run`'s but --config) at its top
# level; in a [[pipelines]] entry the same but the process-wide ones, and `name` (the pipeline's).
FILE_KEYS = frozenset(o.name for o in CATALOGUE if o.scope != COMMAND)
ENTRY_KEYS = frozenset(o.name for o in CATALOGUE if o.scope in (PIPELINE, TABLE)) | {"name"}


def options_of(command: str) -> list[Option]:
    """The options of one command, in --help order: by group, then as the catalogue lists them."""
    mine = [o for o in CATALOGUE if command in o.commands]
    return sorted(mine, key=lambda o: GROUPS.index(o.group) if o.group in GROUPS else len(GROUPS))
