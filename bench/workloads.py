"""cdc2ch against the alternatives on the same Delta histories, in one run:
`python bench/workloads.py [--quick]` (also `make bench` / `make bench-quick`).

Workloads (built with Spark in a temporary directory):
  W1  append-heavy backlog: rows appended over many versions
  W2  update/delete-heavy backlog: a loaded table, then MERGE versions touching ~6% of it each
  W3  steady state: a small commit every 2 s (appends and MERGEs in turn) while `cdc2ch run` polls every second
  W5  a large dimension table: 20M rows (quick: 2M), then 10 MERGE commits each changing 1% of its rows
  W4  many tables: W3 spread over N tables in one `cdc2ch run --config` process (one commit every 2 s,
      round-robin), to show what each extra pipeline costs in latency and memory

Contenders, each into its own ReplacingMergeTree table of the same layout on the embedded ClickHouse:
  cdc2ch     `cdc2ch run --once` as its own process (Spark start-up reported separately) over the backlog of
             a pipeline that exists (loaded at the version before it by `cdc2ch snapshot`), as a service
             meets a backlog; W1 also as a new pipeline, to show what creating one adds
  reference  the loop ClickHouse published for Delta CDF: delta-rs `load_cdf`, drop pre-images, add the
             metadata columns, `insert_arrow` in batches of 80,000 rows (no Spark)
  streaming  the job a Spark user would write by hand: Structured Streaming `readChangeFeed` with
             Trigger.AvailableNow and foreachBatch inserting Arrow (bench/streaming_peer.py, own process,
             Spark start-up excluded)
  native     ClickHouse reading the CDF itself: INSERT ... SELECT FROM deltaLakeLocal(path) SETTINGS
             delta_lake_snapshot_start_version/end_version (the physical limit here; bench/native_peer.py,
             own process, as cdc2ch's ClickHouse reader runs); the two run SHORT_RUNS times each,
             alternating, each in a fresh database, and the median run of each is compared
cdc2ch's Spark reader and the streaming peer likewise run SPARK_RUNS times each, alternating, and are compared
as a user waits for them: the whole process less its Spark start-up (imports, opening the target, cdc2ch's
checks and the peer's table included for both). Every timed run begins once the writes made before it are on
disk.
Prints one line per figure, with each cdc2ch run's time split (read, inserts, the rest) and its CPU by
thread group (JIT compilers, collector, Spark tasks, driver threads, Python), and writes bench/results.md
and bench/results.png.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.model import schema
from cdc2ch.model.config import SparkSettings, TargetName
from cdc2ch.model.design import TableDesign
from cdc2ch.source.spark.session import class_archive, delta_jars, session

# quick: under 3 minutes on 2 cores (fewer versions, the push-down reader on W1 only)
_W = ("w1_rows", "w1_versions", "w2_rows", "w2_versions", "w3_seconds", "w1_scale", "w2_push", "w4_tables")
SIZES = {
    "full": dict(
        zip(_W, (2_000_000, 20, 1_000_000, 20, 60, 10, True, 20)), w5_rows=20_000_000, w5_versions=10
    ),
    "quick": dict(zip(_W, (200_000, 5, 100_000, 3, 14, 0, False, 5)), w5_rows=2_000_000, w5_versions=10),
}
# Runs of each Spark contender (cdc2ch's Spark reader, the streaming peer) per workload, the two alternating:
# one run of either varies by a fifth on these 2 cores (W5: 10.2 and 13.2 s, same code, back to back), and
# with three runs each a workload's ratio moved by up to 0.2 from one full run to the next
SPARK_RUNS = {"full": 5, "quick": 1}
COLUMNS = "id BIGINT, tenant INT, name STRING, amount DOUBLE, at TIMESTAMP"
BATCH = 80_000
SHORT_RUNS = 5  # runs of each sub-second contender (the ClickHouse reader, native) per workload
# The figure of a run that counts, by contender: the two Spark contenders are timed alike, each whole process
# less its Spark start-up ("span"); the others inside their processes, the engine's start left out ("seconds").
COUNTED = {"cdc2ch": "span", "streaming": "span"}


def counted(contender: str) -> str:
    return COUNTED.get(contender, "seconds")


HERE = Path(__file__).resolve().parent


# -- workloads --------------------------------------------------------------------------------------
def _rows(spark, start: int, count: int, salt: int = 0):
    return spark.range(start, start + count, 1, 4).selectExpr(
        "id",
        "cast(id % 1000 AS INT) AS tenant",
        f"concat('name-', id, '-', {salt}) AS name",
        f"rand({salt}) * 1000 AS amount",
        "timestamp_micros(id * 1000) AS at",
    )


FEED = "delta.enableChangeDataFeed = true"


def _create(spark, path: str, properties: str = FEED) -> None:
    spark.sql(f"CREATE TABLE delta.`{path}` ({COLUMNS}) USING delta TBLPROPERTIES ({properties})")


def build_w1(spark, path: str, rows: int, versions: int, properties: str = FEED) -> int:
    """Appends only; returns the first version of the backlog."""
    _create(spark, path, properties)
    per = rows // versions
    for v in range(versions):
        _rows(spark, v * per, per, v).write.format("delta").mode("append").save(path)
    return 1


def build_w2(spark, path: str, rows: int, versions: int, properties: str = FEED) -> int:
    """A loaded table, then MERGEs each touching ~6%: updates, deletes and inserts."""
    _create(spark, path, properties)
    _rows(spark, 0, rows).write.format("delta").mode("append").save(path)
    touched = int(rows * 0.06)
    for v in range(versions):
        src = (
            spark.range(0, touched, 1, 4)
            .selectExpr(f"(id * 16 + {v * 7}) % {rows + touched} AS id")
            .selectExpr(
                "id",
                "cast(id % 1000 AS INT) AS tenant",
                f"concat('merged-', id, '-', {v}) AS name",
                f"rand({v}) * 1000 AS amount",
                "timestamp_micros(id * 1000) AS at",
                "CASE WHEN id % 5 = 0 THEN 'd' ELSE 'u' END AS op",
            )
        )
        _merge(spark, path, src)
    return 2


def _merge(spark, path: str, src) -> None:
    """Upsert `src` (the table's columns plus `op`: 'd' deletes) into the table: one MERGE commit."""
    src.createOrReplaceTempView("merge_source")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING merge_source s ON t.id = s.id "
        f"WHEN MATCHED AND s.op = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET tenant = s.tenant, name = s.name, amount = s.amount, at = s.at "
        f"WHEN NOT MATCHED THEN INSERT (id, tenant, name, amount, at) "
        f"VALUES (s.id, s.tenant, s.name, s.amount, s.at)"
    )


def build_w5(spark, path: str, rows: int, versions: int, properties: str = FEED) -> int:
    """A large dimension table, then MERGEs each changing 1% of its rows (updates, a tenth of them
    deletes). The table is written in files of ~500k rows ordered by id and each
    MERGE touches a band of ids, as a table clustered by key would see: a MERGE rewrites a few files."""
    _create(spark, path, properties)
    spark.range(0, rows, 1, max(4, rows // 500_000)).selectExpr(
        "id", "cast(id % 1000 AS INT) AS tenant", "concat('name-', id) AS name", "rand(0) * 1000 AS amount",
        "timestamp_micros(id * 1000) AS at",
    ).write.format("delta").mode("append").save(path)  # fmt: skip
    touched = rows // 100
    for v in range(versions):
        band = v * 2 * touched + (rows // versions // 7) * v  # distinct bands, spread over the key space
        src = spark.range(0, touched, 1, 4).selectExpr(f"({band} + id * 2) % {rows + touched} AS id").selectExpr(
            "id", "cast(id % 1000 AS INT) AS tenant", f"concat('dim-', id, '-', {v}) AS name",
            f"rand({v}) * 1000 AS amount", "timestamp_micros(id * 1000) AS at",
            "CASE WHEN id % 10 = 0 THEN 'd' ELSE 'u' END AS op",
        )  # fmt: skip
        _merge(spark, path, src)
    return 2


def latest_version(spark, path: str) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]


def cdf_rows(spark, path: str, start: int) -> int:
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .load(path)
        .count()
    )


# -- measuring a process tree -----------------------------------------------------------------------
# Where a run's CPU goes, by thread name (/proc comm, 15 characters): the JVM's JIT compilers and collector,
# Spark's tasks (scan and Arrow conversion), its driver threads (py4j calls: planning, code generation, log
# reads) and the Python process (cdc2ch and the embedded ClickHouse engine's threads).
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CPU_GROUPS = (
    ("JIT", ("C1 CompilerThre", "C2 CompilerThre")),
    ("GC", ("VM Thread", "GC Thread", "VM Periodic Tas")),
    ("tasks", ("Executor task l", "serve-Arrow")),
    ("driver", ("Thread-", "main", "java")),
)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from each thread's /proc children list (not a scan of all of /proc,
    whose cost on these 2 cores would fall on whichever contender is being sampled)."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return tree


def rss_bytes(pid: int) -> int:
    """Resident bytes of one process (its VmRSS; 0 for one that has none left, a zombie)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(stat: str | Path) -> float:
    """User + system CPU seconds from a /proc stat file (a process's or one thread's)."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class PeakRss:
    """Samples the resident memory of a process and all its descendants (Python + JVM + workers), and the
    CPU time of each of their threads (a thread that ends between two samples is missed)."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self.threads: dict[str, tuple[str, str, float]] = {}  # /proc task -> (process, thread, CPU seconds)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            total = 0
            for p in descendants(self.pid):
                try:
                    total += rss_bytes(p)
                    self._sample_threads(p)
                except OSError:
                    pass
            self.peak = max(self.peak, total)

    def _sample_threads(self, pid: int) -> None:
        process = Path(f"/proc/{pid}/comm").read_text().strip()
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:  # a thread may end between the listing and its read
                seconds = cpu_seconds(task / "stat")
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            self.threads[str(task)] = (process, name, seconds)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak

    def cpu(self) -> dict[str, float]:
        """CPU seconds by group: the JVM's CPU_GROUPS and the rest of it, and the Python process."""
        out: dict[str, float] = {}
        for process, thread, seconds in self.threads.values():
            if process != "java":
                group = "Python" if process.startswith("python") else "other"
            else:
                found = (g for g, names in CPU_GROUPS if thread.startswith(names))
                group = next(found, "JVM other")
            out[group] = out.get(group, 0.0) + seconds
        return out


def cdc2ch_run(path: str, table: str, dsn: str, *extra: str) -> tuple[subprocess.Popen, PeakRss]:
    """`cdc2ch run` of `path` into bench.<table> as its own process, its memory sampled; read by Spark unless
    `extra` names a reader (the figures compare Spark's reader with the streaming peer)."""
    args = ["run", "--table", path, "--primary-key", "id", "--target", f"bench.{table}", "--clickhouse", dsn]
    args += [] if "--reader" in extra else ["--reader", "spark"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc2ch", *args, *extra, "--log-format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, PeakRss(proc.pid)


def events(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def _ts(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


# -- contenders -------------------------------------------------------------------------------------
def settled() -> None:
    """Before each timed run: the writes of what ran before it (the last run, or its own untimed set-up, such
    as follow_from's 20M-row merge for W5: about 600 MB of dirty pages) reach the disk now, so that the kernel
    does not write them back during the run and charge one contender for another's data."""
    os.sync()


def follow_from(path: str, start: int, dsn: str, table: str) -> float:
    """Make the pipeline exist before its backlog, as a service meets one: load version start - 1 with
    `cdc2ch snapshot` (ClickHouse reads it), so that `run` continues from `start`. Returns its seconds."""
    t0 = time.monotonic()
    args = [
        "snapshot",
        "--table",
        path,
        "--primary-key",
        "id",
        "--target",
        f"bench.{table}",
        "--clickhouse",
        dsn,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "cdc2ch", *args, "--version", str(start - 1), "--reader", "clickhouse"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"cdc2ch snapshot failed:\n{proc.stderr[-3000:]}")
    # A table a service has kept for a while is merged; one loaded just now is not, and the embedded engine
    # would merge it during the timed run (20M rows for W5), where the other contenders write into tables
    # made empty. Merge it first, untimed.
    merge = f"s = connect({dsn!r}); s.command('OPTIMIZE TABLE bench.{table} FINAL'); s.close()"
    subprocess.run(
        [sys.executable, "-c", f"from cdc2ch.clickhouse.connection.dsn import connect\n{merge}"], check=True
    )
    return time.monotonic() - t0


def run_cdc2ch(path: str, start: int, dsn: str, table: str, *extra: str, new: bool = False) -> dict:
    """`cdc2ch run --once` over the backlog from `start`: by a pipeline that exists (follow_from), or with
    `new` by a new one (--from-version), which also creates its table, checks the first range's keys before
    writing and claims the pipeline."""
    if not new:
        follow_from(path, start, dsn, table)
    settled()
    t0 = time.monotonic()
    proc, rss = cdc2ch_run(
        path, table, dsn, *(("--from-version", str(start)) if new else ()), "--once", *extra
    )
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    peak = rss.stop()
    if proc.returncode != 0:
        raise SystemExit(f"cdc2ch failed:\n{err[-3000:]}")
    evs = events(err)
    start_ev = next(e for e in evs if e["event"] == "start")
    stop_ev = next(e for e in evs if e["event"] == "stopped")
    # Where the time goes: Spark reads (CDF + collect to Arrow; what the loop waited, as the next range is
    # read during a write), ClickHouse inserts, the rest (Delta log and schema lookups, offsets, lock).
    # Spark starts at the first read (a poll with nothing new starts none): its start-up is the "jvm" phase.
    phases = stop_ev.get("phases", {})
    read = sum(e["seconds"] for e in evs if e["event"] == "range_read") - phases.get("jvm", 0.0)
    insert = sum(e["seconds"] for e in evs if e["event"] == "batch")
    total = _ts(stop_ev) - _ts(start_ev) - phases.get("jvm", 0.0)
    split = {"read": read, "insert": insert, "other": max(total - read - insert, 0.0)}
    return {
        "seconds": total,
        # as the streaming peer is timed: the whole process (imports, the target opened and checked, exit)
        # less Spark's start-up
        "span": wall - phases.get("jvm", 0.0),
        "phases": phases,
        "wall": wall,
        "rss": peak,
        "rows": stop_ev["rows_written"],
        "split": split,
        "cpu": rss.cpu(),
    }


def class_archive_ready(path: str, start: int, dsn: str) -> str | None:
    """Make the JVM class archive exist before the first timed Spark run: one untimed `cdc2ch run --once`,
    whose exit saves it, when this classpath has none yet (a new checkout, or one pruned by others). Without
    it that first timed run alone, always cdc2ch's, loads every class from the jars (8-10 s slower on W1 in 4
    of the 5 full runs before this check), while every later run of either contender maps the archive, as
    every run after a user's first does. Returns what it did, or None when the archive was there."""
    archive = class_archive(delta_jars())
    if archive is None or archive.exists():
        return None
    run = run_cdc2ch(path, start, dsn, "archive")
    return f"class archive saved by an untimed run first ({run['wall']:.1f} s): {archive.name}"


def median_run(runs: list[dict], by: str = "seconds") -> dict | None:
    """The run of median `by` (a real run: its phases and peak RSS are its own); None for no runs."""
    return sorted(runs, key=lambda r: r[by])[len(runs) // 2] if runs else None


def _target(sink, name: str, spark_schema) -> str:
    target = TargetName("bench", name)
    types = schema.column_types(spark_schema.jsonValue(), TableDesign(("id",)))
    sink.ensure_database("bench")
    sink.command(f"DROP TABLE IF EXISTS {schema.qualified(target)}")
    sink.command(schema.target_table_ddl(target, types, TableDesign(("id",))))
    return schema.qualified(target)


def run_reference(sink, path: str, start: int, end: int, table_sql: str) -> dict:
    """The published delta-rs loop: load_cdf, drop pre-images, metadata columns, insert_arrow 80k at a time."""
    from deltalake import DeltaTable

    settled()
    t0 = time.monotonic()
    reader = DeltaTable(path).load_cdf(starting_version=start, ending_version=end)
    data = pa.RecordBatchReader.from_stream(reader).read_all()
    # delta-rs hands out string_view columns, which pyarrow cannot filter yet
    data = data.cast(
        pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f for f in data.schema])
    )
    data = data.filter(pc.not_equal(data["_change_type"], "update_preimage"))
    change = pc.cast(data["_change_type"], pa.string())
    deleted = pc.cast(pc.equal(change, "delete"), pa.uint8())
    version = pc.cast(data["_commit_version"], pa.uint64())
    out = pa.table(
        {
            **{c: data[c] for c in ("id", "tenant", "name", "amount", "at")},
            "_commit_version": version,
            "_commit_timestamp": pc.cast(data["_commit_timestamp"], pa.timestamp("ms", tz="UTC")),
            "_change_type": change,
            "_is_deleted": deleted,
            "_version": version,
        }
    )
    with sink.clients.lease() as client:  # clickhouse-connect as is, deduplication off
        for offset in range(0, out.num_rows, BATCH):
            client.insert_arrow(table_sql, out.slice(offset, BATCH), settings={"insert_deduplicate": 0})
    return {"seconds": time.monotonic() - t0, "rows": out.num_rows}


def _peer(script: str, *args: str) -> dict:
    """One peer script in its own process, sampled as cdc2ch's runs are: the JSON line it prints
    ({"seconds": ..., "rows": ...}) and its peak RSS ("rss")."""
    settled()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    rss = PeakRss(proc.pid)
    out, err = proc.communicate()
    wall = time.monotonic() - t0
    peak = rss.stop()
    found = [ln for ln in out.splitlines() if ln.startswith('{"seconds"')]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{script} failed:\n{err[-3000:]}")
    return {**json.loads(found[-1]), "rss": peak, "wall": wall}


def run_streaming(path: str, start: int, dsn: str, table: str) -> dict:
    """bench/streaming_peer.py in its own process; "span" is its whole process less its Spark start-up, as
    cdc2ch's Spark reader is compared with it."""
    run = _peer("streaming_peer.py", path, str(start), dsn, table)
    return {**run, "span": run["wall"] - run["startup"]}


def run_native(path: str, start: int, end: int, dsn: str, table: str, shape) -> dict:
    """bench/native_peer.py in its own process, as cdc2ch and the streaming peer run (each pays the engine's
    or the JVM's first read in a fresh process; start-ups and table creation excluded for all)."""
    return _peer("native_peer.py", path, str(start), str(end), dsn, table, shape.json())


# -- W3, W4 ------------------------------------------------------------------------------------------
def _service(args: list[str]) -> tuple[subprocess.Popen, PeakRss, list[str]]:
    """A continuous `cdc2ch run`, read by Spark (W3's figure), with its stderr lines collected as they come."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cdc2ch",
            "run",
            *args,
            "--reader",
            "spark",
            "--poll-interval",
            "1",
            "--log-format",
            "json",
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return proc, PeakRss(proc.pid), lines


def _wait_committed(proc, lines: list[str], pipelines: int) -> None:
    """Until every pipeline has committed its initial load (version 1)."""
    while sum('"event": "committed"' in ln and '"version": 1,' in ln for ln in list(lines)) < pipelines:
        if proc.poll() is not None:
            raise SystemExit("cdc2ch run exited:\n" + "".join(lines)[-3000:])
        time.sleep(0.5)


def _small_commits(spark, paths: list[str], seconds: float, merges: bool = False) -> None:
    """One 100-row commit every 2 s, to the tables in turn; with `merges`, every other one a MERGE that
    updates 100 rows of the loaded table (pre- and post-images) instead of an append."""
    for i in range(int(seconds / 2)):
        t = time.monotonic()
        path = paths[i % len(paths)]
        if merges and i % 2:
            _rows(spark, i * 100, 100, i).createOrReplaceTempView("steady_source")
            spark.sql(
                f"MERGE INTO delta.`{path}` t USING steady_source s ON t.id = s.id WHEN MATCHED THEN UPDATE "
                f"SET name = s.name, amount = s.amount WHEN NOT MATCHED THEN INSERT *"
            )
        else:
            _rows(spark, 10_000 + i * 100, 100, i).write.format("delta").mode("append").save(path)
        time.sleep(max(0.0, 2 - (time.monotonic() - t)))
    time.sleep(6)


def _latencies(spark, lines: list[str], paths: dict[str, str]) -> dict:
    """Commit-to-visible seconds of every version after the initial load, from Delta's history (commit
    time) and the batch log lines (insert done), per pipeline name -> table path."""
    from delta.tables import DeltaTable

    visible: dict[tuple[str, int], float] = {}
    for e in events("".join(lines)):
        if e["event"] == "batch":
            for v in range(e["start"], e["end"] + 1):
                visible[(e["pipeline"], v)] = _ts(e)
    lat, missing = [], []
    for name, path in paths.items():
        history = (
            DeltaTable.forPath(spark, path).history().selectExpr("version", "unix_millis(timestamp) AS ms")
        )
        for r in history.collect():
            if r["version"] <= 1:  # create, initial load
                continue
            if (name, r["version"]) in visible:
                lat.append(round(visible[(name, r["version"])] - r["ms"] / 1000, 2))
            else:
                missing.append(f"{name}@{r['version']}")
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "commits": len(lat), "missing": missing, "all": lat}


def _loaded(spark, path: str) -> str:
    _create(spark, path)
    _rows(spark, 0, 10_000).write.format("delta").mode("append").save(path)
    return path


def run_steady(spark, path: str, seconds: float, dsn: str) -> dict:
    # Steady state: a loaded table the running pipeline has caught up with; then small commits.
    _loaded(spark, path)
    proc, rss, lines = _service(
        ["--table", path, "--primary-key", "id", "--target", "bench.w3", "--clickhouse", dsn]
    )
    _wait_committed(proc, lines, 1)
    _small_commits(spark, [path], seconds, merges=True)
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    result = _latencies(spark, lines, {"bench.w3": path})
    if os.environ.get("CDC2CH_BENCH_DEBUG"):
        print("W3 latencies:", result["all"])
    return {**result, "rss": rss.stop()}


def run_many(spark, tmp: Path, tables: int, seconds: float, dsn: str) -> dict:
    # W3 over many tables: one process, one Spark session, pipelines polled in turn.
    paths = {f"t{i}": _loaded(spark, str(tmp / f"w4_{i}")) for i in range(tables)}
    config = tmp / "w4.toml"
    config.write_text(
        f'clickhouse = "{dsn}"\n'
        + "".join(
            f'[[pipelines]]\nname = "{n}"\ntable = "{p}"\nprimary-key = "id"\ntarget = "bench.w4_{n}"\n'
            for n, p in paths.items()
        )
    )
    t0 = time.monotonic()
    proc, rss, lines = _service(["--config", str(config)])
    _wait_committed(proc, lines, tables)
    startup = time.monotonic() - t0
    _small_commits(spark, list(paths.values()), seconds)
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    return {**_latencies(spark, lines, paths), "rss": rss.stop(), "startup": startup, "tables": tables}


def _cpu_line(cpu: dict[str, float]) -> str:
    jvm = {g: cpu.get(g, 0.0) for g in [g for g, _ in CPU_GROUPS] + ["JVM other"]}
    parts = ", ".join(f"{g} {s:.1f}" for g, s in jvm.items())
    return f"JVM {sum(jvm.values()):.1f} s ({parts}), Python {cpu.get('Python', 0.0):.1f} s"


# -- report -----------------------------------------------------------------------------------------
def main(size: str) -> None:
    p = SIZES[size]
    t0 = time.monotonic()
    spark = session(SparkSettings())
    spark_start = time.monotonic() - t0
    lines, results = [], {}

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    with tempfile.TemporaryDirectory(prefix="cdc2ch-bench-") as tmp:
        tmp = Path(tmp)
        own_dsn, cdc_dsn = f"chdb://{tmp / 'ch-alternatives'}", f"chdb://{tmp / 'ch-cdc2ch'}"
        with connect(own_dsn) as sink:
            for name, build, args in (
                ("W1", build_w1, (p["w1_rows"], p["w1_versions"])),
                ("W2", build_w2, (p["w2_rows"], p["w2_versions"])),
                ("W5", build_w5, (p["w5_rows"], p["w5_versions"])),
            ):
                path = str(tmp / name.lower())
                t1 = time.monotonic()
                start = build(spark, path, *args)
                end = latest_version(spark, path)
                n = cdf_rows(spark, path, start)
                say(
                    f"{name}: built versions {start}..{end}, {n:,} change rows, in {time.monotonic() - t1:.1f} s"
                )
                shape = spark.read.format("delta").load(path).schema
                saved = class_archive_ready(path, start, f"chdb://{tmp / 'ch-archive'}")
                if saved:
                    say(saved)
                    shutil.rmtree(tmp / "ch-archive")
                # The Spark contenders alternate, each run in an embedded database of its own; the median run
                # of each counts.
                cdcs, streams = [], []
                for i in range(SPARK_RUNS[size]):
                    own = tmp / f"ch-spark-{name.lower()}-{i}"
                    cdcs.append(run_cdc2ch(path, start, f"chdb://{own / 'cdc2ch'}", name.lower()))
                    streams.append(run_streaming(path, start, f"chdb://{own / 'streaming'}", "t"))
                    shutil.rmtree(own)
                # By their spans (COUNTED): cdc2ch's "seconds" begin after it opened and checked its target,
                # where the peer's include making its table.
                cdc, stream = median_run(cdcs, counted("cdc2ch")), median_run(streams, counted("streaming"))
                # The ClickHouse reader and native take about a second, where one run's noise is a tenth of
                # it: each runs SHORT_RUNS times, the two alternating, and the median run of each counts. Each
                # run has a database of its own, where no earlier run's parts wait to be merged.
                pushes, nats = [], []
                for i in range(SHORT_RUNS):
                    own = tmp / f"ch-short-{name.lower()}-{i}"
                    if name == "W1" or p["w2_push"]:
                        push_dsn = f"chdb://{own / 'reader'}"
                        pushes.append(run_cdc2ch(path, start, push_dsn, "t", "--reader", "clickhouse"))
                    nats.append(run_native(path, start, end, f"chdb://{own / 'native'}", "t", shape))
                    shutil.rmtree(own)
                push, nat = median_run(pushes), median_run(nats)
                ref = run_reference(sink, path, start, end, _target(sink, f"ref_{name.lower()}", shape))
                mine = {"cdc2ch": cdc, "cdc2ch --reader clickhouse": push}
                mine = {k: r for k, r in mine.items() if r is not None}
                peers = {"reference": ref, "native": nat, "streaming": stream}
                took = {k: r[counted(k)] for k, r in {**mine, **peers}.items()}
                rate = {k: n / t for k, t in took.items()}
                results[name] = rate
                for label, r in mine.items():
                    say(f"{name} {label}: {rate[label]:,.0f} rows/s excluding Spark start-up ({took[label]:.2f} s), "
                        f"{n / r['wall']:,.0f} rows/s including it ({r['wall']:.1f} s); peak RSS "
                        f"{r['rss'] / 2**20:,.0f} MiB")  # fmt: skip
                    say(f"{name} {label} time: CDF read {r['split']['read']:.2f} s, ClickHouse inserts "
                        f"{r['split']['insert']:.2f} s, log/schema/offsets {r['split']['other']:.2f} s")  # fmt: skip
                    say(f"{name} {label} CPU (whole process, start-up included): {_cpu_line(r['cpu'])}")
                    results.setdefault("phases", {})[(name, label)] = {**r["phases"], "total": r["seconds"]}
                say(
                    f"{name} reference loop (delta-rs): {rate['reference']:,.0f} rows/s ({ref['seconds']:.2f} s)"
                )
                say(f"{name} ClickHouse native: {rate['native']:,.0f} rows/s ({nat['seconds']:.2f} s); peak RSS "
                    f"{nat['rss'] >> 20:,} MiB")  # fmt: skip
                for label, key, runs in (
                    ("cdc2ch", "cdc2ch", cdcs),
                    ("Spark streaming peer", "streaming", streams),
                    ("cdc2ch --reader clickhouse", "cdc2ch --reader clickhouse", pushes),
                    ("ClickHouse native", "native", nats),
                ):
                    if runs:
                        each = ", ".join(f"{r[counted(key)]:.2f}" for r in runs)
                        say(f"{name} {label}, {len(runs)} alternating runs: {each} s (the median counts)")
                say(f"{name} Spark streaming peer (readChangeFeed, AvailableNow, foreachBatch): "
                    f"{rate['streaming']:,.0f} rows/s ({stream['span']:.2f} s, Spark start-up "
                    f"{stream['startup']:.1f} s excluded); peak RSS {stream['rss'] >> 20:,} MiB")  # fmt: skip
                if name == "W1":  # what a new pipeline adds over the same backlog, once
                    for label, extra in (
                        ("cdc2ch", ()),
                        ("cdc2ch --reader clickhouse", ("--reader", "clickhouse")),
                    ):
                        fresh = run_cdc2ch(path, start, cdc_dsn, f"w1_new_{len(extra)}", *extra, new=True)
                        say(f"W1 {label} as a new pipeline (its table created, the first range's keys checked, "
                            f"the pipeline claimed): {fresh['seconds']:.2f} s, against {mine[label]['seconds']:.2f} s "
                            f"for the pipeline that exists")  # fmt: skip
                for label in mine:  # against the streaming peer only what is timed as it is
                    alike = counted(label) == counted("streaming")
                    peer = f", /streaming {rate[label] / rate['streaming']:.2f}x" if alike else ""
                    say(f"{name} ratios {label}: /reference {rate[label] / rate['reference']:.2f}x, "
                        f"/native {rate[label] / rate['native']:.2f}x{peer}")  # fmt: skip
                shutil.rmtree(path)
        if p["w1_scale"]:
            # Memory at scale: W1 at 10x its size, cdc2ch alone (bounded by --max-rows-per-read, not backlog).
            path = str(tmp / "w1x")
            start = build_w1(spark, path, p["w1_rows"] * p["w1_scale"], p["w1_versions"])
            n = cdf_rows(spark, path, start)
            big = run_cdc2ch(path, start, f"chdb://{tmp / 'ch-w1x'}", "w1x")
            results["W1x"] = big
            say(f"W1 x{p['w1_scale']} ({n:,} change rows) cdc2ch: peak RSS {big['rss'] / 2**20:,.0f} MiB "
                f"(target <= 1536 MiB), {n / big['seconds']:,.0f} rows/s excluding Spark start-up "
                f"({big['seconds']:.1f} s)")  # fmt: skip
            shutil.rmtree(path)
        w3 = run_steady(spark, str(tmp / "w3"), p["w3_seconds"], f"chdb://{tmp / 'ch-w3'}")
        results["W3"] = w3
        say(f"W3 commit-to-visible: p50 {w3['p50']:.2f} s, p95 {w3['p95']:.2f} s over {w3['commits']} commits "
            f"(appends and MERGEs; poll interval 1 s; target p95 <= 2 s); missing {w3['missing'] or 'none'}; peak RSS "
            f"{w3['rss'] / 2**20:,.0f} MiB")  # fmt: skip
        w4 = run_many(spark, tmp, p["w4_tables"], p["w3_seconds"], f"chdb://{tmp / 'ch-w4'}")
        results["W4"] = w4
        say(f"W4 {w4['tables']} tables in one process: commit-to-visible p50 {w4['p50']:.2f} s, p95 "
            f"{w4['p95']:.2f} s over {w4['commits']} commits (poll interval 1 s); missing "
            f"{w4['missing'] or 'none'}; all initial loads done {w4['startup']:.1f} s after start; "
            f"peak RSS {w4['rss'] / 2**20:,.0f} MiB")  # fmt: skip
    say(f"Spark start-up (this process, for reference): {spark_start:.1f} s")
    for line in phase_table(results.get("phases", {})):
        say(line)
    write_results(size, lines, results)


PHASES = (
    ("jvm", "JVM start"),
    ("log", "Delta log"),
    ("plan", "plan"),
    ("scan", "scan"),
    ("transfer", "transfer"),
    ("arrow", "to rows"),
    ("rank", "rank"),
    ("insert", "insert"),
    ("offsets", "offsets"),
)


def phase_table(found: dict) -> list[str]:
    """Where each cdc2ch run's time went, in seconds (from its `stopped` event; `total` runs from its `start`
    event, after its target was opened and checked, to `stopped`, less the JVM's start): the JVM's start,
    reading the Delta log, planning the read, Spark's scan (its jobs; rows stream to Python meanwhile), the
    rest of the transfer after the last job, building the target's rows, leaving out the outranked ones,
    ClickHouse inserts (for the ClickHouse reader: its whole INSERT ... SELECT) and offsets. A range is read
    while the one before is inserted, so the phases may add up to more than `total`."""
    if not found:
        return []
    head = ["workload", "reader", *(label for _, label in PHASES), "total"]
    out = [
        "Phases (seconds; reads overlap inserts):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for (workload, reader), seconds in found.items():
        cells = [f"{seconds.get(k, 0.0):.2f}" for k, _ in PHASES] + [f"{seconds['total']:.2f}"]
        short = "clickhouse" if "clickhouse" in reader else "spark"
        out.append("| " + " | ".join([workload, short, *cells]) + " |")
    return out


HISTORY = "## History of full runs"


def write_results(size: str, lines: list[str], results: dict) -> None:
    summary = [f"Machine: {os.cpu_count()} cores. Produced by `bench/workloads.py`.", ""]
    summary += ["| workload | cdc2ch (Spark reader) | cdc2ch --reader clickhouse | reference | native | streaming | "
                "Spark reader / reference, / native, / streaming | ClickHouse reader / reference, / native |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for w in ("W1", "W2", "W5"):
        r = results[w]
        sp, ch = r["cdc2ch"], r.get("cdc2ch --reader clickhouse")
        pushed = (
            (f"{ch:,.0f} rows/s", f"{ch / r['reference']:.2f}x, {ch / r['native']:.2f}x")
            if ch
            else ("-", "-")
        )
        summary.append(f"| {w} | {sp:,.0f} rows/s | {pushed[0]} | {r['reference']:,.0f} rows/s | "
                       f"{r['native']:,.0f} rows/s | {r['streaming']:,.0f} rows/s | {sp / r['reference']:.2f}x, "
                       f"{sp / r['native']:.2f}x, {sp / r['streaming']:.2f}x | {pushed[1]} |")  # fmt: skip
    w3 = results["W3"]
    summary += ["", f"W3 commit-to-visible: p50 {w3['p50']:.2f} s, p95 {w3['p95']:.2f} s (appends and MERGEs; "
                f"poll interval 1 s; target p95 <= 2 s)."]  # fmt: skip
    if "W4" in results:
        w4 = results["W4"]
        summary.append(f"W4 ({w4['tables']} tables in one process) commit-to-visible: p50 {w4['p50']:.2f} s, "
                       f"p95 {w4['p95']:.2f} s; peak RSS {w4['rss'] / 2**20:,.0f} MiB.")  # fmt: skip
    if "W1x" in results:
        summary.append(f"Peak RSS of the cdc2ch process tree on W1 at 10x: "
                       f"{results['W1x']['rss'] / 2**20:,.0f} MiB (target <= 1536 MiB).")  # fmt: skip
    summary += ["", *phase_table(results.get("phases", {})), ""]
    summary += ["", "```", *lines, "```", ""]
    out = HERE / f"results{'' if size == 'full' else '-quick'}.md"
    md = [f"# Benchmark results ({size})", "", "Latest run:", "", *summary]
    if size == "full":  # keep every full run, newest last, so a regression shows against the earlier ones
        old = out.read_text() if out.exists() else ""
        if HISTORY in old:
            history = old[old.index(HISTORY) + len(HISTORY) :].strip()
        else:  # the file from before history was kept: its run becomes the first entry
            history = "### before history was kept\n\n" + old.split("\n", 1)[-1].strip() if old else ""
        stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        md += [HISTORY, "", *([history, ""] if history else []), f"### {stamp}", "", *summary]
    out.write_text("\n".join(md))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    names = ["cdc2ch", "cdc2ch --reader clickhouse", "reference", "native", "streaming"]
    colors = ["C0", "C3", "C1", "C2", "C4"]
    for i, w in enumerate(("W1", "W2", "W5")):
        ax.bar([i * 6 + j for j in range(5)], [results[w].get(n, 0) for n in names], color=colors)
    ax.set_xticks([2, 8, 14], ["W1 append-heavy", "W2 MERGE-heavy", "W5 large dimension"])
    ax.set_ylabel("change rows/s (excl. Spark start-up)")
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c in colors], names)
    fig.tight_layout()
    fig.savefig(HERE / f"results{'' if size == 'full' else '-quick'}.png", dpi=100)


if __name__ == "__main__":
    main("quick" if "--quick" in sys.argv[1:] else "full")
