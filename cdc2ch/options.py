"""Every option of every command, declared once.

From this catalogue come each command's click options and environment variables, the keys a cdc2ch.toml
may hold and where, the conversion of TOML values, and the precedence of an option's sources:
flag > environment variable > the pipeline's [[pipelines]] entry > the file's top level > default.
The resolution below is pure: it needs the parsed values and which of them the user set, not click.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import click

from cdc2ch.config import (
    READERS,
    SCHEMA_CHANGES,
    WRITERS,
    ConfigFile,
    ProcessOptions,
    RunConfig,
    ServeOptions,
    SparkSettings,
    TargetName,
    default_dsn,
)
from cdc2ch.errors import ConfigError
from cdc2ch.tableref import parse_table

# Where an option may be set besides the command line and the environment.
PROCESS = "process"  # concerns the whole process: a config file's top level only
PIPELINE = "pipeline"  # each pipeline's own: the top level or a [[pipelines]] entry
TABLE = "table"  # one table's identity: in the file, never a flag or variable together with --config
COMMAND = "command"  # one command's invocation: never in a config file

RUN = frozenset({"run", "validate"})  # validate checks exactly what run would do, so it has run's options
PIPELINES = RUN | {"snapshot", "verify"}
WITH_CONFIG = PIPELINES | {"status"}
WITH_LOGS = WITH_CONFIG | {"compact", "demo"}
WITH_CLICKHOUSE = WITH_CONFIG | {"compact", "query"}

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


@dataclass(frozen=True)
class Option:
    """One option of one or more commands. `name` is its long flag without dashes, which is also its key
    in a config file; `param` the Python parameter name (default: `name` with underscores); `env` its
    environment variable (default: CDC2CH_<NAME>); `parse` a last step after type conversion."""

    name: str
    commands: frozenset[str]
    scope: str
    _: KW_ONLY
    help: str
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
        object.__setattr__(self, "env", self.env or f"CDC2CH_{self.name.upper().replace('-', '_')}")

    @property
    def long_flag(self) -> str:
        return f"--{self.name}"

    def click_attrs(self) -> dict[str, Any]:
        """Keyword arguments of click.Option."""
        attrs: dict[str, Any] = dict(help=self.help, envvar=self.env, show_envvar=True)
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
            parse = self.parse
            attrs["callback"] = lambda ctx, param, value: parse(value)
        return attrs


# One entry per option, in the order a command lists them in its --help. A table, so laid out by hand.
# fmt: off
CATALOGUE: tuple[Option, ...] = (
    # -- options of a single command
    Option("target", {"status"}, COMMAND, help="Only the pipelines writing to this database.table."),
    Option("json", {"status"}, COMMAND, param="as_json", flag=True,
           help="Print JSON (one object per pipeline) instead of a table."),
    Option("max-lag", {"status"}, COMMAND,
           help="Exit with code 2 when any pipeline is behind by more than this: a number of versions (10) "
           "or a time between the latest Delta commit and the last replicated one (90s, 15m, 2h, 1d); stderr "
           "names those behind. A pipeline whose table cannot be read counts as behind. For monitoring checks."),
    Option("repair", {"verify"}, COMMAND, flag=True,
           help="Re-send the keys found different as of the committed version (rows, or tombstones for keys "
           "Delta does not have), versioned so later changes still win; then verify again. Safe while `run` "
           "replicates."),
    Option("json", {"verify"}, COMMAND, param="as_json", flag=True,
           help="Print one JSON object per pipeline instead of a summary."),
    Option("target", {"compact"}, COMMAND, required=True,
           help="The cdc2ch target table to compact, as database.table."),
    Option("older-than", {"compact"}, COMMAND, metavar="DURATION",
           help="Drop only tombstones committed longer ago than this: 30s, 15m, 12h, 7d, 2w (or combined, "
           "1d12h); younger ones stay for incremental readers. Default (or 0): drop every tombstone."),
    Option("json", {"compact"}, COMMAND, param="as_json", flag=True,
           help="Print the counts as one JSON object instead of a summary line."),
    Option("dir", {"demo"}, COMMAND, param="demo_dir", type=click.Path(file_okay=False),
           default="./cdc2ch-demo", show_default=True, env="CDC2CH_DEMO_DIR",
           help="Where the demo writes its Delta table and embedded ClickHouse (recreated on each run)."),
    Option("format", {"query"}, COMMAND, param="fmt", default="PrettyCompactMonoBlock", show_default=True,
           env="CDC2CH_QUERY_FORMAT",
           help="Any ClickHouse output format: PrettyCompact, TSVWithNames, JSONEachRow, CSV... Used for "
           "statements that return rows and name no FORMAT of their own."),
    # -- which pipelines, and where each starts
    Option("config", WITH_CONFIG, COMMAND, param="config_path", type=click.Path(dir_okay=False),
           help="A cdc2ch.toml listing pipelines (table, primary key, target, options) to run in this "
           "process. Any option can be set in it; a flag or environment variable given too takes "
           "precedence."),
    Option("version", {"snapshot"}, COMMAND, param="snapshot_version", type=click.INT,
           env="CDC2CH_SNAPSHOT_VERSION",
           help="The Delta version to load. Default: the latest. `run` then continues at version + 1."),
    Option("from-version", RUN, TABLE, type=click.INT,
           help="First Delta version to replicate when the pipeline has no offset yet. Default: 0."),
    Option("from-timestamp", RUN, TABLE, parse=parse_timestamp,
           help="Like --from-version, but the first version committed at or after this ISO-8601 time."),
    Option("reset", RUN, PIPELINE, flag=True,
           help="Forget the stored offset and start at --from-version/--from-timestamp (default 0)."),
    Option("reset", {"snapshot"}, PIPELINE, flag=True,
           help="Point the pipeline at this snapshot's version even if its stored offset is further on or "
           "belongs to another source."),
    Option("once", RUN, PROCESS, flag=True, help="Catch up to the latest version and exit (for cron)."),
    Option("poll-interval", RUN, PROCESS, type=click.FLOAT, default=_DEFAULT["poll_interval"],
           show_default=True,
           help="Seconds between polls of the Delta log when running continuously; also the first pause "
           "before retrying a failed pipeline (doubling up to 5 minutes)."),
    # -- how each pipeline replicates
    Option("on-schema-change", RUN, PIPELINE, choices=SCHEMA_CHANGES, default=_DEFAULT["on_schema_change"],
           show_default=True,
           help="When Delta drops, renames or narrows a column (added columns and widened types are "
           "followed automatically): fail stops at that version; resync rebuilds the table from a snapshot "
           "and goes on."),
    Option("writer", RUN, PIPELINE, choices=WRITERS, default=_DEFAULT["writer"], show_default=True,
           help="driver: cdc2ch collects each version range and inserts it. executors: Spark tasks insert "
           "their own partitions straight into a ClickHouse server (task retries are deduplicated). auto: "
           "executors on a cluster with a server target, driver otherwise."),
    Option("reader", PIPELINES, PIPELINE, choices=READERS, default=_DEFAULT["reader"], show_default=True,
           help="spark: Spark reads the Delta table (run: its change data feed) and cdc2ch inserts Arrow "
           "batches. clickhouse: ClickHouse reads the Delta files itself in one INSERT ... SELECT FROM "
           "deltaLakeLocal/deltaLake per range (run: with delta_lake_snapshot_start/end_version), several "
           "times faster; needs ClickHouse to reach the lake (local paths for the embedded target, "
           "S3/HTTP(S) with the server's credentials)."),
    Option("immutable-keys", RUN, PIPELINE, flag=True,
           help="Promise that updates never change key columns: update pre-images are not written."),
    Option("metrics-port", RUN, PROCESS, type=click.IntRange(0, 65535),
           help="Serve Prometheus metrics on this port (path /metrics): rows, batches, bytes, batch "
           "seconds, versions and seconds behind, errors by kind, last success, per pipeline."),
    Option("serve", RUN, PROCESS, metavar="HOST:PORT",
           help="Serve the embedded ClickHouse over the ClickHouse HTTP interface while replicating, read-only "
           "unless --serve-writable, so that `cdc2ch status/query` (which find it by themselves), "
           "clickhouse-client, Grafana or clickhouse-connect can read the directory this process holds. "
           "127.0.0.1:8123 for this host only. Password from CDC2CH_SERVE_PASSWORD."),
    Option("serve-user", RUN, PROCESS, default="default", show_default=True,
           help="The user name --serve accepts (with the password from CDC2CH_SERVE_PASSWORD)."),
    Option("serve-writable", RUN, PROCESS, flag=True,
           help="Let --serve clients write (INSERT, DDL, SET) too; by default every statement runs with "
           "ClickHouse's readonly=1."),
    Option("serve-tls-cert", RUN, PROCESS, type=click.Path(dir_okay=False), metavar="PEM",
           help="Serve HTTPS with this certificate (chain) and --serve-tls-key."),
    Option("serve-tls-key", RUN, PROCESS, type=click.Path(dir_okay=False), metavar="PEM",
           help="The private key of --serve-tls-cert."),
    Option("table", PIPELINES, TABLE,
           help="The Delta table: a path or URI (./orders, /lake/orders, s3a://...), or a catalog name "
           "(schema.table or catalog.schema.table, found through Spark's catalog). Required unless a "
           "--config file names the tables."),
    Option("primary-key", PIPELINES, TABLE,
           help="Column(s) identifying a row, comma-separated: id or tenant,id. Becomes the ORDER BY key. "
           "Required with --table."),
    Option("target", PIPELINES, TABLE,
           help="ClickHouse table as database.table. Default: cdc2ch.<last path segment, or name part, of --table>."),
    Option("pipeline", PIPELINES, PIPELINE,
           help="Name under which the offset is stored. Default: the target name. With --config: run only "
           "the pipeline of that name."),
    Option("batch-size", PIPELINES, PIPELINE, type=click.INT, default=_DEFAULT["batch_size"],
           show_default=True, help="Rows per ClickHouse insert."),
    Option("max-rows-per-read", PIPELINES, PIPELINE, type=click.INT, default=_DEFAULT["max_rows_per_read"],
           show_default=True,
           help="run: versions are read together until their estimated change rows reach this; "
           "snapshot: rows per chunk (with Spark, as far as Parquet row groups allow). Bounds memory."),
    Option("retries", PIPELINES, PIPELINE, type=click.INT, default=_DEFAULT["retries"], show_default=True,
           help="Attempts per ClickHouse call on transient errors (exponential backoff) before giving up."),
    Option("lock-ttl", PIPELINES, PIPELINE, type=click.FLOAT, default=_DEFAULT["lock_ttl"],
           show_default=True,
           help="Seconds after its last heartbeat that a vanished runner stops blocking the pipeline (a "
           "dead process on this host is noticed at once). A second runner exits with code 75."),
    # -- the process: logs, Spark, ClickHouse
    Option("log-level", WITH_LOGS, PROCESS, choices=("debug", "info", "warning", "error"), default="info",
           show_default=True, help="Minimum level of log lines."),
    Option("log-format", WITH_LOGS, PROCESS, choices=("console", "json"), default="console",
           show_default=True,
           help="console: readable lines; json: one JSON object per line (for journald, Loki...)."),
    Option("spark-conf", WITH_CONFIG, PROCESS, multiple=True, metavar="KEY=VALUE",
           help="A Spark setting, passed through as is; repeat for several "
           "(e.g. --spark-conf spark.executor.memory=4g)."),
    Option("spark-master", WITH_CONFIG, PROCESS,
           help="Spark master URL (local[*], spark://host:7077, yarn, k8s://...). Default: local[*], "
           "or what spark-submit set."),
    Option("clickhouse", WITH_CLICKHOUSE, PROCESS, param="clickhouse_dsn", default=default_dsn,
           show_default="chdb://~/.local/share/cdc2ch/clickhouse (embedded)", env="CDC2CH_CLICKHOUSE_URL",
           help="Target ClickHouse: chdb:///path for the embedded engine, or http(s)://user@host:8123/db for "
           "a server (password from CDC2CH_CLICKHOUSE_PASSWORD or CDC2CH_CLICKHOUSE_PASSWORD_FILE, never "
           "the URL)."),
)
# fmt: on

# Keys of a config file: every option that is not one command's (that is, `run`'s but --config) at its top
# level; in a [[pipelines]] entry the same but the process-wide ones, and `name` (the pipeline's).
FILE_KEYS = frozenset(o.name for o in CATALOGUE if o.scope != COMMAND)
ENTRY_KEYS = frozenset(o.name for o in CATALOGUE if o.scope in (PIPELINE, TABLE)) | {"name"}


def options_of(command: str) -> list[Option]:
    """The options of one command, in --help order."""
    return [o for o in CATALOGUE if command in o.commands]


def click_options(command: str) -> Callable:
    """A decorator adding the command's options to a click command."""

    def decorate(fn: Callable) -> Callable:
        for option in reversed(options_of(command)):
            fn = click.option(option.long_flag, option.param, **option.click_attrs())(fn)
        return fn

    return decorate


@functools.cache
def _click_option(option: Option) -> click.Option:
    return click.Option([option.long_flag, option.param], **option.click_attrs())


def from_toml(option: Option, value: Any, where: str) -> Any:
    """A config file's value as the option would have parsed it from the command line. `where` names the
    place in the file for errors."""
    try:
        return convert(option, value)
    except click.BadParameter as exc:
        raise ConfigError(f"Config file {where}: {value!r} is not valid: {exc.format_message()}") from None


def convert(option: Option, value: Any) -> Any:
    """A Python value (a config file's, a keyword argument of the Python API) as the option would have parsed
    it from the command line: a list is comma-joined (primary-key = ["tenant", "id"]), a table becomes
    key=value items ([spark-conf]), a date or time its ISO text. Raises click.BadParameter."""
    if isinstance(value, dict) and option.multiple:
        value = [f"{k}={v}" for k, v in value.items()]
    elif isinstance(value, (list, tuple)) and not option.multiple:
        value = ",".join(str(v) for v in value)
    elif isinstance(value, str) and option.multiple:
        value = [value]
    elif isinstance(value, datetime):
        value = value.isoformat()
    converted = _click_option(option).type_cast_value(None, value)
    return option.parse(converted) if option.parse else converted


@dataclass(frozen=True)
class Invocation:
    """A command's option values, by parameter name, and which of them the user set (by flag or
    environment variable) rather than left at their defaults."""

    command: str
    values: Mapping[str, Any]
    explicit: frozenset[str] = frozenset()

    def with_values(self, **values: Any) -> "Invocation":
        """The same invocation with some values fixed by the command itself (not explicit)."""
        return Invocation(self.command, {**self.values, **values}, self.explicit)


def load_config(invocation: Invocation) -> ConfigFile | None:
    """The --config file of the invocation, checked against the keys the catalogue allows; None without."""
    path = invocation.values.get("config_path")
    return ConfigFile.load(path, FILE_KEYS, ENTRY_KEYS) if path else None


def merge(invocation: Invocation, file: ConfigFile | None) -> list[dict[str, Any]]:
    """One dict of values per pipeline of the file (or just the invocation's values without a file), each
    from the first of: flag, environment variable, the pipeline's entry, the top level, the default."""
    if file is None:
        return [dict(invocation.values)]
    mine = {o.name: o for o in options_of(invocation.command) if o.scope != COMMAND}
    for option in mine.values():
        if option.scope == TABLE and option.param in invocation.explicit:
            key = option.name
            raise ConfigError(
                f"--{key} (or {option.env}) sets one table's {key}, but --config {file.path} lists the "
                f"pipelines: set `{key}` in the file's [[pipelines]] entries instead, or drop --config."
            )
    out = []
    for i, entry in enumerate(file.pipelines):
        merged = dict(invocation.values, pipeline=None)
        for key, value in {**file.common, **entry}.items():
            key = "pipeline" if key == "name" else key
            option = mine.get(key)
            # Another command's option, or one given as a flag or variable (--pipeline then selects).
            if option is None or (key != "pipeline" and option.param in invocation.explicit):
                continue
            merged[option.param] = from_toml(
                option, value, f"{file.path}, [[pipelines]] entry {i + 1}, {key}"
            )
        out.append(merged)
    return out


def process_options(values: Mapping[str, Any]) -> ProcessOptions:
    """The process-wide options among one pipeline's merged values."""
    return ProcessOptions(
        log_format=values["log_format"],
        log_level=values["log_level"],
        clickhouse_dsn=values["clickhouse_dsn"],
        spark=_spark(values),
        config_path=values.get("config_path"),
        metrics_port=values.get("metrics_port"),
        serve=ServeOptions(
            values["serve"],
            values.get("serve_user") or "default",
            bool(values.get("serve_writable")),
            values.get("serve_tls_cert"),
            values.get("serve_tls_key"),
        )
        if values.get("serve")
        else None,
    )


def _spark(values: Mapping[str, Any]) -> SparkSettings:
    return SparkSettings(values.get("spark_master"), SparkSettings.parse_conf(values.get("spark_conf") or ()))


_RUN_FIELDS = frozenset(_DEFAULT) - {"table", "primary_key", "target", "pipeline", "spark"}


def build_config(values: Mapping[str, Any]) -> RunConfig:
    """One pipeline's RunConfig from its merged option values."""
    table, primary_key, target = values.get("table"), values.get("primary_key"), values.get("target")
    if not table or not primary_key:
        missing = "--table" if not table else "--primary-key"
        raise ConfigError(
            f"{missing} is required: name the Delta table with --table and the column(s) identifying a row "
            f"with --primary-key (e.g. --table s3a://lake/orders --primary-key id), or pass --config with a "
            f"cdc2ch.toml that lists pipelines."
        )
    ref = parse_table(table)  # a path, a catalog name or a share, else refused here, before anything starts
    if ref.is_shared:
        check_shared(ref, values)
    target_name = TargetName.parse(target) if target else TargetName.for_source(table)
    return RunConfig(
        table=table,
        primary_key=tuple(k.strip() for k in primary_key.split(",") if k.strip()),
        target=target_name,
        pipeline=values.get("pipeline") or str(target_name),
        spark=_spark(values),
        **{k: v for k, v in values.items() if k in _RUN_FIELDS},
    )


def check_shared(ref, values: Mapping[str, Any]) -> None:
    """A Delta Sharing table: its profile readable and current, and a reader that can read it."""
    from cdc2ch.source.sharing import load_profile

    load_profile(ref.profile)
    if values.get("reader") == "clickhouse" or values.get("writer") == "clickhouse":
        raise ConfigError(
            f"--reader clickhouse has ClickHouse read the Delta table's own files, which a Delta Sharing "
            f"recipient cannot reach: {ref.text} is read through the share's pre-signed file URLs by Spark. "
            f"Drop --reader clickhouse (the default, --reader spark, reads shares)."
        )


def resolve(invocation: Invocation, file: ConfigFile | None) -> tuple[list[RunConfig], ProcessOptions]:
    """The RunConfigs of the pipelines to run (with --pipeline and a file: only that one) and the
    process-wide options."""
    merged = merge(invocation, file)
    configs = [build_config(m) for m in merged]
    process = process_options(merged[0])
    if file is None:
        return configs, process
    for attr, what in (("target", "target table"), ("pipeline", "pipeline name")):
        values = [str(getattr(c, attr)) for c in configs]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ConfigError(
                f"Config file {file.path}: {what} {twice[0]!r} is used by more than one pipeline; each "
                f"pipeline needs its own (set `name` and `target` in its [[pipelines]] entry)."
            )
    if "pipeline" in invocation.explicit:
        wanted = invocation.values["pipeline"]
        chosen = [c for c in configs if c.pipeline == wanted]
        if not chosen:
            raise ConfigError(
                f"--pipeline {wanted!r} is not in {file.path}; its pipelines are: "
                f"{', '.join(c.pipeline for c in configs)}."
            )
        configs = chosen
    return configs, process
