"""Options resolved into configurations: each command's click options from the catalogue (catalogue.py), the
conversion of TOML and Python values, and the precedence of an option's sources:
flag > environment variable > the pipeline's [[pipelines]] entry > the file's top level > default.
The resolution below is pure: it needs the parsed values and which of them the user set, not click.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import click

from cdc2ch.base.errors import ConfigError
from cdc2ch.commands.invocation.catalogue import (  # noqa: F401 - the catalogue's names, as callers know them from here
    CATALOGUE,
    COMMAND,
    ENTRY_KEYS,
    FILE_KEYS,
    GROUPS,
    PIPELINE,
    PIPELINES,
    PROCESS,
    RUN,
    TABLE,
    WITH_CLICKHOUSE,
    WITH_CONFIG,
    WITH_LOGS,
    Option,
    options_of,
    parse_timestamp,
)
from cdc2ch.fleet.patterns import TablePattern, is_pattern
from cdc2ch.model import design
from cdc2ch.model.config import ConfigFile, ProcessOptions, RunConfig, ServeOptions, SparkSettings, TargetName
from cdc2ch.model.objectstore import connectors_for
from cdc2ch.model.tableref import anchored, parse_table


def click_options(command: str) -> Callable:
    """A decorator adding the command's options to a click command."""

    def decorate(fn: Callable) -> Callable:
        for option in reversed(options_of(command)):
            fn = click.option(option.long_flag, option.param, **option.click_attrs())(fn)
        return fn

    return decorate


class GroupedHelp(click.Command):
    """A command whose --help lists its options under the catalogue's group headings, in GROUPS order, and
    says once how environment variables and config files name them."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        options = options_of(self.name or "")
        group = {o.param: o.group for o in options}
        sections: dict[str, list[tuple[str, str]]] = {}
        heading = GROUPS[0]
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                heading = group.get(param.name or "", heading)  # --help joins the last group
                sections.setdefault(heading, []).append(record)
        for heading, records in sections.items():
            with formatter.section(heading):
                formatter.write_dl(records)
        named = [o for o in options if o.env == o.derived_env]
        if named:
            text = (
                f"An option can also be set by an environment variable, CDC2CH_ and its name "
                f"({named[0].long_flag}: {named[0].env}), unless another is shown above."
            )
            if any(o.name == "config" for o in options):
                key = next(o.name for o in options if o.scope != COMMAND)
                text += f' In a --config file an option\'s key is its name: {key} = "...".'
            formatter.write_paragraph()
            formatter.write_text(text + " docs/reference/commands.md lists each one in full.")


class Commands(click.Group):
    """cdc2ch's group of commands, each with its options grouped in --help."""

    command_class = GroupedHelp


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
    if isinstance(value, bool) and not option.flag:  # int(True) is 1: a TOML true is no batch size
        raise click.BadParameter(f"{value!r} is a boolean; --{option.name} takes a value.")
    kind = _click_option(option).type
    if isinstance(kind, click.types.IntParamType) and isinstance(value, float) and not value.is_integer():
        raise click.BadParameter(f"{value!r} is not a whole number.")  # int(1.5) is 1, int(inf) raises
    numeric = isinstance(kind, (click.types.IntParamType, click.types.FloatParamType))
    nested = isinstance(value, (list, tuple)) and (
        numeric or any(isinstance(v, (list, tuple, dict)) for v in value)
    )
    if nested or (isinstance(value, dict) and not option.multiple):  # would become text such as "{'a': 1}"
        raise click.BadParameter(
            f"--{option.name} takes {'a number' if numeric else 'a value or a list of values'}, not a table or "
            f"a {'list' if numeric else 'nested list'}."
        )
    if isinstance(value, dict) and option.multiple:
        value = [
            f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in value.items()
        ]
    elif isinstance(value, (list, tuple)) and not option.multiple:
        value = ",".join(str(v) for v in value)
    elif isinstance(value, str) and option.multiple:
        value = [value]
    elif isinstance(value, datetime):
        value = value.isoformat()
    converted = _click_option(option).type_cast_value(None, value)  # type: ignore[arg-type]  # takes ctx=None
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
    option: Option | None
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


def process_options(values: Mapping[str, Any], tables: Sequence[str | None] = ()) -> ProcessOptions:
    """The process-wide options among one pipeline's merged values; `tables`: every pipeline's table (the
    storage connectors Spark needs follow from them), by default that pipeline's."""
    serving = ("serve_tls_cert", "serve_tls_key", "serve_writable")
    given = [f"--{k.replace('_', '-')}" for k in serving if values.get(k)]
    if given and not values.get("serve"):
        raise ConfigError(
            f"{' and '.join(given)} configure what --serve HOST:PORT serves, but --serve is not given: add "
            f"--serve (e.g. --serve 127.0.0.1:8123) or drop {' and '.join(given)}."
        )
    return ProcessOptions(
        log_format=values["log_format"],
        log_level=values["log_level"],
        clickhouse_dsn=values["clickhouse_dsn"],
        spark=_spark(values, tables or (values.get("table"),)),
        cluster=values.get("cluster"),
        discover_interval=values.get("discover_interval") or 300.0,
        max_parallel=values.get("max_parallel"),
        max_rows_in_memory=values.get("max_rows_in_memory"),
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


def _spark(values: Mapping[str, Any], tables: Sequence[str | None]) -> SparkSettings:
    conf = SparkSettings.parse_conf(values.get("spark_conf") or ())
    connectors = connectors_for([t for t in tables if t], dict(conf))
    return SparkSettings(values.get("spark_master"), conf, connectors)


_RUN_FIELDS = frozenset(f.name for f in fields(RunConfig)) - {
    "table",
    "primary_key",
    "target",
    "pipeline",
    "spark",
    "design",
}


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
    if isinstance(target, TargetName):  # one table of a pattern (discovery.expand)
        target_name = target
    else:
        target_name = TargetName.parse(target) if target else TargetName.for_source(table)
    from cdc2ch.model.view import view_name  # (its SQL needs pyarrow, which --help does not load)

    key = design.names(primary_key)
    chosen = table_design(key, values)
    view_name(target_name, chosen.current_view)  # a bad name is refused here, before anything starts
    return RunConfig(
        table=table,
        primary_key=key,
        target=target_name,
        pipeline=values.get("pipeline") or str(target_name),
        spark=_spark(values, (values.get("table"),)),
        design=chosen,
        **{k: v for k, v in values.items() if k in _RUN_FIELDS},
    )


def check_unique(configs: list[RunConfig], where: str) -> None:
    """Refuse two pipelines with one target table or one name."""
    for attr, what in (("target", "target table"), ("pipeline", "pipeline name")):
        values = [str(getattr(c, attr)) for c in configs]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ConfigError(
                f"{where}: {what} {twice[0]!r} is used by more than one pipeline; each pipeline needs its own "
                f"(set `name` and `target` in its [[pipelines]] entry, or a --target template that tells a "
                f"pattern's tables apart)."
            )


def table_design(primary_key: tuple[str, ...], values: Mapping[str, Any]) -> design.TableDesign:
    """The target table's design from the design options among one pipeline's values."""
    if len(set(primary_key)) != len(primary_key):
        raise ConfigError(f"--primary-key {','.join(primary_key)} names a column twice.")
    return design.TableDesign(
        primary_key,
        order_by=design.names(values.get("order_by")),
        partition_by=(values.get("partition_by") or "").strip() or None,
        settings=design.pairs(values.get("table_settings"), "--table-settings", "index_granularity=4096"),
        exclude=design.names(values.get("exclude_columns")),
        rename=design.pairs(values.get("rename_columns"), "--rename-columns", "email=contact_email"),
        types=design.pairs(values.get("column_types"), "--column-types", "city=LowCardinality(String)"),
        codecs=design.pairs(values.get("column_codecs"), "--column-codecs", "payload=ZSTD(3)"),
        current_view=values.get("current_view") or None,
    )


def check_shared(ref, values: Mapping[str, Any]) -> None:
    """A Delta Sharing table: its profile readable and current, and a reader that can read it."""
    from cdc2ch.source.sharing.restclient import load_profile

    load_profile(ref.profile)
    if values.get("reader") == "clickhouse" or values.get("writer") == "clickhouse":
        raise ConfigError(
            f"--reader clickhouse has ClickHouse read the Delta table's own files, which a Delta Sharing "
            f"recipient cannot reach: {ref.text} is read through the share's pre-signed file URLs by Spark. "
            f"Drop --reader clickhouse: the default, --reader auto, reads shares through Spark."
        )


def resolve(
    invocation: Invocation, file: ConfigFile | None
) -> tuple[list[RunConfig | TablePattern], ProcessOptions]:
    """The RunConfigs of the pipelines to run (with --pipeline and a file: only that one), a TablePattern
    where `table` is a pattern (discovery expands it), and the process-wide options."""
    merged = merge(invocation, file)
    # a pattern's local base is anchored now, as a RunConfig's table is: it is listed again and again later
    configs = [
        TablePattern({**m, "table": anchored(m["table"])}) if is_pattern(m.get("table")) else build_config(m)
        for m in merged
    ]
    process = process_options(merged[0], [m.get("table") for m in merged])
    if file is None:
        return configs, process
    check_unique([c for c in configs if isinstance(c, RunConfig)], f"Config file {file.path}")
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
