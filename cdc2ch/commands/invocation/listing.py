"""Which pipelines an invocation names now: those of its flags or config file, each --table pattern listed
(and listed again, for a service that discovers tables or waits for its first); and where the commands that
address pipelines find them, their targets and their ClickHouse."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

from cdc2ch.base import log as logsetup
from cdc2ch.base.errors import ConfigError
from cdc2ch.base.log import get_logger
from cdc2ch.commands.invocation.options import Invocation, load_config, merge, resolve
from cdc2ch.model.config import ConfigFile, ProcessOptions, RunConfig, TargetName

log = get_logger("cdc2ch")


@dataclass(frozen=True)
class Listed:
    """An invocation's pipelines, its tables listed now."""

    configs: list[RunConfig]
    process: ProcessOptions
    skipped: list  # tables the patterns skip (discovery.Skipped)
    # lists the pipelines again, given those already replicating (None without a pattern)
    again: Callable[[frozenset[str]], tuple[list[RunConfig], list]] | None
    waits: bool = False  # a service of patterns: with no table to follow yet, it waits for one


def configured(
    invocation: Invocation, listed: Listed | None = None
) -> tuple[list[RunConfig], ProcessOptions]:
    """The invocation's pipelines (a pattern's tables listed now) and process options; with no pattern,
    checked before logging is set up. A pattern matching no table that can be followed is refused (a
    service waits instead: see run)."""
    listed = listed or pipelines(invocation)
    configs, process, skipped = listed.configs, listed.process, listed.skipped
    if not configs:
        raise ConfigError(
            f"No table to replicate: the --table pattern matched none that can be followed now "
            f"({len(skipped)} skipped, each named above with why). Fix those tables or the pattern."
        )
    return configs, process


def pipelines(
    invocation: Invocation,
    stop: threading.Event | None = None,
    log_skipped: bool = True,
    file: ConfigFile | None = None,
) -> Listed:
    """The invocation's pipelines, each --table pattern listed now (Spark's start given up on `stop`).
    `log_skipped`: log each table a pattern skips (a command that lists them itself does not). `file`: its
    --config file, when the caller has loaded it already."""
    from cdc2ch.source.spark.session import lazy_session

    items, process = resolve(invocation, file or load_config(invocation))
    if all(isinstance(item, RunConfig) for item in items):
        return Listed([item for item in items if isinstance(item, RunConfig)], process, [], None)
    start_logging(process)
    # skipped tables already logged: a service lists them again and again (None: none logged)
    reported: set[str] | None = set() if log_skipped else None
    spark = lazy_session(process.spark, stop=stop)  # the one session, started once a listing needs it
    configs, skipped = _expand(items, spark, reported)
    once = any(item.values.get("once") for item in items if not isinstance(item, RunConfig))
    return Listed(
        configs,
        process,
        skipped,
        lambda running: _expand(items, spark, reported, running),
        waits=not once,
    )


class Known(NamedTuple):
    """A pipeline as a config file (or the service running it) knows it, whether or not it has run yet."""

    name: str
    target: TargetName
    lock_ttl: float = RunConfig.lock_ttl  # how long its claim counts after its last heartbeat

    @classmethod
    def of(cls, cfg: RunConfig) -> Known:
        return cls(cfg.pipeline, cfg.target, cfg.lock_ttl)


# The values of a command addressing pipelines that `run` reads the same way: where ClickHouse and Spark are.
_SHARED = ("config_path", "clickhouse_dsn", "spark_conf", "spark_master", "log_format", "log_level")


def file_pipelines(
    invocation: Invocation, file: ConfigFile | None = None, named: str | None = None
) -> list[Known] | None:
    """Each pipeline of the invocation's --config file as `run` names them, each pattern's
    tables listed now (a table it skips too, under the name `run` reports it by); None without a file.
    `file`: that file, when the caller has loaded it already. `named`: the one pipeline wanted; an entry of
    that name without a pattern is the answer, and no pattern is listed."""
    if not invocation.values.get("config_path"):
        return None
    from cdc2ch.commands.invocation.catalogue import options_of

    values = {o.param: o.default for o in options_of("run") if not callable(o.default)}
    values.update({k: v for k, v in invocation.values.items() if k in _SHARED}, once=True)
    run = Invocation("run", values, invocation.explicit & set(_SHARED))
    file = file or load_config(run)
    if named is not None:
        entries = [c for c in resolve(run, file)[0] if isinstance(c, RunConfig) and c.pipeline == named]
        if entries:
            return [Known.of(c) for c in entries]
    listed = pipelines(run, log_skipped=False, file=file)
    skipped = [Known(str(s.target), s.target) for s in listed.skipped if s.target is not None]  # no claim
    return [Known.of(c) for c in listed.configs] + skipped


def _expand(items: list, spark, reported: set[str] | None, running: frozenset[str] = frozenset()):
    """The pipelines of `items`, each --table pattern listed now; (pipelines, tables skipped). The tables of
    `running` pipelines are not checked again."""
    from cdc2ch.commands.invocation.options import build_config, check_unique
    from cdc2ch.fleet import discovery
    from cdc2ch.source import open_source
    from cdc2ch.source.tablelisting import LakeTables

    configs, skipped = [], []
    for item in items:
        if isinstance(item, RunConfig):
            configs.append(item)
            continue
        found = discovery.expand(
            item.values, LakeTables(spark), build_config, partial(open_source, spark), running
        )
        said = log.info if reported is not None else log.debug  # a command listing them itself: no line more
        said("pattern_listed", pattern=item.text, tables=len(found.configs), skipped=len(found.skipped))
        configs += found.configs
        skipped += found.skipped
    check_unique(configs, "The pipelines of the --table patterns")
    for s in skipped:
        if reported is not None and s.table not in reported:
            log.warning("table_skipped", pattern=s.pattern, table=s.table, reason=s.reason)
            reported.add(s.table)
    return configs, skipped


def start_logging(process: ProcessOptions) -> None:
    logsetup.configure(process.log_format, process.log_level)


def wait_for_tables(listed: Listed, stop: threading.Event) -> Listed:
    """A service whose patterns match no table it can follow yet (an empty schema, or only tables it skips)
    lists them again every --discover-interval until one appears, rather than exit."""
    interval = listed.process.discover_interval
    assert listed.again is not None  # a service of patterns
    log.warning(
        "waiting_for_tables",
        skipped=len(listed.skipped),
        discover_interval=interval,
        hint="the --table patterns match no table that can be followed yet; they are listed again every "
        "discover interval",
    )
    while not listed.configs and not stop.wait(interval):
        configs, skipped = listed.again(frozenset())
        listed = replace(listed, configs=configs, skipped=skipped)
    return listed


def compact_targets(invocation: Invocation) -> list[TargetName] | None:
    """The tables `compact` compacts: --target's, the --config pipelines' (--pipeline's alone), or None for
    a --pipeline without --config, found in ClickHouse by its records."""
    v = invocation.values
    target, pipeline = v.get("target"), v.get("pipeline_name")
    if target and pipeline:
        raise ConfigError(
            f"--target {target} and --pipeline {pipeline} both name the table to compact: give one of them."
        )
    if target:
        return [TargetName.parse(target)]
    listed = file_pipelines(invocation, named=pipeline)
    if listed is None:
        if pipeline:
            return None
        raise ConfigError(
            "compact needs to know which table: --target database.table, --pipeline NAME (as `cdc2ch status` "
            "shows it) or --config cdc2ch.toml (every pipeline's target)."
        )
    if pipeline is None:
        return [k.target for k in listed]
    return [listed_target(listed, pipeline, v["config_path"])]


def listed_target(listed: list[Known], pipeline: str, path: str) -> TargetName:
    for known in listed:
        if known.name == pipeline:
            return known.target
    raise ConfigError(
        f"--pipeline {pipeline!r} is not in {path}; its pipelines are: {', '.join(k.name for k in listed)}."
    )


def clickhouse_of(invocation: Invocation) -> str:
    """Where the command finds ClickHouse: --clickhouse (or CDC2CH_CLICKHOUSE_URL), else the --config
    file's `clickhouse`, else the default."""
    return merge(invocation, load_config(invocation))[0]["clickhouse_dsn"]
