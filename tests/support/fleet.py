"""A fleet of pipelines for `cdc2ch status`: a few dozen small Delta tables written with delta-rs (no JVM),
shared by hundreds of pipelines whose offsets and health are recorded through cdc2ch's own stores, with the
status each one should show. Used by tests/e2e/commands/test_status_fleet.py and bench/status_fleet.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

from cdc2ch.clickhouse.state.statestore import HealthStore, StateStore
from cdc2ch.model.records import Health, PipelineState

# Commit v of every table is dated BASE + v * STEP (its file's modification time: delta-rs records no
# in-commit timestamp), so each pipeline's seconds behind are known exactly.
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)
STEP = 60


@dataclass(frozen=True)
class Expected:
    """What status should show for one pipeline."""

    pipeline: str
    database: str
    table: str
    committed: int | None
    latest: int | None
    failing: bool
    kind: str | None  # of its last error
    readable: bool = True

    @property
    def versions_behind(self) -> int | None:
        if not self.readable:
            return None
        return self.latest - (self.committed if self.committed is not None else -1)

    @property
    def seconds_behind(self) -> float | None:
        if not self.readable:
            return None
        return float(STEP * (self.latest - max(self.committed if self.committed is not None else 0, 0)))


def delta_tables(root: Path, count: int, checkpoint_every: int = 4) -> dict[str, int]:
    """`count` Delta tables under root, table i with 1 + i % 7 commits (latest version i % 7); every
    `checkpoint_every`-th one has a checkpoint. {path: latest version}."""
    from deltalake import DeltaTable, write_deltalake

    out = {}
    for i in range(count):
        path = str(root / f"t{i:03d}")
        latest = i % 7
        for v in range(latest + 1):
            write_deltalake(path, pa.table({"id": pa.array([v], pa.int64())}), mode="append")
        if checkpoint_every and i % checkpoint_every == 0:
            DeltaTable(path).create_checkpoint()
        for v in range(latest + 1):
            stamp = (BASE + timedelta(seconds=STEP * v)).timestamp()
            os.utime(Path(path) / "_delta_log" / f"{v:020d}.json", (stamp, stamp))
        out[path] = latest
    return out


def build(sink, root: Path, databases: tuple[str, ...], pipelines: int, tables: int) -> list[Expected]:
    """`pipelines` pipelines spread over `databases`, replicating `tables` Delta tables (made under root)
    plus one path that does not exist; their offsets and health saved through StateStore and HealthStore.
    Pipeline i: table i % tables; every 10th has failed its last attempt, every 25th is a table a pattern
    skipped (health only); the others committed some version (or none yet) and succeeded."""
    lake = delta_tables(root, tables)
    paths = sorted(lake)
    gone = str(root / "gone")
    now = datetime.now(timezone.utc)
    expected = []
    states = {db: StateStore(sink, db) for db in databases}
    healths = {db: HealthStore(sink, db) for db in databases}
    for store in (*states.values(), *healths.values()):
        store.ensure()
    for i in range(pipelines):
        db = databases[i % len(databases)]
        name = f"{db}.p{i:04d}"
        if i % 25 == 24:  # skipped by a pattern: a health record only
            health = Health(name, f"{root}/skipped{i}", name).failed(now, "no primary key", "skipped")
            healths[db].save(health)
            expected.append(Expected(name, db, f"{root}/skipped{i}", None, None, True, "skipped", False))
            continue
        path = gone if i % 50 == 17 else paths[i % len(paths)]
        latest = lake.get(path)
        committed = None if latest is None else (i // len(paths)) % (latest + 2) - 1  # -1: none yet
        if committed is not None and committed >= 0:
            state = PipelineState(name, path, name, committed, committed, 10 * i, now)
            states[db].save(state)
        failing = i % 10 == 3
        health = Health(name, path, name).succeeded(now)
        if failing:
            health = health.failed(now, f"pipeline {i} failed", "clickhouse")
        healths[db].save(health)
        expected.append(
            Expected(
                name,
                db,
                path,
                committed if committed is not None and committed >= 0 else None,
                latest,
                failing,
                "clickhouse" if failing else None,
                latest is not None,
            )
        )
    return expected
