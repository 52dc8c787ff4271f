"""Tables on object storage, against a real S3-compatible server (moto's server mode, tests/support/s3server.py),
written by delta-rs and by Spark: the s3a:// example of docs/guides/object-storage.md with only the endpoint and
keys set, both readers,
status and the idle poll without a JVM, verify, snapshots, a pattern that discovers a table added later, and
storage that refuses, throttles or is down, which leaves offsets where they were and says why."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdc2ch.model.config import TargetName
from cdc2ch.model.objectstore import S3Settings
from cdc2ch.source.deltalog.logfiles import python_log
from cdc2ch.source.spark.jars import delta_jars
from cdc2ch.source.tablelisting import LakeTables
from tests.e2e.commands.test_no_java import cdc2ch, no_java_env
from tests.support.helpers import assert_replicated, assert_rows_equal, committed_version
from tests.support.s3server import KEY_ID, REGION, SECRET, S3FaultProxy, S3Server, storage_options

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server
    server.stop()


def reach(spark, endpoint: str, bucket: str | None = None, **more: str) -> None:
    """Point this process's Spark session at the store (per bucket with `bucket`), as a user's settings would."""
    conf = spark._jsc.hadoopConfiguration()
    prefix = f"fs.s3a.bucket.{bucket}." if bucket else "fs.s3a."
    settings = {"endpoint": endpoint, "path.style.access": "true", "access.key": KEY_ID, "secret.key": SECRET,
                "endpoint.region": REGION, **more}  # fmt: skip
    for key, value in settings.items():
        conf.set(prefix + key, value)


@pytest.fixture
def bucket(s3, spark, monkeypatch) -> str:
    """A new bucket, and this process (Spark, pyarrow, ClickHouse) reaching the store as a user's would."""
    name = f"lake-{uuid.uuid4().hex[:12]}"
    s3.bucket(name)
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    reach(spark, s3.endpoint)
    return name


def orders(n: int = 200) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": [f"n{i}" for i in range(n)],
            "amount": pa.array([i * 1.5 for i in range(n)], pa.float64()),
        }
    )


def write_orders(uri: str, env: dict[str, str], n: int = 200) -> None:
    """Version 0, written by delta-rs, with the change data feed on."""
    write_deltalake(
        uri.replace("s3a://", "s3://"),
        orders(n),
        storage_options=storage_options(env),
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def change(spark, uri: str, step: int) -> None:
    """One more version, written by Spark through S3A."""
    table = f"delta.`{uri}`"
    if step % 3 == 0:
        spark.sql(
            f"UPDATE {table} SET amount = amount + 1, name = concat(name, 'u') WHERE id % 5 = {step % 5}"
        )
    elif step % 3 == 1:
        spark.sql(f"DELETE FROM {table} WHERE id % 7 = {step % 7}")
    else:
        spark.createDataFrame([(i, f"m{i}", 0.5) for i in range(190, 230)], "id long, name string, amount double") \
            .createOrReplaceTempView("incoming")  # fmt: skip
        spark.sql(f"MERGE INTO {table} t USING incoming s ON t.id = s.id "
                  "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")  # fmt: skip


def run_once(uri: str, dsn: str, *more: str) -> list[str]:
    """`cdc2ch run --once` of `uri` into the embedded database `dsn`, with JSON logs."""
    return ["run", "--table", uri, "--primary-key", "id", "--once", "--clickhouse", dsn, "--log-format", "json",
            *more]  # fmt: skip


def user_env(store: dict[str, str], java: bool = True, tmp_path: Path | None = None) -> dict[str, str]:
    """A user's environment: nothing about the store but its endpoint and keys (and, without `java`, no Java)."""
    base = no_java_env(tmp_path) if not java and tmp_path else dict(os.environ, PYTHONPATH=str(ROOT))
    base = {k: v for k, v in base.items() if not k.startswith("AWS_")}
    return {**base, **store}


def live_rows(env: dict, dsn: str, target: str) -> list[tuple]:
    sql = f"SELECT id, name, amount FROM {target} FINAL WHERE _is_deleted = 0"
    out = cdc2ch(env, "query", sql, "--format", "JSONEachRow", "--clickhouse", dsn).stdout
    return [(r["id"], r["name"], float(r["amount"])) for r in map(json.loads, out.splitlines())]


def test_the_readme_s3a_example_replicates_with_only_the_endpoint_and_keys_set(spark, s3, bucket, tmp_path):
    uri, dsn = f"s3a://{bucket}/sales/orders", f"chdb://{tmp_path / 'clickhouse'}"
    write_orders(uri, s3.env())
    for step in range(3):
        change(spark, uri, step)
    env, bare = user_env(s3.env()), user_env(s3.env(), java=False, tmp_path=tmp_path)
    run = run_once(uri, dsn)

    # ClickHouse's reader needs no JVM at all, and s3:// as the user may write it is the same table
    mirror = [*run, "--target", "shop.mirror", "--reader", "clickhouse"]
    cdc2ch(bare, *[a.replace("s3a://", "s3://") for a in mirror])
    for step in range(3, 5):
        change(spark, uri, step)
    # Spark, with nothing set but the environment's endpoint and keys
    cdc2ch(env, *run, "--target", "shop.orders")
    cdc2ch(bare, *mirror)
    expected = [(r.id, r.name, r.amount) for r in spark.read.format("delta").load(uri).collect()]
    for target in ("shop.orders", "shop.mirror"):
        assert_rows_equal(expected, live_rows(bare, dsn, target), f"{target} vs Delta {uri}")

    # a snapshot ClickHouse loads from the files the log names: no JVM either
    cdc2ch(bare, "snapshot", "--table", uri, "--primary-key", "id", "--target", "shop.copy", "--reader",
           "clickhouse", "--clickhouse", dsn)  # fmt: skip
    assert_rows_equal(expected, live_rows(bare, dsn, "shop.copy"), f"shop.copy vs Delta {uri}")
    # nothing new: the poll and status read the log from the store without a JVM
    polled = cdc2ch(bare, *run, "--target", "shop.orders")
    assert "committed" not in [json.loads(line).get("event") for line in polled.stderr.splitlines()]
    status = json.loads(cdc2ch(bare, "status", "--format", "json", "--clickhouse", dsn).stdout)
    assert sorted((s["pipeline"], s["committed_version"], s["versions_behind"]) for s in status) == [
        ("shop.copy", 5, 0),
        ("shop.mirror", 5, 0),
        ("shop.orders", 5, 0),
    ]


def test_a_snapshot_a_catalog_table_and_a_pattern_that_discovers_a_table_added_later(
    spark, s3, bucket, cli, sink, database, clickhouse_http, http_sink
):
    first, second = f"s3a://{bucket}/sales/items", f"s3a://{bucket}/sales/shops"
    write_orders(first, s3.env(), n=50)
    change(spark, first, 0)
    cli.replicate("snapshot", first, f"{database}.items_copy")
    assert_replicated(spark, sink, first, TargetName(database, "items_copy"))
    spark.sql(f"CREATE DATABASE {database}")
    spark.sql(f"CREATE TABLE {database}.items USING delta LOCATION '{first}'")
    cli.replicate("run", f"{database}.items", f"{database}.named", "--once")
    assert_replicated(spark, sink, first, TargetName(database, "named"))
    # Spark's tasks insert into a server themselves: they read the store as the driver does
    cli.replicate("run", first, f"{database}.tasks", "--once", "--writer", "executors", "--clickhouse",
                  clickhouse_http.dsn)  # fmt: skip
    assert_replicated(spark, http_sink, first, TargetName(database, "tasks"))
    # a server's reader, with the keys in a named collection on the server
    collection = f"lake_{database}"
    http_sink.command(f"CREATE NAMED COLLECTION {collection} AS access_key_id = '{KEY_ID}', "
                      f"secret_access_key = '{SECRET}'")  # fmt: skip
    try:
        cli.replicate("run", first, f"{database}.pushed", "--once", "--reader", "clickhouse", "--lake-collection",
                      collection, "--clickhouse", clickhouse_http.dsn)  # fmt: skip
    finally:
        http_sink.command(f"DROP NAMED COLLECTION {collection}")
    assert_replicated(spark, http_sink, first, TargetName(database, "pushed"))

    pattern = ("run", "--table", f"s3a://{bucket}/sales/*", "--primary-key", "id", "--target",
               f"{database}.{{table}}", "--once")  # fmt: skip
    cli(*pattern)
    assert_replicated(spark, sink, first, TargetName(database, "items"))
    write_orders(second, s3.env(), n=30)
    change(spark, second, 1)
    change(spark, first, 2)
    cli(*pattern)
    assert_replicated(spark, sink, first, TargetName(database, "items"))
    assert_replicated(spark, sink, second, TargetName(database, "shops"))
    # verify reads the store as run does
    verified = json.loads(cli("verify", *pattern[1:-1], "--json").stdout)
    assert sorted((r["pipeline"], r["ok"]) for r in verified) == [(f"{database}.items", True),
                                                                   (f"{database}.shops", True)], verified  # fmt: skip


def change_by_delta_rs(uri: str, env: dict[str, str]) -> list[tuple]:
    """An UPDATE, a DELETE and a MERGE written by delta-rs (no JVM: the test's time is ClickHouse's); the rows
    after them."""
    from deltalake import DeltaTable

    table = DeltaTable(uri.replace("s3a://", "s3://"), storage_options=storage_options(env))
    table.update({"amount": "amount + 1", "name": "concat(name, 'u')"}, predicate="id % 5 = 0")
    table.delete("id % 7 = 1")
    table = DeltaTable(uri.replace("s3a://", "s3://"), storage_options=storage_options(env))
    table.merge(orders(90).slice(70), "t.id = s.id", source_alias="s", target_alias="t") \
        .when_matched_update_all().when_not_matched_insert_all().execute()  # fmt: skip
    table = DeltaTable(uri.replace("s3a://", "s3://"), storage_options=storage_options(env))
    return [(r["id"], r["name"], r["amount"]) for r in table.to_pyarrow_table().to_pylist()]


def test_auto_has_a_server_read_s3_with_its_collection_once_a_probe_shows_it_reads_the_same_table(
    s3, bucket, cli, database, clickhouse_http, http_sink
):
    uri, target = f"s3a://{bucket}/sales/lines", TargetName(database, "lines")
    write_orders(uri, s3.env(), n=80)
    expected = change_by_delta_rs(uri, s3.env())
    collection = f"keys_{database}"
    http_sink.command(f"CREATE NAMED COLLECTION {collection} AS access_key_id = '{KEY_ID}', "
                      f"secret_access_key = '{SECRET}'")  # fmt: skip
    server = ("--reader", "auto", "--clickhouse", clickhouse_http.dsn, "--log-format", "json")
    try:
        ran = cli.replicate("run", uri, target, "--once", "--lake-collection", collection, *server)
        # a collection the server does not hold: the probe fails, Spark is kept, and validate says why
        missing = cli.replicate("validate", uri, target, "--lake-collection", f"{collection}_gone", *server)
    finally:
        http_sink.command(f"DROP NAMED COLLECTION {collection}")
    (chosen,) = cli.events(ran, "reader_chosen")
    assert chosen["reader"] == "clickhouse", chosen
    assert f"named collection {collection}" in chosen["reason"] and "probe at version 3" in chosen["reason"]
    assert {e["reader"] for e in cli.events(ran, "batch")} == {"clickhouse"}
    final = http_sink.query_rows(f"SELECT id, name, amount FROM {target} FINAL WHERE _is_deleted = 0")
    assert_rows_equal(expected, [tuple(r) for r in final], f"{target} vs Delta {uri}")
    (kept,) = cli.events(missing, "reader_chosen")
    assert (
        kept["reader"] == "spark" and "probe of ClickHouse reading it at version 3 failed" in kept["reason"]
    )
    assert "reader spark (auto: a probe of ClickHouse reading it at version 3 failed" in missing.stdout
    assert SECRET not in ran.stderr + missing.stdout + missing.stderr


def test_a_poll_with_nothing_new_asks_the_store_two_heads_and_reads_nothing(s3, monkeypatch):
    """A fleet polls every table each second: with nothing new, a poll checks that the newest version it
    knows is there and the next is not, one HEAD each (a missing key's file info would also LIST), and takes
    the newest commit as it read it before."""
    name = f"lake-{uuid.uuid4().hex[:12]}"
    s3.bucket(name)
    proxy = S3FaultProxy(s3).start()
    try:
        uri = f"s3a://{name}/polled"
        for _ in range(3):
            write_deltalake(uri.replace("s3a://", "s3://"), orders(5), mode="append",
                            storage_options=storage_options(s3.env()))  # fmt: skip
        for key, value in s3.env(proxy.endpoint).items():
            monkeypatch.setenv(key, value)
        log = python_log(uri, s3=S3Settings.of({}, os.environ))  # the store's, from the environment
        assert log.latest().version == 2
        proxy.requests.clear()
        assert log.latest().version == 2
        assert [method for method, _ in proxy.requests] == ["HEAD", "HEAD"], proxy.requests
    finally:
        proxy.down()


def test_storage_that_throttles_refuses_or_is_down_leaves_the_offset_and_says_why(
    spark, s3, bucket, cli, sink, database, monkeypatch
):
    proxy = S3FaultProxy(s3).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        # Spark's s3a client, with few retries, so that a store down for longer than them is met in seconds
        reach(spark, proxy.endpoint, bucket, **{"retry.limit": "1", "retry.throttle.limit": "1",
                                                "attempts.maximum": "1", "retry.interval": "10ms"})  # fmt: skip
        uri = f"s3a://{bucket}/orders"
        write_orders(uri, s3.env(), n=60)
        target = TargetName(database, "orders")
        cli.replicate("run", uri, target, "--once")
        change(spark, uri, 0)
        change(spark, uri, 1)

        def refused(expect_words: str) -> list[dict]:
            result = cli.replicate("run", uri, target, "--once", expect=1)
            out = result.stderr
            assert expect_words in out and "no offset moved" in out, out[-3000:]
            assert committed_version(sink, database, str(target)) == 0
            return cli.events(result, "reader_chosen")

        proxy.add_fault("slowdown")  # every request, the log's first
        refused("throttling")
        proxy.clear()
        proxy.add_fault(
            "slowdown", lambda method, path: method == "GET" and ".parquet" in path
        )  # the data files' reads
        # The default reader's probe of ClickHouse fails in seconds (its S3 client bounded), and Spark, chosen
        # instead, is refused in turn.
        (chosen,) = refused("throttling")
        assert chosen["reader"] == "spark" and "a probe of ClickHouse reading it" in chosen["reason"], chosen
        proxy.clear()
        proxy.down()
        refused("could not be reached")
        proxy.up()
        proxy.add_fault("delay", seconds=0.2)  # slow, not failing: it only takes longer
        done = cli.replicate("run", uri, target, "--once")
        assert [e["reader"] for e in cli.events(done, "reader_chosen")] == ["clickhouse"]
        assert committed_version(sink, database, str(target)) == 2
        assert_replicated(spark, sink, uri, target)
    finally:
        proxy.down()
        reach(spark, s3.endpoint, bucket)


def test_a_wrong_key_and_a_missing_connector_say_what_to_do_and_create_nothing(tmp_path):
    server = S3Server(auth=4)  # issued keys (3 requests) and the bucket; then every request is checked
    try:
        key_id, secret = server.issue_keys()
        server.client(aws_access_key_id=key_id, aws_secret_access_key=secret).create_bucket(Bucket="lake")
        good = server.env(key_id=key_id, secret=secret)
        uri, dsn = "s3a://lake/sales/orders", f"chdb://{tmp_path / 'clickhouse'}"
        write_orders(uri, good)
        run = run_once(uri, dsn, "--target", "shop.o")

        wrong = cdc2ch(user_env(server.env(key_id=key_id, secret="wrong"), java=False, tmp_path=tmp_path), *run,
                       expect=1).stderr  # fmt: skip
        assert "refused the credentials" in wrong and "AWS_ACCESS_KEY_ID" in wrong, wrong[-3000:]
        assert "wrong" not in wrong.replace("a wrong or missing key", ""), "the secret was shown"
        missing = cdc2ch(user_env(good), *run, "--spark-conf", f"spark.jars={','.join(delta_jars())}",
                         expect=1).stderr  # fmt: skip
        assert "no file system for s3a://" in missing and "hadoop-aws" in missing, missing[-3000:]
        status = cdc2ch(user_env(good), "status", "--clickhouse", dsn, expect=0)
        assert "No pipelines found" in status.stdout + status.stderr
    finally:
        server.stop()


def test_a_pattern_on_s3_is_listed_without_spark_as_hadoop_lists_it(spark, s3, monkeypatch):
    """A fleet re-lists its patterns: on S3, pyarrow lists them with the endpoint and keys of the environment
    (no JVM is asked for), each segment matched alone, directories only; a directory without a log is
    listed as not Delta. The same glob in Hadoop's own syntax is listed by Hadoop, with the same answer."""
    name = s3.bucket(f"lake-{uuid.uuid4().hex[:12]}")
    for table in ("sales/items", "sales/shops", "hr/people"):
        write_deltalake(f"s3://{name}/{table}", orders(3), storage_options=storage_options(s3.env()))
    s3.client().put_object(Bucket=name, Key="sales/notes/readme.txt", Body=b"not a table")
    s3.client().put_object(Bucket=name, Key="sales/file.txt", Body=b"not a directory")
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)

    def no_spark():
        raise AssertionError("Spark was started to list S3")

    expected = [
        (f"s3a://{name}/sales/items", "items", "sales", True),
        (f"s3a://{name}/sales/notes", "notes", "sales", False),
        (f"s3a://{name}/sales/shops", "shops", "sales", True),
    ]
    assert LakeTables(no_spark).directories(f"s3a://{name}/sales/*", "a test") == expected
    assert LakeTables(no_spark).directories(f"s3://{name}/sales/*", "a test") == expected  # named as s3a://
    assert LakeTables(no_spark).directories(f"s3a://{name}/*/[ip]*", "a test") == [
        (f"s3a://{name}/hr/people", "people", "hr", True),
        expected[0],
    ]
    reach(spark, s3.endpoint, name)
    hadoop = LakeTables(spark).directories(f"s3a://{name}/sales/{{items,notes,shops}}", "a test")
    assert sorted(hadoop) == expected


def test_a_range_of_appends_is_read_from_its_files_without_reading_the_log_again(s3, tmp_path):
    """ClickHouse's Delta reader reads the table's log again for each range it reads (its checkpoint pointer,
    seven listings of the log, each commit file again), to find what cdc2ch's own reading of the log already
    found. A range that only appends is read from the files its commits add: the store sees no read of the
    checkpoint pointer and one listing (cdc2ch's); the rows are the table's. No Java is reachable: every
    request is cdc2ch's or its engine's."""
    name = f"lake-{uuid.uuid4().hex[:12]}"
    s3.bucket(name)
    uri = f"s3a://{name}/appended"
    write_orders(uri, s3.env(), n=50)
    proxy = S3FaultProxy(s3).start()
    try:
        env = user_env(s3.env(proxy.endpoint), java=False, tmp_path=tmp_path)
        dsn = f"chdb://{tmp_path / 'ch'}"
        cdc2ch(env, *run_once(uri, dsn, "--reader", "clickhouse", "--target", "s3.appended"))
        for i in range(3):  # versions 1..3, one row each
            more = pa.table({"id": pa.array([100 + i], pa.int64()), "name": [f"x{i}"], "amount": [0.5]})
            write_deltalake(uri.replace("s3a://", "s3://"), more, mode="append",
                            storage_options=storage_options(s3.env()))  # fmt: skip
        proxy.requests.clear()
        result = cdc2ch(env, *run_once(uri, dsn, "--reader", "clickhouse", "--target", "s3.appended"))
        requests = list(proxy.requests)
        batches = [json.loads(line) for line in result.stderr.splitlines() if '"batch"' in line]
        assert [(b["start"], b["end"], b["rows"]) for b in batches] == [(1, 3, 3)]
        expected = [(i, f"n{i}", i * 1.5) for i in range(50)] + [(100 + i, f"x{i}", 0.5) for i in range(3)]
        assert sorted(live_rows(env, dsn, "s3.appended")) == expected
        listings = [p for m, p in requests if m == "GET" and "list-type" in p]
        assert len(listings) <= 1, listings  # ClickHouse's Delta reader: 8
        assert ("GET", f"/{name}/appended/_delta_log/_last_checkpoint") not in requests, requests
    finally:
        proxy.down()
