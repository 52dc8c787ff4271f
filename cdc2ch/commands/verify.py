"""`cdc2ch verify`: prove the target's live rows equal the Delta table at the pipeline's committed version.

Both sides reduce their rows to per-bucket counts and sums of row hashes over one canonical text of every
value (canonical.py): Spark over the Delta table at the committed version, ClickHouse over `FINAL` (each
engine aggregates where the data is, so only a few thousand numbers cross the wire whatever the table's
size). Buckets that disagree are narrowed down to keys, a bounded number of buckets at a time. A key whose
target row is newer than the committed version (`run` keeps going meanwhile) is compared again at the next
committed version instead of being reported. `--repair` re-sends exactly the keys found wrong, versioned
just above the committed version so later changes still win (contract.REPAIR).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

from cdc2ch.base.errors import Cdc2chError, SourceError
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.model import canonical, contract, schema
from cdc2ch.model.canonical import CLICKHOUSE, SPARK
from cdc2ch.model.config import RunConfig
from cdc2ch.model.identity import Identity
from cdc2ch.replication.fullload.progress import Progress
from cdc2ch.replication.projection import designed_source

ROWS_PER_BUCKET = 2_000  # narrowing a mismatching bucket reads about this many keys on each side
MAX_BUCKETS = 1 << 16
NARROW_KEYS = 200_000  # keys per side held at once while narrowing (memory bound)
SAMPLE = 20  # keys shown per kind of difference
RECHECKS = 5  # rounds for keys that change while verifying


@dataclass(frozen=True)
class Difference:
    kind: str  # missing | extra | differing
    key: dict
    columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    pipeline: str
    target: str
    version: int
    delta_rows: int
    target_rows: int
    buckets: int
    mismatched_buckets: int
    counts: dict = field(default_factory=lambda: {"missing": 0, "extra": 0, "differing": 0})
    sample: tuple[Difference, ...] = ()
    missing_columns: tuple[str, ...] = ()
    changing: int = 0  # keys changed by `run` while verifying, compared at a newer version
    repaired: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(self.counts.values()) and not self.missing_columns

    def summary(self) -> str:
        if self.ok:
            return f"ok at version {self.version} ({self.delta_rows} rows)"
        parts = [f"{n} {kind}" for kind, n in self.counts.items() if n]
        if self.missing_columns:
            parts.append(f"columns missing from the target: {', '.join(self.missing_columns)}")
        return f"differs at version {self.version}: " + ", ".join(parts)

    def as_dict(self) -> dict:
        return {
            "pipeline": self.pipeline,
            "target": self.target,
            "version": self.version,
            "ok": self.ok,
            "delta_rows": self.delta_rows,
            "target_rows": self.target_rows,
            "buckets": self.buckets,
            "mismatched_buckets": self.mismatched_buckets,
            **self.counts,
            "missing_columns": list(self.missing_columns),
            "changing": self.changing,
            "repaired": self.repaired,
            "seconds": round(self.seconds, 3),
            "sample": [{"kind": d.kind, "key": d.key, "columns": list(d.columns)} for d in self.sample],
        }


def nothing_to_verify(cfg: RunConfig) -> Cdc2chError:
    return Cdc2chError(
        f"Pipeline {cfg.pipeline!r} has not replicated anything into {cfg.target} yet, so there is nothing to "
        f"verify. Run `cdc2ch run --once` (or `cdc2ch snapshot`) for it first, then verify."
    )


class Sides:
    """The SQL of both sides for one table: key text, row hash and bucket, rendered by each dialect.

    A key is a row's identity (identity.py: sorting key and partition columns), so what is compared is what
    `SELECT ... FINAL` shows. Buckets go by the sorting key alone, which every row ClickHouse collapses into
    one shares (the partition columns may differ within one partition)."""

    def __init__(self, fields: list[dict], identity: Identity, buckets: int):
        by_name = {f["name"]: f for f in fields}
        self.fields = fields
        self.keys = [by_name[k] for k in identity.columns]
        self.sorting = [by_name[k] for k in identity.order_by]
        self.buckets = buckets

    def key(self, d) -> str:
        return canonical.row_text(self.keys, d)

    def hash(self, d) -> str:
        return canonical.hash60(canonical.row_text(self.fields, d), d)

    def bucket(self, d) -> str:
        return canonical.bucket(canonical.row_text(self.sorting, d), self.buckets, d)

    def column(self, f: dict, d) -> str:
        return canonical.text(canonical.quoted(f["name"], d), f["type"], d)


class Verifier:
    def __init__(self, cfg: RunConfig, source, sink: Sink, store, log, stop: threading.Event | None = None):
        self.cfg, self.sink, self.store, self.log = cfg, sink, store, log
        self.source = designed_source(source, cfg.design)  # the Delta rows in the target's columns
        self.stop = stop or threading.Event()
        self.table_sql = schema.qualified(cfg.target)
        self._found: set[str] = set()  # key texts already reported (memory grows with differences only)

    # -- the two sides -----------------------------------------------------------------------------
    def _committed(self) -> int:
        state = self.store.load(self.cfg.pipeline)
        if state is None or state.committed_version < 0:
            raise nothing_to_verify(self.cfg)
        return state.committed_version

    def _delta(self, version: int):
        return self.source.snapshot(version)

    def _live(self) -> str:
        return f"{self.table_sql} FINAL WHERE _is_deleted = 0"

    def _delta_buckets(self, df, sides: Sides) -> dict[int, tuple[int, int]]:
        from pyspark.sql import functions as F

        rows = (
            df.selectExpr(f"{sides.bucket(SPARK)} AS __cdc2ch_b", f"{sides.hash(SPARK)} AS __cdc2ch_h")
            .groupBy("__cdc2ch_b")
            .agg(F.count(F.lit(1)), F.sum("__cdc2ch_h"))
            .collect()
        )
        return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def _target_buckets(self, sides: Sides) -> dict[int, tuple[int, int]]:
        rows = self.sink.query_rows(
            f"SELECT {sides.bucket(CLICKHOUSE)} AS __cdc2ch_b, count(), "
            f"toString(sum(toUInt128({sides.hash(CLICKHOUSE)}))) FROM {self._live()} GROUP BY __cdc2ch_b",
            what="digest the target table",
        )
        return {int(b): (int(n), int(s)) for b, n, s in rows}

    def _delta_keys(
        self, df, sides: Sides, where: str | None = None, keys=None
    ) -> dict[str, tuple[int, dict]]:
        """{key text: (row hash, key)} of the Delta rows in `where` (SQL over the table) or with `keys`."""
        names = [f["name"] for f in sides.keys]
        cols = [f"{sides.key(SPARK)} AS __cdc2ch_k", f"{sides.hash(SPARK)} AS __cdc2ch_h"] + [
            f"{canonical.quoted(n, SPARK)} AS `__cdc2ch_key{i}`" for i, n in enumerate(names)
        ]
        picked = self._with_keys(df, sides, keys) if keys is not None else df.where(where)
        found = picked.selectExpr(*cols).collect()
        return {r[0]: (int(r[1]), dict(zip(names, (_show(v) for v in r[2:])))) for r in found}

    def _with_keys(self, df, sides: Sides, keys):
        """The rows of `df` whose key text is one of `keys` (a semi-join: any number of keys)."""
        wanted = df.sparkSession.createDataFrame([(k,) for k in keys], "__cdc2ch_wanted STRING")
        keyed = df.selectExpr("*", f"{sides.key(SPARK)} AS __cdc2ch_wanted")
        return keyed.join(wanted, "__cdc2ch_wanted", "left_semi").drop("__cdc2ch_wanted")

    def _target_keys(
        self, sides: Sides, where: str = "1", having: str = "1"
    ) -> dict[str, tuple[int, int, bool, dict]]:
        """{key text: (row hash, newest commit version, deleted, key)} of the rows FINAL would keep among
        those in `where` (over the sorting key) or `having` (over the key text): one per sorting key and
        partition, read from all rows (FINAL may leave tombstones out, and a key deleted after the version
        being verified must show as changed, not missing)."""
        names = [f["name"] for f in sides.keys]
        keys = ", ".join(f"argMax({schema.quote(n)}, _version)" for n in names)
        sorting = canonical.row_text(sides.sorting, CLICKHOUSE)
        rows = self.sink.query_rows(
            f"SELECT argMax({sides.key(CLICKHOUSE)}, _version) AS __cdc2ch_k, "
            f"argMax({sides.hash(CLICKHOUSE)}, _version), max(_commit_version), argMax(_is_deleted, _version), "
            f"{keys} FROM {self.table_sql} WHERE {where} GROUP BY {sorting}, _partition_id HAVING {having}",
            what="read keys of the target table",
        )
        return {r[0]: (int(r[1]), int(r[2]), bool(r[3]), dict(zip(names, map(_show, r[4:])))) for r in rows}

    def _target_keys_in(self, sides: Sides, keys) -> dict[str, tuple[int, int, bool, dict]]:
        out: dict = {}
        for chunk in _chunks(sorted(keys)):
            out.update(self._target_keys(sides, having=f"__cdc2ch_k IN ({_ch_list(chunk)})"))
        return out

    # -- verify ------------------------------------------------------------------------------------
    def run(self, repair: bool = False) -> Report:
        t0 = time.monotonic()
        version = self._committed()
        fields = self.source.schema_at(version)["fields"]
        present = set(self.sink.table_columns(self.cfg.target) or ())
        missing_columns = tuple(f["name"] for f in fields if f["name"] not in present)
        compared = [f for f in fields if f["name"] in present]
        (target_rows,) = self.sink.query_rows(f"SELECT count() FROM {self._live()}")[0]
        buckets = max(16, min(MAX_BUCKETS, int(target_rows) // ROWS_PER_BUCKET + 1))
        sides = Sides(compared, self.cfg.identity, buckets)
        df = self._delta(version)
        self.log.info("verify_started", version=version, buckets=buckets, target_rows=int(target_rows))
        theirs, ours = self._delta_buckets(df, sides), self._target_buckets(sides)
        mismatched = sorted(b for b in set(theirs) | set(ours) if theirs.get(b) != ours.get(b))
        report = Report(
            self.cfg.pipeline,
            str(self.cfg.target),
            version,
            sum(n for n, _ in theirs.values()),
            int(target_rows),
            buckets,
            len(mismatched),
            missing_columns=missing_columns,
        )
        self.log.info(
            "verify_digests", mismatched_buckets=len(mismatched), seconds=round(time.monotonic() - t0, 3)
        )
        per_pass = max(1, NARROW_KEYS // ROWS_PER_BUCKET)
        groups = range(0, len(mismatched), per_pass)
        what = f"verify {self.cfg.pipeline}"
        with Progress(what, None, len(groups), unit="bucket group", shown=bool(groups)) as progress:
            for i in groups:
                group = ", ".join(str(b) for b in mismatched[i : i + per_pass])
                report = self._narrow(report, df, sides, version, group, repair)
                progress.advance(0, 1)
            progress.done()
        report = self._check_versions(report, sides, version, repair)
        return replace(report, seconds=time.monotonic() - t0)

    def _check_versions(self, report: Report, sides: Sides, version: int, repair: bool) -> Report:
        """Rows whose `_version` breaks the row contract (contract.sql_version): the same content, but an
        older change replayed later could win over them. Reported as a difference in `_version`."""
        names = [f["name"] for f in sides.keys]
        rows = self.sink.query_rows(
            f"SELECT {sides.key(CLICKHOUSE)}, {', '.join(schema.quote(n) for n in names)} FROM {self.table_sql} "
            f"FINAL WHERE _commit_version <= {int(version)} AND _version != {contract.sql_version()} "
            f"LIMIT {NARROW_KEYS}",
            what="check the target's merge versions",
        )
        found = {
            r[0]: ("differing", dict(zip(names, map(_show, r[1:])))) for r in rows if r[0] not in self._found
        }
        self._found.update(found)
        if not found:
            return report
        room = max(0, SAMPLE - sum(1 for d in report.sample if d.kind == "differing"))
        sample = [Difference("differing", key, ("_version",)) for _, key in list(found.values())[:room]]
        counts = {**report.counts, "differing": report.counts["differing"] + len(found)}
        repaired = report.repaired + (self._repair(sides, version, found) if repair else 0)
        return replace(report, counts=counts, sample=report.sample + tuple(sample), repaired=repaired)

    def _narrow(self, report: Report, df, sides: Sides, version: int, group: str, repair: bool) -> Report:
        delta = self._delta_keys(df, sides, where=f"{sides.bucket(SPARK)} IN ({group})")
        target = self._target_keys(sides, where=f"{sides.bucket(CLICKHOUSE)} IN ({group})")
        found, newer = _compare(delta, target, version)
        for _ in range(RECHECKS):  # keys `run` changed after `version`: compare again where run is now
            if not newer:
                break
            time.sleep(0.5)
            version2 = self._committed()
            d2 = self._delta_keys(self._delta(version2), sides, keys=newer)
            t2 = self._target_keys_in(sides, newer)
            again, newer = _compare(d2, t2, version2)
            found = {**found, **again}
        found = {k: v for k, v in found.items() if k not in self._found}
        self._found.update(found)
        counts = dict(report.counts)
        for kind, _ in found.values():
            counts[kind] += 1
        sample = list(report.sample)
        wanted = {kind: SAMPLE - sum(1 for d in sample if d.kind == kind) for kind in counts}
        chosen = []
        for k, (kind, key) in found.items():
            if wanted[kind] > 0:
                wanted[kind] -= 1
                chosen.append((k, kind, key))
        columns = self._differing_columns(sides, version, [k for k, kind, _ in chosen if kind == "differing"])
        sample += [Difference(kind, key, columns.get(k, ())) for k, kind, key in chosen]
        repaired = report.repaired
        if repair and found:
            repaired += self._repair(sides, version, found)
        return replace(report, counts=counts, sample=tuple(sample), changing=report.changing + len(newer),
                       repaired=repaired)  # fmt: skip

    def _differing_columns(self, sides: Sides, version: int, keys: list[str]) -> dict[str, tuple[str, ...]]:
        """For a few differing keys, the columns whose texts differ (by name, in table order)."""
        if not keys:
            return {}
        names = [f["name"] for f in sides.fields]
        spark_cols = [f"{sides.key(SPARK)} AS __cdc2ch_k"] + [
            f"{sides.column(f, SPARK)} AS `__cdc2ch_c{i}`" for i, f in enumerate(sides.fields)
        ]
        picked = self._with_keys(self._delta(version), sides, keys)
        theirs = {r[0]: r[1:] for r in picked.selectExpr(*spark_cols).collect()}
        ch_cols = ", ".join(sides.column(f, CLICKHOUSE) for f in sides.fields)
        ours = {
            r[0]: r[1:]
            for r in self.sink.query_rows(
                f"SELECT {sides.key(CLICKHOUSE)} AS __cdc2ch_k, {ch_cols} FROM {self._live()} "
                f"AND __cdc2ch_k IN ({_ch_list(keys)})"
            )
        }
        out = {}
        for k in keys:
            a, b = theirs.get(k, ()), ours.get(k, ())
            out[k] = tuple(n for n, x, y in zip(names, a, b) if x != y) or ("_version",)
        return out

    # -- repair ------------------------------------------------------------------------------------
    def _repair(self, sides: Sides, version: int, found: dict) -> int:
        """Re-send the keys found wrong as of `version`: their Delta rows (missing, differing) and
        tombstones (extra), at the repair version of `version` so any later change still wins."""
        from cdc2ch.clickhouse.writers.driver import InsertInto, insert_rows

        live = [k for k, (kind, _) in found.items() if kind != "extra"]
        gone = [k for k, (kind, _) in found.items() if kind == "extra"]
        commit = self.source.commit(version)
        ts_ms = commit.timestamp_ms if commit is not None else int(time.time() * 1000)
        written = 0
        if live:
            rows = self._with_keys(self._delta(version), sides, live)
            table = contract.spark_snapshot_rows(rows, version, ts_ms, contract.REPAIR).toArrow()
            token = lambda i, batch: contract.repair_token(self.cfg.pipeline, version, batch)  # noqa: E731
            into = InsertInto(self.sink, self.table_sql, self.log)
            written += insert_rows(into, table, self.cfg, "verify --repair", token)[0]
        if gone:
            cols = ", ".join(schema.quote(f["name"]) for f in sides.fields)
            meta = contract.sql_fixed_meta(version, ts_ms, contract.REPAIR_DELETE)
            for chunk in _chunks(sorted(gone)):
                self.sink.command(
                    f"INSERT INTO {self.table_sql} ({cols}, {', '.join(contract.WRITTEN_META)}) SELECT {cols}, "
                    f"{', '.join(meta)} FROM {self._live()} AND {sides.key(CLICKHOUSE)} IN ({_ch_list(chunk)})",
                    what="tombstone keys the Delta table does not have",
                )
            written += len(gone)
        self.log.info("verify_repaired", version=version, rows=written, live=len(live), tombstones=len(gone))
        return len(found)


def _compare(delta: dict, target: dict, version: int) -> tuple[dict, set]:
    """Differences of one group of keys: ({key text: (kind, key)}, key texts whose target row is newer)."""
    found, newer = {}, set()
    for k in set(delta) | set(target):
        d, t = delta.get(k), target.get(k)
        if t is not None and t[1] > version:
            newer.add(k)
            continue
        live = t is not None and not t[2]
        if d is not None and not live:
            found[k] = ("missing", d[1])
        elif d is None and t is not None and live:
            found[k] = ("extra", t[3])
        elif d is not None and t is not None and live and d[0] != t[0]:
            found[k] = ("differing", d[1])
    return found, newer


def _ch_list(texts) -> str:
    return ", ".join(contract.sql_literal(t) for t in texts)


def _chunks(items: list, size: int = 2_000):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _show(value):
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def check_target(sink: Sink, cfg: RunConfig) -> None:
    if not sink.table_exists(cfg.target):
        raise SourceError(
            f"The target table {cfg.target} does not exist, so there is nothing to verify. Run `cdc2ch run "
            f"--once` (or `cdc2ch snapshot`) for pipeline {cfg.pipeline!r} first."
        )


def render(reports: list[Report], repair: bool) -> str:
    """The console summary: one line per pipeline, then a table of sample differences where there are any."""
    from cdc2ch.commands.status import aligned

    lines = []
    for r in reports:
        head = f"{r.pipeline} ({r.target}): {r.summary()}"
        extra = (
            [f"{r.changing} keys changed while verifying (compared at a newer version)"] if r.changing else []
        )
        if repair:
            extra.append(f"repaired {r.repaired} keys")
        lines.append(head + (f"; {'; '.join(extra)}" if extra else "") + f" in {r.seconds:.1f}s")
        if r.sample:
            rows = [
                [d.kind, ", ".join(f"{k}={v}" for k, v in d.key.items()), ", ".join(d.columns)]
                for d in r.sample
            ]
            lines += ["  " + line for line in aligned(["KIND", "KEY", "COLUMNS"], rows)]
    return "\n".join(lines)
