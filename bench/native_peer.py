"""ClickHouse reading the change data feed itself, as a user would by hand: one `INSERT ... SELECT FROM
deltaLakeLocal(path)` with `delta_lake_snapshot_start_version/end_version` and the metadata columns computed
in the same statement, into a ReplacingMergeTree of the same layout.

`python bench/native_peer.py PATH START END DSN TABLE SCHEMA_JSON`: runs in its own process, as cdc2ch does
(so both pay the engine's first read of a Delta table in a fresh process), and prints one JSON line
{"seconds": S, "rows": N}: S is the statement and the count after it, its table made beforehand.
"""

from __future__ import annotations

import json
import sys
import time

from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign


def main(path: str, start: int, end: int, dsn: str, table: str, shape: dict) -> None:
    design, target = TableDesign(("id",)), TargetName("bench", table)
    with connect(dsn) as sink:
        sink.ensure_database("bench")
        sink.command(f"DROP TABLE IF EXISTS {schema.qualified(target)}")
        sink.command(schema.target_table_ddl(target, schema.column_types(shape, design), design))
        table_sql = schema.qualified(target)
        cols = ", ".join(schema.quote(f["name"]) for f in shape["fields"])
        rank = "multiIf(_change_type = 'update_preimage', 1, _change_type = 'delete', 2, 3)"
        t0 = time.monotonic()
        with sink.reads_files():
            sink.command(
                f"INSERT INTO {table_sql} ({cols}, _commit_version, _commit_timestamp, _change_type, "
                f"_is_deleted, _version) SELECT {cols}, _commit_version, _commit_timestamp, _change_type, "
                f"_change_type IN ('delete', 'update_preimage'), _commit_version * 4 + {rank} "
                f"FROM deltaLakeLocal({schema.literal(path)})",
                settings={"delta_lake_snapshot_start_version": start, "delta_lake_snapshot_end_version": end},
            )
        rows = sink.query_rows(f"SELECT count() FROM {table_sql}")[0][0]
        print(json.dumps({"seconds": time.monotonic() - t0, "rows": rows}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], json.loads(sys.argv[6]))
