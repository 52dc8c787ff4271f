"""What a table pattern matches now, and which of those tables can be followed: local directories are listed
by Python, other storage through Hadoop's FileSystem (with the credentials Spark reads with), catalog schemas
through Spark's catalog, shares through the sharing server's listings. A table that cannot be followed is
skipped with its reason."""

from __future__ import annotations

import fnmatch
import functools
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.fleet import patterns
from cdc2ch.fleet.patterns import Match, Pattern
from cdc2ch.fleet.serviceports import TableListing
from cdc2ch.model import schema
from cdc2ch.model.changeset import FEED
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.design import names
from cdc2ch.model.tableref import DELTA_LOG, display_name, is_local, normalize_uri
from cdc2ch.replication import plan
from cdc2ch.replication.ports import ChangeSource
from cdc2ch.replication.projection import designed_source


@dataclass(frozen=True)
class Skipped:
    """A table a pattern matched that is not replicated, and why (the whole paragraph)."""

    pattern: str
    table: str
    reason: str
    target: TargetName | None = None  # where it would go: its pipeline's name, under which `status` shows it


@dataclass(frozen=True)
class Expanded:
    configs: list[RunConfig]
    skipped: list[Skipped]


def list_matches(pattern: Pattern, tables: TableListing) -> tuple[list[Match], list[Match]]:
    """The tables `pattern` matches now, and the matched directories that are not Delta tables; by name."""
    why = f"listing the tables --table {pattern.text!r} matches"
    if pattern.kind == patterns.STORAGE:
        local = _local(pattern)
        if local is not None:
            return local
        found: list[Match] = []
        others: list[Match] = []
        for table, name, parent, delta in tables.directories(pattern.text, why):
            (found if delta else others).append(Match(table, name, parent))
        return sorted(found, key=lambda m: m.table), sorted(others, key=lambda m: m.table)
    if pattern.kind == patterns.CATALOG:
        try:
            names = tables.catalog(pattern.base, f"{why} in Spark's catalog")
        except Exception as exc:  # Spark's AnalysisException: no such schema, no catalog
            raise ConfigError(
                f"--table {pattern.text!r}: Spark's catalog cannot list schema {display_name(pattern.base)} "
                f"({str(exc).splitlines()[0][:300]}). Check the schema's name and the catalog's settings "
                f"(--spark-conf)."
            ) from None
        return [
            Match(display_name((*pattern.base, n)), n, pattern.base[-1])
            for n in sorted(names)
            if pattern.matches(n)
        ], []
    profile, share, schema_name = pattern.base
    return [
        Match(f"{profile}#{share}.{s}.{t}", t, s)
        for s, t in sorted(tables.shared(profile, share, schema_name))
        if pattern.matches(t)
    ], []


def _local(pattern: Pattern) -> tuple[list[Match], list[Match]] | None:
    """A local directory's pattern listed by Python, as Hadoop's glob lists it, without a JVM; None for
    other storage, or a glob using Hadoop's own syntax ({a,b}, [^a], escapes), which Hadoop lists."""
    if not is_local(pattern.base[0]) or any("{" in g or "[^" in g or "\\" in g for g in pattern.glob):
        return None
    level = [normalize_uri(pattern.base[0])]
    for glob in pattern.glob:  # one path segment at a time, directories only
        below = []
        for directory in level:
            try:
                entries = list(os.scandir(directory))
            except OSError:  # missing, not a directory, not readable: nothing matches there
                continue
            below += [e.path for e in entries if fnmatch.fnmatchcase(e.name, glob) and e.is_dir()]
        level = below
    found: list[Match] = []
    others: list[Match] = []
    for path in level:
        match = Match(path, os.path.basename(path), os.path.basename(os.path.dirname(path)))
        (found if os.path.isdir(os.path.join(path, DELTA_LOG)) else others).append(match)
    return sorted(found, key=lambda m: m.table), sorted(others, key=lambda m: m.table)


def expand(
    values: Mapping[str, Any],
    tables: TableListing,
    build: Callable[[Mapping[str, Any]], RunConfig],
    open_source: Callable[[str], ChangeSource],
    running: Collection[str] = (),
) -> Expanded:
    """The pipelines of one pattern's option values: one per matched table that can be followed (its
    `table`, `primary_key` and `target` filled in, then `build`), and the tables skipped with why. The
    pipelines named in `running` are replicating already: their tables are not opened and checked again."""
    pattern = patterns.parse_pattern(values["table"])
    matches, others = list_matches(pattern, tables)
    keys = dict(values.get("primary_keys") or ())
    default = names(values.get("primary_key"))
    template = values.get("target")
    skipped = [
        Skipped(pattern.text, m.table, _not_delta(pattern.text, m), patterns.target_of(template, m))
        for m in others
    ]
    chosen = []
    for match in matches:
        key = patterns.key_of(match.name, default, keys)
        target = patterns.target_of(template, match)
        if not key:
            skipped.append(Skipped(pattern.text, match.table, _no_key(pattern.text, match), target))
            continue
        chosen.append((match, key, target))
    patterns.check_targets(pattern.text, [(m, t) for m, _, t in chosen])
    configs = []
    for match, key, target in chosen:
        cfg = build({**values, "table": match.table, "primary_key": key, "target": target, "pipeline": None})
        reason = None if cfg.pipeline in running else unfit(functools.partial(open_source, match.table), cfg)
        if reason:
            skipped.append(Skipped(pattern.text, match.table, reason, target))
        else:
            configs.append(cfg)
    return Expanded(configs, sorted(skipped, key=lambda s: s.table))


def unfit(opened: Callable[[], Any], cfg: RunConfig) -> str | None:
    """Why the table (its change source, `opened`) cannot be followed now, or None: not a Delta table, no
    Change Data Feed, key columns missing."""
    try:
        source = opened()
        if (cfg.changes_from == FEED or not source.derives) and not source.cdf_enabled():
            return str(plan.cdf_disabled_error(source.uri))
        view = designed_source(source, cfg.design)
        schema.column_types(view.schema_at(view.latest().version), cfg.design)
    except (ConfigError, SourceError) as exc:
        return str(exc)
    return None


def _not_delta(pattern: str, match: Match) -> str:
    return (
        f"{match.table} matches --table {pattern!r} but is not a Delta table (it has no {DELTA_LOG} directory), "
        f"so it is not replicated. Narrow the pattern if that is expected."
    )


def _no_key(pattern: str, match: Match) -> str:
    return (
        f"{match.table} matches --table {pattern!r} but has no primary key: there is no --primary-key default "
        f'and primary-keys does not name {match.name!r}. Add `{match.name} = ["column", ...]` to '
        f"primary-keys (or a default primary-key) to replicate it."
    )
