"""Run configuration: one frozen value built once by the CLI and passed down."""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cdc2ch.base.errors import ConfigError
from cdc2ch.model.design import TableDesign
from cdc2ch.model.identity import Identity
from cdc2ch.model.tableref import anchored, parse_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_DATABASE = "cdc2ch"
DEFAULT_BATCH_SIZE = 80_000
DEFAULT_MAX_ROWS_PER_READ = 500_000

# The values a choice option accepts; the command line offers the same (see options.py).
READERS = ("spark", "clickhouse", "auto")
WRITERS = ("auto", "driver", "executors")
SWITCH = ("on", "off")
FINAL_MERGE_EVERY = timedelta(
    minutes=1
)  # a service's merges: each partition at most this often (fleet/merges.py)
SCHEMA_CHANGES = ("fail", "resync", "follow")  # follow: renames and drops in place (renames.py)
INITIAL_LOADS = ("auto", "snapshot", "changes")  # how a new pipeline begins (replication/startup/initial.py)
# where a range's changes come from (replication/plan.py origin): the change data feed, the log's file actions
CHANGES_FROM = ("auto", "cdf", "log")


def default_data_dir() -> Path:
    """Where the embedded ClickHouse keeps its files unless --clickhouse says otherwise."""
    if os.environ.get("CDC2CH_HOME"):
        return Path(os.environ["CDC2CH_HOME"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cdc2ch"


def default_dsn() -> str:
    return f"chdb://{default_data_dir() / 'clickhouse'}"


@dataclass(frozen=True)
class TargetName:
    database: str
    table: str

    @classmethod
    def parse(cls, text: str, default_database: str = DEFAULT_DATABASE) -> "TargetName":
        """`db.table` or `table`; a name containing dots can be backquoted: `db`.`my.table`."""
        try:
            parts = _split_dotted(text)
        except ValueError as exc:
            why = f" ({exc})"
        else:
            if len(parts) == 1:
                return cls(default_database, parts[0])
            if len(parts) == 2:
                return cls(parts[0], parts[1])
            why = ""
        raise ConfigError(
            f"--target {text!r} is not a ClickHouse table name{why}. Use `database.table` (or just `table` for "
            f"database {default_database!r}); quote a part that contains dots with backticks, e.g. `db`.`a.b`."
        )

    @classmethod
    def for_source(cls, table: str) -> "TargetName":
        """Default target: the table's own name (the last path segment, or the last part of a catalog
        name: sales.orders -> cdc2ch.orders), in the default database."""
        return cls(DEFAULT_DATABASE, parse_table(table).last)

    def __str__(self) -> str:
        return f"{self.database}.{self.table}"


def _split_dotted(text: str) -> list[str]:
    """Split on dots outside backticks; a doubled backtick inside backticks is a literal one. ValueError
    saying why for text that is no dotted name."""
    parts: list[str] = []
    current, i, quoted_part = "", 0, False
    while i < len(text):
        ch = text[i]
        if ch == "`" and not current and not quoted_part:
            end = i + 1
            while True:
                end = text.find("`", end)
                if end == -1:
                    raise ValueError("a backtick is not closed")
                if text[end + 1 : end + 2] == "`":
                    end += 2
                    continue
                break
            current, quoted_part, i = text[i + 1 : end].replace("``", "`"), True, end + 1
        elif ch == ".":
            parts.append(current)
            current, quoted_part, i = "", False, i + 1
        elif quoted_part:
            raise ValueError(f"{ch!r} follows a backquoted name")
        else:
            current, i = current + ch, i + 1
    parts.append(current)
    if any(not part for part in parts):
        raise ValueError("a part of it is empty")
    return parts


_SECRET_KEY = re.compile(
    r"token|secret|password|credential|access[._-]?key|account\.key|(^|\.)sas(\.|$)", re.I
)


def is_secret_key(key: str) -> bool:
    """A Spark setting whose value must not be shown (a catalog token, a storage key...)."""
    return bool(_SECRET_KEY.search(key))


@dataclass(frozen=True)
class SparkSettings:
    master: str | None = None
    conf: tuple[tuple[str, str], ...] = ()
    connectors: frozenset[str] = frozenset()  # storage connectors the process's tables need (objectstore.py)

    def __repr__(self) -> str:
        shown = tuple((k, "***" if is_secret_key(k) else v) for k, v in self.conf)
        return (
            f"SparkSettings(master={self.master!r}, conf={shown!r}, connectors={sorted(self.connectors)!r})"
        )

    @staticmethod
    def parse_conf(items: tuple[str, ...] | list[str]) -> tuple[tuple[str, str], ...]:
        out = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"--spark-conf {item!r} is not of the form key=value. Pass each Spark setting as its own "
                    f"option, e.g. --spark-conf spark.executor.memory=4g."
                )
            out.append((key.strip(), value))
        return tuple(out)


@dataclass(frozen=True)
class RunConfig:
    table: str
    primary_key: tuple[str, ...]
    target: TargetName
    clickhouse_dsn: str
    pipeline: str
    spark: SparkSettings = field(default_factory=SparkSettings)
    from_version: int | None = None
    from_timestamp: datetime | None = None
    reset: bool = False
    once: bool = False
    poll_interval: float = 5.0
    batch_size: int = DEFAULT_BATCH_SIZE
    max_rows_per_read: int = DEFAULT_MAX_ROWS_PER_READ
    immutable_keys: bool = False
    retries: int = 5
    lock_ttl: float = 60.0
    on_schema_change: str = "fail"
    writer: str = "auto"
    initial_load: str = "auto"
    changes_from: str = "auto"
    # snapshot only
    snapshot_version: int | None = None
    reader: str = "auto"
    # a named collection on the ClickHouse server with the credentials its reader (--reader clickhouse) reads
    # object storage with; None: the server's own S3 settings (the embedded engine: the environment's)
    lake_collection: str | None = None
    # the target table's design (design.py); default: sorted by the primary key, every column as Delta has it
    design: TableDesign = None  # type: ignore[assignment]  # None: __post_init__ sets the default
    # the ClickHouse cluster the target lives on (clickhouse/connection/placement.py); None: one server
    cluster: str | None = None
    # a service compacts the target this often (fleet/upkeep.py), dropping tombstones older than
    # compact_older_than (None: all of them); None: never
    compact_every: timedelta | None = None
    compact_older_than: timedelta | None = None
    # a service merges what FINAL would collapse (fleet/merges.py): each partition of the target at most once
    # this often, once its pipeline is caught up; off: never
    final_merges: str = "on"
    final_merge_every: timedelta = None  # type: ignore[assignment]  # None: __post_init__ sets FINAL_MERGE_EVERY

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", anchored(self.table))
        if not self.primary_key:
            raise ConfigError(
                "--primary-key is required: name the Delta column(s) that identify a row, e.g. id or a,b."
            )
        if len(set(self.primary_key)) != len(self.primary_key):
            raise ConfigError(f"--primary-key {','.join(self.primary_key)} names a column twice.")
        if self.design is None:
            object.__setattr__(self, "design", TableDesign(self.primary_key))
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1 (got {self.batch_size}).")
        if self.max_rows_per_read < self.batch_size:
            object.__setattr__(self, "max_rows_per_read", self.batch_size)
        if self.from_version is not None and self.from_version < 0:
            raise ConfigError(f"--from-version must be 0 or more (got {self.from_version}).")
        if self.from_version is not None and self.from_timestamp is not None:
            raise ConfigError("Give either --from-version or --from-timestamp, not both.")
        if self.lake_collection is not None and not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*", self.lake_collection
        ):
            raise ConfigError(
                f"--lake-collection {self.lake_collection!r} is not a named collection's name: ClickHouse names "
                f"them with letters, digits and underscores, not starting with a digit (CREATE NAMED COLLECTION "
                f"lake_s3 AS access_key_id = '…', secret_access_key = '…')."
            )
        if self.snapshot_version is not None and self.snapshot_version < 0:
            raise ConfigError(f"--version must be 0 or more (got {self.snapshot_version}).")
        for name, choices in (
            ("reader", READERS),
            ("on_schema_change", SCHEMA_CHANGES),
            ("writer", WRITERS),
            ("initial_load", INITIAL_LOADS),
            ("changes_from", CHANGES_FROM),
            ("final_merges", SWITCH),
        ):
            value = getattr(self, name)
            if value not in choices:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be {_either(choices)} (got {value!r}).")
        if self.initial_load == "snapshot" and (self.from_version is not None or self.from_timestamp):
            raise ConfigError(
                "--initial-load snapshot starts a new pipeline with a snapshot of the latest version, and "
                "--from-version/--from-timestamp asks it to replay the change feed from an earlier one: give one."
            )
        # `not (x >= 1)` also refuses nan, which every comparison answers False; inf never ends a wait.
        if not (self.lock_ttl >= 1 and math.isfinite(self.lock_ttl)):
            raise ConfigError(f"--lock-ttl must be at least 1 second (got {self.lock_ttl}), and finite.")
        if not (self.poll_interval > 0 and math.isfinite(self.poll_interval)):
            raise ConfigError(f"--poll-interval must be positive (got {self.poll_interval}), and finite.")
        if self.retries < 1:
            raise ConfigError(
                f"--retries counts attempts per ClickHouse call: at least 1 (got {self.retries})."
            )
        if self.final_merge_every is None:
            object.__setattr__(self, "final_merge_every", FINAL_MERGE_EVERY)
        if self.final_merge_every <= timedelta(0):
            raise ConfigError(
                f"--final-merge-every must be a positive duration such as 30s or 5m (got "
                f"{self.final_merge_every}); --final-merges off turns the merges off."
            )
        self._check_compaction()

    @property
    def merges_final(self) -> bool:
        """Whether a service merges the target between turns (not with --once, nor on a cluster, whose
        Distributed table has no parts of its own)."""
        return self.final_merges == "on" and not self.once and not self.cluster

    def _check_compaction(self) -> None:
        if self.compact_every is None:
            if self.compact_older_than is not None:
                raise ConfigError(
                    "--compact-older-than says which tombstones a scheduled compaction drops, but no "
                    "--compact-every schedules one. Add --compact-every (e.g. 1d), or drop "
                    "--compact-older-than (`cdc2ch compact --older-than` compacts once)."
                )
            return
        if self.compact_every <= timedelta(0):
            raise ConfigError(
                f"--compact-every must be a positive duration such as 1h or 1d (got {self.compact_every}); "
                f"leave it out for no scheduled compaction."
            )
        if self.cluster:
            raise ConfigError(
                f"--compact-every compacts the target on a schedule, and a target on --cluster {self.cluster} "
                f"is a Distributed table, which cdc2ch does not compact yet (its young tombstones would have "
                f"to be set aside on every shard). Drop --compact-every for this pipeline."
            )

    @property
    def identity(self) -> Identity:
        """Which target columns identify a row (identity.py)."""
        return self.design.identity


def _either(choices: tuple[str, ...]) -> str:
    """`a or b`, `a, b or c`."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}"


@dataclass(frozen=True)
class ProcessOptions:
    """What the process needs besides its pipelines: logging, metrics, and where ClickHouse and Spark are
    (which every pipeline of the process shares)."""

    log_format: str
    log_level: str
    clickhouse_dsn: str
    spark: SparkSettings = field(default_factory=SparkSettings)
    cluster: str | None = None
    discover_interval: float = 300.0
    max_parallel: int | None = None  # None: parallel_default()
    max_rows_in_memory: int | None = None  # None: two ranges per worker
    config_path: str | None = None
    metrics_port: int | None = None
    serve: ServeOptions | None = None

    def __post_init__(self) -> None:
        if not (self.discover_interval > 0 and math.isfinite(self.discover_interval)):
            raise ConfigError(
                f"--discover-interval must be a positive number of seconds (got {self.discover_interval})."
            )


@dataclass(frozen=True)
class ServeOptions:
    """`run --serve`: the embedded engine over the ClickHouse HTTP interface (password from the environment)."""

    address: str
    user: str = "default"
    writable: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d+[smhdw])+")
_PART = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str, option: str) -> timedelta:
    """`30s`, `15m`, `12h`, `7d`, `2w` (or several, as in `1d12h`) or `0`."""
    value = (text or "").strip().lower().replace(" ", "")
    if value == "0":
        return timedelta(0)
    if _DURATION.fullmatch(value):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(value))
        try:
            return timedelta(seconds=seconds)
        except OverflowError:
            pass
    raise ConfigError(
        f"{option} {text!r} is not a duration cdc2ch understands. Give a whole number followed by a unit: "
        f"s (seconds), m (minutes), h (hours), d (days) or w (weeks), e.g. 7d or 12h, several together as "
        f"in 1d12h, or 0."
    )


# -- config files -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigFile:
    """A cdc2ch.toml: top-level keys are options for every pipeline, each [[pipelines]] entry names one
    table and may override per-pipeline options. Keys are option names without dashes (`primary-key`;
    `primary_key` works too). Without [[pipelines]] the top level is the one pipeline."""

    path: str
    common: dict[str, Any]
    pipelines: tuple[dict[str, Any], ...]

    @classmethod
    def load(cls, path: str, top_level: Collection[str], entry: Collection[str]) -> "ConfigFile":
        """Read and check a file: `top_level` and `entry` are the keys valid at the top level and in a
        [[pipelines]] entry (options.py knows them)."""
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(
                f"Config file {path} does not exist. Pass the path of a cdc2ch.toml (see deploy/cdc2ch.toml.example)."
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"Config file {path} is not valid TOML: {exc}. Fix the file and run again."
            ) from None
        entries = data.pop("pipelines", None)
        if entries is None:
            entries = [{}]
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise ConfigError(
                f"Config file {path}: `pipelines` must be a list of tables, written as [[pipelines]] sections, "
                f"each with at least `table` and `primary-key`."
            )
        # Every unknown key of the file is reported at once, each with the valid keys closest to it.
        unknown: list[str] = []
        common = _normalized(data, "the top level", set(top_level), unknown)
        # A key valid at the top level but not in an entry concerns the whole process.
        process_wide = set(top_level) - set(entry)
        pipelines = tuple(
            _normalized(e, f"[[pipelines]] entry {i + 1}", set(entry), unknown, process_wide)
            for i, e in enumerate(entries)
        )
        if unknown:
            raise ConfigError(
                f"Config file {path}: {'; '.join(unknown)}. Keys are `cdc2ch run` option names without the "
                f"leading dashes (`cdc2ch run --help` lists them): fix the file and run again."
            )
        return cls(path, common, pipelines)


def _normalized(
    section: dict[str, Any],
    where: str,
    known: set[str],
    unknown: list[str],
    process_wide: Collection[str] = frozenset(),
) -> dict[str, Any]:
    """The section's keys with dashes; each key not `known` is described in `unknown` instead."""
    out = {}
    for key, value in section.items():
        name = key.replace("_", "-")
        if name in known:
            out[name] = value
            continue
        close = difflib.get_close_matches(name, sorted(known))
        elsewhere = [] if close else difflib.get_close_matches(name, sorted(process_wide))
        if name in process_wide:
            hint = " (it concerns the whole process: set it at the top level)"
        elif close or elsewhere:
            hint = f" (did you mean {' or '.join(repr(k) for k in close or elsewhere)}?"
            hint += " It concerns the whole process: set it at the top level)" if elsewhere else ")"
        else:
            hint = ""
        unknown.append(f"unknown key {key!r} in {where}{hint}")
    return out
