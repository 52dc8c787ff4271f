"""Which columns a column-mapping table renamed or dropped at one version, found by field id, and what the
target table must do about them (`--on-schema-change follow`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc2ch.base.errors import SchemaChangeError
from cdc2ch.model.contract import CDF_COLUMNS
from cdc2ch.model.design import TableDesign

ID = "delta.columnMapping.id"


@dataclass(frozen=True)
class Moves:
    """What one version did to the table's columns, in Delta's names."""

    renamed: tuple[tuple[str, str], ...] = ()  # (old name, new name)
    dropped: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()  # the same name on a new field id: a new column whose old values are gone


@dataclass(frozen=True)
class TargetMoves:
    """What the target table must do before it takes rows of the new schema, in the target's names."""

    renamed: tuple[tuple[str, str], ...] = ()
    dropped: tuple[str, ...] = ()
    breaking: tuple[str, ...] = ()  # what ClickHouse cannot follow in place, described for the user


def field_ids(schema_json: dict[str, Any] | None) -> dict[int, str] | None:
    """{field id: name} of a schema's own top-level columns, or None when a column has no field id (no
    column mapping: a rename cannot be told from a drop and an add)."""
    if not schema_json:
        return None
    out = {}
    for f in schema_json.get("fields", ()):
        if f["name"] in CDF_COLUMNS:
            continue
        found = (f.get("metadata") or {}).get(ID)
        if found is None:
            return None
        out[int(found)] = f["name"]
    return out


def column_moves(before: dict[str, Any] | None, after: dict[str, Any] | None) -> Moves | None:
    """The renames, drops and replacements between two schemas with column mapping, by field id; None when
    either has no field ids."""
    old, new = field_ids(before), field_ids(after)
    if old is None or new is None:
        return None
    new_ids = {name: i for i, name in new.items()}
    renamed = tuple((name, new[i]) for i, name in old.items() if i in new and new[i] != name)
    gone = [name for i, name in old.items() if i not in new]
    replaced = tuple(n for n in gone if n in new_ids)
    return Moves(renamed, tuple(n for n in gone if n not in new_ids), replaced)


def in_target(moves: Moves, design: TableDesign) -> TargetMoves:
    """`moves` as the target sees them (--exclude-columns and --rename-columns name Delta's columns)."""
    renamed, dropped, breaking = [], [], []
    named = {c for c, _ in (*design.rename, *design.types, *design.codecs)}
    for old, new in moves.renamed:
        was, now = old not in design.exclude, new not in design.exclude
        if old in named:  # the options follow a column by its Delta name: the user says where it goes now
            breaking.append(
                f"column {old!r} was renamed to {new!r}, and --rename-columns, --column-types or "
                f"--column-codecs name it by its old name: name it {new!r} there and run again"
            )
        elif was and now and design.target_name(old) != design.target_name(new):
            renamed.append((design.target_name(old), design.target_name(new)))
        elif was and not now:
            dropped.append(design.target_name(old))
        elif now and not was:
            breaking.append(
                f"column {old!r}, left out by --exclude-columns, was renamed to {new!r}, which is not left out: "
                f"the target holds none of its values"
            )
    dropped += [design.target_name(c) for c in moves.dropped if c not in design.exclude]
    breaking += [
        f"column {c!r} was replaced by a new column of the same name (a new column mapping id), whose older "
        f"rows hold no value"
        for c in moves.replaced
        if c not in design.exclude
    ]
    return TargetMoves(tuple(renamed), tuple(dropped), tuple(breaking))


def pending(current: list[str], moves: TargetMoves) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(renames, drops) the table with user columns `current` still needs, and what it cannot do. A rename
    already done (the new name there, the old one gone) or a drop already done is not repeated: a rerun
    after a crash midway finishes the step."""
    have = set(current)
    renames, breaking = [], list(moves.breaking)
    for old, new in moves.renamed:
        if old in have and new not in have:
            renames.append((old, new))
        elif old not in have and new not in have:
            breaking.append(f"column {old!r} was renamed to {new!r}, and the target has neither")
        elif old in have:
            breaking.append(f"column {old!r} was renamed to {new!r}, a name the target already has")
    return renames, [c for c in moves.dropped if c in have], breaking


def renamed_columns(
    current: dict[str, str], renames: list[tuple[str, str]], drops: list[str]
) -> dict[str, str]:
    """The table's {column: type} once `renames` and `drops` are applied, in its order."""
    names = dict(renames)
    return {names.get(c, c): t for c, t in current.items() if c not in drops}


def check_keys(moves: Moves, design: TableDesign, where: str, committed: int, target: str) -> None:
    """Refuse a rename or drop of a column the row's identity is made of (primary key, sorting key, partition
    expression): ClickHouse cannot rename or drop such a column in place, and the pipeline's key options
    name the old column. Nothing is changed."""
    identity = design.identity
    hit: list[tuple[str, str | None]] = [
        (old, new) for old, new in moves.renamed if design.target_name(old) in identity.columns
    ]
    hit += [
        (old, None) for old in moves.dropped + moves.replaced if design.target_name(old) in identity.columns
    ]
    if not hit:
        return
    old, new = hit[0]
    column = design.target_name(old)
    role = (
        "primary-key"
        if column in identity.primary_key
        else "sorting-key"
        if column in identity.order_by
        else "partition"
    )
    what = f"renamed to {new!r}" if new else "dropped"
    then = f" naming {new!r}" if new else " without it"
    raise SchemaChangeError(
        f"Delta column {old!r} of {where} was {what}, and it is a {role} column of ClickHouse table {target}. "
        f"ClickHouse cannot rename or drop a column of a table's sorting or partition key in place, and the "
        f"pipeline's --primary-key, --order-by and --partition-by name the old column, so --on-schema-change "
        f"follow does not follow this change: replication stopped with version {committed} committed and the "
        f"table unchanged. To go on, replicate the table into a new --target with the key options{then} (a "
        f"new pipeline begins with a snapshot of the table as it is now) and point readers at it; the old "
        f"table stays as it was at version {committed}."
    )
