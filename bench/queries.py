"""What a query on the replica costs against a plain table: `python bench/queries.py [--quick]` (also
`make bench` / `make bench-quick`).

A Delta table (written by Spark) is loaded at version 0: ROWS rows of orders (id, city, amount, qty,
created_at spread over a year); then 10 versions of MERGEs each changing 5% of its rows, keys spread over the
whole table (updates, a tenth of them deletes, a few inserts). It is replicated as a service would: `run
--once` after version 0, then `run --once` after the churn, on the embedded ClickHouse. Each design (the
default, sorted by id; and partitioned by month of created_at) has its own engine directory.

Beside each target, a plain `MergeTree` of the same design holding exactly its current rows, merged into one
part per partition (the limit: nothing to collapse). Five queries run on `<target>_current` (the view cdc2ch
keeps, FINAL without tombstones) and on the plain table, each the median of 5 runs in one process:

  after churn    right after the churn's `run --once`
  levers         the same state, each of the view's query settings on and off (per query)
  steady         a continuous `cdc2ch run` (upkeep on by default) while recent orders keep changing (a MERGE
                 every 2 s updating recent rows and adding new ones), until its upkeep has merged; then the
                 service stopped, STEADY_AFTER more commits replicated by `run --once` and not yet merged:
                 what a running service leaves between two of its merges

Prints a table per state and design; `--keep DIR` keeps (and reuses) the Delta table and engine directories.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SIZES = {"quick": 2_000_000, "full": 20_000_000}
VERSIONS, CHURN = 10, 0.05
STEADY_EVERY = 2.0  # seconds between two commits while the service runs
STEADY_AFTER = 3  # commits replicated after the service stopped, not merged
STEADY_LIMIT = 300.0  # seconds at most of the service's run
QUIET = 15.0  # seconds without a merge: the service has merged the churn's parts
RUNS = 5
DESIGNS = {"sorted by id": (), "partitioned by month": ("--partition-by", "toYYYYMM(created_at)")}
COLUMNS = "id BIGINT, city STRING, amount DOUBLE, qty INT, created_at TIMESTAMP"
SPAN = 365 * 86400  # created_at spans a year over the first ROWS ids
QUERIES: dict[str, list[str]] = {
    "count()": ["SELECT count() FROM {t}"],
    "GROUP BY city with sum, avg": ["SELECT city, sum(amount), avg(qty) FROM {t} GROUP BY city"],
    "sum(amount) WHERE qty < 5": ["SELECT sum(amount) FROM {t} WHERE qty < 5"],
    "4 point lookups by key": [
        f"SELECT * FROM {{t}} WHERE id = {k}" for k in (17, 250_001, 999_999, 1_500_007)
    ],
    "top 10 by amount": ["SELECT id, amount FROM {t} ORDER BY amount DESC LIMIT 10"],
}
# The view's query settings measured one by one (levers), applied to each query on the view (whose own
# definition sets do_not_merge_across_partitions_select_final = 1: here turned off).
LEVERS: dict[str, dict[str, int]] = {
    "do_not_merge_across_partitions_select_final=0": {"do_not_merge_across_partitions_select_final": 0},
    "split_parts_ranges_into_intersecting_and_non_intersecting_final=0": {
        "split_parts_ranges_into_intersecting_and_non_intersecting_final": 0
    },
    "split_intersecting_parts_ranges_into_layers_final=0": {
        "split_intersecting_parts_ranges_into_layers_final": 0
    },
    "use_skip_indexes_if_final=0": {"use_skip_indexes_if_final": 0},
    "query_plan_optimize_lazy_final=1": {"query_plan_optimize_lazy_final": 1},
    "enable_vertical_final=0": {"enable_vertical_final": 0},
}


def _select(rows: int, first: int, count: int, salt: int, prefix: str = "city") -> str:
    """The columns of orders id = first .. first + count - 1 (created_at follows id)."""
    return (
        f"SELECT id, concat('{prefix}-', cast(pmod(hash(id, {salt}), 50) AS STRING)) AS city, "
        f"rand({salt}) * 1000 AS amount, cast(pmod(hash(id, {salt} + 1), 20) AS INT) AS qty, "
        f"timestamp_seconds(1700000000 + cast(id * {SPAN / rows} AS BIGINT)) AS created_at "
        f"FROM range({first}, {first + count})"
    )


def _merge(spark, path: str, source_sql: str) -> None:
    spark.sql(source_sql).createOrReplaceTempView("churn")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING churn s ON t.id = s.id "
        f"WHEN MATCHED AND s.op = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET city = s.city, amount = s.amount, qty = s.qty "
        f"WHEN NOT MATCHED AND s.op != 'd' THEN INSERT (id, city, amount, qty, created_at) "
        f"VALUES (s.id, s.city, s.amount, s.qty, s.created_at)"
    )


def build(spark, path: str, rows: int) -> None:
    """Version 0: the loaded table (one CREATE TABLE ... AS SELECT)."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true) "
        f"AS {_select(rows, 0, rows, 0)}"
    )


def churn(spark, path: str, rows: int) -> None:
    """VERSIONS MERGEs, each changing CHURN of the rows, keys spread over the table (a permutation of the id
    space, a fiftieth beyond the loaded ids: inserts); a tenth of them deletes."""
    space, touched = rows + rows // 50, int(rows * CHURN)
    for v in range(1, VERSIONS + 1):
        ids = f"SELECT pmod(id * 7919 + {v * 104729}, {space}) AS id FROM range(0, {touched})"
        cols = _select(rows, 0, 0, v).split(" FROM ")[0].replace("SELECT ", "")
        _merge(
            spark,
            path,
            f"SELECT {cols}, CASE WHEN pmod(id + {v}, 10) = 0 THEN 'd' ELSE 'u' END AS op FROM ({ids})",
        )


def steady_commit(spark, path: str, rows: int, i: int, top: int) -> int:
    """One commit of recent orders: a thousandth of the rows among the newest ids updated, as many new ones
    added. Returns the new top id."""
    n = max(rows // 2000, 100)
    cols = _select(rows, 0, 0, 1000 + i).split(" FROM ")[0].replace("SELECT ", "")
    recent = f"SELECT {top} - 1 - id * 7 AS id FROM range(0, {n})"
    new = f"SELECT {top} + id AS id FROM range(0, {n})"
    _merge(spark, path, f"SELECT {cols}, 'u' AS op FROM ({recent} UNION ALL {new})")
    return top + n


# -- cdc2ch ---------------------------------------------------------------------------------------------
def cdc2ch(path: str, dsn: str, extra: tuple[str, ...], *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "cdc2ch", "run", "--table", path, "--primary-key", "id"]
    cmd += ["--target", "bench.orders", "--clickhouse", dsn, *extra, *args, "--log-format", "json"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def once(path: str, dsn: str, extra: tuple[str, ...]) -> float:
    t0 = time.monotonic()
    proc = cdc2ch(path, dsn, extra, "--once")
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"cdc2ch run --once failed:\n{err[-3000:]}")
    return time.monotonic() - t0


def steady(spark, path: str, dsn: str, extra: tuple[str, ...], rows: int, top: int) -> tuple[int, dict]:
    """A continuous run with its upkeep while commits arrive, until it has merged after the first of them
    (and STEADY_EVERY * 10 s more); then STEADY_AFTER commits replicated by `run --once`."""
    proc = cdc2ch(path, dsn, extra, "--poll-interval", "1")
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True).start()
    t0, commits, merged_at = time.monotonic(), 0, None
    merges = lambda: sum('"event": "final_merge_done"' in ln for ln in list(lines))  # noqa: E731
    # First the merges of the churn's parts: until none came for QUIET s (or none at all in STEADY_LIMIT / 2).
    seen, changed = 0, time.monotonic()
    while time.monotonic() - t0 < STEADY_LIMIT / 2:
        if proc.poll() is not None:
            raise SystemExit("cdc2ch run exited:\n" + "".join(lines)[-3000:])
        if merges() != seen:
            seen, changed = merges(), time.monotonic()
        elif seen and time.monotonic() - changed >= QUIET:
            break
        time.sleep(0.5)
    before, churn_merged = merges(), time.monotonic() - t0
    while time.monotonic() - t0 < STEADY_LIMIT:
        if proc.poll() is not None:
            raise SystemExit("cdc2ch run exited:\n" + "".join(lines)[-3000:])
        t = time.monotonic()
        top = steady_commit(spark, path, rows, commits, top)
        commits += 1
        if merged_at is None and merges() > before:
            merged_at = time.monotonic()
        if merged_at is not None and time.monotonic() - merged_at > STEADY_EVERY * 10:
            break
        time.sleep(max(0.0, STEADY_EVERY - (time.monotonic() - t)))
    proc.send_signal(signal.SIGTERM)
    proc.wait(180)
    done = [json.loads(ln) for ln in lines if '"event": "final_merge_done"' in ln]
    for i in range(STEADY_AFTER):
        top = steady_commit(spark, path, rows, commits + i, top)
    once(path, dsn, extra)
    return top, {
        "seconds": round(time.monotonic() - t0, 1),
        "commits": commits + STEADY_AFTER,
        "churn_merged": round(churn_merged, 1),
        "churn_merges": before,
        "merges": len(done),
        "merge_seconds": round(sum(m.get("seconds", 0.0) for m in done), 2),
    }


# -- measuring (in a process of its own: one embedded engine per directory at a time) ----------------------
def measure(directory: str, partition: str | None, levers: bool) -> dict:
    import chdb.session as chs

    s = chs.Session(directory)
    view, table = "bench.orders_current", "bench.orders"

    def scalar(sql: str) -> str:
        return str(s.query(sql, "TSV")).strip()

    # The state measured stays as it was found: no merge of the engine's own runs meanwhile.
    s.query(f"SYSTEM STOP MERGES {table}")
    s.query("DROP TABLE IF EXISTS bench.plain")
    part = f"PARTITION BY {partition} SETTINGS allow_nullable_key = 1" if partition else ""
    s.query(f"CREATE TABLE bench.plain ENGINE = MergeTree ORDER BY id {part} AS SELECT * FROM {view}")
    s.query("OPTIMIZE TABLE bench.plain FINAL")
    state = {
        "current": int(scalar(f"SELECT count() FROM {view}")),
        "stored": int(scalar(f"SELECT count() FROM {table}")),
        "parts": int(
            scalar(
                "SELECT count() FROM system.parts WHERE database = 'bench' AND table = 'orders' AND active"
            )
        ),
        "partitions": int(
            scalar(
                "SELECT uniq(partition_id) FROM system.parts WHERE database = 'bench' AND table = 'orders' AND active"
            )
        ),
    }
    same = scalar(
        f"SELECT (SELECT sum(cityHash64(*)) FROM {view}) = (SELECT sum(cityHash64(*)) FROM bench.plain)"
    )
    assert same == "1", "the plain table does not hold the view's rows"

    def once(queries: list[str], on: str, settings: dict[str, int]) -> float:
        tail = (" SETTINGS " + ", ".join(f"{k} = {v}" for k, v in settings.items())) if settings else ""
        t0 = time.perf_counter()
        for q in queries:
            s.query(q.format(t=on) + tail, "Null")
        return (time.perf_counter() - t0) * 1000

    def timed(queries: list[str], *contenders: tuple[str, dict[str, int]]) -> list[float]:
        """Median ms of each contender (table, settings), their runs alternating: on a shared machine
        each sees the same load."""
        runs: list[list[float]] = [[] for _ in contenders]
        for _ in range(RUNS):
            for i, (on, settings) in enumerate(contenders):
                runs[i].append(once(queries, on, settings))
        return [statistics.median(r) for r in runs]

    for queries in QUERIES.values():  # warm: each column read once
        timed(queries, (view, {}), ("bench.plain", {}))
    out: dict = {"state": state, "view": {}, "plain": {}, "levers": {}}
    for name, queries in QUERIES.items():
        out["view"][name], out["plain"][name] = timed(queries, (view, {}), ("bench.plain", {}))
        if levers:
            out["levers"][name] = {}
            for lever, st in LEVERS.items():
                default, with_lever = timed(queries, (view, {}), (view, st))
                out["levers"][name][lever] = (default, with_lever)
    s.query("DROP TABLE IF EXISTS bench.plain")
    s.close()
    return out


def measured(directory: str, partition: str | None, levers: bool = False) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--measure",
            directory,
            "--partition",
            partition or "",
            *(["--levers"] if levers else []),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"measuring failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(title: str, m: dict) -> list[str]:
    st = m["state"]
    lines = [
        "",
        f"{title}: {st['current']:,} current rows ({st['stored']:,} stored, {st['parts']} parts in "
        f"{st['partitions']} partitions)",
        "| query | `orders_current` | plain MergeTree | ratio |",
        "|---|---|---|---|",
    ]
    for name in QUERIES:
        v, p = m["view"][name], m["plain"][name]
        lines.append(f"| {name} | {v:.1f} ms | {p:.1f} ms | {v / p:.2f}× |")
    if m["levers"]:
        lines += [
            "",
            f"{title}, the view's query settings one by one: ms with the setting / ms without (runs alternating)",
        ]
        levers = list(LEVERS)
        lines.append("| query | " + " | ".join(f"`{lv}`" for lv in levers) + " |")
        lines.append("|---" * (len(levers) + 1) + "|")
        for name in QUERIES:
            row = [f"{m['levers'][name][lv][1]:.0f} / {m['levers'][name][lv][0]:.0f}" for lv in levers]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
    return lines


def main(size: str, keep: str | None) -> None:
    from cdc2ch.model.config import SparkSettings
    from cdc2ch.source.spark.session import session

    rows = SIZES[size]
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="cdc2ch-queries-"))
    work.mkdir(parents=True, exist_ok=True)
    spark = session(SparkSettings())
    path = str(work / "orders")
    say = lambda text: print(text, flush=True)  # noqa: E731
    say(f"Query benchmark ({size}: {rows:,} rows, {VERSIONS} MERGEs of {CHURN:.0%}), in {work}")

    def replicate_each_design() -> None:
        """`run --once` into each design's own embedded target, as a service catching up would."""
        for i, extra in enumerate(DESIGNS.values()):
            seconds = once(path, f"chdb://{work}/ch-{i}", extra)
            say(f"  run --once {' '.join(extra) or '(default design)'}: {seconds:.0f} s")

    try:
        fresh = not (work / "churned").exists()
        if fresh:
            for d in ("orders", *(f"ch-{i}" for i in range(len(DESIGNS)))):
                shutil.rmtree(work / d, ignore_errors=True)
            t0 = time.monotonic()
            build(spark, path, rows)
            say(f"version 0 written ({time.monotonic() - t0:.0f} s)")
            replicate_each_design()
            t0 = time.monotonic()
            churn(spark, path, rows)
            say(f"churn written ({time.monotonic() - t0:.0f} s)")
            replicate_each_design()
            (work / "churned").write_text(str(rows + rows // 50))
        top = int((work / "churned").read_text())
        for i, (design, extra) in enumerate(DESIGNS.items()):
            partition = extra[1] if extra else None
            d = str(work / f"ch-{i}")
            for ln in table(f"After churn, {design}", measured(d, partition, levers=True)):
                say(ln)
        for i, (design, extra) in enumerate(DESIGNS.items()):
            partition = extra[1] if extra else None
            d = str(work / f"ch-{i}")
            top, run = steady(spark, path, f"chdb://{d}", extra, rows, top)
            (work / "churned").write_text(str(top))
            say(
                f"\nservice: {run['churn_merges']} merges of the churn's parts in its first {run['churn_merged']} s, "
                f"then {run['commits']} commits; {run['merges']} merges in all ({run['merge_seconds']} s) in "
                f"{run['seconds']} s"
            )
            for ln in table(f"Steady state, {design}", measured(d, partition, levers=size == "quick")):
                say(ln)
    finally:
        spark.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2M rows instead of 20M")
    ap.add_argument("--keep", metavar="DIR", help="keep the tables in DIR (and reuse them when there)")
    ap.add_argument("--measure", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--partition", default="", help=argparse.SUPPRESS)
    ap.add_argument("--levers", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure, a.partition or None, a.levers)))
    else:
        os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        main("quick" if a.quick else "full", a.keep)
