"""Spark/Delta schema -> ClickHouse types and DDL.

Works on Spark's JSON schema (`StructType.jsonValue()`), so it is pure and needs no Spark session.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.model.config import TargetName
from cdc2ch.model.contract import CDF_COLUMNS, META_COLUMNS
from cdc2ch.model.contract import sql_literal as literal
from cdc2ch.model.design import TableDesign
from cdc2ch.model.design import setting_sql as _setting
from cdc2ch.model.identity import Identity

# A parsed ClickHouse type: (name, args), args being nested trees, (field name or None, tree) pairs, or text.
TypeTree = tuple[str, tuple[Any, ...]]

_PRIMITIVE = {
    "boolean": "Bool",
    "byte": "Int8",
    "short": "Int16",
    "integer": "Int32",
    "long": "Int64",
    "float": "Float32",
    "double": "Float64",
    "string": "String",
    "binary": "String",
    "date": "Date32",
    "timestamp": "DateTime64(6, 'UTC')",
    "timestamp_ntz": "DateTime64(6)",
    # VARIANT: its JSON text (Spark's to_json), which keeps every value; see docs/reference/table-features.md.
    "variant": "String",
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_CHAR = re.compile(r"(?:var)?char\(\d+\)")


def quote(name: str) -> str:
    """Quote a ClickHouse identifier; safe for spaces, dots, backticks, reserved words and unicode."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def qualified(target: TargetName) -> str:
    return f"{quote(target.database)}.{quote(target.table)}"


def clickhouse_type(spark_type: Any, nullable: bool, column: str = "?") -> str:
    """Map one Spark type (JSON form) to ClickHouse. Array, Map and Tuple are never wrapped in Nullable."""
    if isinstance(spark_type, str):
        if spark_type in _PRIMITIVE:
            base = _PRIMITIVE[spark_type]
        elif m := _DECIMAL.fullmatch(spark_type):
            base = f"Decimal({m.group(1)}, {m.group(2)})"
        elif _CHAR.fullmatch(spark_type):
            base = "String"
        else:
            raise SourceError(
                f"Column {column!r} has Spark type {spark_type!r}, which cdc2ch cannot map to ClickHouse. "
                f"Supported: boolean, integral and floating types, decimal, string, binary, date, timestamp, "
                f"timestamp_ntz, variant, array, map and struct. Cast or drop the column in a view of the table."
            )
        return f"Nullable({base})" if nullable else base
    kind = spark_type.get("type")
    if kind == "array":
        return f"Array({clickhouse_type(spark_type['elementType'], spark_type['containsNull'], column)})"
    if kind == "map":
        key = clickhouse_type(spark_type["keyType"], False, column)
        value = clickhouse_type(spark_type["valueType"], spark_type["valueContainsNull"], column)
        return f"Map({key}, {value})"
    if kind == "struct":
        fields = ", ".join(
            f"{quote(f['name'])} {clickhouse_type(f['type'], f.get('nullable', True), column)}"
            for f in spark_type["fields"]
        )
        return f"Tuple({fields})"
    # User-defined types carry their SQL type underneath.
    if kind == "udt" and "sqlType" in spark_type:
        return clickhouse_type(spark_type["sqlType"], nullable, column)
    raise SourceError(f"Column {column!r} has an unsupported Spark type {spark_type!r}.")


def contains_type(spark_type: Any, name: str) -> bool:
    """Whether a Spark type (JSON form) is, or holds at any depth, the type `name`: a primitive ("variant")
    or a kind of nested type ("map")."""
    if isinstance(spark_type, str):
        return spark_type == name
    kind = spark_type.get("type")
    if kind == name:
        return True
    if kind == "array":
        return contains_type(spark_type["elementType"], name)
    if kind == "map":
        return contains_type(spark_type["keyType"], name) or contains_type(spark_type["valueType"], name)
    if kind == "struct":
        return any(contains_type(f["type"], name) for f in spark_type["fields"])
    return kind == "udt" and contains_type(spark_type.get("sqlType", ""), name)


def user_fields(schema_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The Delta table's own columns, without the CDF metadata columns."""
    return [f for f in schema_json["fields"] if f["name"] not in CDF_COLUMNS]


def column_types(schema_json: dict[str, Any], design: TableDesign) -> dict[str, str]:
    """Ordered {column: ClickHouse type} for the user columns of a schema as the target sees it (design's
    names, design.project_schema): the design's chosen types where it has them; checks the identity columns
    and reserved names."""
    identity = design.identity
    fields = user_fields(schema_json)
    names = [f["name"] for f in fields]
    missing = [k for k in identity.primary_key if k not in names]
    if missing:
        raise SourceError(
            f"Primary-key column(s) {', '.join(map(repr, missing))} are not in the Delta table, whose columns "
            f"are: {', '.join(names)}. Pass existing column names to --primary-key (case-sensitive)."
        )
    clashes = [n for n in names if n in META_COLUMNS]
    if clashes:
        raise SourceError(
            f"The Delta table has column(s) {', '.join(clashes)}, which cdc2ch reserves for its own "
            f"bookkeeping in ClickHouse. Rename them in a view or in the table, or with --rename-columns."
        )
    types = {}
    for f in fields:
        name = f["name"]
        if name in identity.columns and not isinstance(f["type"], str):
            role = "Primary-key" if name in identity.primary_key else "Sorting or partition"
            raise SourceError(
                f"{role} column {name!r} has a nested type; a row's identity must be made of plain columns "
                f"(number, string, date, timestamp, decimal)."
            )
        mapped = clickhouse_type(
            f["type"], f.get("nullable", True) and name not in identity.primary_key, name
        )
        types[name] = _chosen(design, name, mapped)
    return types


def _chosen(design: TableDesign, column: str, mapped: str) -> str:
    """The type --column-types chose for `column`, when it holds every value of the `mapped` type."""
    chosen = design.chosen_type(column)
    if chosen is None:
        return mapped
    if not fits(chosen, mapped):
        raise ConfigError(
            f"--column-types gives column {design.source_name(column)!r} the type {chosen}, which cannot hold "
            f"every value of its Delta type ({mapped} in ClickHouse): values would be lost or changed. Choose "
            f"{mapped}, a wider type, or LowCardinality({mapped}) where its values repeat."
        )
    return chosen


def takes(column_type: str, needed: str) -> bool:
    """Whether an existing column of `column_type` takes rows of Delta's `needed` type as it is, the way
    schema evolution sees it (diff): the same type, or LowCardinality or Nullable of it."""
    have = parse_type(column_type)
    return widen(have, parse_type(needed)) == _plain(have)


def fits(column_type: str, needed: str) -> bool:
    """Whether a ClickHouse column of `column_type` holds every value of `needed` unchanged: it is `needed`
    or a widening of it."""
    have = parse_type(column_type)
    return widen(parse_type(needed), have) == _plain(have)


def _template(name: str) -> str:
    packaged = resources.files("cdc2ch").joinpath("sql").joinpath(name)
    if packaged.is_file():
        return packaged.read_text()
    # Source checkout: the templates live in the top-level sql/ folder.
    return (Path(__file__).resolve().parents[2] / "sql" / name).read_text()


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--")).strip()


def target_table_ddl(
    target: TargetName, types: dict[str, str], design: TableDesign, comment: str | None = None
) -> str:
    identity = design.identity
    columns = ",\n".join(f"    {column_sql(name, ch_type, design)}" for name, ch_type in types.items())
    settings = ", ".join(_setting(k, v) for k, v in design.table_settings(nullable_key(types, design)))
    ddl = _strip_comments(_template("create_target_table.sql")).format(
        table=qualified(target),
        columns=columns,
        partition_by=f"PARTITION BY {design.partition_by}\n" if design.partition_by else "",
        order_by=", ".join(quote(k) for k in identity.order_by),
        settings=settings,
    )
    return ddl + (f"\nCOMMENT {literal(comment)}" if comment else "")


def nullable_key(types: dict[str, str], design: TableDesign) -> bool:
    """Whether a column of the row's identity is Nullable (the table then needs allow_nullable_key)."""
    return any(_plain(parse_type(types[c]))[0] == "Nullable" for c in design.identity.columns if c in types)


def column_sql(name: str, ch_type: str, design: TableDesign) -> str:
    """A column's definition: name, type and the design's codec."""
    codec = design.codec(name)
    return f"{quote(name)} {ch_type}" + (f" CODEC({codec})" if codec else "")


def state_table_ddl(database: str, table: str, template: str = "create_state_table.sql") -> str:
    return _strip_comments(_template(template)).format(table=f"{quote(database)}.{quote(table)}")


# -- schema evolution -------------------------------------------------------------------------------
# ClickHouse type strings are compared as parsed trees: (name, args), where a Tuple's args are
# (element name, tree) pairs and other args are trees or literal strings (Decimal precision, time zone).

_INTS = ("Int8", "Int16", "Int32", "Int64")
_INT_DIGITS = {"Int8": 3, "Int16": 5, "Int32": 10, "Int64": 19}
_WRAPPERS = ("Nullable", "Array", "LowCardinality")


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside parentheses, quotes and backticks."""
    parts, depth, quote_ch, start, i = [], 0, None, 0, 0
    while i < len(text):
        ch = text[i]
        if quote_ch:
            if ch == "\\":
                i += 1
            elif ch == quote_ch:
                quote_ch = None
        elif ch in "`'":
            quote_ch = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _unquote_name(name: str) -> str:
    if name.startswith("`") and name.endswith("`"):
        return re.sub(r"\\(.)", r"\1", name[1:-1])
    return name


def parse_type(text: str) -> TypeTree:
    text = text.strip()
    if "(" not in text:
        return (text, ())
    name, inner = text[: text.index("(")], text[text.index("(") + 1 : text.rindex(")")]
    args = _split_top(inner, ",")
    if name == "Tuple":
        elements: list[tuple[str | None, TypeTree]] = []
        for arg in args:
            head = _split_top(arg, " ")
            if len(head) > 1:
                elements.append((_unquote_name(head[0]), parse_type(arg[len(head[0]) :])))
            else:
                elements.append((None, parse_type(arg)))
        return (name, tuple(elements))
    if name in _WRAPPERS or name == "Map":
        return (name, tuple(parse_type(a) for a in args))
    return (name, tuple(args))


def render_type(tree: TypeTree) -> str:
    name, args = tree
    if not args:
        return name
    if name == "Tuple":
        inner = ", ".join(render_type(t) if n is None else f"{quote(n)} {render_type(t)}" for n, t in args)
    elif name in _WRAPPERS or name == "Map":
        inner = ", ".join(render_type(a) for a in args)
    else:
        inner = ", ".join(args)
    return f"{name}({inner})"


def _widen_base(old: TypeTree, new: TypeTree) -> TypeTree | None:
    """The type a column of type `old` must become to hold values of type `new` without loss
    (Delta type widening), or None when `new` is narrower or unrelated."""
    if old == new:
        return old
    (o, oa), (n, na) = old, new
    if o in _INTS and n in _INTS:
        return new if _INTS.index(n) > _INTS.index(o) else None
    if n == "Float64" and (o == "Float32" or o in _INTS[:3]):
        return new
    if n == "Decimal" and o == "Decimal":
        (p1, s1), (p2, s2) = (map(int, oa), map(int, na))
        return new if s2 >= s1 and p2 - s2 >= p1 - s1 else None
    if n == "Decimal" and o in _INTS:
        p, s = map(int, na)
        return new if p - s >= _INT_DIGITS[o] else None
    if o == "Date32" and n == "DateTime64":
        return new
    if o == n == "DateTime64":  # a finer precision in the same time zone
        return new if int(na[0]) >= int(oa[0]) and na[1:] == oa[1:] else None
    if o == n == "Array":
        inner = widen(oa[0], na[0])
        return (o, (inner,)) if inner else None
    if o == n == "Map":
        key, value = widen(oa[0], na[0]), widen(oa[1], na[1])
        return (o, (key, value)) if key and value else None
    if o == n == "Tuple":
        # Struct evolution: fields may be added (anywhere) and widened, never removed or renamed.
        old_fields = dict(oa)
        if None in old_fields or not set(old_fields) <= {name for name, _ in na}:
            return None
        fields = []
        for name, tree in na:
            merged = widen(old_fields[name], tree) if name in old_fields else tree
            if merged is None:
                return None
            fields.append((name, merged))
        return (o, tuple(fields))
    return None


def _plain(tree: TypeTree) -> TypeTree:
    """A type without LowCardinality, which changes how values are stored, not which values fit."""
    name, args = tree
    if name == "LowCardinality":
        return _plain(args[0])
    if name == "Nullable":
        return ("Nullable", (_plain(args[0]),))
    return tree


def widen(old: TypeTree, new: TypeTree) -> TypeTree | None:
    """Like _widen_base, also across Nullable: a column stays Nullable once it is."""
    old, new = _plain(old), _plain(new)
    nullable = old[0] == "Nullable" or new[0] == "Nullable"
    base = _widen_base(old[1][0] if old[0] == "Nullable" else old, new[1][0] if new[0] == "Nullable" else new)
    if base is None:
        return None
    return ("Nullable", (base,)) if nullable and base[0] not in ("Array", "Map", "Tuple") else base


@dataclass(frozen=True)
class SchemaDiff:
    """What a ClickHouse table needs to take rows of a new Delta schema."""

    added: dict[str, str]  # column -> type, for ALTER TABLE ADD COLUMN
    modified: dict[str, tuple[str, str]]  # column -> (current type, wider type), for MODIFY COLUMN
    breaking: list[str]  # changes ClickHouse cannot follow in place, described for the user
    renamed: tuple[tuple[str, str], ...] = ()  # (column, new name), for RENAME COLUMN (renames.py)
    dropped: tuple[str, ...] = ()  # for DROP COLUMN (renames.py)

    @property
    def empty(self) -> bool:
        return not (self.added or self.modified or self.breaking or self.renamed or self.dropped)


def user_columns(existing: dict[str, str]) -> dict[str, str]:
    """A target table's own columns ({column: type}, in table order), without cdc2ch's bookkeeping."""
    return {c: t for c, t in existing.items() if c not in CDF_COLUMNS + META_COLUMNS}


def diff(existing: dict[str, str], wanted: dict[str, str], identity: Identity) -> SchemaDiff:
    """Compare the target table's user columns with those a Delta schema maps to. ClickHouse cannot change
    the type of the identity's columns (sorting and partition keys) in place."""
    current = user_columns(existing)
    added = {c: t for c, t in wanted.items() if c not in current}
    modified: dict[str, tuple[str, str]] = {}
    breaking = [
        f"column {c!r} is no longer in the Delta table (dropped or renamed)"
        for c in current
        if c not in wanted
    ]
    for c, new in wanted.items():
        if c not in current:
            continue
        old_tree = parse_type(current[c])
        merged = widen(old_tree, parse_type(new))
        if merged is None:
            breaking.append(f"column {c!r} changed type from {current[c]} to {new}, which is not a widening")
        elif merged != _plain(old_tree):
            if c in identity.columns:
                role = "primary-key" if c in identity.primary_key else "sorting or partition key"
                breaking.append(
                    f"{role} column {c!r} widened from {current[c]} to {new}, and ClickHouse cannot change "
                    f"the type of an ORDER BY or PARTITION BY column in place"
                )
            else:
                modified[c] = (current[c], render_type(merged))
    return SchemaDiff(added, modified, breaking)
