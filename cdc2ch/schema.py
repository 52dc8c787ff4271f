"""Spark/Delta schema -> ClickHouse types and DDL.

Works on Spark's JSON schema (`StructType.jsonValue()`), so it is pure and needs no Spark session.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from cdc2ch.config import TargetName
from cdc2ch.errors import SourceError

# Columns the Change Data Feed adds to every row.
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# Columns cdc2ch adds to the target table (besides CDF_COLUMNS).
META_COLUMNS = ("_is_deleted", "_version", "_synced_at")

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
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_CHAR = re.compile(r"(?:var)?char\(\d+\)")


def quote(name: str) -> str:
    """Quote a ClickHouse identifier; safe for spaces, dots, backticks, reserved words and unicode."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def qualified(target: TargetName) -> str:
    return f"{quote(target.database)}.{quote(target.table)}"


def literal(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
                f"timestamp_ntz, array, map and struct. Cast or drop the column in a view of the table."
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


def user_fields(schema_json: dict) -> list[dict]:
    """The Delta table's own columns, without the CDF metadata columns."""
    return [f for f in schema_json["fields"] if f["name"] not in CDF_COLUMNS]


def column_types(schema_json: dict, primary_key: tuple[str, ...]) -> dict[str, str]:
    """Ordered {column: ClickHouse type} for the user columns; checks the key and reserved names."""
    fields = user_fields(schema_json)
    names = [f["name"] for f in fields]
    missing = [k for k in primary_key if k not in names]
    if missing:
        raise SourceError(
            f"Primary-key column(s) {', '.join(map(repr, missing))} are not in the Delta table, whose columns "
            f"are: {', '.join(names)}. Pass existing column names to --primary-key (case-sensitive)."
        )
    clashes = [n for n in names if n in META_COLUMNS]
    if clashes:
        raise SourceError(
            f"The Delta table has column(s) {', '.join(clashes)}, which cdc2ch reserves for its own "
            f"bookkeeping in ClickHouse. Rename them in a view or in the table."
        )
    types = {}
    for f in fields:
        is_key = f["name"] in primary_key
        if is_key and not isinstance(f["type"], str):
            raise SourceError(
                f"Primary-key column {f['name']!r} has a nested type; a key must be a plain column "
                f"(number, string, date, timestamp, decimal)."
            )
        types[f["name"]] = clickhouse_type(f["type"], f.get("nullable", True) and not is_key, f["name"])
    return types


def _template(name: str) -> str:
    packaged = resources.files("cdc2ch").joinpath("sql", name)
    if packaged.is_file():
        return packaged.read_text()
    # Source checkout: the templates live in the top-level sql/ folder.
    return (Path(__file__).resolve().parent.parent / "sql" / name).read_text()


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--")).strip()


def target_table_ddl(target: TargetName, types: dict[str, str], primary_key: tuple[str, ...]) -> str:
    columns = ",\n".join(f"    {quote(name)} {ch_type}" for name, ch_type in types.items())
    order_by = ", ".join(quote(k) for k in primary_key)
    return _strip_comments(_template("create_target_table.sql")).format(
        table=qualified(target), columns=columns, order_by=order_by
    )


def state_table_ddl(database: str, table: str, template: str = "create_state_table.sql") -> str:
    return _strip_comments(_template(template)).format(table=f"{quote(database)}.{quote(table)}")
