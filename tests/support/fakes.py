"""In-memory implementations of cdc2ch's ports (cdc2ch/replication/ports.py), for tests of the loop's decisions
without a JVM or a ClickHouse engine.

`FakeTable` plays a Delta table with a change data feed; `MemoryTarget` plays the target database: tables
of rows with ReplacingMergeTree's FINAL (per key the row of the greatest `_version`, the later insert on a
tie, tombstones hidden); `MemoryWriter` inserts a range's Arrow rows in batches and can be told to stop or
crash after some of them. Rows go through the real row contract (`contract.arrow_rows`).
"""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime, timedelta, timezone

import pyarrow as pa

from cdc2ch.base.errors import LockedError, SinkError, SourceError
from cdc2ch.model import contract, schema
from cdc2ch.model.changeset import FEED, LOG, Commit, RangeResult
from cdc2ch.model.config import RunConfig, TargetName
from cdc2ch.model.identity import Identity
from cdc2ch.model.records import PipelineState
from cdc2ch.replication.ports import Ports

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPARK_TYPES = {"long": pa.int64(), "string": pa.string(), "integer": pa.int32(), "double": pa.float64()}


def spark_schema(columns: dict[str, str]) -> dict:
    return {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in columns.items()],
    }


class Clock:
    """A monotonic clock the test sets by hand."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTable:
    """A Delta table in memory: commits of inserts, updates (key changes included) and deletes, each with
    the change rows Delta's CDF would give, and the table's rows after each version."""

    def __init__(self, columns: dict[str, str] | None = None, key: str = "id", cdf: bool = True):
        self.key = key
        self.columns = dict(columns or {"id": "long", "name": "string"})
        self.cdf = cdf
        self.versions: list[dict] = []  # {"commit", "changes", "schema", "rows"}
        self.rows: dict = {}
        self.first_retained = 0  # versions before it were removed from the log
        self.vacuumed: set[str] = set()  # files removed from storage (Commit.files paths)
        self.protocol = {"minReaderVersion": 1, "minWriterVersion": 4, "readerFeatures": None}
        self.commit(operation="CREATE TABLE", metadata=True)

    @property
    def latest(self) -> int:
        return len(self.versions) - 1

    def commit(
        self,
        *ops,
        operation: str = "WRITE",
        metadata: bool = False,
        drop: str | None = None,
        properties: dict | None = None,
        parameters: dict | None = None,
        files=None,
    ) -> int:
        """ops: ("insert", row), ("update", key, {col: value}), ("delete", key). `drop` drops a column;
        `properties`, the table properties of a metaData action; `parameters`, the operation's; `files`, the
        commit's file actions (model.commit.Files; None: unknown, as for a share)."""
        changes = []
        if drop:
            self.columns.pop(drop)
            self.rows = {k: {c: v for c, v in r.items() if c != drop} for k, r in self.rows.items()}
            metadata = True
        for op in ops:
            if op[0] == "insert":
                row = {c: op[1].get(c) for c in self.columns}
                self.rows[row[self.key]] = row
                changes.append({**row, "_change_type": "insert"})
            elif op[0] == "update":
                old = self.rows.pop(op[1])
                new = {**old, **op[2]}
                self.rows[new[self.key]] = new
                changes += [
                    {**old, "_change_type": "update_preimage"},
                    {**new, "_change_type": "update_postimage"},
                ]
            elif op[0] == "delete":
                changes.append({**self.rows.pop(op[1]), "_change_type": "delete"})
        version = len(self.versions)
        ts = T0 + timedelta(seconds=version)
        for c in changes:
            c.update(_commit_version=version, _commit_timestamp=ts)
        metadata = metadata or properties is not None
        commit = Commit(version, ts, operation, len(changes), parameters or {}, metadata, properties, files)
        self.versions.append(
            {"commit": commit, "changes": changes, "schema": dict(self.columns), "rows": dict(self.rows)}
        )
        return version

    def rows_at(self, version: int) -> list[dict]:
        return sorted(self.versions[version]["rows"].values(), key=lambda r: r[self.key])


def late_feed_table() -> FakeTable:
    """Rows written before the change data feed was switched on at version 2, then changes."""
    import json

    on = {"delta.enableChangeDataFeed": "true"}
    t = FakeTable()
    t.versions[0]["commit"] = Commit(0, T0, "CREATE TABLE", 0, {}, True, {})  # without the feed
    t.commit(*[("insert", {"id": i, "name": f"n{i}"}) for i in range(1, 5)])
    t.commit(properties=on, parameters={"properties": json.dumps(on)}, operation="SET TBLPROPERTIES")
    t.commit(("update", 2, {"name": "two"}), ("delete", 3))
    return t


class FakeSource:
    """The ChangeSource port over a FakeTable."""

    streams = False
    derives = True

    def __init__(self, table: FakeTable, uri: str = "/lake/t"):
        self.table, self.uri, self.location = table, uri, uri
        self.reads: list[tuple[int, int]] = []
        self.keys: set[tuple[str, ...]] = set()  # the keys its reads were told identify a row
        self.origins: list[tuple[int, int, str]] = []  # (start, end, origin) of each read

    def latest(self) -> Commit:
        return self.table.versions[-1]["commit"]

    def commit(self, version: int) -> Commit | None:
        if self.table.first_retained <= version <= self.table.latest:
            return self.table.versions[version]["commit"]
        return None

    def commits(self, start: int, end: int | None = None) -> list[Commit]:
        end = self.table.latest if end is None else end
        return [c for v in range(start, end + 1) if (c := self.commit(v)) is not None]

    def lag(self, committed: int, latest: Commit) -> tuple[int, float | None]:
        return max(latest.version - committed, 0), 0.0

    def file_exists(self, path: str) -> bool | None:
        return path not in self.table.vacuumed

    def version_at(self, ts: datetime) -> int:
        return next(v["commit"].version for v in self.table.versions if v["commit"].timestamp >= ts)

    def table_id(self) -> str:
        return "fake-table"

    def cdf_enabled(self) -> bool:
        return self.table.cdf

    def protocol(self) -> dict:
        return dict(self.table.protocol)

    def properties(self, version: int | None = None) -> dict[str, str]:
        """The last metaData's properties up to `version`, else the table's feed setting."""
        found = {"delta.enableChangeDataFeed": str(self.table.cdf).lower()}
        for v in self.table.versions[: None if version is None else version + 1]:
            if v["commit"].properties is not None:
                found = dict(v["commit"].properties)
        return found

    def schema_at(self, version: int) -> dict:
        return spark_schema(self.table.versions[version]["schema"])

    def mapped_schema(self, version: int) -> dict | None:
        return None  # no column mapping: renames stay breaking

    def changes(self, start: int, end: int, key: tuple[str, ...] = (), origin: str = FEED) -> FakeChanges:
        self.reads.append((start, end))
        self.keys.add(key)
        self.origins.append((start, end, origin))
        if origin == LOG:
            rows = [r for v in range(start, end + 1) for r in self._derived(v)]
        else:
            rows = [r for v in range(start, end + 1) for r in self.table.versions[v]["changes"]]
        changes = FakeChanges(start, end, self.uri, self.table.versions[end]["schema"], rows, origin)
        changes.range_commits = [v["commit"] for v in self.table.versions[start : end + 1]]
        changes.range_properties = self.properties(end)
        return changes

    def _derived(self, version: int) -> list[dict]:
        """What the log yields for `version`: each changed or removed row of the version before as a delete,
        each new or changed row as an insert (as if every touched row's file were rewritten)."""
        before = self.table.versions[version - 1]["rows"] if version else {}
        after = self.table.versions[version]["rows"]
        meta = {
            "_commit_version": version,
            "_commit_timestamp": self.table.versions[version]["commit"].timestamp,
        }
        gone = [{**r, "_change_type": "delete", **meta} for k, r in before.items() if after.get(k) != r]
        new = [{**r, "_change_type": "insert", **meta} for k, r in after.items() if before.get(k) != r]
        return gone + new

    def warm_up(self, immutable_keys: bool) -> float | None:
        return 0.0

    def snapshot(self, version: int) -> list[dict]:
        return self.table.rows_at(version)


class FakeChanges:
    def __init__(
        self, start: int, end: int, uri: str, columns: dict[str, str], rows: list[dict], origin: str = FEED
    ):
        self.start, self.end, self.uri, self.columns, self.rows = start, end, uri, columns, rows
        self.origin = origin
        self.location = uri
        self.schema = spark_schema(columns)
        self.range_commits: list[Commit] = []
        self.range_properties: dict[str, str] = {}

    def arrow_rows(self, immutable_keys: bool) -> pa.Table:
        fields = [(c, SPARK_TYPES[t]) for c, t in self.columns.items()]
        fields += [("_change_type", pa.string()), ("_commit_version", pa.int64()),
                   ("_commit_timestamp", pa.timestamp("us", tz="UTC"))]  # fmt: skip
        cdf = pa.Table.from_pylist([{n: r.get(n) for n, _ in fields} for r in self.rows], pa.schema(fields))
        return contract.arrow_rows(cdf, immutable_keys)

    def arrow_chunks(self, immutable_keys: bool, held_rows: int):
        yield self.arrow_rows(immutable_keys)

    def spark_rows(self, immutable_keys: bool):
        raise NotImplementedError("no Spark in the unit layer")

    def read_error(self, exc: Exception) -> Exception:
        return SourceError(str(exc))

    def commits(self) -> list[Commit]:
        return list(self.range_commits)

    def properties(self) -> dict[str, str]:
        return dict(self.range_properties)


class MemoryTarget:
    """The target database: tables (name -> columns, comment, rows) with FINAL as ReplacingMergeTree."""

    def __init__(self):
        self.tables: dict[str, dict] = {}
        self.statements: list[str] = []

    def final(self, name: str, key: str = "id") -> list[dict]:
        best: dict = {}
        for row in self.tables[name]["rows"]:
            k = row[key]
            if k not in best or row["_version"] >= best[k]["_version"]:
                best[k] = row
        live = [r for r in best.values() if not r["_is_deleted"]]
        return sorted(live, key=lambda r: r[key])

    def user_rows(self, name: str, columns, key: str = "id") -> list[dict]:
        return [{c: r.get(c) for c in columns} for r in self.final(name, key)]


class MemoryTables:
    """The TargetTables port of one target on a MemoryTarget."""

    def __init__(self, db: MemoryTarget, target: TargetName, identity: Identity):
        self.db, self.name, self.identity = db, str(target), identity
        self.table_sql = self.name

    def prepare(self, types: dict[str, str], comment: str | None = None, moves=None) -> schema.SchemaDiff:
        existing = self.db.tables.get(self.name)
        if existing is None:
            self.db.tables[self.name] = {"columns": dict(types), "comment": comment or "", "rows": []}
            return schema.diff(types, types, self.identity)
        change = schema.diff(existing["columns"], types, self.identity)
        if not change.breaking:
            existing["columns"].update(change.added)
        return change

    def check(self, types: dict[str, str], new: bool) -> None:
        """The in-memory target always fits."""

    def comment(self, suffix: str = "") -> str | None:
        table = self.db.tables.get(self.name + suffix)
        return None if table is None else table["comment"]

    def comments(self, *suffixes: str) -> list[str | None]:
        return [self.comment(s) for s in suffixes]

    def drop(self, suffix: str) -> None:
        self.db.statements.append(f"DROP {self.name + suffix}")
        self.db.tables.pop(self.name + suffix, None)

    def exchange(self, suffix: str, design=None) -> None:
        self.db.statements.append(f"EXCHANGE {self.name + suffix}")
        t = self.db.tables
        t[self.name], t[self.name + suffix] = t[self.name + suffix], t[self.name]

    def settle(self, design=None) -> None:
        pass


class Crash(BaseException):
    """A process dying at a chosen point (kill -9): nothing in it gets to handle it."""


class Refused(Exception):
    """ClickHouse refusing an insert (a failure cdc2ch handles)."""


class MemoryWriter:
    """The RangeWriter port: inserts a range's rows in batches of `batch_size`, each remembered with its
    token; a replayed token is dropped, as ClickHouse's insert deduplication does. `stop_after` sets the
    stop event after that many batches; `crash_after` raises Crash after that many, `fail_after` Refused."""

    kind = "driver"
    range_factor = 1
    collects = True

    def __init__(self, db: MemoryTarget, table: str, cfg: RunConfig, stop: threading.Event):
        self.db, self.table, self.cfg, self.stop = db, table, cfg, stop
        self.tokens: set[str] = set()
        self.batches = 0
        self.stop_after: int | None = None
        self.crash_after: int | None = None
        self.fail_after: int | None = None
        self.checked: list[tuple[int, int]] = []  # ranges check() was asked about

    def check(self, rng, estimate: int) -> None:
        self.checked.append((rng.start, rng.end))
        rows = rng.arrow_rows(self.cfg.immutable_keys)
        contract.check_keys(rows, self.cfg.primary_key, f"versions {rng.start}..{rng.end}")

    def write(self, rng, state: PipelineState, estimate: int) -> RangeResult:
        from cdc2ch.clickhouse.writers import changerows as changes

        rows = rng.arrow_rows(self.cfg.immutable_keys)
        contract.check_keys(rows, self.cfg.primary_key, f"versions {rng.start}..{rng.end}")
        order = changes.replay_order(rows, self.cfg.primary_key)
        written = 0
        for i, batch in enumerate(changes.batches(rows, self.cfg.batch_size, order)):
            if self.stop.is_set():
                return RangeResult(rng.start, rng.end, written, False)
            if self.crash_after is not None and self.batches >= self.crash_after:
                raise Crash(f"crashed before batch {i} of {rng.start}..{rng.end}")
            if self.fail_after is not None and self.batches >= self.fail_after:
                raise Refused(f"refused batch {i} of {rng.start}..{rng.end}")
            token = contract.driver_batch_token(self.cfg.pipeline, rng.start, rng.end, i, batch)
            table = self.db.tables[self.table]
            seen = table.setdefault("tokens", set())  # ClickHouse keeps them per table: a dropped one's go
            if token not in seen:
                self.tokens.add(token)
                seen.add(token)
                table["rows"].extend(batch.to_pylist())
            written += batch.num_rows
            self.batches += 1
            if self.stop_after is not None and self.batches >= self.stop_after:
                self.stop.set()
        return RangeResult(rng.start, rng.end, written, True)


class MemoryStore:
    """The OffsetStore port."""

    def __init__(self):
        self.states: dict[str, PipelineState] = {}
        self.begun: dict[str, int] = {}  # pipeline -> version of a snapshot with chunks recorded
        self.saves = 0
        self.ensured = False

    def ensure(self) -> None:
        self.ensured = True

    def load(self, pipeline: str) -> PipelineState | None:
        return self.states.get(pipeline)

    def load_all(self) -> list[PipelineState]:
        return sorted(self.states.values(), key=lambda s: s.pipeline)

    def save(self, state: PipelineState) -> None:
        self.states[state.pipeline] = state
        self.saves += 1

    def snapshot_begun(self, pipeline: str) -> int | None:
        return self.begun.get(pipeline)


class MemoryFootprint:
    """The Footprint port: takes back the pipeline's offset and the tables added since mark()."""

    def __init__(self, db: MemoryTarget, store: MemoryStore, pipeline: str):
        self.db, self.store, self.pipeline = db, store, pipeline
        self.before: set[str] | None = None
        self.undone: list[list[str]] = []

    def mark(self) -> None:
        self.before = set(self.db.tables)

    def undo(self) -> list[str]:
        if self.before is None:
            return []
        self.store.states.pop(self.pipeline, None)
        dropped = sorted(set(self.db.tables) - self.before)
        for name in dropped:
            del self.db.tables[name]
        self.before = None
        self.undone.append(dropped)
        return dropped


class MemoryLock:
    """The Lock port: records what was asked; `other` is the holder another runner would be (refused)."""

    def __init__(self):
        self.held = False
        self.acquired = self.checked = 0
        self.other: str | None = None

    def check(self) -> None:
        self.checked += 1
        self._refuse()

    def acquire(self) -> None:
        self._refuse()
        self.held, self.acquired = True, self.acquired + 1

    def _refuse(self) -> None:
        if self.other is not None:
            raise LockedError(f"Pipeline 'p' is already being run by {self.other}.")

    def release(self) -> None:
        self.held = False


class Harness:
    """A pipeline's ports on one MemoryTarget, and a Replicator over them."""

    def __init__(self, table: FakeTable, **options):
        self.table, self.source, self.db = table, FakeSource(table), MemoryTarget()
        self.store, self.lock = MemoryStore(), MemoryLock()
        self.footprint: MemoryFootprint | None = None  # the last replicator's
        self.options = options
        self.snapshots: list[int] = []
        self.stop = threading.Event()
        self.cfg = self.config()
        self.writer = MemoryWriter(self.db, str(self.cfg.target), self.cfg, self.stop)

    def config(self, **more) -> RunConfig:
        values = {
            "table": self.source.uri,
            "primary_key": ("id",),
            "target": TargetName("db", "t"),
            "clickhouse_dsn": "chdb:///mem",
            "pipeline": "p",
            "batch_size": 2,
            "max_rows_per_read": 2,
            "once": True,
            **self.options,
            **more,
        }
        return RunConfig(**values)

    def _load_snapshot(self, side: RunConfig, version: int, comment: str) -> int | None:
        """A snapshot into the side table, the way Snapshotter writes one (live rows at `version`)."""
        self.snapshots.append(version)
        tables = MemoryTables(self.db, side.target, side.identity)
        tables.prepare(schema.column_types(self.source.schema_at(version), side.design), comment)
        rows = self.table.rows_at(version)
        ts = self.table.versions[version]["commit"].timestamp
        for row in rows:
            self.db.tables[str(side.target)]["rows"].append(
                {**row, "_commit_version": version, "_commit_timestamp": ts, "_change_type": contract.SNAPSHOT,
                 "_is_deleted": 0, "_version": contract.version(version, contract.SNAPSHOT)}
            )  # fmt: skip
        return len(rows)

    def replicator(self, metrics=None, budget=None, **more):
        from cdc2ch.clickhouse.writers.pushdown import LakeFunctionReader
        from cdc2ch.replication.budget import UNLIMITED
        from cdc2ch.replication.pipeline import Replicator

        cfg = self.config(**more) if more else self.cfg
        self.writer.cfg = cfg
        self.footprint = MemoryFootprint(self.db, self.store, cfg.pipeline)
        ports = Ports(
            store=self.store,
            lock=self.lock,
            tables=MemoryTables(self.db, cfg.target, cfg.identity),
            writer=lambda kind: self.writer,
            load_snapshot=self._load_snapshot,
            remote_target=False,
            local_master=True,
            footprint=self.footprint,
            lake_reader=LakeFunctionReader(
                lambda setting: True
            ),  # pure: the storage it reaches, every setting
        )
        return Replicator(
            cfg, self.source, stop=self.stop, metrics=metrics, ports=ports, budget=budget or UNLIMITED
        )

    def run(self, budget=None, **more) -> PipelineState:
        self.stop.clear()
        return self.replicator(budget=budget, **more).run()

    def final(self) -> list[dict]:
        return self.db.user_rows(str(self.cfg.target), self.table.columns)

    def expected(self, version: int | None = None) -> list[dict]:
        return self.table.rows_at(self.table.latest if version is None else version)


class RecordingSink:
    """A ClickHouse connection (clickhouse/connection) that records the statements and queries sent to it:
    each statement reports `written` rows or fails with `fail_code`; each query answers `answer`."""

    one_process = False  # a server's: it reads no local table's files itself

    def __init__(self, fail_code: int | None = None, written: int = 2, answer=((1, 7),)):
        self.fail_code, self.written, self.answer = fail_code, written, list(answer)
        self.commands: list = []
        self.queries: list = []

    def reads_files(self):
        return contextlib.nullcontext()

    def row_count(self, table_sql):
        return 0

    def command(self, sql, what="", settings=None):
        self.commands.append((sql, settings))
        if self.fail_code is not None:
            raise SinkError("refused", code=self.fail_code)
        return type("Summary", (), {"written_rows": self.written})()

    def query_rows(self, sql, parameters=None, what="", settings=None):
        self.queries.append((sql, settings))
        return self.answer
