"""One comparable form for a row read by Spark (Row values) and by the delta-sharing connector (pandas values).

Standard library only: it is imported both by the tests and by the connector script running in its own
virtualenv. Values are canonicalised by their Delta type (the schema's JSON form), so a pandas float standing
for a null integer, a numpy array for an array, (key, value) pairs for a map all meet Spark's form.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
INTEGERS = ("byte", "short", "integer", "long")


def _missing(value) -> bool:
    if value is None:
        return True
    if type(value).__name__ in ("NaTType", "NAType"):
        return True
    return isinstance(value, float) and math.isnan(value)


def _micros(value) -> int:
    """A timestamp as microseconds since the epoch (UTC)."""
    if type(value).__name__ == "Timestamp":  # pandas: `.value` is UTC nanoseconds, tz-aware or not
        return value.value // 1000
    if type(value).__name__ == "datetime64":  # numpy
        return int(value.astype("datetime64[us]").astype("int64"))
    if value.tzinfo is None:  # Spark collects naive datetimes in the local zone
        value = value.astimezone(dt.timezone.utc)
    return (value - EPOCH) // dt.timedelta(microseconds=1)


def canon(value, dtype):
    if _missing(value):
        return None
    if isinstance(dtype, dict):
        kind = dtype["type"]
        if kind == "array":
            return [canon(v, dtype["elementType"]) for v in value]
        if kind == "map":
            pairs = value.items() if hasattr(value, "items") else value
            return sorted(
                ([canon(k, dtype["keyType"]), canon(v, dtype["valueType"])] for k, v in pairs), key=repr
            )
        if kind == "struct":
            fields = value.asDict() if hasattr(value, "asDict") else dict(value)
            return [canon(fields.get(f["name"]), f["type"]) for f in dtype["fields"]]
        raise ValueError(f"unknown type {dtype}")
    if dtype in INTEGERS:
        return int(value)
    if dtype in ("float", "double"):
        return float(value)
    if dtype == "boolean":
        return bool(value)
    if dtype == "binary":
        return bytes(value).hex()
    if dtype.startswith("decimal"):
        return format(Decimal(str(value)).normalize(), "f")
    if dtype == "date":
        return value.isoformat()[:10]
    if dtype == "timestamp":
        return _micros(value)
    if dtype == "commit_ms":  # _commit_timestamp: a timestamp in Spark, epoch milliseconds in the connector
        return (
            int(value)
            if isinstance(value, int) or type(value).__name__.startswith("int")
            else _micros(value) // 1000
        )
    return str(value)


def canon_rows(rows, columns: list[str], types: dict[str, object]) -> list[list]:
    """Rows (mappings by column name) canonicalised and sorted; the order of rows carries no meaning."""
    out = [[canon(row[c], types[c]) for c in columns] for row in rows]
    return sorted(out, key=repr)
