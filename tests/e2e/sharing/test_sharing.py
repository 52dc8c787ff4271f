"""Delta Sharing end to end: Delta tables written by Spark, shared by tests/support/sharing_server.py over HTTP,
replicated by `cdc2ch` through the share into real chdb. FINAL equals the provider's Delta table; faults
give their named outcome; no token or secret shows up anywhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cdc2ch.model.config import TargetName
from cdc2ch.source import open_source
from cdc2ch.source.sharing import restclient as sharing_client
from tests.e2e.replication.test_replication import COLS, _append, scenario_mix
from tests.support.helpers import (
    Proc,
    assert_replicated,
    committed_version,
    create_table,
    delta_rows,
    latest_version,
)
from tests.support.sharing_connector import (
    assert_agree,
    assert_connector_agrees,
    read_with_connector,
    spark_derived,
)
from tests.support.sharing_server import SharingServer


def scenario_history(spark, path):
    """On a copy of the 26-version mix of every kind of write (append, overwrite, replaceWhere, UPDATE, DELETE,
    MERGE): a key-changing UPDATE and a column added (the schema of the end version): 29 versions."""
    spark.sql(f"UPDATE delta.`{path}` SET id = id + 1000000 WHERE id % 4 = 1")  # key change
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (extra STRING)")
    spark.createDataFrame([(5_000_000, "a", "late", 1.0, "x")], COLS + ", extra STRING").write.format(
        "delta"
    ).mode("append").save(path)


@pytest.fixture(scope="module")
def share(spark, tmp_path_factory, built):
    """One server for the module; its tables are written on first use, once."""
    root = tmp_path_factory.mktemp("shared")
    with SharingServer() as server:
        server.root, server.paths, server.built = root, {}, built
        server.profile_path = server.profile(root)
        yield server


def _table(server, spark, name) -> str:
    if name not in server.paths:
        path = server.built.copy(scenario_mix, server.root / name)
        {"mix": scenario_history}[name](spark, path)
        server.share(f"prov.sales.{name}", path)
        server.paths[name] = path
    return server.paths[name]


def _url(server, name):
    return server.url(server.profile_path, f"prov.sales.{name}")


def _no_secret(server, *results):
    """No bearer token, client secret or access token the server issued in any of the outputs."""
    for r in results:
        text = r if isinstance(r, str) else r.stdout + r.stderr
        assert server.secrets and not [s for s in server.secrets if s in text]


def _nothing_created(sink, database):
    assert sink.query_rows(f"SELECT name FROM system.tables WHERE database = '{database}'") == []


# -- 1. the replication matrix through a share ---------------------------------------------------------------
def test_final_equals_the_providers_table(share, spark, sink, cli, database):
    name = "mix"
    path = _table(share, spark, name)
    target = TargetName(database, name)
    result = cli.replicate("run", _url(share, name), target, "--once")
    latest = latest_version(spark, path)
    assert committed_version(sink, database, str(target)) == latest
    assert_replicated(spark, sink, path, target, latest)
    status = cli("status", "--json")
    row = next(r for r in json.loads(status.stdout) if r["pipeline"] == str(target))
    assert (row["latest_version"], row["versions_behind"]) == (latest, 0)
    assert row["location"].endswith(f"/shares/prov/schemas/sales/tables/{name}")
    _no_secret(share, result, status)
    assert_connector_agrees(
        share, share.profile_path, f"prov.sales.{name}", spark, path, versions=(1, latest)
    )


def test_a_table_shared_with_history_and_no_feed_replicates_from_the_query_since_a_version(
    share, spark, sink, cli, database
):
    """No change data feed: /changes is refused, and each run reads a query since its first version, the rows
    of each version's added files inserts and of its removed files deletes. FINAL equals the table after
    every run; the official connector's parts read the same query answer as Delta derives the changes."""
    path = str(share.root / "nofeed")
    t = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {t} ({COLS}) USING delta PARTITIONED BY (part)")  # v0: no feed
    share.share("prov.sales.nofeed", path)
    url, target = _url(share, "nofeed"), TargetName(database, "nofeed")
    values = ", ".join(f"({i}, '{'ab'[i % 2]}', 'n{i}', {i}.5)" for i in range(12))
    steps = [
        [f"INSERT INTO {t} VALUES {values}"],  # v1
        [
            f"UPDATE {t} SET name = 'upd' WHERE id % 3 = 0",  # v2: files rewritten
            f"DELETE FROM {t} WHERE id IN (4, 5)",  # v3
            f"INSERT INTO {t} VALUES (4, 'a', 'back', 4.0)",  # v4: a deleted key comes back
        ],
        [
            f"UPDATE {t} SET id = id + 100 WHERE id = 7",  # v5: a key change (7 goes)
            # v6: part b deleted and re-inserted in one commit: 9 changed, 11 kept, 1 gone
            f"INSERT INTO {t} REPLACE WHERE part = 'b' SELECT id, part, IF(id = 9, 'again', name), amount "
            f"FROM {t} WHERE part = 'b' AND id <> 1",
        ],
    ]
    queries = 0
    for statements in steps:
        for statement in statements:
            spark.sql(statement)
        result = cli.replicate("run", url, target, "--once")
        assert_replicated(spark, sink, path, target)
        asked = [q for m, q in share.requests if m == "POST" and q.endswith("/nofeed/query")]
        assert len(asked) > queries  # (queries since a version: the table has no snapshot read)
        queries = len(asked)
    assert committed_version(sink, database, str(target)) == 6
    assert any("/nofeed/changes" in q for _, q in share.requests)  # asked, and refused
    _no_secret(share, result)
    task, expected = spark_derived(spark, path, 2, 6)
    (got,) = read_with_connector([{**task, "url": url}])
    assert_agree(got, expected, "a query since version 2")
    kinds = {(row[-3], row[-2]) for row in got["rows"]}  # (_change_type, _commit_version)
    assert {("insert", 2), ("delete", 2), ("delete", 3), ("insert", 6), ("delete", 6)} <= kinds, kinds
    assert (got["version"], got["metadata_versions"]) == (2, [])


# -- 2. a snapshot through /query killed with -9, resumed, then run ------------------------------------------
def _query(dsn, sql):
    out = subprocess.run([sys.executable, "-m", "cdc2ch", "query", sql, "--clickhouse", dsn, "--format",
                          "JSONCompactEachRow"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [json.loads(ln) for ln in out.stdout.splitlines()]


def test_killed_snapshot_resumes_then_run_continues(
    share, spark, cli, clickhouse_http, http_sink, database, tmp_path
):
    """The killed process writes through ClickHouse's HTTP interface (the password goes by environment)."""
    path = str(tmp_path / "snap")
    create_table(spark, path, "id BIGINT, v STRING")
    spark.range(0, 4000, 1, 8).selectExpr("id", "cast(id * 3 as string) v").write.format("delta").mode(
        "append"
    ).save(path)
    n = latest_version(spark, path)
    spark.sql(f"UPDATE delta.`{path}` SET v = 'later' WHERE id % 7 = 0")
    share.share("prov.sales.snap", path)
    url, target, dsn = _url(share, "snap"), TargetName(database, "snap"), clickhouse_http.dsn
    # One shared file per Spark task, a chunk per 2 tasks (the cores of the session's master, which the killed
    # process runs too: the same chunks): 4 chunks; each download held 1.5 s, so the kill lands mid-way.
    snapshot = ("snapshot", "--table", url, "--primary-key", "id", "--target", str(target), "--clickhouse", dsn,
                "--version", str(n), "--spark-master", spark.sparkContext.master,
                "--spark-conf", "spark.sql.files.maxPartitionBytes=1")  # fmt: skip
    share.slow(1.5, path_contains="/files/", times=8)
    first = Proc(*snapshot)
    first.wait_for("chunk", timeout=240)
    first.kill_9()
    assert first.wait(60) == -signal.SIGKILL
    with share._lock:
        share._rules.clear()
    landed = {e["chunk"] for e in first.events("chunk")}
    # The rerun in this process: the same snapshot on the session's Spark, with the same split size.
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1")
    try:
        second = cli(*snapshot[:-4])
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    done = cli.events(second, "chunk")
    assert done[0]["of"] == 4 and landed and not landed & {e["chunk"] for e in done}  # landed: not read again
    assert len(done) <= 4 - len(landed)
    assert_replicated(spark, http_sink, path, target, n)
    twice = (
        f"SELECT count() FROM (SELECT id, _version FROM {target} GROUP BY id, _version HAVING count() > 1)"
    )
    assert http_sink.query_rows(f"SELECT count() FROM {target}") == [(4000,)]  # no row twice
    run = cli.replicate("run", url, target, "--once", "--clickhouse", dsn)
    assert cli.events(run, "range_read")[0]["start"] == n + 1
    assert_replicated(spark, http_sink, path, target)
    assert http_sink.query_rows(twice) == [(0,)]
    _no_secret(share, first.stderr + first.stdout, second, run)


# -- 3. kill -9 during a shared catch-up --------------------------------------------------------------------
def test_killed_catch_up_converges_without_duplicates(share, spark, tmp_path):
    path = _table(share, spark, "mix")
    dsn = f"chdb://{tmp_path / 'ch'}"
    args = ("run", "--table", _url(share, "mix"), "--primary-key", "id", "--target", "k.mix", "--clickhouse", dsn,
            "--once", "--max-rows-per-read", "40", "--spark-master", "local[1]")  # fmt: skip
    first = Proc(*args)
    first.wait_for("committed", timeout=240)
    first.kill_9()
    assert first.wait(60) == -signal.SIGKILL
    second = Proc(*args)
    assert second.wait(300) == 0, second.stderr[-3000:]
    reads = second.events("range_read")
    assert not reads or reads[0]["start"] > 0  # resumed after what the first one committed
    _no_secret(share, first.stderr + first.stdout, second.stderr + second.stdout)

    def query(sql):
        return _query(dsn, sql)

    cols = ["id", "part", "name", "amount"]
    got = query("SELECT id, part, name, amount FROM k.mix FINAL WHERE _is_deleted = 0")
    expected = delta_rows(spark, path, columns=cols)
    assert sorted((r[0], r[1].encode(), r[2].encode(), r[3]) for r in got) == sorted(expected)
    assert query(
        "SELECT count() FROM (SELECT id, _version FROM k.mix GROUP BY id, _version HAVING count() > 1)"
    )[0] == [0]


# -- 4. faults ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(share, spark):
    """A small shared table of three versions for the fault cases."""
    path = str(share.root / "small")
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", f"n{i}", 1.0) for i in range(20)])
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 5")
    share.share("prov.sales.small", path)
    share.paths["small"] = path
    return path


def test_wrong_token_is_one_paragraph_naming_profile_and_endpoint(
    share, small, sink, cli, database, tmp_path
):
    profile = tmp_path / "stale.share"
    wrong = "dss-" + "0" * 32
    profile.write_text(
        json.dumps({"shareCredentialsVersion": 1, "endpoint": share.endpoint, "bearerToken": wrong})
    )
    result = cli.replicate(
        "run", f"{profile}#prov.sales.small", TargetName(database, "small"), "--once", expect=1
    )
    assert str(profile) in result.stderr and share.endpoint in result.stderr and "HTTP 401" in result.stderr
    assert wrong not in result.stdout + result.stderr
    _nothing_created(sink, database)


def test_throttling_and_server_errors_are_retried(share, small, spark, sink, cli, database, monkeypatch):
    share.fail(429, path_contains="/changes", times=1, retry_after=1)
    share.fail(503, path_contains="/version", times=1)
    target = TargetName(database, "throttled")
    result = cli.replicate("run", _url(share, "small"), target, "--once")
    waits = [e for e in cli.events(result) if e.get("event") == "sharing_retry"]
    assert any(e["wait_s"] >= 1.0 for e in waits) and len(waits) == 2
    assert_replicated(spark, sink, small, target)
    # A server that keeps failing: bounded attempts, one paragraph, nothing created for a new pipeline.
    monkeypatch.setattr(sharing_client, "ATTEMPTS", 2)
    share.fail(500, path_contains="/changes", times=2)  # each read: 2 attempts
    other = TargetName(database, "failing")
    failed = cli.replicate("run", _url(share, "small"), other, "--once", expect=1)
    assert "kept failing" in failed.stderr and "HTTP 500 after 2 attempts" in failed.stderr
    assert (
        sink.query_rows(
            f"SELECT count() FROM system.tables WHERE database = '{database}' AND name = 'failing'"
        )[0][0]
        == 0
    )
    _no_secret(share, result, failed)


def test_ranges_cut_from_one_answer_are_read_under_the_schema_in_force(
    share, small, spark, sink, cli, database
):
    """Versions [0, 2] planned from one /changes answer, read as [0, 1] and [2, 2]: the second range has no
    metaData line of its own and still finds its schema; the run exits 0. (The history replayed as asked: a
    version of over ten such reads would otherwise begin with a snapshot.)"""
    target = TargetName(database, "cut")
    result = cli.replicate("run", _url(share, "small"), target, "--once", "--batch-size", "10",
                           "--max-rows-per-read", "10", "--initial-load", "changes")  # fmt: skip
    assert [(e["start"], e["end"]) for e in cli.events(result, "range_read")][-1] == (2, 2)
    assert_replicated(spark, sink, small, target)


def test_expired_urls_are_requested_again(share, small, spark):
    source = open_source(spark, _url(share, "small"))
    latest = latest_version(spark, small)
    changes = source.changes(1, latest)
    asked = sum(1 for _, target in share.requests if "/changes" in target)
    share.expire_urls()  # the URLs of that answer now get 403 from the storage
    rows = changes.arrow_rows(False)
    assert sum(1 for _, target in share.requests if "/changes" in target) == asked + 1
    cdf = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1).load(small)
    assert rows.num_rows == cdf.count() == 20 + 5


def test_the_collected_share_feed_has_the_bytes_of_the_spark_layout(share, spark):
    """A shared range is collected as its feed, the metadata columns computed in Arrow (contract.arrow_rows);
    the executors writer computes them in Spark (contract.spark_rows). Both must give the same schema and
    bytes: insert deduplication tokens digest them."""
    from cdc2ch.model import contract

    path = str(share.root / "layout")
    create_table(spark, path, COLS)
    _append(spark, path, [(i, "a", f"n{i}", 1.0) for i in range(10)])
    spark.sql(f"UPDATE delta.`{path}` SET id = id + 100 WHERE id = 3")  # a key changes: a pre-image
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 4")
    share.share("prov.sales.layout", path)
    changes = open_source(spark, _url(share, "layout")).changes(1, latest_version(spark, path))
    order = [(c, "ascending") for c in ("id", "_version")]
    for immutable_keys in (False, True):
        got = changes.arrow_rows(immutable_keys)
        want = changes.spark_rows(immutable_keys).toArrow()
        assert got.schema.equals(want.schema, check_metadata=True), immutable_keys
        assert got.num_rows == want.num_rows == 10 + 1 + (1 if immutable_keys else 2)
        assert contract.digest(got.sort_by(order)) == contract.digest(want.sort_by(order))


def test_history_not_shared_says_what_to_enable_and_snapshot_is_the_way_in(
    share, small, spark, sink, cli, database
):
    share.share("prov.sales.nohist", small, history=False)
    url = _url(share, "nohist")
    target = TargetName(database, "nohist")
    refused = cli.replicate("run", url, target, "--once", expect=1)
    assert "WITH HISTORY" in refused.stderr and "delta.enableChangeDataFeed" in refused.stderr
    assert "cdc2ch snapshot" in refused.stderr
    _nothing_created(sink, database)
    loaded = cli.replicate("snapshot", url, target)
    assert_replicated(spark, sink, small, target)
    _no_secret(share, refused, loaded)


def test_versions_the_server_no_longer_has_mean_resync(share, small, spark, sink, cli, database):
    target = TargetName(database, "gone")
    cli.replicate("run", _url(share, "small"), target, "--once")
    committed = committed_version(sink, database, str(target))
    _append(spark, small, [(100, "a", "new", 1.0)])
    body = json.dumps({"errorCode": "INVALID_PARAMETER_VALUE",
                       "message": f"Cannot time travel to version {committed + 1}: the earliest available version "
                                  f"is {committed + 5}"})  # fmt: skip
    share.fail(400, path_contains="/changes", times=1, body=body)
    refused = cli.replicate("run", _url(share, "small"), target, "--once", expect=1)
    assert "resync with `cdc2ch snapshot`" in refused.stderr
    assert committed_version(sink, database, str(target)) == committed  # offset untouched
    cli.replicate("run", _url(share, "small"), target, "--once")
    assert_replicated(spark, sink, small, target)


def test_refused_input_creates_nothing(share, spark, sink, cli, database, tmp_path):
    path = str(tmp_path / "dv")
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({COLS}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true, "
        f"delta.enableDeletionVectors = true)"
    )
    _append(spark, path, [(1, "a", "x", 1.0)])
    share.share("prov.sales.dv", path)
    dv = cli.replicate("run", _url(share, "dv"), TargetName(database, "dv"), "--once", expect=1)
    assert "deletion vectors" in dv.stderr
    reader = cli.replicate("run", _url(share, "mix"), TargetName(database, "ops"), "--once", "--reader",
                           "clickhouse", expect=2)  # fmt: skip
    assert "--reader clickhouse" in reader.stderr and "Drop --reader clickhouse" in reader.stderr
    missing = cli.replicate("run", f"{tmp_path}/none.share#prov.sales.mix", TargetName(database, "x"), "--once",
                            expect=2)  # fmt: skip
    assert "none.share does not exist" in missing.stderr
    _nothing_created(sink, database)
    _no_secret(share, dv, reader, missing)
    assert os.path.exists(share.profile_path)


# -- 5. OAuth client-credentials profiles -------------------------------------------------------------------
def test_oauth_profile_replicates_and_renews_its_access_token(
    share, small, spark, sink, cli, database, tmp_path
):
    share.oauth(ttl=4)
    # A wrong client secret: one paragraph naming the profile and the token endpoint, nothing created.
    wrong = share.oauth_profile(tmp_path, secret="oss-" + "1" * 32)
    target = TargetName(database, "oauth")
    refused = cli.replicate("run", f"{wrong}#prov.sales.small", target, "--once", expect=1)
    paragraph = refused.stderr.strip().splitlines()[-1]
    assert wrong in paragraph and share.token_endpoint in paragraph and "HTTP 401" in paragraph, (
        refused.stderr
    )
    assert "oss-" + "1" * 32 not in refused.stdout + refused.stderr
    _nothing_created(sink, database)
    assert share.token_calls and set(share.token_calls) == {401}

    profile = share.oauth_profile(tmp_path)
    url = f"{profile}#prov.sales.small"
    del share.token_calls[:]
    result = cli.replicate("run", url, target, "--once")
    assert_replicated(spark, sink, small, target)
    assert share.token_calls and set(share.token_calls) == {200}
    status = cli("status", "--json")

    # Renewal: an access token is reused while valid and fetched again before it expires; one the server
    # stops accepting (revoked) is fetched again once, and the request succeeds.
    source = open_source(spark, url)
    refused_before, calls = share.refused, len(share.token_calls)
    source.client.version()
    source.client.version()
    assert len(share.token_calls) == calls + 1  # reused
    time.sleep(3.2)  # past 3/4 of its 4 s life
    source.client.version()
    assert len(share.token_calls) == calls + 2 and share.refused == refused_before
    with share._lock:
        share.issued.clear()
    assert source.client.version() == latest_version(spark, small)
    assert len(share.token_calls) == calls + 3 and share.refused == refused_before + 1

    # The official connector reads through the same token endpoint (HTTP Basic client authentication).
    before = len(share.token_calls)
    assert_connector_agrees(share, profile, "prov.sales.small", spark, small)
    assert len(share.token_calls) > before and set(share.token_calls) == {200}
    _no_secret(share, refused, result, status)


# -- 6. validate and verify on a share ----------------------------------------------------------------------
def test_validate_and_verify_on_a_share(share, small, spark, sink, cli, database):
    url = _url(share, "small")
    fresh = TargetName(database, "checked")
    checked = cli("validate", "--table", url, "--primary-key", "id", "--target", str(fresh))
    latest = latest_version(spark, small)
    where = f"{share.endpoint}/shares/prov/schemas/sales/tables/small"
    assert (
        f"ok  {fresh}  {url} -> {fresh}: served at {where}, latest version {latest}, starts at version 0"
        in (checked.stdout)
    )
    _nothing_created(sink, database)

    target = TargetName(database, "verified")
    cli.replicate("run", url, target, "--once")
    ok = cli("verify", "--table", url, "--primary-key", "id", "--target", str(target), "--json")
    (report,) = json.loads(ok.stdout)
    rows = spark.read.format("delta").load(small).count()  # the module's `small` grows in another test
    assert report["ok"] and report["delta_rows"] == report["target_rows"] == rows, report
    # A changed row with a higher _version: FINAL now shows it, verify names that key and column.
    sink.command(
        f"INSERT INTO {target} SELECT * REPLACE ('tampered' AS name, _version + 1 AS _version) FROM {target} "
        f"FINAL WHERE id = 7"
    )
    drift = cli("verify", "--table", url, "--primary-key", "id", "--target", str(target), "--json", expect=1)
    (report,) = json.loads(drift.stdout)
    assert (report["missing"], report["extra"], report["differing"]) == (0, 0, 1), report
    (found,) = report["sample"]
    assert (found["kind"], found["key"]) == ("differing", {"id": 7}) and "name" in found["columns"], report
    _no_secret(share, checked, ok, drift)


# -- patterns over a share -----------------------------------------------------------------------------------
def test_a_sharing_pattern_replicates_a_schema_and_a_whole_share(
    share, spark, sink, cli, database, monkeypatch
):
    """`#share.schema.*` lists one schema's tables, `#share.*` every table of the share (both listings paged:
    two tables a page here)."""
    monkeypatch.setattr("cdc2ch.source.sharing.restclient.PAGE", 2)
    name = f"p{database}"
    paths = {}
    for schema_name, table in (("sales", "a"), ("sales", "b"), ("other", "c")):
        paths[schema_name, table] = str(share.root / f"{name}_{schema_name}_{table}")
        create_table(spark, paths[schema_name, table], "id BIGINT, v STRING")
        _append_rows(spark, paths[schema_name, table], 3)
        share.share(f"{name}.{schema_name}.{table}", paths[schema_name, table])

    cli.replicate("run", f"{share.profile_path}#{name}.sales.*", f"{database}.{{table}}", "--once")
    for table in ("a", "b"):
        assert_replicated(spark, sink, paths["sales", table], TargetName(database, table))
    assert not sink.table_exists(TargetName(database, "c"))

    cli.replicate("run", f"{share.profile_path}#{name}.*", f"{database}.{{schema}}_{{table}}", "--once")
    for schema_name, table in paths:
        target = TargetName(database, f"{schema_name}_{table}")
        assert_replicated(spark, sink, paths[schema_name, table], target)


def _append_rows(spark, path: str, rows: int) -> None:
    spark.sql(f"INSERT INTO delta.`{path}` VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(rows)))
