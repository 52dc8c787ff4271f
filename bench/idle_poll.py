"""What a cron poll with nothing new costs: `python bench/idle_poll.py [--runs N] [--json]`.

One small Delta table (written by delta-rs), replicated once; then `cdc2ch run --once` is timed as a whole
process (its bytecode compiled, as installed), N times, while no version is new: against the embedded default
(chdb:///dir) and against a server target (tests/support/chserver.py: cdc2ch's ClickHouse HTTP interface on chdb, in
a process of its own). Beside it, two references, each a process that opens the embedded engine and answers
one query: through chdb's own API (the engine itself), and through clickhouse-connect (the client cdc2ch
writes with, whose import brings urllib3 and ssl); and a third, the floor of any poll that reads its offset
from the engine: the statements one idle poll had the engine run, recorded and run again through chdb's own
API alone, and again on the engine's extension loaded without chdb's Python package (which imports pyarrow and
numpy). Prints the median, min and max wall and the peak RSS of each process tree (the command and
anything it starts, a JVM included), sampled from /proc, and the CPU seconds of the tree (what a loaded
machine stretches the wall from), and checks the goals: <= 1 s wall; <= 150 MB against a server; no more
than the engine itself (chdb's own API) on the embedded default.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from workloads import cpu_seconds, descendants, rss_bytes  # this folder: the workloads' sampler's readings

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "idle-poll"
GOAL_WALL_S = 1.0
GOAL_SERVER_RSS_MIB = 150e6 / 2**20  # 150 MB
MIB = 2**20


def tree(pid: int) -> tuple[int, dict[int, float]]:
    """Resident bytes of `pid` and every process below it, and the CPU seconds of each, from /proc."""
    rss, cpu = 0, {}
    for p in descendants(pid):
        try:
            rss += rss_bytes(p)
            cpu[p] = cpu_seconds(f"/proc/{p}/stat")
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
    return rss, cpu


def timed(argv: list[str], env: dict) -> tuple[float, int, float]:
    """(wall seconds, peak RSS bytes of the process tree, CPU seconds of the tree) of one run of `argv`,
    which must succeed. CPU: what the tree's processes were last seen to have used, or what the processes
    it waited for used, whichever is more (a JVM it did not wait for is only seen)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, seen = [0], {}

    def sample() -> None:
        while proc.poll() is None:
            rss, cpu = tree(proc.pid)
            peak[0] = max(peak[0], rss)
            seen.update(cpu)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{err.decode()[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, peak[0], max(waited, sum(seen.values()))


def summary(name: str, runs: list[tuple[float, int, float]]) -> dict:
    walls, rss, cpu = [w for w, _, _ in runs], [r / MIB for _, r, _ in runs], [c for _, _, c in runs]
    return {
        "case": name,
        "runs": len(runs),
        "wall_median_s": round(statistics.median(walls), 3),
        "wall_min_s": round(min(walls), 3),
        "wall_max_s": round(max(walls), 3),
        "rss_median_mib": round(statistics.median(rss), 1),
        "rss_max_mib": round(max(rss), 1),
        "cpu_median_s": round(statistics.median(cpu), 3),
    }


# One idle poll, in-process, with each statement clickhouse-connect hands the engine recorded (its text, format
# and parameters, and the rows of an INSERT ... FROM INFILE) to the JSON file argv[1].
RECORD = """
import atexit, json, re, sys
from clickhouse_connect.driver._backend.chdb_backend import ChdbBackend
from cdc2ch.__main__ import main
out, sys.argv, said = sys.argv[1], ["cdc2ch", *json.loads(sys.argv[2])], []
run = ChdbBackend._query_locked
def recorded(self, sql, fmt, params=None):
    text = sql.decode() if isinstance(sql, bytes) else sql
    infile = re.search(r"FROM INFILE '([^']+)'", text)
    data = open(infile[1]).read() if infile else None
    said.append({"sql": text, "fmt": fmt, "params": params or {}, "data": data})
    return run(self, sql, fmt, params)
ChdbBackend._query_locked = recorded
ChdbBackend._open_stream = lambda *a: sys.exit("an idle poll streamed a result: record it too")
atexit.register(lambda: open(out, "w").write(json.dumps(said)))
main()
"""

# The recorded statements (argv[2]) run again on `c`, an engine connection opened on the directory argv[1].
_REPLAYED = """
for s in json.load(open(sys.argv[2])):
    sql = s["sql"]
    if s["data"] is not None:
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(sys.argv[2]), delete=False) as f:
            f.write(s["data"])
        sql = re.sub(r"FROM INFILE '[^']+'", f"FROM INFILE '{f.name}'", sql)
    c.query(sql, s["fmt"], params=s["params"])
c.close()
"""

# Through chdb's own API only.
REPLAY = (
    """
import json, os, re, sys, tempfile
import chdb
c = chdb.connect(sys.argv[1])
"""
    + _REPLAYED
)

# On the engine's extension loaded by itself, as chdb's package loads it (preloaded with RTLD_DEEPBIND, from
# its own folder) but without the package's Python modules, which import pyarrow and numpy (about 68 MiB and
# 0.2 s) and open an in-memory engine to ask its version: the floor of a poll whose client of the engine needs
# neither.
LEAN_REPLAY = (
    """
import ctypes, importlib.machinery, importlib.util, json, os, re, sys, tempfile
here = os.path.dirname(importlib.util.find_spec("chdb").origin)
library = os.path.join(here, "_chdb.abi3.so")
ctypes.CDLL(library, mode=sys.getdlopenflags() | os.RTLD_DEEPBIND)
cwd = os.getcwd()
os.chdir(here)
loader = importlib.machinery.ExtensionFileLoader("chdb._chdb", library)
engine = importlib.util.module_from_spec(importlib.util.spec_from_loader("chdb._chdb", loader))
loader.exec_module(engine)
os.chdir(cwd)
assert not {m.split(".")[0] for m in sys.modules} & {"pyarrow", "numpy"} and "chdb" not in sys.modules
c = engine.connect("file:" + sys.argv[1])
"""
    + _REPLAYED
)


def start_server(directory: str, env: dict) -> tuple[subprocess.Popen, int]:
    """tests/support/chserver.py in a process of its own on the chdb directory; (process, port)."""
    code = (
        "import sys, time\n"
        "from tests.support.chserver import ChServer\n"
        f"server = ChServer({directory!r}, user='default', password={PASSWORD!r}).__enter__()\n"
        "print(server.port, flush=True)\n"
        "time.sleep(10**9)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load = os.getloadavg()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CDC2CH_CLICKHOUSE_PASSWORD": PASSWORD}
    results = []
    # An installed package has its bytecode (pip compiles it at install): without it, with
    # PYTHONDONTWRITEBYTECODE set, every poll would compile cdc2ch's modules again (0.15-0.2 s here).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "cdc2ch")], check=True)
    with tempfile.TemporaryDirectory(prefix="cdc2ch-idle-") as tmp:
        table = f"{tmp}/orders"
        rows = pa.table({"id": pa.array(range(1000), pa.int64()), "name": [f"n{i}" for i in range(1000)]})
        write_deltalake(table, rows, configuration={"delta.enableChangeDataFeed": "true"})
        embedded, served = f"chdb://{tmp}/embedded", f"{tmp}/served"

        def arguments(dsn: str, *extra: str) -> list[str]:
            """cdc2ch's arguments for one poll of the table into `dsn`."""
            return [
                *("run", "--once", "--table", table, "--primary-key", "id"),
                "--target",
                "bench.orders",
                "--clickhouse",
                dsn,
                "--log-level",
                "warning",
                *extra,
            ]

        def poll(dsn: str, *extra: str) -> list[str]:
            return [sys.executable, "-m", "cdc2ch", *arguments(dsn, *extra)]

        # The first run replicates the table; later ones find nothing new.
        timed(poll(embedded, "--reader", "clickhouse"), env)
        results.append(
            summary(
                "run --once, nothing new, embedded", [timed(poll(embedded), env) for _ in range(args.runs)]
            )
        )
        path = embedded[len("chdb://") :]
        said = f"{tmp}/said.json"
        timed([sys.executable, "-c", RECORD, said, json.dumps(arguments(embedded))], env)
        references = {
            "the engine alone (chdb), one query": "import chdb\n"
            f"c = chdb.connect({path!r}); c.query('SELECT 1'); c.close()",
            "the engine via clickhouse-connect, one query": "import clickhouse_connect\n"
            f"c = clickhouse_connect.get_client(dsn={embedded!r}); c.query('SELECT 1'); c.close()",
            f"the engine alone, the poll's {len(json.loads(Path(said).read_text()))} statements": REPLAY,
            "the engine's extension, the same statements": LEAN_REPLAY,
        }
        for name, code in references.items():
            argv = [sys.executable, "-c", code, path, said]
            results.append(summary(name, [timed(argv, env) for _ in range(args.runs)]))
        server, port = start_server(served, env)
        try:
            dsn = f"http://default@127.0.0.1:{port}/"
            timed(poll(dsn), env)  # a served engine reads no local files: Spark replicates it
            results.append(
                summary("run --once, nothing new, server", [timed(poll(dsn), env) for _ in range(args.runs)])
            )
        finally:
            server.terminate()
            server.wait()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"load average before: {' '.join(f'{x:.1f}' for x in load)} ({os.cpu_count()} cores)")
    print(
        f"{'case':<46} {'wall median':>11} {'min':>6} {'max':>6} {'CPU':>6} {'peak RSS median':>16} {'max':>7}"
    )
    for r in results:
        print(
            f"{r['case']:<46} {r['wall_median_s']:>10.2f}s {r['wall_min_s']:>5.2f}s {r['wall_max_s']:>5.2f}s "
            f"{r['cpu_median_s']:>5.2f}s {r['rss_median_mib']:>12.0f} MiB {r['rss_max_mib']:>4.0f} MiB"
        )
    poll_embedded, engine_ref, client_ref, floor, lean, poll_server = results
    extra = poll_embedded["rss_median_mib"] - engine_ref["rss_median_mib"]
    client = poll_embedded["rss_median_mib"] - client_ref["rss_median_mib"]
    work = floor["rss_median_mib"] - engine_ref["rss_median_mib"]
    bare = lean["rss_median_mib"] - engine_ref["rss_median_mib"]
    checks = [
        ("wall <= 1 s (embedded)", poll_embedded["wall_median_s"] <= GOAL_WALL_S),
        ("wall <= 1 s (server)", poll_server["wall_median_s"] <= GOAL_WALL_S),
        ("RSS <= 150 MB (server)", poll_server["rss_median_mib"] <= GOAL_SERVER_RSS_MIB),
        (
            f"RSS <= the engine's own (embedded: {extra:+.0f} MiB; {client:+.0f} MiB over the engine via "
            f"clickhouse-connect; the poll's statements alone take {work:+.0f} MiB on the engine, "
            f"{bare:+.0f} MiB on its extension alone)",
            poll_embedded["rss_median_mib"] <= engine_ref["rss_median_mib"],
        ),
    ]
    for name, ok in checks:
        print(f"goal {name}: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
