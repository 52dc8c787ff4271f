"""What an insert sends: cdc2ch's Arrow payload is the one clickhouse-connect's insert_arrow would send, and
a batch's digest is that of its whole Arrow IPC stream, though neither is built the client's way."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest
import xxhash
from clickhouse_connect.driver.query import arrow_buffer

from cdc2ch.clickhouse.connection.rows import arrow_file
from cdc2ch.model import contract


def batch(n: int) -> pa.Table:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": pa.array([None if i % 7 == 0 else f"name-{i}" for i in range(n)]),
            "amount": pa.array([i / 3 for i in range(n)]),
            "at": pa.array([at] * n, pa.timestamp("us", tz="UTC")),
            "_change_type": pa.array(
                ["insert", "delete"] * (n // 2) + ["insert"] * (n % 2)
            ).dictionary_encode(),
        }
    )


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
@pytest.mark.parametrize("rows", [0, 1, 70_000])
def test_the_arrow_payload_is_the_clients_own(compression, rows):
    data = batch(rows)
    assert bytes(arrow_file(data, compression)) == arrow_buffer(data, compression)[1].to_pybytes()


@pytest.mark.parametrize("rows", [0, 1, 70_000])
def test_the_digest_is_that_of_the_whole_ipc_stream(rows):
    data = batch(rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    assert contract.digest(data) == xxhash.xxh3_128_hexdigest(sink.getvalue())[:20]
    assert contract.digest(data.slice(1)) != contract.digest(data) or rows == 0
