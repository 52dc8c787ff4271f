"""Names that need quoting (spaces, dots, backticks, reserved words, unicode) in the Delta path, the
columns, the key, the target database and table: replicated, snapshotted and reported on both targets."""

from __future__ import annotations

import json

import pytest

from cdc2ch.model.config import TargetName
from tests.support.helpers import assert_replicated, committed_version, latest_version

# Spark SQL column list, `order id` the key. (Delta itself cannot UPDATE a column with a backtick in its
# name, so backticks are tested in the ClickHouse names only.)
COLUMNS = "`order id` BIGINT, `select` STRING, `a.b` STRING, `ü名` STRING, `n°-#1` INT, `from` DOUBLE"


@pytest.mark.parametrize("target_kind", ["embedded", "server"])
def test_awkward_names_everywhere(target_kind, spark, sink, cli, database, tmp_path, request, monkeypatch):
    path = str(tmp_path / "my table.ü")
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({COLUMNS}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true, "
        f"delta.columnMapping.mode = 'name', delta.minReaderVersion = 2, delta.minWriterVersion = 5)"
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 's', 'ab', 'ü', 1, 1.5), (2, 't', 'cd', '名', 2, 2.5)")
    spark.sql(f"UPDATE delta.`{path}` SET `select` = 'S', `n°-#1` = 10 WHERE `order id` = 1")

    dsn, check = cli.dsn, sink
    if target_kind == "server":
        endpoint = request.getfixturevalue("clickhouse_http")
        monkeypatch.setenv("CDC2CH_CLICKHOUSE_PASSWORD", endpoint.password)
        dsn, check = endpoint.dsn, request.getfixturevalue("http_sink")
    target = TargetName(f"{database} db-ü", "t.1 `x` select")
    spelled = f"`{target.database}`.`{target.table.replace('`', '``')}`"
    assert TargetName.parse(spelled) == target
    common = ["--table", path, "--primary-key", "order id", "--clickhouse", dsn]

    cli("run", *common, "--target", spelled, "--once")
    assert_replicated(spark, check, path, target)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE `order id` = 2")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (3, 'from', 'x.y', 'ß', 3, 3.5)")
    cli("run", *common, "--target", spelled, "--once")
    assert_replicated(spark, check, path, target)
    assert committed_version(check, target.database, str(target)) == latest_version(spark, path)

    snap = TargetName(target.database, "snap `2`")
    cli("snapshot", *common, "--target", f"`{snap.database}`.`snap ``2```")
    assert_replicated(spark, check, path, snap)

    report = json.loads(cli("status", "--clickhouse", dsn, "--target", spelled, "--json").stdout)
    assert [r["pipeline"] for r in report] == [str(target)] and report[0]["versions_behind"] == 0
    out = cli(
        "query",
        f"SELECT `order id`, `n°-#1` FROM {spelled} FINAL WHERE NOT _is_deleted ORDER BY 1",
        "--format",
        "TSV",
        "--clickhouse",
        dsn,
    ).stdout
    assert out.split() == ["1", "10", "3", "3"]
