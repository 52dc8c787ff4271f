"""One canonical text for every value, rendered in Spark SQL and in ClickHouse SQL (what `verify` hashes).

Each side reduces its rows to per-bucket counts and sums of 60-bit row hashes; the two agree only if both
render every value to the same text, so the rule below is written once, over the Delta schema (Spark's
JSON form), and rendered for each engine by a small dialect.

The text of a value:
  null                     N             (Array, Map and Tuple cannot be Nullable in ClickHouse: a null one
                                          is stored empty, so it is rendered as empty on both sides)
  boolean                  1 | 0
  integral                 decimal digits
  float, double            NaN, or the IEEE-754 bits as a signed integer (exact: -0.0, inf, subnormals)
  decimal                  plain digits without trailing zeros (1.50 -> 1.5, 2.00 -> 2)
  string                   <bytes>:<text>     binary: upper-case hex
  date                     days since 1970-01-01 (dates before 1970 negative)
  timestamp, _ntz          microseconds since 1970-01-01 (wall clock as UTC for _ntz)
  array                    [e1,e2]      map: {k=v,...} sorted by entry text      struct: (f1,f2)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cdc2ch.model.contract import sql_literal

NULL = "N"
HASH_BITS = 60  # row hashes: the first 15 hex digits of MD5 (sums stay exact in Decimal(38) / UInt128)
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_CHAR = re.compile(r"(?:var)?char\(\d+\)")
_TRIM_ZEROS = r"(\.[0-9]*[1-9])0+$|\.0+$"


@dataclass(frozen=True)
class Dialect:
    """How one engine spells the few operations the rule needs (`{x}` is the value's expression)."""

    name: str
    lit: Any
    concat: Any
    join: str  # join an array of texts with ','
    each: str  # apply `{f}` (a lambda over `{v}`) to array `{x}`
    sort: str
    entries: str  # an array of `{f}` over the map's key `{k}` and value `{v}`
    field: str  # a struct field by name
    null_case: str  # `{x}` null -> `{empty}`, else `{text}`
    primitives: dict[str, str]


def _spark_lit(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


SPARK = Dialect(
    name="spark",
    lit=_spark_lit,
    concat=lambda *parts: f"concat({', '.join(parts)})",
    join="array_join({x}, ',')",
    each="transform({x}, {v} -> {f})",
    sort="array_sort({x})",
    entries="transform(map_entries({x}), {e} -> {f})",
    field="{x}.`{name}`",
    null_case="CASE WHEN {x} IS NULL THEN {empty} ELSE {text} END",
    primitives={
        "boolean": "CASE WHEN {x} THEN '1' ELSE '0' END",
        "integral": "CAST({x} AS STRING)",
        "float": "CASE WHEN isnan({x}) THEN 'NaN' "
        "ELSE CAST(java_method('java.lang.Float', 'floatToRawIntBits', {x}) AS STRING) END",
        "double": "CASE WHEN isnan({x}) THEN 'NaN' "
        "ELSE CAST(java_method('java.lang.Double', 'doubleToRawLongBits', {x}) AS STRING) END",
        "decimal": f"regexp_replace(CAST({{x}} AS STRING), '{_TRIM_ZEROS}', '$1')",
        "string": "concat(CAST(octet_length({x}) AS STRING), ':', {x})",
        "binary": "hex({x})",
        "date": "CAST(unix_date({x}) AS STRING)",
        "timestamp": "CAST(unix_micros({x}) AS STRING)",
        "timestamp_ntz": "CAST(unix_micros(to_utc_timestamp(CAST({x} AS TIMESTAMP), current_timezone())) AS STRING)",
    },
)

CLICKHOUSE = Dialect(
    name="clickhouse",
    lit=sql_literal,
    concat=lambda *parts: f"concat({', '.join(parts)})",
    join="arrayStringConcat({x}, ',')",
    each="arrayMap({v} -> {f}, {x})",
    sort="arraySort({x})",
    entries="arrayMap(({k}, {v}) -> {f}, mapKeys({x}), mapValues({x}))",
    field="tupleElement({x}, {quoted})",
    null_case="if(isNull({x}), {empty}, {text})",
    primitives={
        "boolean": "if({x}, '1', '0')",
        "integral": "toString({x})",
        "float": "if(isNaN({x}), 'NaN', toString(reinterpretAsInt32(assumeNotNull({x}))))",
        "double": "if(isNaN({x}), 'NaN', toString(reinterpretAsInt64(assumeNotNull({x}))))",
        "decimal": f"replaceRegexpOne(toString({{x}}), '{_TRIM_ZEROS}', '\\\\1')",
        "string": "concat(toString(length({x})), ':', {x})",
        "binary": "hex({x})",
        "date": "toString(toInt32({x}))",
        "timestamp": "toString(toUnixTimestamp64Micro({x}))",
        "timestamp_ntz": "toString(toUnixTimestamp64Micro({x}))",
    },
)


def _primitive(spark_type: str) -> str:
    if spark_type in ("byte", "short", "integer", "long"):
        return "integral"
    if _DECIMAL.fullmatch(spark_type):
        return "decimal"
    if _CHAR.fullmatch(spark_type):
        return "string"
    return spark_type


def text(x: str, spark_type: Any, d: Dialect, depth: int = 0) -> str:
    """The expression rendering value `x` of `spark_type` (JSON form) as its canonical text; never null."""
    if isinstance(spark_type, dict) and spark_type.get("type") == "udt":
        return text(x, spark_type["sqlType"], d, depth)
    kind = spark_type if isinstance(spark_type, str) else spark_type.get("type")
    v, k, e = f"v{depth}", f"k{depth}", f"e{depth}"
    if kind == "array":
        inner = text(v, spark_type["elementType"], d, depth + 1)
        body = d.concat(d.lit("["), d.join.format(x=d.each.format(x=x, v=v, f=inner)), d.lit("]"))
    elif kind == "map":
        if d is SPARK:
            key, value = f"{e}.key", f"{e}.value"
        else:
            key, value = k, v
        entry = d.concat(
            text(key, spark_type["keyType"], d, depth + 1),
            d.lit("="),
            text(value, spark_type["valueType"], d, depth + 1),
        )
        listed = d.entries.format(x=x, e=e, k=k, v=v, f=entry)
        body = d.concat(d.lit("{"), d.join.format(x=d.sort.format(x=listed)), d.lit("}"))
    elif kind == "struct":
        fields = [
            text(
                d.field.format(x=x, name=f["name"].replace("`", "``"), quoted=d.lit(f["name"])),
                f["type"],
                d,
                depth,
            )
            for f in spark_type["fields"]
        ]
        body = d.concat(d.lit("("), *_commas(fields, d), d.lit(")"))
    else:
        template = d.primitives.get(_primitive(kind))
        if template is None:
            raise ValueError(f"no canonical text for Spark type {spark_type!r}")
        body = template.format(x=x)
    return d.null_case.format(x=x, empty=d.lit(empty(spark_type)), text=body) if _nullable(kind, d) else body


def _nullable(kind: str, d: Dialect) -> bool:
    # ClickHouse's Array, Map and Tuple are never null; Spark's are rendered as empty when they are.
    return d is SPARK or kind not in ("array", "map", "struct")


def empty(spark_type: Any) -> str:
    """The text of a null value: ClickHouse stores a null Array/Map empty and a null Tuple as null fields."""
    kind = spark_type if isinstance(spark_type, str) else spark_type.get("type")
    if kind == "array":
        return "[]"
    if kind == "map":
        return "{}"
    if kind == "struct":
        return "(" + ",".join(empty(f["type"]) for f in spark_type["fields"]) + ")"
    if kind == "udt":
        return empty(spark_type["sqlType"])
    return NULL


def _commas(parts: list[str], d: Dialect) -> list[str]:
    out: list[str] = []
    for i, p in enumerate(parts):
        if i:
            out.append(d.lit(","))
        out.append(p)
    return out


def quoted(name: str, d: Dialect) -> str:
    return (
        "`" + name.replace("`", "``") + "`"
        if d is SPARK
        else "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
    )


def row_text(fields: list[dict[str, Any]], d: Dialect) -> str:
    """The canonical text of a row of `fields` (Spark schema JSON fields, in table order)."""
    parts = [text(quoted(f["name"], d), f["type"], d) for f in fields]
    return d.concat(*_commas(parts, d)) if len(parts) > 1 else parts[0]


def hash60(text_sql: str, d: Dialect) -> str:
    """A 60-bit integer hash of a text: the first 15 hex digits of its MD5, on both engines."""
    if d is SPARK:
        return f"CAST(conv(substr(md5({text_sql}), 1, 15), 16, 10) AS DECIMAL(20, 0))"
    return f"bitShiftRight(reinterpretAsUInt64(reverse(unhex(substring(hex(MD5({text_sql})), 1, 16)))), 4)"


def bucket(text_sql: str, buckets: int, d: Dialect) -> str:
    """The bucket of a key text: digits 16..23 of its MD5, modulo `buckets` (independent of the row hash)."""
    if d is SPARK:
        return (
            f"CAST(pmod(CAST(conv(substr(md5({text_sql}), 16, 8), 16, 10) AS BIGINT), {int(buckets)}) AS INT)"
        )
    return f"toInt32(reinterpretAsUInt32(reverse(unhex(substring(hex(MD5({text_sql})), 16, 8)))) % {int(buckets)})"
