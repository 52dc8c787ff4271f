"""Test helpers: build Delta histories with Spark and compare Delta with ClickHouse value by value."""

from __future__ import annotations

import datetime as dt
import decimal
import fcntl
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from cdc2ch.model import schema
from cdc2ch.model.config import TargetName


def create_table(spark, path: str, columns: str, partitioned_by: str | None = None) -> None:
    part = f"PARTITIONED BY ({partitioned_by})" if partitioned_by else ""
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({columns}) USING delta {part} "
        f"TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )


def orders(spark, path: str) -> None:
    """A small history in versions 0..3: created; rows 1, 2, 3 inserted; row 2 updated; row 3 deleted."""
    create_table(spark, path, "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    spark.sql(f"UPDATE delta.`{path}` SET name = 'x' WHERE id = 2")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")


def vacuum_everything(spark, path: str) -> None:
    """VACUUM with no retention: every file the table no longer references goes, change files included
    (Delta refuses a retention under 7 days unless its check is off, for this call only)."""
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")


def latest_version(spark, path: str) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]


def normalize(value):
    """A comparable form: NaN equal to itself, binary and text both as bytes, nested values recursively."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(value, dict):
        return tuple(sorted((normalize(k), normalize(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(normalize(v) for v in value)
    if isinstance(value, decimal.Decimal):
        return value.normalize() if value.is_finite() else value
    return value


def _rows(table, columns) -> list[tuple]:
    data = table.select(columns).to_pylist()
    # Map columns come back from Arrow as lists of (key, value) pairs on both sides.
    return sorted((tuple(normalize(r[c]) for c in columns) for r in data), key=repr)


def delta_rows(spark, path: str, version: int | None = None, columns: list[str] | None = None) -> list[tuple]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(path)
    columns = columns or df.columns
    return _rows(df.toArrow(), columns)


def delta_rs_rows(path: str, version: int, columns: list[str]) -> list[tuple]:
    """The Delta table at `version` as delta-rs reads it (no JVM: a cheap reference for many versions)."""
    from deltalake import DeltaTable

    return _rows(DeltaTable(path, version=version).to_pyarrow_table(), columns)


def clickhouse_rows(sink, target: TargetName, columns: list[str], final: bool = True) -> list[tuple]:
    """The live rows of `target` (with `final=False`: the rows a view such as <target>_current shows)."""
    cols = ", ".join(schema.quote(c) for c in columns)
    live = " FINAL WHERE _is_deleted = 0" if final else ""
    # Strings as binary: a String column may hold bytes that are not UTF-8 (Spark BINARY).
    table = sink.query_arrow(
        f"SELECT {cols} FROM {schema.qualified(target)}{live}",
        settings={"output_format_arrow_string_as_string": 0},
    )
    return _rows(table, columns)


def assert_replicated(
    spark,
    sink,
    path: str,
    target: TargetName,
    version: int | None = None,
    *,
    view: bool = False,
    rename: dict[str, str] | None = None,
    exclude: tuple[str, ...] = (),
) -> None:
    """FINAL (live rows, user columns) equals the Delta table at `version` (default: latest), row for row.
    With `view`, `target` is a current-state view: its columns are exactly Delta's (`rename`d, without
    `exclude`d ones), in order, and its rows Delta's."""
    columns = [c for c in spark.read.format("delta").load(path).columns if c not in exclude]
    expected = delta_rows(spark, path, version, columns)
    named = [(rename or {}).get(c, c) for c in columns]
    if view:
        assert list(sink.table_columns(target) or ()) == named, f"view {target} has the wrong columns"
    actual = clickhouse_rows(sink, target, named, final=not view)
    assert_rows_equal(expected, actual, f"{target} vs Delta {path}@{version}")


def assert_rows_equal(expected: list[tuple], actual: list[tuple], what: str) -> None:
    """The same rows, as many times each; else which are missing and which extra."""
    expected_set, actual_set = set(expected), set(actual)
    missing = [r for r in expected if r not in actual_set]
    extra = [r for r in actual if r not in expected_set]
    assert sorted(expected, key=repr) == sorted(actual, key=repr), (
        f"{what}: {len(expected)} vs {len(actual)} rows; missing {missing[:5]}, extra {extra[:5]}"
    )


def committed_version(sink, database: str, pipeline: str) -> int:
    rows = sink.query_rows(
        f"SELECT committed_version FROM {schema.quote(database)}.cdc2ch_state FINAL WHERE pipeline = {{p:String}}",
        {"p": pipeline},
    )
    return rows[0][0]


def recorded_version(sink, database: str, pipeline: str) -> int | None:
    """The pipeline's committed version, or None when it has no offset (a new pipeline's failed first
    attempt is taken back)."""
    if not sink.table_exists(TargetName(database, "cdc2ch_state")):
        return None
    rows = sink.query_rows(
        f"SELECT committed_version FROM {schema.quote(database)}.cdc2ch_state FINAL WHERE pipeline = {{p:String}}",
        {"p": pipeline},
    )
    return rows[0][0] if rows else None


class SinkTap:
    """A real sink with hooks after each insert and each statement (to act at a chosen point of a job)."""

    def __init__(self, inner, after_insert=None, after_command=None):
        self.inner = inner
        self.after_insert = after_insert or (lambda table_sql: None)
        self.after_command = after_command or (lambda what: None)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def insert_arrow(self, table_sql, data, token=None):
        n = self.inner.insert_arrow(table_sql, data, token)
        self.after_insert(table_sql)
        return n

    def insert_row(self, table_sql, values):
        self.inner.insert_row(table_sql, values)
        self.after_insert(table_sql)

    def command(self, sql, what="run a statement", settings=None):
        out = self.inner.command(sql, what=what, settings=settings)
        self.after_command(what)
        return out


def without_cdc2ch(path: str) -> str:
    """PATH as in a shell that has not activated cdc2ch's virtualenv: no directory holding a `cdc2ch`."""
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and not (Path(d) / "cdc2ch").exists())


class Proc:
    """A real `cdc2ch` process (own interpreter, own Spark), its output collected as it comes."""

    def __init__(self, *args: str, env: dict | None = None, cwd: str | None = None, group: bool = False):
        """`group`: in a process group of its own (with its JVM), for `interrupt` to signal as Ctrl-C does."""
        import os
        import subprocess
        import sys
        import threading

        argv = [sys.executable, "-m", "cdc2ch", *args]
        if args[0] in ("run", "snapshot", "status"):
            argv += ["--log-format", "json"]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=group,
        )
        self.pid = self.proc.pid
        self.stderr_lines: list[str] = []
        self.stdout = ""
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_stderr, daemon=True),
            threading.Thread(target=self._read_stdout, daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read_stderr(self):
        for line in self.proc.stderr:
            with self._changed:
                self.stderr_lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def _read_stdout(self):
        self.stdout = self.proc.stdout.read()

    @property
    def stderr(self) -> str:
        return "\n".join(self.stderr_lines)

    def events(self, name: str | None = None) -> list[dict]:
        import json

        out = []
        for line in list(self.stderr_lines):
            if line.startswith("{"):
                ev = json.loads(line)
                if name is None or ev.get("event") == name:
                    out.append(ev)
        return out

    def wait_for(self, name: str, timeout: float = 300) -> dict:
        """Block until the process logs event `name` (fails if it exits first)."""
        import time

        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = self.events(name)
                if found:
                    return found[0]
                assert self.proc.poll() is None or self._readers[0].is_alive(), (
                    f"cdc2ch exited {self.proc.returncode} before logging {name!r}:\n{self.stderr[-3000:]}"
                )
                assert time.monotonic() < deadline, f"no {name!r} event in {timeout}s:\n{self.stderr[-3000:]}"
                self._changed.wait(0.5)

    def signal(self, sig) -> None:
        import os

        os.kill(self.pid, sig)

    def kill_9(self) -> None:
        """kill -9 of the process, then of its Spark JVM (tests/support/processes.py)."""
        from tests.support.processes import kill_9

        kill_9(self.pid)

    def interrupt(self) -> None:
        """SIGINT to the whole process group, as a terminal's Ctrl-C (needs `group=True`)."""
        import os
        import signal

        assert os.getpgid(self.pid) == self.pid, "started without group=True: would signal the tests"
        os.killpg(self.pid, signal.SIGINT)

    def wait(self, timeout: float = 600) -> int:
        code = self.proc.wait(timeout)
        for t in self._readers:
            t.join(10)
        return code


def job_config(path: str, target: TargetName, dsn: str, **options):
    """The RunConfig `cdc2ch run --once --reader spark` would build, for driving a job in-process over a
    DeltaSource (Spark's reads)."""
    from cdc2ch.model.config import RunConfig

    return RunConfig(
        table=path,
        primary_key=("id",),
        target=target,
        clickhouse_dsn=dsn,
        pipeline=str(target),
        once=True,
        **{"reader": "spark", **options},
    )


def out_of_memory_paragraph(command: str, *args: str, dsn: str) -> str:
    """Run `cdc2ch <command> <args>` on the embedded target `dsn` with a 512 MiB driver heap, expecting it
    to run out of memory: checks exit code 1, no traceback and no pipeline recorded; returns the last line."""
    import subprocess
    import sys

    cli = [sys.executable, "-m", "cdc2ch"]
    proc = subprocess.run(
        [*cli, command, *args, "--clickhouse", dsn, "--spark-conf", "spark.driver.memory=512m"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    status = subprocess.run(
        [*cli, "status", "--clickhouse", dsn], capture_output=True, text=True, timeout=120
    )
    assert "No pipelines found" in status.stdout + status.stderr
    return proc.stderr.strip().splitlines()[-1]


class BuiltTables:
    """Delta histories written once per test run and handed out as copies, so that tests reading the same
    history do not each write it again with Spark, and a test may change its own copy. The workers of one
    run share `root`: the first to need a history writes it under a lock while the others wait for it. A copy
    keeps the log's files and their modification times (the commit timestamps of a log without in-commit
    timestamps)."""

    def __init__(self, spark, root: Path):
        self.spark, self.root = spark, root
        root.mkdir(parents=True, exist_ok=True)

    def copy(self, build: Callable[..., None], dest: Path, *args: object) -> str:
        """A copy at `dest` of the table `build(spark, path, *args)` writes, built on first use."""
        name = f"{build.__module__}.{build.__qualname__}" + "".join(f"-{a}" for a in args)
        source, done = self.root / name, self.root / f"{name}.done"
        with open(self.root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                shutil.rmtree(source, ignore_errors=True)  # what a worker that failed mid-way left
                build(self.spark, str(source), *args)
                done.touch()
        shutil.copytree(source, dest)
        return str(dest)


def java_home_that_waits(directory: Path, wait: str) -> Path:
    """A JAVA_HOME in `directory` whose java runs the shell lines `wait`, then the real java: a JVM still
    starting while a test acts."""
    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")) or shutil.which(
        "java"
    )
    assert java, "the tests need Java"
    (directory / "bin").mkdir(parents=True)
    script = directory / "bin" / "java"
    script.write_text(f'#!/bin/sh\n{wait}\nexec {os.path.realpath(java)} "$@"\n')
    script.chmod(0o755)
    return directory
