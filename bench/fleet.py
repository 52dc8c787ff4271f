"""A fleet of tables in one process: `python bench/fleet.py [--tables N] [--big-rows N] [--quick] [--no-load S]`.

Writes N small Delta tables (1-10k rows each) with delta-rs under one directory and serves them with one
`cdc2ch run --table DIR/* --poll-interval 1` on the embedded engine (`--serve`, so that this script reads
the replica while it runs). Once they are loaded, a big table (its rows in versions of a million) appears in
the directory and is discovered and loaded beside them. While the big table's
load runs, a writer commits one row to each of 20 random small tables every second. Prints:

- the lag of those changes (their `_synced_at` in ClickHouse minus the commit's time): p50, p95, max
  (goal: p95 <= poll interval + 2 s);
- the big load's rows/s in the fleet next to the same load alone (goal >= 0.8x);
- the service's peak RSS, Python and JVM together (goal <= 2 GiB);
- `cdc2ch status` wall time over every pipeline (goal < 2 s);
- the time from the big table's appearance to its rows in ClickHouse (goal <= discover interval + load).

With `--no-load S` there is no big table: the writer runs S seconds alone and only the lag is printed, the
small tables' lag with every worker theirs (capacity without fairness).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from light_turn import tree_cpu  # this script's own directory: bench/
from workloads import descendants, rss_bytes

ROOT = Path(__file__).resolve().parents[1]
CDF = {"delta.enableChangeDataFeed": "true"}
SEED = 20261126


def rows(start: int, count: int) -> pa.Table:
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table({"id": ids, "name": pa.array([f"n{i}" for i in range(start, start + count)])})


def write_lake(lake: Path, staging: Path, tables: int, big_rows: int, rng: random.Random) -> list[str]:
    """The small tables in the lake; the big one beside it, moved in later (a rename: it appears whole)."""
    names = []
    for i in range(tables):
        name = f"small_{i:03d}"
        write_deltalake(str(lake / name), rows(0, rng.randint(1_000, 10_000)), configuration=CDF)
        names.append(name)
    step = 1_000_000
    for start in range(0, big_rows, step):
        write_deltalake(str(staging / "big"), rows(start, min(step, big_rows - start)), mode="append",
                        configuration=CDF)  # fmt: skip
    return names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants (the Spark JVM is a child)."""
    total = 0
    for p in descendants(pid):
        try:
            total += rss_bytes(p)
        except OSError:
            pass
    return total


class Service:
    """`cdc2ch run` as its own process, its JSON log lines kept, its peak RSS sampled."""

    def __init__(self, *args: str):
        argv = [sys.executable, "-m", "cdc2ch", "run", *args, "--log-format", "json"]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.events: list[dict] = []
        self.peak = 0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def _sample(self) -> None:
        while self.proc.poll() is None:
            self.peak = max(self.peak, tree_rss(self.proc.pid))
            time.sleep(0.5)

    def wait_for(self, test, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"cdc2ch run ended or took over {timeout}s before {what}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def load_rate(events: list[dict], pipeline: str) -> tuple[int, float]:
    """(rows, rows/s) of a pipeline's load: its first range read to its last commit."""
    mine = [e for e in events if e.get("pipeline") == pipeline]
    first = next(e for e in mine if e["event"] in ("range_read", "snapshot_chunk", "claimed"))
    last = [e for e in mine if e["event"] == "committed"][-1]
    seconds = (
        datetime.fromisoformat(last["timestamp"]) - datetime.fromisoformat(first["timestamp"])
    ).total_seconds()
    return int(last["total_rows"]), int(last["total_rows"]) / max(seconds, 1e-9)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def write_changes(lake: Path, names: list[str], rng: random.Random, going) -> list[tuple[str, int, float]]:
    """One row to each of 20 random small tables every second while `going()`: (table, id, commit time)."""
    written: list[tuple[str, int, float]] = []
    next_id = 10_000_000
    while going():
        tick = time.time()
        for name in rng.sample(names, min(20, len(names))):
            write_deltalake(str(lake / name), rows(next_id, 1), mode="append")
            written.append((name, next_id, time.time()))
            next_id += 1
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    return written


def change_lags(service: Service, reader, written: list[tuple[str, int, float]]) -> list[float]:
    """Seconds from each written row's commit to its `_synced_at` in ClickHouse (waiting for them to land)."""
    lags = []
    for name in sorted({t for t, _, _ in written}):
        mine = {i: at for t, i, at in written if t == name}

        def arrived(n: str = name, k: int = len(mine)) -> bool:
            return reader.query(f"SELECT count() FROM bench.{n} WHERE id >= 10000000").result_rows[0][0] >= k

        service.wait_for(arrived, 600, f"{name}'s rows")
        for i, synced in reader.query(
            f"SELECT id, toUnixTimestamp64Milli(min(_synced_at)) FROM bench.{name} WHERE id >= 10000000 GROUP BY id"
        ).result_rows:
            lags.append(synced / 1000 - mine[i])
    return lags


def serve(lake: Path, work: Path, discover_interval: float, reader: str, *extra: str) -> tuple[Service, int]:
    """`cdc2ch run --table LAKE/* --poll-interval 1 --serve`, and the port it serves on."""
    port = free_port()
    service = Service(
        "--table", f"{lake}/*", "--primary-key", "id", "--target", "bench.{table}", "--poll-interval", "1",
        "--discover-interval", str(discover_interval), "--clickhouse", f"chdb://{work / 'fleet'}",
        "--serve", f"127.0.0.1:{port}", "--reader", reader, *extra,
    )  # fmt: skip
    return service, port


def loaded(service: Service) -> int:
    return len({e["pipeline"] for e in service.events if e["event"] == "committed"})


def without_load(args, lake: Path, names: list[str], rng: random.Random, work: Path) -> None:
    """The writer alone for args.no_load seconds, no big table: what the small tables' lag is when every
    worker is theirs (a lag as high as with the load says capacity, not fairness, is short)."""
    import clickhouse_connect

    service, port = serve(lake, work, args.discover_interval, args.reader, *args.extra)
    service.wait_for(lambda: loaded(service) >= len(names), 3600, "the small tables' first loads")
    reader = clickhouse_connect.get_client(host="127.0.0.1", port=port, username="default")
    until, cpu0 = time.time() + args.no_load, tree_cpu(service.proc.pid)
    written = write_changes(lake, names, rng, lambda: time.time() < until and service.proc.poll() is None)
    cores = (tree_cpu(service.proc.pid) - cpu0) / args.no_load  # what the stream of small changes costs
    lags = change_lags(service, reader, written)
    service.stop()
    turns = sum(1 for e in service.events if e["event"] == "committed")
    print(f"small tables' changes, no load ({len(lags)} commits to 20 tables a second for {args.no_load:.0f}s): "
          f"lag p50 {quantile(lags, 0.5):.2f}s, p95 {quantile(lags, 0.95):.2f}s, max {max(lags):.2f}s "
          f"(goal p95 <= 3.0s); {turns} committed ranges in all; the service used {cores:.2f} of "
          f"{os.cpu_count()} cores; peak RSS {service.peak / 2**20:,.0f} MiB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--big-rows", type=int, default=20_000_000)
    parser.add_argument("--discover-interval", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="40 tables and a 2M-row load")
    parser.add_argument("--no-load", type=float, default=0.0, metavar="SECONDS",
                        help="no big table: the writer runs this long alone (capacity without fairness)")  # fmt: skip
    parser.add_argument(
        "--reader", choices=("spark", "clickhouse", "auto"), default="spark", help="the fleet's --reader"
    )
    parser.add_argument("--max-parallel", type=int, help="the fleet's --max-parallel (default: cdc2ch's)")
    parser.add_argument("--events", type=Path, help="write the service's log events here (JSON lines)")
    args = parser.parse_args()
    args.extra = ["--max-parallel", str(args.max_parallel)] if args.max_parallel else []
    if args.quick:
        args.tables, args.big_rows = 40, 2_000_000
    if args.no_load:
        args.big_rows = 0
    rng = random.Random(SEED)
    work = Path(tempfile.mkdtemp(prefix="cdc2ch-fleet-"))
    lake = work / "lake"
    staging = work / "staging"
    names = write_lake(lake, staging, args.tables, args.big_rows, rng)
    print(f"fleet: {args.tables} small tables and {args.big_rows:,} rows to load, seed {SEED}, in {work}")

    if args.no_load:
        return without_load(args, lake, names, rng, work)
    # The big load alone: the reference for its rate in the fleet.
    alone = Service("--table", str(staging / "big"), "--primary-key", "id", "--target", "bench.big", "--once",
                    "--clickhouse", f"chdb://{work / 'alone'}", "--reader", args.reader)  # fmt: skip
    alone.proc.wait()
    alone_rows, alone_rate = load_rate(alone.events, "bench.big")

    service, port = serve(lake, work, args.discover_interval, args.reader, *args.extra)
    import clickhouse_connect

    service.wait_for(lambda: loaded(service) >= len(names), 3600, "the small tables' first loads")
    reader = clickhouse_connect.get_client(host="127.0.0.1", port=port, username="default")
    # The big table arrives while the fleet is served: discovered, then loaded beside the small tables.
    (staging / "big").rename(lake / "big")
    created_at = time.time()
    last_version = (args.big_rows - 1) // 1_000_000

    def big_running() -> bool:
        return not any(e["event"] == "committed" and e.get("pipeline") == "bench.big" and
                       e.get("version") == last_version for e in service.events)  # fmt: skip

    service.wait_for(lambda: any(e.get("pipeline") == "bench.big" for e in service.events), 600, "the load")
    discovered = time.time() - created_at
    written = write_changes(lake, names, rng, lambda: big_running() and service.proc.poll() is None)
    service.wait_for(lambda: not big_running(), 3600, "the big load")
    done = next(e for e in service.events if e["event"] == "committed" and e.get("pipeline") == "bench.big"
                and e.get("version") == last_version)  # fmt: skip
    to_clickhouse = datetime.fromisoformat(done["timestamp"]).timestamp() - created_at
    lags = change_lags(service, reader, written)
    service.wait_for(lambda: not big_running(), 3600, "the big load")
    big_rows, big_rate = load_rate(service.events, "bench.big")
    peak = service.peak
    service.stop()

    t0 = time.monotonic()
    status = subprocess.run([sys.executable, "-m", "cdc2ch", "status", "--clickhouse", f"chdb://{work / 'fleet'}"],
                            capture_output=True, text=True)  # fmt: skip
    status_s = time.monotonic() - t0
    listed = max(0, len(status.stdout.splitlines()) - 1)

    print(f"small tables' changes during the load ({len(lags)} commits to 20 tables a second): "
          f"lag p50 {quantile(lags, 0.5):.2f}s, p95 {quantile(lags, 0.95):.2f}s, max {max(lags):.2f}s "
          f"(goal p95 <= 3.0s)")  # fmt: skip
    print(f"big load: {big_rows:,} rows at {big_rate:,.0f} rows/s in the fleet, {alone_rate:,.0f} rows/s alone "
          f"({alone_rows:,} rows): {big_rate / alone_rate:.2f}x (goal >= 0.8x)")  # fmt: skip
    print(f"peak RSS of the service (Python + JVM): {peak / 2**20:,.0f} MiB (goal <= 2048 MiB)")
    print(f"cdc2ch status: {listed} pipelines in {status_s:.2f}s wall, process start included (goal < 2s)"
          + ("" if status.returncode == 0 else f" [exit {status.returncode}]"))  # fmt: skip
    print(f"new table to its rows in ClickHouse: {to_clickhouse:.1f}s (discovered after {discovered:.1f}s, "
          f"discover interval {args.discover_interval:.0f}s; load {big_rows / big_rate:.1f}s)")  # fmt: skip
    if args.events:
        args.events.write_text("".join(json.dumps(e) + "\n" for e in service.events))
    failed = [e for e in service.events if e["event"] == "pipeline_failed"]
    print(f"failed pipeline attempts (each retried): {len(failed)}"
          + (f"; the first: {failed[0].get('error', '')[:300]}" if failed else ""))  # fmt: skip


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
