"""`--on-schema-change follow`: a Spark-written column-mapping table's RENAME COLUMN and DROP COLUMN followed in
the target table in place (no rebuild) at their version, the current-state view with them; a kill -9 at the
schema step and a rerun; a key column renamed refused in a paragraph with nothing moved; a column the design
renames keeps its target name once --rename-columns names its new Delta name."""

from __future__ import annotations

import signal
import threading

import pytest

from cdc2ch.base.errors import SchemaChangeError
from cdc2ch.model.config import TargetName
from cdc2ch.model.design import TableDesign
from cdc2ch.replication.pipeline import Replicator
from cdc2ch.source.sparkread.deltasource import DeltaSource
from tests.e2e.clickhouse.test_faults import _env, server  # noqa: F401 (a fixture)
from tests.e2e.replication.test_schema_changes import _sql
from tests.support.helpers import (
    Proc,
    assert_replicated,
    clickhouse_rows,
    committed_version,
    job_config,
    latest_version,
)

FOLLOW = ("--on-schema-change", "follow")
READERS = ("spark", "clickhouse")


def _mapped(spark, path: str, columns: str, rows: str, mode: str = "name") -> str:
    """A column-mapping table with the change feed on, and `rows` at version 1."""
    _sql(
        spark,
        f"CREATE TABLE delta.`{path}` ({columns}) USING delta TBLPROPERTIES "
        f"(delta.enableChangeDataFeed = true, delta.columnMapping.mode = '{mode}')",
        f"INSERT INTO delta.`{path}` VALUES {rows}",
    )
    return path


def _uuid(sink, target: TargetName) -> str:
    """The table's UUID: kept by ALTER, traded by the EXCHANGE TABLES of a resync."""
    rows = sink.query_rows(
        "SELECT toString(uuid) FROM system.tables WHERE database = {d:String} AND name = {t:String}",
        {"d": target.database, "t": target.table},
    )
    return rows[0][0]


def _columns(sink, target: TargetName) -> list[str]:
    return [c for c in sink.table_columns(target) if not c.startswith("_")]


def _equal(spark, sink, path: str, target: TargetName) -> None:
    """FINAL and the current-state view both equal Delta at its latest version, which is committed."""
    assert committed_version(sink, target.database, str(target)) == latest_version(spark, path)
    assert_replicated(spark, sink, path, target)
    assert_replicated(spark, sink, path, TargetName(target.database, target.table + "_current"), view=True)


def test_renames_and_drops_are_followed_in_place_at_their_version(spark, sink, cli, database, tmp_path):
    """With each reader: Spark's change feed, and ClickHouse's own Delta reader (`--reader clickhouse`)."""
    columns = "id INT, region STRING, a STRING, b STRING, c INT"
    rows = "(1, 'eu', 'a1', 'b1', 1), (2, 'us', 'a2', 'b2', 2), (3, 'eu', 'a3', 'b3', 3)"
    path = _mapped(spark, str(tmp_path / "follow"), columns, rows, mode="id")  # the other tests: `name`
    targets = {r: (TargetName(database, f"followed_{r}"), ("--reader", r, *FOLLOW)) for r in READERS}
    uuids = {}
    for reader, (target, args) in targets.items():
        cli.replicate("run", path, target, "--once", *args)
        uuids[reader] = _uuid(sink, target)
    _sql(
        spark,
        f"UPDATE delta.`{path}` SET a = 'old name' WHERE id = 1",  # v2: written as `a`
        f"ALTER TABLE delta.`{path}` RENAME COLUMN a TO `a new`",  # v3
        f"INSERT INTO delta.`{path}` VALUES (4, 'us', 'a4', 'b4', 4)",
        f"ALTER TABLE delta.`{path}` DROP COLUMN b",  # v5
        f"UPDATE delta.`{path}` SET `a new` = 'new name' WHERE id = 2",
        f"ALTER TABLE delta.`{path}` ADD COLUMNS (b STRING)",  # v7: a new `b`, empty in older rows
        f"INSERT INTO delta.`{path}` VALUES (5, 'eu', 'a5', 6, 'b5')",
        f"DELETE FROM delta.`{path}` WHERE id = 3",
    )
    for reader, (target, args) in targets.items():
        events = cli.events(cli.replicate("run", path, target, "--once", *args))
        assert not [e for e in events if e["event"].startswith("resync")], reader
        assert _uuid(sink, target) == uuids[reader]  # the same table, altered
        # Each ALTER lands between the commit of the version before and the rows of its own version.
        order = [(e["event"], e.get("version")) for e in events if e["event"] in ("committed", "column_renamed",
                                                                                  "column_dropped")]  # fmt: skip
        assert order == [("committed", 2), ("column_renamed", None), ("committed", 4), ("column_dropped", None),
                         ("committed", 6), ("committed", 9)], reader  # fmt: skip
        assert _columns(sink, target) == ["id", "region", "a new", "c", "b"]
        _equal(spark, sink, path, target)

    # Under fail (the default) the same kind of change still stops.
    target, args = targets["spark"]
    _sql(spark, f"ALTER TABLE delta.`{path}` RENAME COLUMN c TO d")
    err = " ".join(cli.replicate("run", path, target, "--once", expect=1).stderr.split())
    assert "column 'c' is no longer in the Delta table" in err and "--on-schema-change resync" in err
    cli.replicate("run", path, target, "--once", *args)
    assert (
        _columns(sink, target) == ["id", "region", "a new", "d", "b"]
        and _uuid(sink, target) == uuids["spark"]
    )
    _equal(spark, sink, path, target)


def test_a_kill_at_the_rename_then_a_rerun(spark, http_sink, cli, server, fault_proxy, database, tmp_path):  # noqa: F811
    path = _mapped(
        spark,
        str(tmp_path / "killed_rename"),
        "id INT, a STRING, b STRING",
        "(1, 'a1', 'b1'), (2, 'a2', 'b2')",
    )
    target = TargetName(database, "killed_rename")
    args = ["run", "--table", path, "--primary-key", "id", "--target", str(target), "--once", *FOLLOW,
            "--clickhouse", fault_proxy.url_for()]  # fmt: skip
    cli(*args)
    uuid = _uuid(http_sink, target)
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` RENAME COLUMN a TO z",  # v2
        f"ALTER TABLE delta.`{path}` DROP COLUMN b",  # v3
        f"INSERT INTO delta.`{path}` VALUES (3, 'z3')",
        f"UPDATE delta.`{path}` SET z = 'upd' WHERE id = 1",
    )
    proc = None

    def kill(req):
        proc.kill_9()

    # Killed as the ALTER goes out: it still reaches ClickHouse, the view and the offset stay behind.
    rule = fault_proxy.add_fault("call", match=lambda req: "RENAME COLUMN" in req.sql, fn=kill)
    proc = Proc(*args, env=_env(server))
    assert proc.wait() == -signal.SIGKILL, proc.stderr[-2000:]
    fault_proxy.settle()  # the ALTER is forwarded after the kill: wait until it has landed
    assert rule.fired == 1
    assert committed_version(http_sink, database, str(target)) == 1
    assert _columns(http_sink, target) == ["id", "z", "b"]  # the rename landed; nothing after it
    fault_proxy.clear()
    cli(*args)  # the rerun sees the rename done and goes on: the drop, the view, the rows
    assert _uuid(http_sink, target) == uuid
    assert _columns(http_sink, target) == ["id", "z"]
    _equal(spark, http_sink, path, target)


def test_a_renamed_sorting_key_column_is_refused_and_nothing_moves(spark, sink, cli, database, tmp_path):
    """Refused by a service running when the rename arrives (at its version), and by a run started after it
    (at start), in the same paragraph."""
    path = _mapped(
        spark, str(tmp_path / "keyed"), "id INT, region STRING, a STRING", "(1, 'eu', 'a1'), (2, 'us', 'a2')"
    )
    target = TargetName(database, "keyed")
    design = ("--order-by", "region,id", *FOLLOW)
    cli.replicate("run", path, target, "--once", *design)
    uuid = _uuid(sink, target)
    cfg = job_config(
        path, target, cli.dsn, on_schema_change="follow", design=TableDesign(("id",), ("region", "id"))
    )
    running = Replicator(cfg, DeltaSource(spark, path), sink, threading.Event())
    running.start()
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` RENAME COLUMN region TO area",  # v2
        f"INSERT INTO delta.`{path}` VALUES (3, 'eu', 'a3')",
    )
    try:
        with pytest.raises(SchemaChangeError) as refused:
            running.step()
    finally:
        running.close()
    result = cli.replicate("run", path, target, "--once", *design, expect=1)
    for err, where in (
        (str(refused.value), "at version 2 (RENAME COLUMN region TO area)"),
        (result.stderr, ""),
    ):
        err = " ".join(err.split())
        assert f"{where}" in err and "Delta column 'region'" in err and "was renamed to 'area'" in err, err
        assert "is a sorting-key column of ClickHouse table" in err
        assert "cannot rename or drop a column of a table's sorting or partition key in place" in err
        assert "replication stopped with version 1 committed and the table unchanged" in err
        assert "new --target with the key options naming 'area'" in err
    assert committed_version(sink, database, str(target)) == 1
    assert _columns(sink, target) == ["id", "region", "a"] and _uuid(sink, target) == uuid
    rows = clickhouse_rows(sink, target, ["id", "region", "a"])
    assert sorted(rows) == [(1, b"eu", b"a1"), (2, b"us", b"a2")]  # the rows of version 1, nothing after


def test_a_column_renamed_for_the_target_keeps_its_name_once_the_option_follows(
    spark, sink, cli, database, tmp_path
):
    path = _mapped(
        spark, str(tmp_path / "optioned"), "id INT, email STRING, x INT", "(1, 'e1', 1), (2, 'e2', 2)"
    )
    target = TargetName(database, "optioned")
    cli.replicate("run", path, target, "--once", *FOLLOW, "--rename-columns", "email=contact")
    uuid = _uuid(sink, target)
    _sql(
        spark,
        f"ALTER TABLE delta.`{path}` RENAME COLUMN email TO mail",
        f"UPDATE delta.`{path}` SET mail = 'new' WHERE id = 2",
    )
    err = cli.replicate("run", path, target, "--once", *FOLLOW, "--rename-columns", "email=contact", expect=2)
    assert "--rename-columns names column(s) 'email'" in " ".join(err.stderr.split())
    assert committed_version(sink, database, str(target)) == 1
    cli.replicate("run", path, target, "--once", *FOLLOW, "--rename-columns", "mail=contact")
    assert _columns(sink, target) == ["id", "contact", "x"] and _uuid(sink, target) == uuid
    assert committed_version(sink, database, str(target)) == latest_version(spark, path)
    renamed = {"mail": "contact"}
    assert_replicated(spark, sink, path, target, rename=renamed)
    assert_replicated(spark, sink, path, TargetName(database, "optioned_current"), view=True, rename=renamed)
