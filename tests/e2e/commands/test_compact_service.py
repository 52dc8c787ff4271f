"""`run --compact-every`: a service compacting its targets on schedule while commits with deletes arrive.

A real `run --serve` process on the embedded engine (readers go through its HTTP interface, as `status` does:
chdb cannot be opened by a second process), Delta tables written by Spark meanwhile.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import clickhouse_connect
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdc2ch.clickhouse.tables.compaction import SIDE_SUFFIX, VIEW_SUFFIX
from tests.e2e.fleet.test_operations import _free_port, _scrape, _wait, _write_config
from tests.support.helpers import Proc, create_table, delta_rs_rows, latest_version

PASSWORD = "compact-s3cret"
LIVE = "SELECT id, v FROM {t} FINAL WHERE _is_deleted = 0 ORDER BY id"
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])


def _rows(rows) -> tuple:
    return tuple(sorted(tuple(int(x) for x in r) for r in rows))


def test_service_compacts_on_schedule_while_commits_arrive(spark, database, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for path in (a, b):
        create_table(spark, path, "id BIGINT, v BIGINT")
        spark.sql(f"INSERT INTO delta.`{path}` SELECT id, 0 FROM range(40)")
    spark.sql(f"DELETE FROM delta.`{b}` WHERE id < 10")  # tombstones younger than b's bound: all kept
    data, port, metrics_port = tmp_path / "clickhouse", _free_port(), _free_port()
    config = _write_config(
        tmp_path,
        f'poll-interval = 0.3\ncompact-every = "1s"\n'
        f'[[pipelines]]\nname = "a"\ntable = "{a}"\nprimary-key = "id"\ntarget = "{database}.a"\n'
        f'compact-older-than = "0s"\n'
        f'[[pipelines]]\nname = "b"\ntable = "{b}"\nprimary-key = "id"\ntarget = "{database}.b"\n'
        f'compact-older-than = "1h"\n',
    )
    env = {"CDC2CH_SERVE_PASSWORD": PASSWORD}
    service = Proc("run", "--config", config, "--clickhouse", f"chdb://{data}", "--serve",
                   f"127.0.0.1:{port}", "--metrics-port", str(metrics_port), env=env, cwd=str(tmp_path))  # fmt: skip
    try:
        service.wait_for("serving", 300)
        client = clickhouse_connect.get_client(host="127.0.0.1", port=port, password=PASSWORD)
        table_a, table_b = f"`{database}`.a", f"`{database}`.b"
        first = _wait(lambda: service.events("compact_done"), 300, service, "a first compaction")
        assert first

        # Readers query a's FINAL while commits with deletes arrive and compactions run between turns.
        seen, errors, stop = set(), [], threading.Event()

        def read():
            reader = clickhouse_connect.get_client(host="127.0.0.1", port=port, password=PASSWORD)
            try:
                while not stop.is_set():
                    seen.add(_rows(reader.query(LIVE.format(t=table_a)).result_rows))
                    time.sleep(0.1)
            except BaseException as exc:
                errors.append(exc)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        start = latest_version(spark, a)

        def dropping() -> int:
            """Compactions of a that dropped tombstones, so far."""
            return sum(
                e["dropped"] > 0 for e in service.events("compact_done") if e["target"] == f"{database}.a"
            )

        # Commits by delta-rs (Spark's take many times the CPU); a delete last in each round: the compaction
        # after it merges away every older version.
        for k in range(1, 7):
            before = dropping()
            write_deltalake(a, pa.table({"id": [100 + k], "v": [k]}, schema=SCHEMA), mode="append")
            DeltaTable(a).update(updates={"v": str(k)}, predicate="id % 7 = 0")
            DeltaTable(a).delete(f"id % 7 = {k}")
            # A compaction dropping this round's tombstones before the next round (a poll, not a sleep).
            _wait(lambda b=before: dropping() > b, 120, service, f"a compaction after round {k}")
        latest = latest_version(spark, a)
        expected = _rows(delta_rs_rows(a, latest, ["id", "v"]))

        def caught_up_and_clean():
            live = _rows(client.query(LIVE.format(t=table_a)).result_rows)
            raw = client.query(f"SELECT count(), countIf(_is_deleted = 1) FROM {table_a}").result_rows[0]
            return live == expected and raw == (len(expected), 0)

        # Every tombstone older than the bound (0 s) is gone, with every older version of every key.
        _wait(caught_up_and_clean, 300, service, "a replicated and compacted to its live rows")
        time.sleep(1)
        stop.set()
        for t in readers:
            t.join(30)
        assert not errors, errors[0]
        versions = {_rows(delta_rs_rows(a, v, ["id", "v"])) for v in range(start, latest + 1)}
        assert len(seen) > 2 and seen <= versions, sorted(seen - versions)[:3]  # FINAL: a Delta version

        done = [e for e in service.events("compact_done") if e["target"] == f"{database}.a"]
        assert sum(e["dropped"] > 0 for e in done) >= 2, done  # compactions interleaved with the deletes
        removed_a = sum(e["dropped"] for e in done)
        assert removed_a == 40 + 6 - len(expected), done  # each deleted key's tombstone, once
        # b's tombstones are younger than its bound: every one kept, the table not rewritten.
        assert client.query(f"SELECT count() FROM {table_b} WHERE _is_deleted = 1").result_rows[0][0] == 10
        for e in service.events("compact_done"):
            if e["target"] == f"{database}.b":
                assert e["dropped"] == 0 and e["kept"] == 10 and not e["optimized"], e
        leftovers = client.query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND (endsWith(name, {s:String}) "
            "OR endsWith(name, {v:String}))",
            parameters={"db": database, "s": SIDE_SUFFIX, "v": VIEW_SUFFIX},
        ).result_rows
        assert leftovers == []

        # Compactions go on (later ones drop nothing), and each is logged just before it is counted: wait
        # for the counters to take in every compaction the log has shown so far.
        counted = [
            ("cdc2ch_compactions_total", ("pipeline=a",)),
            ("cdc2ch_compaction_seconds_count", ("pipeline=a",)),
        ]

        def counters_caught_up():
            found = _scrape(metrics_port)
            return found if all(found[c] >= len(done) for c in counted) else None

        m = _wait(counters_caught_up, 30, service, "the compaction counters")
        assert m[("cdc2ch_tombstones_removed_total", ("pipeline=a",))] == removed_a
        assert m[("cdc2ch_compaction_seconds_sum", ("pipeline=a",))] > 0
        assert m[("cdc2ch_tombstones_removed_total", ("pipeline=b",))] == 0

        # `status` finds the service by itself and shows the last compaction and the tombstones removed.
        status = Proc("status", "--config", config, "--clickhouse", f"chdb://{data}", "--json", env=env,
                      cwd=str(tmp_path))  # fmt: skip
        assert status.wait() == 0, status.stderr[-3000:]
        rows = {r["pipeline"]: r for r in json.loads(status.stdout)}
        assert rows["a"]["last_compaction_at"] and rows["a"]["compacted"], rows["a"]
        assert rows["a"]["tombstones_removed_total"] == removed_a, rows["a"]
        assert rows["b"]["tombstones_removed"] == 0 and rows["b"]["tombstones_removed_total"] == 0, rows["b"]
        table = Proc(
            "status",
            "--config",
            config,
            "--clickhouse",
            f"chdb://{data}",
            "--wide",
            env=env,
            cwd=str(tmp_path),
        )
        assert table.wait() == 0 and "compacted" in table.stdout.splitlines()[0], table.stdout
    finally:
        service.signal(signal.SIGTERM)
        code = service.wait()
    assert code == 0, service.stderr[-3000:]
