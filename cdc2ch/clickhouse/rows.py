"""One row of cdc2ch's own tables (offsets, health, layout, progress) as ClickHouse's JSONEachRow text.

ClickHouse parses the line into the table's own column types, so no Arrow table is built for a row: an
idle poll that only records its health would otherwise pay pyarrow's JSON reader and the engine's Arrow
input (about 9 MiB of an embedded poll's peak RSS) for it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone


def json_row(values: dict) -> bytes:
    """`values` as one JSONEachRow line. Datetimes (aware, or naive meaning UTC) as UTC text to the
    millisecond, which a DateTime64(3, 'UTC') column reads as it is."""
    return json.dumps({k: _utc_text(v) if isinstance(v, datetime) else v for k, v in values.items()}).encode()


def _utc_text(ts: datetime) -> str:
    if ts.tzinfo is not None:
        ts = ts.astimezone(timezone.utc)
    return ts.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
