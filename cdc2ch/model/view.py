"""The current-state view of a target: which name it has (if any), and the query that shows the table's
live rows, the user's columns only, without FINAL or tombstones to remember."""

from __future__ import annotations

from collections.abc import Iterable

from cdc2ch.base.errors import ConfigError
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName

SUFFIX = "_current"  # the default name: <target>_current
NONE = "none"  # --current-view none: no view


def view_name(target: TargetName, chosen: str | None) -> TargetName | None:
    """The view of `target` as --current-view chose it: None for `none`, `<target>_current` by default, a
    bare name in the target's database, or `db.name`."""
    if chosen and chosen.strip().lower() == NONE:
        return None
    if not chosen or not chosen.strip():
        return TargetName(target.database, target.table + SUFFIX)
    try:
        view = TargetName.parse(chosen.strip(), default_database=target.database)
    except ConfigError:
        view = None
    if view is None or view == target:
        why = "is the target table itself" if view == target else "is not a ClickHouse name"
        raise ConfigError(
            f"--current-view {chosen!r} {why}. Give the view its own name (`name` in the target's database "
            f"{target.database!r}, or `database.name`), or `none` for no view."
        )
    return view


# FINAL collapses each partition on its own, as merges do: a row's identity holds its partition
# (docs/design.md, "Row identity"), and a partition of one merged part is read without collapsing.
SETTINGS = "do_not_merge_across_partitions_select_final = 1"


def current_select(target: TargetName, columns: Iterable[str]) -> str:
    """The view's query over `target` whose user columns are `columns`: each key's last state, live rows
    only."""
    cols = ", ".join(schema.quote(c) for c in columns)
    return f"SELECT {cols} FROM {schema.qualified(target)} FINAL WHERE _is_deleted = 0 SETTINGS {SETTINGS}"
