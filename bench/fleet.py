"""A fleet of tables in one process: `python bench/fleet.py [--tables N] [--big-rows N] [--quick] [--no-load S]
[--s3]`.

Writes N small Delta tables (1-10k rows each) with delta-rs under one directory and serves them with one
`cdc2ch run --table DIR/* --poll-interval 1` on the embedded engine (`--serve`, so that this script reads
the replica while it runs). With `--s3` the tables are on object storage instead (SeaweedFS's S3 gateway,
bench/seaweed.py, built by `make seaweedfs`; moto's server, tests/support/s3server.py, where it is not built
or with `--store moto`) and the target is a ClickHouse server (tests/support/chserver.py in a process of
its own) holding the store's keys in a named collection (`--lake-collection`): the case where `--reader auto`
may have the server read the lake itself; which reader it chose, and why, is printed (`--reader` defaults to
auto there, to spark on local disk).

Once they are loaded, a big table (its rows in versions of a million) appears in the directory and is
discovered and loaded beside them. While the big table's load runs, a writer commits one row to each of 20
random small tables every second. Prints:

- the lag of those changes (their `_synced_at` in ClickHouse minus the commit's time): p50, p95, max
  (goal: p95 <= poll interval + 2 s);
- the big load's rows/s in the fleet next to the same load alone (goal >= 0.8x);
- the service's peak RSS, Python and JVM together (goal <= 2 GiB), and with a server target's process;
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
from collections import deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from light_turn import tree_cpu  # this script's own directory: bench/
from seaweed import SeaweedServer, available
from workloads import descendants, rss_bytes

from tests.support.s3server import KEY_ID, SECRET, S3Server, storage_options

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CDF = {"delta.enableChangeDataFeed": "true"}
SEED = 20261126


def rows(start: int, count: int) -> pa.Table:
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table({"id": ids, "name": pa.array([f"n{i}" for i in range(start, start + count)])})


class Lake:
    """Where the tables are: a local directory, or a bucket of an S3 server (`s3`, tests/support/s3server.py)."""

    def __init__(self, work: Path, s3=None):
        self.work, self.s3 = work, s3
        self.options = storage_options(s3.env()) if s3 else None
        if s3:
            s3.bucket("lake")

    def uri(self, name: str, staging: bool = False) -> str:
        """A table's URI as delta-rs writes it (cdc2ch is given its s3a:// form)."""
        folder = "staging" if staging else "lake"
        return f"s3://lake/{folder}/{name}" if self.s3 else str(self.work / folder / name)

    def pattern(self) -> str:
        return self.uri("*").replace("s3://", "s3a://")

    def write(self, name: str, table: pa.Table, staging: bool = False, **options) -> None:
        write_deltalake(self.uri(name, staging), table, storage_options=self.options, **options)

    def publish(self, name: str) -> None:
        """Move a staged table into the lake, appearing whole: a rename, or on S3 its data files copied
        first and its log last, in order."""
        if not self.s3:
            return (self.work / "staging" / name).rename(self.work / "lake" / name)
        client = self.s3.client()
        keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
            Bucket="lake", Prefix=f"staging/{name}/") for o in page.get("Contents", [])]  # fmt: skip
        for key in sorted(keys, key=lambda k: ("/_delta_log/" in k, k)):
            client.copy_object(Bucket="lake", Key="lake/" + key[len("staging/") :],
                               CopySource={"Bucket": "lake", "Key": key})  # fmt: skip
        return None


def write_lake(lake: Lake, tables: int, big_rows: int, rng: random.Random) -> list[str]:
    """The small tables in the lake; the big one beside it, moved in later (it appears whole)."""
    names = []
    for i in range(tables):
        name = f"small_{i:03d}"
        lake.write(name, rows(0, rng.randint(1_000, 10_000)), configuration=CDF)
        names.append(name)
    step = 1_000_000
    for start in range(0, big_rows, step):
        lake.write("big", rows(start, min(step, big_rows - start)), staging=True, mode="append",
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

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        argv = [sys.executable, "-m", "cdc2ch", "run", *args, "--log-format", "json"]
        self.proc = subprocess.Popen(
            argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
        )
        self.events: list[dict] = []
        self.other: deque[str] = deque(maxlen=40)  # the last lines that are not log events (a traceback)
        self.peak = self.peak_with = 0  # the service's; with what `also` reports (a server target's process)
        self.also: Callable[[], int] = lambda: 0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            if line.startswith("{"):
                self.events.append(json.loads(line))
            else:
                self.other.append(line.rstrip())

    def _sample(self) -> None:
        while self.proc.poll() is None:
            mine = tree_rss(self.proc.pid)
            self.peak, self.peak_with = max(self.peak, mine), max(self.peak_with, mine + self.also())
            time.sleep(0.5)

    def wait_for(self, test, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                errors = [json.dumps(e) for e in self.events if e.get("level") == "error"][-5:]
                raise SystemExit(f"cdc2ch run ended or took over {timeout}s before {what}:\n"
                                 + "\n".join(errors + list(self.other)))  # fmt: skip
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


def write_changes(lake: Lake, names: list[str], rng: random.Random, going) -> list[tuple[str, int, float]]:
    """One row to each of 20 random small tables every second while `going()`: (table, id, commit time)."""
    written: list[tuple[str, int, float]] = []
    next_id = 10_000_000
    while going():
        tick = time.time()
        for name in rng.sample(names, min(20, len(names))):
            lake.write(name, rows(next_id, 1), mode="append")
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


class Target:
    """Where the fleet replicates to: the embedded engine, served by the fleet's process (`--serve`), or a
    ClickHouse server of its own (tests/support/chserver.py) with the lake's keys in a named collection."""

    PASSWORD = "bench-secret"

    def __init__(self, work: Path, lake: Lake):
        self.work, self.server = work, None
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if lake.s3:  # the service reads the log and runs Spark with the store's endpoint and keys
            self.env.update(lake.s3.env(), CDC2CH_CLICKHOUSE_PASSWORD=self.PASSWORD)
            code = ("import time\nfrom tests.support.chserver import ChServer\n"
                    f"server = ChServer({str(work / 'server')!r}, password={self.PASSWORD!r}).__enter__()\n"
                    "print(server.port, flush=True)\ntime.sleep(10**9)\n")  # fmt: skip
            plain = {
                k: v for k, v in self.env.items() if not k.startswith("AWS_")
            }  # its keys: the collection's
            self.server = subprocess.Popen([sys.executable, "-c", code], env=plain, stdout=subprocess.PIPE,
                                           text=True)  # fmt: skip
            self.port = int(self.server.stdout.readline())
            self.client().command(
                f"CREATE NAMED COLLECTION lake AS access_key_id = '{KEY_ID}', secret_access_key = '{SECRET}'"
            )

    def dsn(self, name: str) -> str:
        return f"http://default@127.0.0.1:{self.port}/" if self.server else f"chdb://{self.work / name}"

    def options(self) -> list[str]:
        return ["--lake-collection", "lake"] if self.server else []

    def client(self):
        import clickhouse_connect

        password = self.PASSWORD if self.server else ""
        return clickhouse_connect.get_client(host="127.0.0.1", port=self.port, username="default",
                                             password=password)  # fmt: skip

    def rss(self) -> int:
        return tree_rss(self.server.pid) if self.server else 0

    def stop(self) -> None:
        if self.server:
            self.server.terminate()
            self.server.wait(60)


def cpu_by_process(service: Service, target: Target, lake: Lake) -> dict[str, float]:
    """CPU seconds so far of cdc2ch (with its JVM), the ClickHouse server, the S3 store, and this script
    (the writer of the small tables' commits): where a run's cores went."""
    own = os.times()
    return {
        "cdc2ch": tree_cpu(service.proc.pid),
        "ClickHouse server": tree_cpu(target.server.pid) if target.server else 0.0,
        "S3 store": tree_cpu(lake.s3.proc.pid) if lake.s3 else 0.0,
        "writer": own.user + own.system,
    }


def serve(lake: Lake, target: Target, discover_interval: float, reader: str, *extra: str) -> Service:
    """`cdc2ch run --table LAKE/* --poll-interval 1` into the target (the embedded engine with `--serve`)."""
    served = [] if target.server else ["--serve", f"127.0.0.1:{free_port()}"]
    if not target.server:
        target.port = int(served[1].rsplit(":", 1)[1])
    service = Service(
        "--table", lake.pattern(), "--primary-key", "id", "--target", "bench.{table}", "--poll-interval", "1",
        "--discover-interval", str(discover_interval), "--clickhouse", target.dsn("fleet"),
        "--reader", reader, *served, *target.options(), *extra, env=target.env,
    )  # fmt: skip
    return service


def chosen_readers(events: list[dict]) -> str:
    """What `--reader auto` chose for the fleet's pipelines: how many of each, and a reason of each."""
    last = {e["pipeline"]: e for e in events if e["event"] == "reader_chosen"}
    if not last:
        return "no reader_chosen events (a reader was given)"
    counts: dict[str, int] = {}
    for e in last.values():
        counts[e["reader"]] = counts.get(e["reader"], 0) + 1
    reasons = {e["reader"]: e["reason"] for e in last.values()}
    return "; ".join(f"{reader} for {n} ({reasons[reader][:200]})" for reader, n in sorted(counts.items()))


def loaded(service: Service) -> int:
    return len({e["pipeline"] for e in service.events if e["event"] == "committed"})


def without_load(args, lake: Lake, target: Target, names: list[str], rng: random.Random) -> None:
    """The writer alone for args.no_load seconds, no big table: what the small tables' lag is when every
    worker is theirs (a lag as high as with the load says capacity, not fairness, is short)."""
    service = serve(lake, target, args.discover_interval, args.reader, *args.extra)
    service.wait_for(lambda: loaded(service) >= len(names), 3600, "the small tables' first loads")
    reader = target.client()
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
    print(f"--reader {args.reader} chose: {chosen_readers(service.events)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--big-rows", type=int, default=20_000_000)
    parser.add_argument("--discover-interval", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="40 tables and a 2M-row load")
    parser.add_argument("--no-load", type=float, default=0.0, metavar="SECONDS",
                        help="no big table: the writer runs this long alone (capacity without fairness)")  # fmt: skip
    parser.add_argument("--s3", action="store_true",
                        help="the tables on an S3 server, the target a ClickHouse server (reader: auto)")  # fmt: skip
    parser.add_argument("--store", choices=("seaweedfs", "moto"),
                        help="the S3 server of --s3 (default: SeaweedFS where built, else moto)")  # fmt: skip
    parser.add_argument(
        "--reader",
        choices=("spark", "clickhouse", "auto"),
        help="the fleet's --reader (default: spark; auto with --s3)",
    )
    parser.add_argument("--max-parallel", type=int, help="the fleet's --max-parallel (default: cdc2ch's)")
    parser.add_argument("--events", type=Path, help="write the service's log events here (JSON lines)")
    args = parser.parse_args()
    args.extra = ["--max-parallel", str(args.max_parallel)] if args.max_parallel else []
    args.reader = args.reader or ("auto" if args.s3 else "spark")
    if args.quick:
        args.tables, args.big_rows = 40, 2_000_000
    if args.no_load:
        args.big_rows = 0
    rng = random.Random(SEED)
    work = Path(tempfile.mkdtemp(prefix="cdc2ch-fleet-"))
    if args.s3 and not args.store:
        args.store = "moto" if available() else "seaweedfs"
        if args.store == "moto":
            print(f"SeaweedFS unavailable ({available()}): the store is moto's server, which answers one "
                  "request at a time; the lag then measures moto", flush=True)  # fmt: skip
    s3 = (SeaweedServer() if args.store == "seaweedfs" else S3Server()) if args.s3 else None
    try:
        lake = Lake(work, s3)
        names = write_lake(lake, args.tables, args.big_rows, rng)
        target = Target(work, lake)
        try:
            where = (
                f"on an S3 server ({args.store}), into a ClickHouse server"
                if s3
                else "on local disk, into the embedded engine"
            )
            print(f"fleet: {args.tables} small tables and {args.big_rows:,} rows to load {where}, --reader "
                  f"{args.reader}, seed {SEED}, in {work}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
            if args.no_load:
                return without_load(args, lake, target, names, rng)
            return with_load(args, lake, target, names, rng)
        finally:
            target.stop()
    finally:
        if s3:
            s3.stop()


def with_load(args, lake: Lake, target: Target, names: list[str], rng: random.Random) -> None:
    """The big load alone (the reference for its rate), then the fleet with the big table arriving and the
    writer committing to the small tables while it loads."""
    alone = Service("--table", lake.uri("big", staging=True).replace("s3://", "s3a://"), "--primary-key", "id",
                    "--target", "alone.big", "--once", "--clickhouse", target.dsn("alone"), "--reader",
                    args.reader, *target.options(), env=target.env)  # fmt: skip
    alone.proc.wait()
    alone_rows, alone_rate = load_rate(alone.events, "alone.big")

    service = serve(lake, target, args.discover_interval, args.reader, *args.extra)
    service.also = target.rss
    service.wait_for(lambda: loaded(service) >= len(names), 3600, "the small tables' first loads")
    reader = target.client()
    # The big table arrives while the fleet is served: discovered, then loaded beside the small tables.
    lake.publish("big")
    created_at = time.time()
    last_version = (args.big_rows - 1) // 1_000_000

    def big_running() -> bool:
        return not any(e["event"] == "committed" and e.get("pipeline") == "bench.big" and
                       e.get("version") == last_version for e in service.events)  # fmt: skip

    service.wait_for(lambda: any(e.get("pipeline") == "bench.big" for e in service.events), 600, "the load")
    discovered = time.time() - created_at
    cpu0, wall0 = cpu_by_process(service, target, lake), time.monotonic()
    written = write_changes(lake, names, rng, lambda: big_running() and service.proc.poll() is None)
    service.wait_for(lambda: not big_running(), 3600, "the big load")
    cpu = {k: v - cpu0[k] for k, v in cpu_by_process(service, target, lake).items()}
    load_wall = time.monotonic() - wall0
    done = next(e for e in service.events if e["event"] == "committed" and e.get("pipeline") == "bench.big"
                and e.get("version") == last_version)  # fmt: skip
    to_clickhouse = datetime.fromisoformat(done["timestamp"]).timestamp() - created_at
    lags = change_lags(service, reader, written)
    big_rows, big_rate = load_rate(service.events, "bench.big")
    service.stop()

    t0 = time.monotonic()
    status = subprocess.run([sys.executable, "-m", "cdc2ch", "status", "--clickhouse", target.dsn("fleet")],
                            capture_output=True, text=True, env=target.env)  # fmt: skip
    status_s = time.monotonic() - t0
    listed = max(0, len(status.stdout.splitlines()) - 1)

    print(f"small tables' changes during the load ({len(lags)} commits to 20 tables a second): "
          f"lag p50 {quantile(lags, 0.5):.2f}s, p95 {quantile(lags, 0.95):.2f}s, max {max(lags):.2f}s "
          f"(goal p95 <= 3.0s)")  # fmt: skip
    print(f"big load: {big_rows:,} rows at {big_rate:,.0f} rows/s in the fleet, {alone_rate:,.0f} rows/s alone "
          f"({alone_rows:,} rows): {big_rate / alone_rate:.2f}x (goal >= 0.8x)")  # fmt: skip
    server = (
        f"; with the ClickHouse server's process {service.peak_with / 2**20:,.0f} MiB"
        if target.server
        else ""
    )
    print(
        f"peak RSS of the service (Python + JVM): {service.peak / 2**20:,.0f} MiB (goal <= 2048 MiB){server}"
    )
    print(f"cdc2ch status: {listed} pipelines in {status_s:.2f}s wall, process start included (goal < 2s)"
          + ("" if status.returncode == 0 else f" [exit {status.returncode}]"))  # fmt: skip
    print(f"new table to its rows in ClickHouse: {to_clickhouse:.1f}s (discovered after {discovered:.1f}s, "
          f"discover interval {args.discover_interval:.0f}s; load {big_rows / big_rate:.1f}s)")  # fmt: skip
    print(f"--reader {args.reader} chose: {chosen_readers(service.events)}")
    print(f"CPU seconds while the big table loaded ({load_wall:.1f} s wall, {os.cpu_count()} cores): "
          + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))  # fmt: skip
    print(
        f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores"
    )
    if args.events:
        args.events.write_text("".join(json.dumps(e) + "\n" for e in service.events))
    failed = [e for e in service.events if e["event"] == "pipeline_failed"]
    print(f"failed pipeline attempts (each retried): {len(failed)}"
          + (f"; the first: {failed[0].get('error', '')[:300]}" if failed else ""))  # fmt: skip


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
