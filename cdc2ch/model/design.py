"""A target table's design, as the user chose it: sorting key, partition expression and table settings, and
which Delta columns reach it under which names, types and codecs.

One frozen value built with the configuration. Column options name Delta's columns; --partition-by is
ClickHouse SQL over the target's columns (renamed ones by their new names). The row identity that follows
from the design is `identity` (identity.py), in target names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cdc2ch.base.errors import ConfigError
from cdc2ch.model.identity import Identity

# Settings every target table gets unless the user sets them: replays are dropped on arrival; and merges
# take the vertical algorithm (the key and version columns first, then one column at a time) wherever
# ClickHouse allows it, not only from 11 columns besides the key. A target receives a backlog in many
# parts of about a batch each, which the engine merges while more arrive: with every column at once, its
# read buffers for each part and column held 110-180 MiB more at the peak of a 20M-row load, and the load
# ran 13-15 % longer (bench/results.md).
DEFAULT_SETTINGS = (
    ("non_replicated_deduplication_window", "10000"),
    ("vertical_merge_algorithm_min_columns_to_activate", "1"),
)
_SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"-?\d+(\.\d+)?")

Pairs = tuple[tuple[str, str], ...]


def split_top(text: str) -> list[str]:
    """Split a comma-separated list on the commas outside parentheses and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'`\"":
            quote = ch
        elif ch in "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """`a,b` (or a list of such) as a tuple of names."""
    items = [value] if isinstance(value, str) else list(value or ())
    return tuple(n.strip() for item in items for n in item.split(",") if n.strip())


def pairs(value: str | Iterable[str] | None, flag: str, example: str) -> Pairs:
    """`k=v,k2=v2` items (repeatable) as ((k, v), ...); a piece without `=` continues the value before it, so
    a codec list or a type with commas needs no quoting: `ts=Delta, ZSTD(3)`."""
    items = [value] if isinstance(value, str) else list(value or ())
    out: list[list[str]] = []
    for item in items:
        for piece in split_top(item):
            key, sep, rest = piece.partition("=")
            if sep and key.strip() and "(" not in key:
                out.append([key.strip(), rest.strip()])
            elif out:
                out[-1][1] += ", " + piece
            else:
                raise ConfigError(f"{flag} {item!r} is not of the form column=value (e.g. {flag} {example}).")
    for key, v in out:
        if not v:
            raise ConfigError(f"{flag} gives {key!r} no value (e.g. {flag} {example}).")
    keys = [k for k, _ in out]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"{flag} names {twice[0]!r} twice; give each column one value.")
    return tuple((k, v) for k, v in out)


def setting_sql(key: str, value: str) -> str:
    """`key = value`, the value as a number or a string literal (already quoted ones as they are)."""
    if _NUMBER.fullmatch(value) or (value.startswith("'") and value.endswith("'") and len(value) > 1):
        return f"{key} = {value}"
    return f"{key} = '" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class TableDesign:
    primary_key: tuple[str, ...]  # Delta names
    order_by: tuple[str, ...] = ()  # Delta names; empty: the primary key
    partition_by: str | None = None  # ClickHouse expression over target names
    settings: Pairs = ()  # ClickHouse table settings
    exclude: tuple[str, ...] = ()  # Delta columns never read into ClickHouse
    rename: Pairs = ()  # (Delta name, target name)
    types: Pairs = ()  # (Delta name, ClickHouse type)
    codecs: Pairs = ()  # (Delta name, codec list)
    current_view: str | None = None  # the current-state view (view.py): None <target>_current, "none" none
    identity: Identity = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for key, value in self.settings:
            if not _SETTING.fullmatch(key) or not value:
                raise ConfigError(
                    f"--table-settings {key}={value} is not a ClickHouse table setting of the form name=value "
                    f"(e.g. --table-settings index_granularity=4096)."
                )
        kept = set(self.primary_key) | set(self.order_by)
        bad = [c for c in self.exclude if c in kept]
        if bad:
            raise ConfigError(
                f"--exclude-columns names {', '.join(bad)}, which the target needs to identify a row (primary "
                f"key or --order-by). Exclude other columns, or choose another key."
            )
        dropped = [c for c, _ in (*self.rename, *self.types, *self.codecs) if c in self.exclude]
        if dropped:
            raise ConfigError(
                f"Column {dropped[0]!r} is excluded by --exclude-columns and also renamed, typed or given a "
                f"codec; an excluded column is not in the target at all. Drop one of the two options."
            )
        targets = [self.target_name(c) for c in self.primary_key + self.order_by]
        identity = Identity.of(
            targets[: len(self.primary_key)], targets[len(self.primary_key) :], self.partition_by
        )
        news = [new for _, new in self.rename]
        if len(set(news)) != len(news):
            raise ConfigError(f"--rename-columns gives two columns the same name: {', '.join(news)}.")
        object.__setattr__(self, "identity", identity)

    # -- names ------------------------------------------------------------------------------------
    def target_name(self, delta_name: str) -> str:
        return dict(self.rename).get(delta_name, delta_name)

    def source_name(self, target_name: str) -> str:
        return {new: old for old, new in self.rename}.get(target_name, target_name)

    @property
    def reshapes(self) -> bool:
        """Whether rows need reshaping on their way to ClickHouse (columns left out or renamed)."""
        return bool(self.exclude or self.rename)

    def check_columns(self, delta_columns: list[str], where: str) -> None:
        """Refuse options naming columns the Delta table (`where`) does not have, and renames that clash (a
        missing primary-key column is schema.column_types' to say)."""
        have = set(delta_columns)
        named = [
            ("--order-by", self.order_by),
            ("--exclude-columns", self.exclude),
            ("--rename-columns", tuple(c for c, _ in self.rename)),
            ("--column-types", tuple(c for c, _ in self.types)),
            ("--column-codecs", tuple(c for c, _ in self.codecs)),
        ]
        for flag, cols in named:
            missing = [c for c in cols if c not in have]
            if missing:
                raise ConfigError(
                    f"{flag} names column(s) {', '.join(map(repr, missing))}, which {where} does not have; its "
                    f"columns are: {', '.join(delta_columns)}. Use the Delta table's column names "
                    f"(case-sensitive)."
                )
        kept = [self.target_name(c) for c in delta_columns if c not in self.exclude]
        clash = sorted({n for n in kept if kept.count(n) > 1})
        if clash:
            raise ConfigError(
                f"--rename-columns gives column {clash[0]!r} a name another column of {where} has. Choose a "
                f"name no other column uses."
            )
        unknown = [c for c in self.identity.partition_columns if c not in kept]
        if unknown:
            raise ConfigError(
                f"--partition-by {self.partition_by} reads {', '.join(map(repr, unknown))}, which is not a "
                f"column of the target table (from {where}: {', '.join(kept)}). Name target columns (renamed "
                f"ones by their new name, excluded ones cannot be used)."
            )

    def checked_schema(self, schema_json: dict[str, Any], where: str = "the Delta table") -> dict[str, Any]:
        """project_schema, after checking the options' columns against the schema (a table's latest one: an
        older version may lack a column added since)."""
        from cdc2ch.model.contract import CDF_COLUMNS

        self.check_columns([f["name"] for f in schema_json["fields"] if f["name"] not in CDF_COLUMNS], where)
        return self.project_schema(schema_json)

    def project_schema(self, schema_json: dict[str, Any]) -> dict[str, Any]:
        """A Spark JSON schema as the target sees it: excluded fields left out, renamed ones renamed."""
        if not self.reshapes:
            return schema_json
        fields = [
            {**f, "name": self.target_name(f["name"])}
            for f in schema_json["fields"]
            if f["name"] not in self.exclude
        ]
        return {**schema_json, "fields": fields}

    # -- DDL ----------------------------------------------------------------------------------------
    def codec(self, target_column: str) -> str | None:
        return dict(self.codecs).get(self.source_name(target_column))

    def chosen_type(self, target_column: str) -> str | None:
        return dict(self.types).get(self.source_name(target_column))

    def table_settings(self, nullable_key: bool) -> Pairs:
        """The table's settings: the defaults, allow_nullable_key where an identity column is Nullable, then
        the user's (which win)."""
        mine = dict(self.settings)
        base = DEFAULT_SETTINGS + ((("allow_nullable_key", "1"),) if nullable_key else ())
        return tuple((k, v) for k, v in base if k not in mine) + self.settings

    def describe(self) -> dict[str, Any]:
        """The design as `status` and logs show it (only what differs from the defaults)."""
        out: dict[str, Any] = {}
        if self.identity.order_by != self.identity.primary_key:
            out["order_by"] = list(self.identity.order_by)
        for key, value in (
            ("partition_by", self.partition_by),
            ("settings", dict(self.settings)),
            ("exclude", list(self.exclude)),
            ("rename", dict(self.rename)),
            ("types", dict(self.types)),
            ("codecs", dict(self.codecs)),
            ("current_view", self.current_view),
        ):
            if value:
                out[key] = value
        return out
