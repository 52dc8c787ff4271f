"""A soak under faults: `python bench/soak.py [--minutes N] [--seed S] [--target server|embedded|both]`.

Runs `cdc2ch run --config` the way a service runs, against a writer that commits all the time, while a
chaos schedule (printed with its seed) kills, stops and disturbs it at random moments; then stops the
writer, lets the service catch up and checks every table with a reader of its own. Exit 0 only when every
count below is 0 and every offset equals the table's latest version.

- The writer (a process of its own, delta-rs) commits every 0.5-2 s to six tables: an integer key, a
  composite key (string + int), unicode and NULL-heavy text, a table whose changes move rows between
  identities (key UPDATEs, sorting-column UPDATEs, delete + re-insert of a key in one commit, MERGEs that
  delete and insert), one that gains a column mid-soak, and one created mid-soak, which reaches the service
  through a config change and a restart. It also compacts (OPTIMIZE: a commit without data change).
- `server`: the target is the test ClickHouse HTTP endpoint (tests/support/chserver.py, on the engine of this
  process) behind a FaultProxy. Chaos: kill -9, SIGTERM, SIGINT, a kill of Spark's JVM, connections
  refused, a reset after an insert landed, HTTP 500 with retryable codes, an answer slower than
  `send_receive_timeout`, the endpoint down for longer than the retries last, a second `run` of the same
  pipelines, and `cdc2ch verify` against the live service.
- `embedded`: the default target, served with `--serve`; the process faults, the second `run` and `verify`
  through the service.

The checker compares delta-rs's latest version with `SELECT ... FINAL WHERE _is_deleted = 0` (not `verify`,
which runs as well), counts (identity, _version) pairs stored twice, reads the offsets and the claims left.
A failure prints the seed: `make soak SEED=...` replays the same schedule and the same writes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads import descendants  # noqa: E402  (this script's own directory: bench/)

PASSWORD = "soak-secret"
DATABASE = "soak"
# name -> (primary key, extra design options for its pipeline)
TABLES = {
    "ints": (["id"], {}),
    "composite": (["tenant", "n"], {}),
    "texts": (["id"], {}),
    "moving": (["id"], {"order-by": "grp,id"}),
    "growing": (["id"], {}),
    "late": (["id"], {}),
}
FIRST = [t for t in TABLES if t != "late"]
SERVER_FAULTS = ["kill9", "sigterm", "sigint", "kill_jvm", "refused", "reset_after_insert", "http500", "slow",
                 "outage", "second_run", "verify"]  # fmt: skip
EMBEDDED_FAULTS = ["kill9", "sigterm", "sigint", "kill_jvm", "second_run", "verify"]
SEND_RECEIVE_TIMEOUT = 4  # seconds; the `slow` fault answers later than this
# How long a stop signal may take, as deploy/systemd/cdc2ch.service allows (TimeoutStopSec): a run stops
# after the range in flight, and on a loaded machine a first Spark read takes a minute or more.
STOP_TIMEOUT = 300


# -- the writer ------------------------------------------------------------------------------------------
def writer_main(args: argparse.Namespace) -> None:
    """Commit to the tables until `args.stop` exists; one JSON line per commit in `args.journal`."""
    from writes import Writer  # noqa: PLC0415 (bench/writes.py: the writer's operations)

    rng = random.Random(args.seed)
    lake = Path(args.lake)
    start = time.time()
    writer = Writer(lake, rng, spark_share=args.spark_share)
    with open(args.journal, "a") as journal:
        for name in FIRST:
            journal.write(json.dumps(writer.create(name)) + "\n")
        journal.flush()
        while not Path(args.stop).exists():
            elapsed = time.time() - start
            if "late" not in writer.live and elapsed >= args.late_at:
                entry = writer.create("late")
            elif not writer.grown and elapsed >= args.grow_at:
                entry = writer.grow("growing")
            else:
                entry = writer.step(rng.choice(sorted(writer.live)))
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            time.sleep(rng.uniform(0.5, 2.0))


# -- the service -----------------------------------------------------------------------------------------
@dataclass
class Phase:
    target: str
    work: Path
    seed: int
    seconds: float
    verbose: bool
    spark_share: float = 0.15  # of the writer's commits, made by Spark
    dsn: str = ""
    direct: str = ""  # where the checker reads: the endpoint itself, never through the proxy
    serve_port: int = 0
    proxy: object = None
    service: subprocess.Popen | None = None
    logged_before: int = 0  # the service log's size when the service was last started
    events: Counter = field(default_factory=Counter)
    exits: Counter = field(default_factory=Counter)
    schedule: list[tuple[float, str]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    max_lag: float = 0.0
    commits: int = 0
    verify_live: list[int] = field(default_factory=list)
    followed: list[str] = field(default_factory=list)  # the tables the config names
    lags: list[float] = field(default_factory=list)  # sampled every half second while faults come

    @property
    def config(self) -> Path:
        return self.work / "cdc2ch.toml"

    def env(self) -> dict[str, str]:
        env = {**os.environ, "CDC2CH_CLICKHOUSE_PASSWORD": PASSWORD, "CDC2CH_SERVE_PASSWORD": PASSWORD,
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        env.pop("CDC2CH_CLICKHOUSE_URL", None)
        return env

    def write_config(self, tables: list[str]) -> None:
        self.followed = list(tables)
        lines = [f'clickhouse = "{self.dsn}"', "poll-interval = 1", "retries = 4", 'spark-master = "local[2]"',
                 "discover-interval = 5", ""]  # fmt: skip
        for name in tables:
            key, design = TABLES[name]
            lines += ["[[pipelines]]", f'name = "{name}"', f'table = "{self.work / "lake" / name}"',
                      f"primary-key = {json.dumps(key)}", f'target = "{DATABASE}.{name}"']  # fmt: skip
            lines += [f"{k} = {json.dumps(v)}" for k, v in design.items()]
            lines.append("")
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text("\n".join(lines))
        tmp.replace(self.config)  # a restart never reads half a file

    def cdc2ch(self, *args: str, log: str = "service.log") -> subprocess.Popen:
        out = open(self.work / log, "a")  # noqa: SIM115 (the child owns it)
        return subprocess.Popen([sys.executable, "-m", "cdc2ch", *args], env=self.env(), stdout=out,
                                stderr=subprocess.STDOUT, cwd=self.work, start_new_session=True)  # fmt: skip

    def start(self) -> None:
        serve = ["--serve", f"127.0.0.1:{self.serve_port}"] if self.target == "embedded" else []
        log = self.work / "service.log"
        self.logged_before = log.stat().st_size if log.exists() else 0
        self.service = self.cdc2ch("run", "--config", str(self.config), "--log-format", "json", *serve)

    def alive(self) -> bool:
        return self.service is not None and self.service.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
        """Signal the service and wait for it; its exit code (None: it had to be killed)."""
        if not self.alive():
            return self.service.returncode if self.service else None
        wait_until_logging(self.work / "service.log", self.logged_before)
        wait_until_catching(self.service.pid, signal.SIGTERM)
        self.service.send_signal(sig)
        try:
            return self.service.wait(timeout)
        except subprocess.TimeoutExpired:
            self.service.kill()
            self.service.wait()
            return None
        finally:
            end_group(self.service)


def end_group(proc: subprocess.Popen) -> None:
    """What systemd does once a service's main process has exited (KillMode=mixed): kill what is left of
    its group. A JVM left by a `kill -9` of its driver lives on otherwise, and takes a share of the CPU."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until_logging(log: Path, before: int, timeout: float = 60) -> None:
    """Until the service has written to its log: it logs only once it catches stop signals. Its signal mask
    alone does not tell under coverage.py's `sigterm` option, whose handler catches SIGTERM from the first
    instant and ends the process with it."""
    deadline = time.time() + timeout
    while time.time() < deadline and (log.stat().st_size if log.exists() else 0) <= before:
        time.sleep(0.05)


def wait_until_catching(pid: int, sig: int, timeout: float = 30) -> None:
    """Until the process handles `sig` (its SigCgt mask): cdc2ch catches stop signals from its first line,
    but not in the milliseconds before it, while Python itself starts: there a signal's default action
    ends the process (which systemd counts as a clean stop), and that is not what the soak checks."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/status") as fh:
                caught = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return  # gone, or no /proc: signal it as it is
        if caught >> (sig - 1) & 1:
            return
        time.sleep(0.01)


def jvm_of(pid: int) -> int | None:
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/comm") as fh:
                if fh.read().strip() == "java":
                    return child
        except OSError:
            pass
    return None


# -- chaos -----------------------------------------------------------------------------------------------
class Chaos:
    """Applies one fault at a time; every kind once in each round, rounds shuffled by the seed."""

    def __init__(self, phase: Phase, rng: random.Random, kinds: list[str], replica: Replica):
        self.phase, self.rng, self.kinds, self.replica = phase, rng, kinds, replica
        self.queue: list[str] = []

    def next_kind(self) -> str:
        if not self.queue:
            self.queue = self.rng.sample(self.kinds, len(self.kinds))
        return self.queue.pop()

    def apply(self, kind: str) -> None:
        p = self.phase
        p.events[kind] += 1
        if kind in ("kill9", "sigterm", "sigint"):
            sig = {"kill9": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}[kind]
            code = p.stop(sig)
            p.exits[f"{kind}->{code}"] += 1
            if kind != "kill9" and code != 0:
                p.findings.append(f"{kind}: the service exited {code}, not 0")
            p.start()
        elif kind == "kill_jvm":  # once the service has started Spark (it may be starting still)
            jvm, waited = None, time.time() + 30
            while jvm is None and p.alive() and time.time() < waited:
                jvm = jvm_of(p.service.pid)
                time.sleep(0.5)
            if jvm is None:
                p.events["kill_jvm_skipped"] += 1
                return
            try:
                os.kill(jvm, signal.SIGKILL)
            except ProcessLookupError:  # it ended between the lookup and the kill
                p.events["kill_jvm_skipped"] += 1
                return
        elif kind == "refused":
            p.proxy.down()
            time.sleep(self.rng.uniform(1, 4))
            p.proxy.up()
        elif kind == "outage":  # longer than --retries (4 attempts) of backoff last
            p.proxy.down()
            time.sleep(self.rng.uniform(20, 30))
            p.proxy.up()
        elif kind == "reset_after_insert":
            p.proxy.add_fault("reset_after", match=lambda req: req.is_insert and "soak" in req.sql, times=1)
        elif kind == "http500":
            code = self.rng.choice([242, 252, 319, 202])
            p.proxy.add_fault("error", match=lambda req: "soak" in req.sql, times=2, code=code, status=500)
        elif kind == "slow":
            p.proxy.add_fault(
                "delay", match=lambda req: req.is_insert, times=1, seconds=SEND_RECEIVE_TIMEOUT + 2
            )
        elif kind == "second_run":
            other = p.cdc2ch("run", "--config", str(p.config), "--log-format", "json", log="second.log")
            try:
                code = other.wait(8)
            except subprocess.TimeoutExpired:
                other.send_signal(signal.SIGTERM)
                code = other.wait(STOP_TIMEOUT)
            p.exits[f"second_run->{code}"] += 1
            # On the embedded database one of the two is refused (exit 75): the second, or, when the
            # service was restarting, the service (a restart a second later then takes over again).
            if code not in (0, 75):
                p.findings.append(f"a second run exited {code}, not 0 or 75")
        elif kind == "verify":  # of pipelines that have begun: one without a target has nothing to verify
            if set(p.followed) <= set(self.replica.offsets()):
                p.verify_live.append(run_verify(p))
            else:
                p.events["verify_skipped_not_started"] += 1


def run_verify(p: Phase) -> int:
    """`cdc2ch verify` of every pipeline; through the endpoint itself on a server (faults are the service's)."""
    args = ["verify", "--config", str(p.config), "--log-format", "json"]
    if p.target == "server":
        args += ["--clickhouse", p.direct]
    proc = p.cdc2ch(*args, log="verify.log")
    return proc.wait(600)


# -- reading the replica ---------------------------------------------------------------------------------
class Replica:
    """The checker's own client: the endpoint itself (server) or the service's --serve (embedded), which
    comes and goes with the service: connected on use, again after a failure."""

    def __init__(self, url: str):
        import logging
        from urllib.parse import urlsplit

        self.url = urlsplit(url)
        self.client = None
        logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)  # a service restarting is expected

    def rows(self, sql: str, wait: float = 120) -> list[tuple]:
        """The rows of `sql`, trying again for `wait` seconds while the endpoint does not answer."""
        import clickhouse_connect

        deadline = time.time() + wait
        while True:
            try:
                if self.client is None:
                    self.client = clickhouse_connect.get_client(
                        host=self.url.hostname, port=self.url.port, username="default", password=PASSWORD,
                        connect_timeout=5, send_receive_timeout=60, autogenerate_session_id=False,
                    )  # fmt: skip
                return self.client.query(sql).result_rows
            except Exception:
                self.client = None
                if time.time() >= deadline:
                    raise
                time.sleep(1)

    def offsets(self) -> dict[str, int]:
        """Each pipeline's committed version; {} while the endpoint (or the state table) is not there."""
        try:
            rows = self.rows(f"SELECT pipeline, committed_version FROM {DATABASE}.cdc2ch_state FINAL", wait=0)
        except Exception as exc:
            if os.environ.get("SOAK_DEBUG"):
                print("offsets:", repr(exc)[:300], file=sys.stderr)
            return {}
        return {p: int(v) for p, v in rows}


def normal(value):
    if isinstance(value, float):
        return round(value, 9)
    return value


def check_table(replica: Replica, lake: Path, name: str) -> dict:
    from deltalake import DeltaTable

    dt = DeltaTable(str(lake / name))
    data = dt.to_pyarrow_table()
    columns = data.column_names
    key = TABLES[name][0]
    identity = ["grp", "id"] if name == "moving" else key
    delta = {tuple(normal(r[c]) for c in key): tuple(normal(r[c]) for c in columns) for r in data.to_pylist()}
    cols = ", ".join(f"`{c}`" for c in columns)
    rows = replica.rows(f"SELECT {cols} FROM {DATABASE}.`{name}` FINAL WHERE _is_deleted = 0")
    idx = [columns.index(c) for c in key]
    clickhouse = {}
    for r in rows:
        r = tuple(normal(v) for v in r)
        clickhouse[tuple(r[i] for i in idx)] = r
    twice = replica.rows(
        f"SELECT count() FROM (SELECT {', '.join(identity)}, _version FROM {DATABASE}.`{name}` "
        f"GROUP BY {', '.join(identity)}, _version HAVING count() > 1)"
    )[0][0]
    return {
        "table": name,
        "rows": len(delta),
        "version": dt.version(),
        "missing": len(delta.keys() - clickhouse.keys()),
        "extra": len(clickhouse.keys() - delta.keys()),
        "differing": sum(1 for k in delta.keys() & clickhouse.keys() if delta[k] != clickhouse[k]),
        "duplicate_rows_in_clickhouse": len(rows) - len(clickhouse),
        "stored_twice": int(twice),
    }


# -- one phase -------------------------------------------------------------------------------------------
class Journal:
    """The writer's commits, read as they come: per table, the versions and their commit times."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.commits: dict[str, list[tuple[int, float]]] = {}

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path) as fh:
            fh.seek(self.offset)
            lines = fh.readlines()
            if lines and not lines[-1].endswith("\n"):
                lines.pop()
            self.offset += sum(len(line.encode()) for line in lines)
        entries = [json.loads(line) for line in lines]
        for e in entries:
            self.commits.setdefault(e["table"], []).append((e["version"], e["t"]))
        return entries

    def lag(self, offsets: dict[str, int], now: float, followed: list[str]) -> float:
        """Seconds since the oldest commit the service has not yet recorded, over the tables it follows."""
        worst = 0.0
        for table, commits in self.commits.items():
            if table not in followed:
                continue
            done = offsets.get(table, -1)  # a pipeline that has not begun has every version to do
            pending = [t for v, t in commits if v > done]
            if pending:
                worst = max(worst, now - min(pending))
        return worst


class Endpoints:
    """Where the service writes and the checker reads. A server phase hosts the engine in this process: the
    test ClickHouse endpoint on it, and a FaultProxy in front for the service."""

    def __init__(self, p: Phase):
        self.p, self.holder, self.server = p, None, None
        if p.target == "server":
            from cdc2ch.clickhouse.connection.dsn import connect
            from tests.support.chserver import ChServer, FaultProxy

            self.holder = connect(f"chdb://{p.work / 'clickhouse'}", 1)
            self.holder.__enter__()  # the engine this process hosts; the endpoint adds its handles to it
            self.server = ChServer(str(p.work / "clickhouse"), user="default", password=PASSWORD).start()
            p.proxy = FaultProxy("127.0.0.1", self.server.port).start()
            p.direct = f"http://default@127.0.0.1:{self.server.port}/"
            p.dsn = p.proxy.url_for() + f"?send_receive_timeout={SEND_RECEIVE_TIMEOUT}"
            self.reader_url = p.direct
        else:
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                p.serve_port = sock.getsockname()[1]
            p.dsn = f"chdb://{p.work / 'clickhouse'}"
            self.reader_url = f"http://127.0.0.1:{p.serve_port}/"

    def claims_left(self, replica: Replica) -> int:
        """Unreleased claims, read once the service has stopped (the embedded database: by `cdc2ch query`)."""
        sql = f"SELECT count() FROM {DATABASE}.cdc2ch_locks FINAL WHERE released = 0"
        if self.server is not None:
            return int(replica.rows(sql)[0][0])
        cmd = [sys.executable, "-m", "cdc2ch", "query", "--clickhouse", self.p.dsn, "--format", "TSV", sql]
        out = subprocess.run(cmd, env=self.p.env(), capture_output=True, text=True, cwd=self.p.work)
        return int(out.stdout.strip() or -1)

    def close(self) -> None:
        if self.server is not None:
            self.p.proxy.stop()
            self.server.stop()
            self.holder.__exit__(None, None, None)


def run_phase(p: Phase) -> dict:
    rng = random.Random(p.seed)
    lake = p.work / "lake"
    lake.mkdir(parents=True)
    journal, stop_file = Journal(p.work / "journal.jsonl"), p.work / "writer.stop"
    ends = Endpoints(p)
    writer = subprocess.Popen(
        [sys.executable, __file__, "--writer", "--lake", str(lake), "--journal", str(journal.path),
         "--stop", str(stop_file), "--seed", str(p.seed), "--late-at", str(p.seconds * 0.4),
         "--grow-at", str(p.seconds * 0.55), "--spark-share", str(p.spark_share)],
        env={**p.env(), "PYTHONPATH": f"{ROOT / 'bench'}:{ROOT}"},
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while len(journal.commits) < len(FIRST) and time.time() < deadline:
            journal.read()
            time.sleep(0.2)
        p.write_config(FIRST)
        p.start()
        replica = Replica(ends.reader_url)
        chaos_loop(p, rng, journal, replica)
        stop_file.touch()  # the end: the writer stops, faults are cleared, the service catches up
        writer.wait(STOP_TIMEOUT)  # a Spark commit in flight ends first; on a loaded machine, minutes
        journal.read()
        p.commits = sum(len(c) for c in journal.commits.values())
        offsets, latest = settle(p, journal, replica, lake)
        results = [check_table(replica, lake, t) for t in latest]
        p.verify_live.append(run_verify(p))
        final_code = p.stop()
        if final_code != 0:
            p.findings.append(f"the final SIGTERM: the service exited {final_code}, not 0")
        for r in results:
            r["offset"] = offsets.get(r["table"])
            r["offset_ok"] = r["offset"] == latest[r["table"]]
        return {
            "results": results,
            "claims_left": ends.claims_left(replica),
            "verify_exit": p.verify_live[-1],
        }
    finally:
        stop_file.touch()
        for proc in (writer, p.service):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if p.service is not None:
            end_group(p.service)
        ends.close()


def chaos_loop(p: Phase, rng: random.Random, journal: Journal, replica: Replica) -> None:
    """Until the phase's time is up: a fault every 4-12 s, the config change once the late table exists,
    a restart a second after any exit (as systemd would), and the lag sampled."""
    chaos = Chaos(p, rng, SERVER_FAULTS if p.target == "server" else EMBEDDED_FAULTS, replica)
    known: dict[str, int] = {}
    started = time.time()
    next_fault = started + rng.uniform(5, 10)
    while time.time() < started + p.seconds:
        journal.read()
        if "late" not in p.followed and "late" in journal.commits:
            p.write_config(list(TABLES))
            p.schedule.append((round(time.time() - started, 1), "config_change"))
            p.events["config_change"] += 1
            p.exits[f"config_change->{p.stop()}"] += 1
            p.start()
        if not p.alive():
            p.exits[f"unexpected->{p.service.returncode}"] += 1
            end_group(p.service)
            time.sleep(1)
            p.start()
        known.update(replica.offsets())  # the last offsets read: while the service restarts, none are
        p.lags.append(journal.lag(known, time.time(), p.followed))
        p.max_lag = max(p.max_lag, p.lags[-1])
        if time.time() >= next_fault:
            kind = chaos.next_kind()
            p.schedule.append((round(time.time() - started, 1), kind))
            if p.verbose:
                print(f"  {time.time() - started:6.1f}s {kind}", flush=True)
            chaos.apply(kind)
            next_fault = time.time() + rng.uniform(4, 12)
        time.sleep(0.5)


def settle(p: Phase, journal: Journal, replica: Replica, lake: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Faults cleared, every table followed, the service running: wait (5 min at most) until each offset is
    its table's latest version. The offsets seen last, and the latest versions."""
    from deltalake import DeltaTable

    if p.proxy is not None:
        p.proxy.clear()
        p.proxy.up()
    tables = [t for t in TABLES if t in journal.commits]
    if p.followed != tables:
        p.write_config(tables)
        p.stop()
        p.start()
    latest = {t: DeltaTable(str(lake / t)).version() for t in tables}
    offsets: dict[str, int] = {}
    deadline = time.time() + 300
    while time.time() < deadline:
        if not p.alive():
            p.exits[f"unexpected->{p.service.returncode}"] += 1
            end_group(p.service)
            p.start()
        offsets = {**offsets, **replica.offsets()}
        if all(offsets.get(t) == latest[t] for t in tables):
            break
        time.sleep(1)
    p.max_lag = max(p.max_lag, journal.lag(offsets, time.time(), p.followed))
    return offsets, latest


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def report(p: Phase, outcome: dict, minutes: float) -> bool:
    results = outcome["results"]
    print(f"\n== {p.target}: {minutes:.1f} min, seed {p.seed}, {p.commits} commits, "
          f"{sum(r['rows'] for r in results)} rows at the end; lag p50 {pct(p.lags, 50):.1f} s, "
          f"p95 {pct(p.lags, 95):.1f} s, max {p.max_lag:.1f} s")  # fmt: skip
    print("faults:", ", ".join(f"{k} {v}" for k, v in sorted(p.events.items())) or "none")
    print("exits:", ", ".join(f"{k} x{v}" for k, v in sorted(p.exits.items())) or "none")
    print("schedule:", " ".join(f"{t}s:{k}" for t, k in p.schedule))
    print(f"verify: live runs exited {p.verify_live[:-1]}, final {p.verify_live[-1]}")
    header = ["table", "version", "offset", "rows", "missing", "extra", "differing", "stored_twice"]
    print("  ".join(f"{h:>12}" for h in header))
    for r in results:
        print("  ".join(f"{str(r[h]):>12}" for h in header))
    print(f"claims left: {outcome['claims_left']}")
    bad = [r for r in results if r["missing"] or r["extra"] or r["differing"] or r["stored_twice"]
           or r["duplicate_rows_in_clickhouse"] or not r["offset_ok"]]  # fmt: skip
    ok = not bad and not p.findings and outcome["claims_left"] == 0 and outcome["verify_exit"] == 0
    ok = ok and all(code == 0 for code in p.verify_live)
    for f in p.findings:
        print("finding:", f)
    print(
        "PASS"
        if ok
        else f"FAIL: replay with `make soak SEED={p.seed}` (python bench/soak.py --seed {p.seed})"
    )
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=2.0, help="chaos time, split between the targets")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--target", choices=["server", "embedded", "both"], default="both")
    ap.add_argument("--workdir", default=None, help="keep the tables, logs and database here")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--spark-share", type=float, default=0.15, help="share of the writer's commits made by Spark"
    )
    for hidden in ("--lake", "--journal", "--stop", "--late-at", "--grow-at"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer:
        args.seed, args.late_at, args.grow_at = int(args.seed), float(args.late_at), float(args.grow_at)
        writer_main(args)
        return 0
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    targets = ["server", "embedded"] if args.target == "both" else [args.target]
    if len(targets) > 1:  # a process hosts one embedded engine: each target in a process of its own
        print(f"soak seed {seed}: {args.minutes} min over {', '.join(targets)}", flush=True)
        # Side by side: a phase mostly waits (on JVMs starting, on its service catching up), and each has its
        # own directory, engine, ports and writer. Each one's output is printed whole once both have ended.
        phases = []
        for i, t in enumerate(targets):
            cmd = [sys.executable, __file__, "--target", t, "--seed", str(seed + i), "--minutes",
                   str(args.minutes / len(targets)), "--spark-share", str(args.spark_share)]  # fmt: skip
            cmd += ["--verbose"] if args.verbose else []
            if args.workdir:
                cmd += ["--workdir", str(Path(args.workdir) / t)]
            out = tempfile.TemporaryFile("w+")  # noqa: SIM115 (read back below)
            phases.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True), out))
        codes = []
        for proc, out in phases:
            codes.append(proc.wait())
            out.seek(0)
            print(out.read(), end="", flush=True)
            out.close()
        return 0 if all(c == 0 for c in codes) else 1
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"cdc2ch-soak-{targets[0]}-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"soak {targets[0]}: seed {seed}, {args.minutes} min, work in {work}", flush=True)
    phase = Phase(targets[0], work, seed, args.minutes * 60, args.verbose, args.spark_share)
    outcome = run_phase(phase)
    return 0 if report(phase, outcome, args.minutes) else 1


if __name__ == "__main__":
    sys.exit(main())
