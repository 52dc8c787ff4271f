"""tests/support/sharing_server.py proven against the official `delta-sharing` connector (its own venv).

Spark writes Delta tables with Change Data Feed on; the server shares them; the connector's snapshots and
change feeds must equal Spark's own `versionAsOf` / `readChangeFeed` reads row for row. Errors, auth, URL
expiry and the fault hooks are checked with the connector where it sees them, with plain HTTP otherwise.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.helpers import latest_version
from tests.support.sharing_connector import (
    assert_agree,
    assert_connector_agrees,
    read_with_connector,
    spark_changes,
    spark_snapshot,
)
from tests.support.sharing_server import SharingServer

TYPES = (
    "id INT, part STRING, flag BOOLEAN, tiny TINYINT, small SMALLINT, big BIGINT, real FLOAT, dbl DOUBLE, "
    "amount DECIMAL(12,3), day DATE, at TIMESTAMP, raw BINARY, tags ARRAY<INT>, attrs MAP<STRING,INT>, "
    "inner STRUCT<a: INT, b: STRING>, name STRING"
)
NAMES = "id part flag tiny small big real dbl amount day at raw tags attrs inner name".split()
ROW = (
    "({i}, IF({i} % 2 = 0, 'even', 'odd'), {i} % 2 = 0, {i}, {i} * 10, CAST({i} AS BIGINT) * 1000000000, "
    "{i} / 4, {i} / 3, CAST({i} * 1.125 AS DECIMAL(12,3)), DATE'2024-02-27' + {i}, "
    "TIMESTAMP'2024-03-30 22:15:00.123456' + make_interval(0,0,0,0,{i},0,0), CAST('raw{i}' AS BINARY), "
    "array({i}, NULL, {i}), map('k', {i}, 'z', NULL), named_struct('a', {i}, 'b', 'x{i}'), 'name {i}')"
)


# Checkpoints at v3 and v6: the server rebuilds later snapshots from Spark's checkpoint files.
CHECKPOINTS = "TBLPROPERTIES (delta.checkpointInterval = 3)"


def rows(*ids: int) -> str:
    return ", ".join(ROW.format(i=i) for i in ids)


@pytest.fixture(scope="module")
def typed(spark, tmp_path_factory):
    """A partitioned table of many types with a history of every kind of write (few: each costs seconds)."""
    path, sql = str(tmp_path_factory.mktemp("sharing") / "typed"), spark.sql
    sql(
        f"CREATE TABLE delta.`{path}` ({TYPES}) USING delta PARTITIONED BY (part) {CHECKPOINTS}"
    )  # v0: no CDF
    sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")  # v1
    nulls = ", ".join(["NULL"] * (len(NAMES) - 1))
    sql(f"INSERT INTO delta.`{path}` VALUES {rows(1, 2, 3, 4, 5, 6, 7)}, (8, {nulls})")  # v2
    sql(f"UPDATE delta.`{path}` SET name = 'updated', amount = amount + 1 WHERE id % 3 = 0")  # v3
    sql(f"DELETE FROM delta.`{path}` WHERE id IN (2, 7)")  # v4
    sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (extra STRING)")  # v5: a schema change
    sql(
        f"CREATE OR REPLACE TEMP VIEW src AS SELECT IF(id = 1, 9, id) AS id, {', '.join(NAMES[1:])}, "
        f"'new' AS extra FROM delta.`{path}` VERSION AS OF 2 WHERE id IN (1, 5)"
    )
    sql(
        f"MERGE INTO delta.`{path}` t USING src s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET name = 'merged', extra = 'm' WHEN NOT MATCHED THEN INSERT *"
    )  # v6
    sql(f"INSERT OVERWRITE delta.`{path}` SELECT * FROM delta.`{path}` WHERE id <> 1")  # v7: no change files
    return path


@pytest.fixture(scope="module")
def shared(typed, tmp_path_factory):
    with SharingServer() as server:
        server.share("s.d.typed", typed)
        server.share("other.x.frozen", typed, history=False)
        yield server, server.profile(tmp_path_factory.mktemp("profile"))


def test_connector_reads_what_spark_reads(spark, typed, shared):
    server, profile = shared
    assert latest_version(spark, typed) == 7
    assert sorted(p.name for p in Path(typed, "_delta_log").glob("*.checkpoint.parquet")) == [
        f"{v:020d}.checkpoint.parquet" for v in (3, 6)
    ]
    server.fail(503, path_contains="/query", times=2)  # the connector retries server errors, then must agree
    assert_connector_agrees(server, profile, "s.d.typed", spark, typed, versions=(1, 7))
    pairs = [spark_snapshot(spark, typed, 4), spark_changes(spark, typed, 3, 6)]
    url = server.url(profile, "s.d.typed")
    results = read_with_connector(
        [*({**task, "url": url} for task, _ in pairs), {"kind": "list", "profile": profile}]
    )
    for (task, expected), got in zip(pairs, results[:-1], strict=True):
        what = f"{task['kind']} {task.get('version', (task.get('start'), task.get('end')))}"
        assert_agree(got, expected, what)
        assert got["rows"], what  # every read above has rows: an empty pair of reads would prove nothing
    changes = {(row[-3], row[-2]) for row in results[1]["rows"]}  # (_change_type, _commit_version)
    kinds = {
        ("update_preimage", 3),
        ("update_postimage", 3),
        ("delete", 4),
        ("update_postimage", 6),
        ("insert", 6),
    }
    assert kinds <= changes, changes
    assert results[-1] == {
        "shares": ["other", "s"],
        "tables": ["other.x.frozen", "s.d.typed"],
        "tables_by_schema": ["other.x.frozen", "s.d.typed"],
    }
    queries = [target for method, target in server.requests if method == "POST"]
    assert len(queries) == 2 + 2  # two snapshots, two refused and retried
    assert any(target.startswith("/files/") for _, target in server.requests)


def test_connector_sees_refusals(spark, typed, shared, tmp_path):
    """Errors reach the connector with the reference server's status and words."""
    server, profile = shared
    dv = str(tmp_path / "dv")
    spark.sql(
        f"CREATE TABLE delta.`{dv}` (id INT) USING delta TBLPROPERTIES (delta.enableDeletionVectors = true)"
    )
    server.share("s.d.dv", dv)
    wrong = SharingServer(token="not-the-token")
    wrong.endpoint = server.endpoint
    short = SharingServer(
        url_ttl=0.0
    ).start()  # every URL it issues has expired when the connector fetches it
    short.share("s.d.typed", typed)
    try:
        url = lambda name, p=profile: server.url(p, name)  # noqa: E731
        snapshot, changes = {"kind": "snapshot", "types": {}}, {"kind": "changes", "types": {}}
        tasks = [
            {**snapshot, "url": url("s.d.typed", wrong.profile(tmp_path))},
            {**snapshot, "url": url("other.x.frozen"), "version": 1},
            {**changes, "url": url("other.x.frozen"), "start": 1, "end": 2},
            {**changes, "url": url("s.d.typed"), "start": 0, "end": 7},
            {**changes, "url": url("s.d.typed"), "start": 9, "end": 10},
            {**snapshot, "url": url("s.d.nope")},
            {**snapshot, "url": url("s.d.dv")},
            {**snapshot, "url": url("s.d.typed", short.profile(tmp_path))},
        ]
        got = read_with_connector(tasks)
    finally:
        short.stop()
    bad = "INVALID_PARAMETER_VALUE"
    expected = [
        (401, "UNAUTHENTICATED", "The bearer token is missing or incorrect"),
        (
            400,
            bad,
            "Reading table by version or timestamp is not supported because history sharing is not enabled",
        ),
        (400, bad, "cdf is not enabled on table other.x.frozen"),
        (
            400,
            bad,
            "Error getting change data for range [0, 7] as change data was not recorded for version [0]",
        ),
        (
            400,
            bad,
            "Provided Start version(9) for reading change data is invalid. Start version cannot be greater",
        ),
        (404, "RESOURCE_DOES_NOT_EXIST", "[Share/Schema/Table] 's/d/nope' does not exist"),
        (400, "UNSUPPORTED_OPERATION", "Unsupported Delta Table Properties"),
    ]
    for (status, code, words), result in zip(expected, got):
        assert (result.get("status"), result.get("errorCode")) == (status, code), (status, code, result)
        assert words in result["message"], (words, result)
    assert got[-1]["error"] == "FileNotFoundError" and "/files/" in got[-1]["message"], got[
        -1
    ]  # fsspec's 403


def _get(url: str, headers: dict | None = None, method: str = "GET", data: bytes | None = None):
    request = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _ndjson(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.decode().splitlines()]


def test_server_answers_the_protocol(shared):
    """What the connector does not exercise: change and streaming queries by version, metadata at a version,
    Range reads, URL expiry, auth and the fault hooks, over plain HTTP."""
    server, _ = shared
    auth = {"Authorization": f"Bearer {server.token}"}
    table = f"{server.endpoint}/shares/s/schemas/d/tables/typed"

    status, headers, body = _get(
        f"{table}/changes?startingVersion=3&endingVersion=6&includeHistoricalMetadata=true", auth
    )
    lines = _ndjson(body)
    assert (
        status == 200
        and headers["Delta-Table-Version"] == "3"
        and lines[0] == {"protocol": {"minReaderVersion": 1}}
    )
    assert lines[1]["metaData"]["version"] == 3 and "extra" not in lines[1]["metaData"]["schemaString"]
    kinds = [(next(iter(line)), next(iter(line.values())).get("version")) for line in lines[2:]]
    # UPDATE and MERGE wrote change files; DELETE of whole rows too; ALTER only a schema change.
    assert ("metaData", 5) in kinds and {k for k, v in kinds if v in (3, 6)} == {"cdf"}, kinds
    cdf = next(line["cdf"] for line in lines if "cdf" in line)
    assert {"url", "id", "partitionValues", "size", "timestamp", "version", "expirationTimestamp"} <= set(cdf)

    status, headers, body = _get(
        f"{table}/query", auth, "POST", json.dumps({"startingVersion": 2, "endingVersion": 2}).encode()
    )
    adds = [line["add"] for line in _ndjson(body) if "add" in line]
    assert status == 200 and adds and all(a["version"] == 2 and a["timestamp"] > 0 for a in adds)
    assert all(json.loads(a["stats"])["numRecords"] >= 1 for a in adds)

    status, headers, body = _get(f"{table}/metadata?version=4", auth)
    assert status == 200 and headers["Delta-Table-Version"] == "4" and "extra" not in body.decode()
    assert (
        _get(f"{table}/metadata?version=4", {**auth, "delta-sharing-capabilities": "responseformat=delta"})[0]
        == 400
    )

    status, headers, body = _get(f"{table}/query", auth, "POST", b'{"version": 3}')
    files = [line["file"] for line in _ndjson(body)[2:]]
    assert status == 200 and files and all(f["version"] == 3 for f in files)
    url, size = files[0]["url"], files[0]["size"]
    assert _get(url, {}, "HEAD")[1]["Content-Length"] == str(size)
    status, headers, body = _get(url, {"Range": "bytes=0-3"})
    assert (status, body, headers["Content-Range"]) == (206, b"PAR1", f"bytes 0-3/{size}")
    assert _get(url, {"Range": "bytes=-4"})[2] == b"PAR1" and len(_get(url)[2]) == size
    server.expire_urls()
    status, _, body = _get(url)
    assert status == 403 and b"Request has expired" in body

    status, _, body = _get(f"{table}/version")
    assert status == 401 and json.loads(body)["errorCode"] == "UNAUTHENTICATED"
    status, headers, _ = _get(f"{table}/version", auth)
    assert status == 200 and headers["Delta-Table-Version"] == "7"
    assert _get(table, auth, "HEAD")[1]["Delta-Table-Version"] == "7"

    server.fail(429, path_contains="/version", retry_after=2, body='{"errorCode":"X","message":"slow down"}')
    status, headers, body = _get(f"{table}/version", auth)
    assert (status, headers["Retry-After"], json.loads(body)["message"]) == (429, "2", "slow down")
    assert _get(f"{table}/version", auth)[0] == 200  # `times` (1) used up
    server.slow(0.5, path_contains="/version", times=1)
    started = time.monotonic()
    assert _get(f"{table}/version", auth)[0] == 200 and time.monotonic() - started >= 0.5
    assert server.requests[-1] == ("GET", "/delta-sharing/shares/s/schemas/d/tables/typed/version")
