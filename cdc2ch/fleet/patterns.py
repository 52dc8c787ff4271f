"""Which `--table` values are patterns naming many tables, and the pipeline each matched table becomes: its
name and target from a template, and its primary key from the default or a per-table override.

A pattern is a `--table` with a glob in its last part (`*`, `?`, `[...]`):

- storage: the last path segments, `/lake/sales/*`, `s3a://lake/*/orders_*`; a matched directory is a
  table when it holds `_delta_log/`;
- catalog: the table part of a name, `sales.*`, `main.sales.orders_*`;
- Delta Sharing: `<profile>#<share>.<schema>.*` (one schema's tables) or `<profile>#<share>.*` (every
  table of the share).

Listing what a pattern matches is discovery.py's; this module is pure.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cdc2ch.base.errors import ConfigError
from cdc2ch.model.config import TargetName
from cdc2ch.model.tableref import is_path, is_shared, split_name

STORAGE, CATALOG, SHARING = "storage", "catalog", "sharing"
DEFAULT_TARGET = "cdc2ch.{table}"
_GLOB = re.compile(r"[*?\[]")
_FIELDS = ("table", "schema")


def is_pattern(text: str | None) -> bool:
    """Whether `--table` names many tables: a glob character where a name goes."""
    if not text:
        return False
    t = text.strip()
    if is_shared(t):
        return bool(_GLOB.search(t.rpartition("#")[2]))
    return bool(_GLOB.search(t))


@dataclass(frozen=True)
class Pattern:
    """A parsed pattern. `base` is what is listed: a directory (storage), a schema's name parts (catalog),
    or (profile, share, schema or None) (sharing); `glob` matches a table's name within it (storage: the
    path segments below `base`, each its own glob)."""

    text: str
    kind: str
    base: tuple[str, ...]
    glob: tuple[str, ...]

    def matches(self, name: str) -> bool:
        """Whether a catalog or shared table name matches the glob."""
        return fnmatch.fnmatchcase(name, self.glob[-1])


@dataclass(frozen=True)
class TablePattern:
    """One pipeline entry (or the flags) whose `--table` is a pattern: its merged option values, expanded
    into one pipeline per table once the tables are listed (discovery.expand)."""

    values: Mapping

    @property
    def text(self) -> str:
        return self.values["table"]

    @property
    def pipeline(self) -> str:
        return self.values.get("pipeline") or self.text


@dataclass(frozen=True)
class Match:
    """One table a pattern matches: what `--table` would name it, its own name and its schema's (the
    parent directory of a storage table)."""

    table: str
    name: str
    schema: str


def parse_pattern(text: str) -> Pattern:
    t = text.strip()
    if is_shared(t):
        return _sharing(t)
    if is_path(t):
        return _storage(t)
    return _catalog(t)


def _storage(text: str) -> Pattern:
    head, _, _ = text.partition("://")
    scheme = head + "://" if "://" in text else ""
    segments = text[len(scheme) :].rstrip("/").split("/")
    first = next(i for i, s in enumerate(segments) if _GLOB.search(s))
    base = "/".join(segments[:first]) or "/"
    return Pattern(text, STORAGE, (scheme + base,), tuple(segments[first:]))


def _catalog(text: str) -> Pattern:
    try:
        parts = split_name(text.replace("*", "_STAR_").replace("?", "_QM_"))
    except ValueError as exc:
        raise _refused(text, str(exc)) from None
    parts = [p.replace("_STAR_", "*").replace("_QM_", "?") for p in parts]
    if len(parts) not in (2, 3) or any(_GLOB.search(p) for p in parts[:-1]):
        raise _refused(text, "only the table part of schema.table or catalog.schema.table may hold a glob")
    return Pattern(text, CATALOG, tuple(parts[:-1]), (parts[-1],))


def _sharing(text: str) -> Pattern:
    profile, _, name = text.rpartition("#")
    parts = name.rsplit(".", 2)
    if not profile.strip() or len(parts) < 2 or any(_GLOB.search(p) for p in parts[:-1]) or not all(parts):
        raise _refused(
            text,
            "a shared pattern is <profile>#<share>.<schema>.<glob> or <profile>#<share>.* (every table of "
            "the share)",
        )
    if len(parts) == 2:
        if parts[1] != "*":
            raise _refused(text, "a glob over a whole share is `*`: name the schema to match table names")
        return Pattern(text, SHARING, (profile, parts[0], ""), ("*",))
    return Pattern(text, SHARING, (profile, parts[0], parts[1]), (parts[2],))


def _refused(text: str, why: str) -> ConfigError:
    return ConfigError(
        f"--table {text!r} reads as a pattern of tables, but {why}. Patterns are a path whose last segments "
        f"hold a glob (/lake/sales/*, s3a://lake/sales/orders_*), a catalog name whose table part does "
        f"(sales.*, main.sales.orders_*), or a Delta Sharing name (./p.share#share.schema.*, ./p.share#share.*)."
    )


def target_of(template: str | None, match: Match) -> TargetName:
    """The target of one matched table: `template` (database.table, each part may hold {table} and
    {schema}) filled in; the parts are split before filling, so names with dots stay one part."""
    template = template or DEFAULT_TARGET
    name = TargetName.parse(template)
    try:
        return TargetName(
            name.database.format(table=match.name, schema=match.schema),
            name.table.format(table=match.name, schema=match.schema),
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"--target {template!r} is not a target template: {exc}. With a pattern in --table, --target names "
            f"each table's target as database.table where {{table}} (the table's name) and {{schema}} (its "
            f"schema, or parent directory) are filled in, e.g. analytics.{{table}}."
        ) from None


def key_of(
    name: str, default: tuple[str, ...] | None, keys: Mapping[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """A matched table's primary key: its own in `keys` (by table name), else the default; () for none."""
    return tuple(keys.get(name) or default or ())


def check_targets(pattern: str, matched: Iterable[tuple[Match, TargetName]]) -> None:
    """Refuse two tables that would write into one target, naming both."""
    seen: dict[TargetName, Match] = {}
    for match, target in matched:
        other = seen.setdefault(target, match)
        if other is not match:
            raise ConfigError(
                f"Tables {other.table} and {match.table}, both matched by --table {pattern!r}, would both be "
                f"replicated into {target}. Give --target a template that tells them apart (for example "
                f"{{schema}}_{{table}}), or narrow the pattern. Nothing was written."
            )
