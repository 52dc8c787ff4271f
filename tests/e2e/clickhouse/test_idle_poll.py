"""An idle poll (`run --once` with nothing new) pays only for what it must: against a server, the statements
it needs (each a round trip the poll waits for); on the embedded engine, no JIT compiler and no Arrow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.support.chserver import FaultProxy

ROOT = Path(__file__).resolve().parents[3]

# The 3 queries clickhouse-connect sends when it connects (version and time zone, the settings, the protocol
# probe), 1 look at all cdc2ch tables of the database, the claim check before any work (1 read), health (1),
# the control table that does not exist (1 look), layout (1), offset (1), the target's description (1), an
# interrupted resync's tables (1), the claim checked again where the pipeline would be claimed (1 read: with
# nothing to write it is not claimed, which took 3 reads, 2 writes, a 0.25 s pause and 2 reads of the offset
# and layout once claimed), health written (1) and the verify table that does not exist (1 look).
IDLE_STATEMENTS = 14


PASSWORD = "test-password"


def serve(directory: Path):
    """tests/support/chserver.py on the chdb `directory` in a process of its own; (process, port)."""
    code = (
        "import time\n"
        "from tests.support.chserver import ChServer\n"
        f"server = ChServer({str(directory)!r}, password={PASSWORD!r}).__enter__()\n"
        "print(server.port, flush=True)\n"
        "time.sleep(10**9)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def poll(args: list[str], env: dict) -> None:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]


def replicated(tmp_path: Path) -> tuple[list[str], Path, dict]:
    """A small Delta table replicated into an embedded directory by a first poll: (the poll's arguments but
    the --clickhouse DSN, the directory, the environment)."""
    table, directory = str(tmp_path / "orders"), tmp_path / "clickhouse"
    rows = pa.table({"id": pa.array(range(100), pa.int64()), "name": [f"n{i}" for i in range(100)]})
    write_deltalake(table, rows, configuration={"delta.enableChangeDataFeed": "true"})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CDC2CH_CLICKHOUSE_PASSWORD": PASSWORD}
    env.pop("CDC2CH_CLICKHOUSE_PASSWORD_FILE", None)
    run = ["run", "--once", "--table", table, "--primary-key", "id", "--target", "idle_poll.orders",
           "--reader", "clickhouse", "--clickhouse"]  # fmt: skip
    poll([sys.executable, "-m", "cdc2ch", *run, f"chdb://{directory}"], env)
    return run, directory, env


def idle_poll_said(tmp_path: Path, code: str):
    """What the poll `code` (run as `python -c`, the poll's arguments as JSON in argv[1]) printed last, as
    JSON, after a first poll replicated a small table and the default reader found nothing new."""
    run, directory, env = replicated(tmp_path)
    args = [a for a in run if a not in ("--reader", "clickhouse")]  # the default reader: nothing new
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps([*args, f"chdb://{directory}"])],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_idle_poll_sends_only_the_statements_it_needs(tmp_path):
    run, directory, env = replicated(tmp_path)
    # A served engine reads no lake files: the poll finds nothing new the same way.
    proc, port = serve(directory)
    try:
        with FaultProxy("127.0.0.1", port) as proxy:
            poll([sys.executable, "-m", "cdc2ch", *run, proxy.url_for()], env)
            sent = list(proxy.log)
    finally:
        proc.kill()
        proc.wait()
    listing = "\n".join(sent)
    assert len(sent) <= IDLE_STATEMENTS, f"{len(sent)} statements:\n{listing}"
    assert not [s for s in sent if s.startswith(("CREATE", "ALTER"))], listing  # every table is there
    assert not [s for s in sent if s.startswith("INSERT") and "cdc2ch_locks" in s], listing  # nor a claim
    assert sum("FROM system.settings" in s for s in sent) == 1, listing  # the driver's own listing only


# The poll's own process, asked afterwards what its engine compiled and what it imported.
IN_PROCESS_POLL = """
import json, sys
import clickhouse_connect
from cdc2ch.cli import main
sys.argv = ["cdc2ch", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
engine = clickhouse_connect.get_client(dsn=sys.argv[-1])
compiled = engine.query("SELECT sum(value) FROM system.events WHERE event = 'CompileFunction'").result_rows
print(json.dumps({"compiled": compiled[0][0], "modules": sorted(sys.modules)}))
"""


def test_an_embedded_idle_poll_compiles_no_expression_and_builds_no_arrow_row(tmp_path):
    """What an idle poll on the embedded engine keeps out of its peak RSS: the engine's JIT compiler, which
    its bookkeeping statements would reach by their fourth run (the claim check), an Arrow table per row it
    records (pyarrow's JSON reader and the engine's Arrow input), and pyarrow's compute functions (about
    8 MiB), which only rows need."""
    seen = idle_poll_said(tmp_path, IN_PROCESS_POLL)
    assert seen["compiled"] == 0
    assert not {"pyarrow.json", "pyarrow.compute", "pyspark"} & set(seen["modules"])


# The `cdc2ch` command itself (its entry point, which defers pyarrow), asked at its exit what it imported.
COMMAND_POLL = """
import atexit, json, sys
from cdc2ch.__main__ import main
sys.argv = ["cdc2ch", *json.loads(sys.argv[1])]
atexit.register(lambda: print(json.dumps(sorted(sys.modules))))
main()
"""


def test_the_idle_poll_command_imports_neither_pyarrow_nor_numpy(tmp_path):
    """pyarrow and numpy (about 68 MiB and 0.17 s of a ~1 s poll) are imported by cdc2ch's modules and by the
    embedded engine's package, yet an idle poll uses neither: the command defers them (base/deferred.py)."""
    modules = set(idle_poll_said(tmp_path, COMMAND_POLL))
    assert "chdb" in modules and "cdc2ch.model.contract" in modules  # the modules that import pyarrow ran
    assert not {m for m in modules if m == "numpy" or m.startswith(("numpy.", "pyarrow."))}


def test_an_own_table_dropped_behind_a_running_process_is_created_again(sink, database, chdb_dsn):
    """What a connection knows of cdc2ch's tables is dropped with the first statement that finds one gone."""
    import clickhouse_connect

    from cdc2ch.base.errors import SinkError

    health = f"`{database}`.cdc2ch_health"

    def ensure() -> None:
        sink.ensure_state_table(
            database, "cdc2ch_health", "create_health_table.sql", "create the health table"
        )

    ensure()
    other = clickhouse_connect.get_client(dsn=chdb_dsn)  # by hand, on a connection of its own
    other.command(f"DROP TABLE {health}")
    other.close()
    with pytest.raises(SinkError, match="UNKNOWN_TABLE|does not exist"):
        sink.query_rows(f"SELECT count() FROM {health}")
    ensure()
    assert sink.query_rows(f"SELECT count() FROM {health}") == [(0,)]
