"""The soak's writer: one commit at a time to tables of several kinds, chosen by a seeded generator, by
delta-rs and, for some commits, by Spark (its UPDATE, DELETE and MERGE write change files of their own).

Each table keeps its live keys in memory (this process is its only writer), so every operation names keys
that exist (updates, deletes, re-inserts, key moves) or that do not (appends).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

CDF = {"delta.enableChangeDataFeed": "true"}
TEXTS = ["plain", "naïve café", "日本語のテキスト", "emoji 🚀✨", "quote ' and \" and \\", "", "tab\tnew\nline",
         "Ελληνικά", "x" * 300, None, None]  # fmt: skip
GROUPS = ["north", "south", "east", "west"]
SPARK_TABLES = ("ints", "composite", "texts")  # some of their commits are Spark's
TENANTS = ["acme", "globex", "west coast", "o'hara"]


def sql(value) -> str:
    """A literal as delta-rs's SQL (DataFusion) reads it: quotes doubled, backslashes as they are."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def spark_sql(value) -> str:
    """A literal as Spark SQL reads it: backslash escapes."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return sql(value)


class Writer:
    def __init__(self, lake: Path, rng: random.Random, spark_share: float = 0.0):
        self.lake, self.rng, self.spark_share = lake, rng, spark_share
        self._spark = None
        # Spark starts beside the first delta-rs commits: started at the first Spark commit instead, its JVM
        # held every table still for as long as it took to start, on a loaded machine minutes.
        self._starting = threading.Thread(target=self._start_spark, daemon=True) if spark_share > 0 else None
        if self._starting is not None:
            self._starting.start()
        self.live: dict[str, set] = {}  # table -> live keys
        self.next_id: dict[str, int] = {}
        self.grown = False

    # -- rows of each kind --------------------------------------------------------------------------
    def _rows(self, name: str, keys: list) -> pa.Table:
        r = self.rng
        if name == "composite":
            return pa.table({"tenant": [k[0] for k in keys], "n": pa.array([k[1] for k in keys], pa.int64()),
                             "amount": [round(r.uniform(-1e6, 1e6), 2) for _ in keys]})  # fmt: skip
        ids = pa.array([k[0] for k in keys], pa.int64())
        if name == "texts":
            return pa.table({"id": ids, "txt": pa.array([r.choice(TEXTS) for _ in keys], pa.string()),
                             "note": pa.array([r.choice(TEXTS) for _ in keys], pa.string())})  # fmt: skip
        if name == "moving":
            return pa.table({"id": ids, "grp": [r.choice(GROUPS) for _ in keys],
                             "val": pa.array([r.randrange(10**6) for _ in keys], pa.int64())})  # fmt: skip
        columns = {"id": ids, "v": pa.array([r.randrange(10**6) for _ in keys], pa.int64())}
        if name == "ints":
            columns["s"] = pa.array([f"s{r.randrange(1000)}" for _ in keys], pa.string())
        if name == "growing" and self.grown:
            columns["extra"] = pa.array([r.choice(TEXTS) for _ in keys], pa.string())
        return pa.table(columns)

    def _new_keys(self, name: str, count: int) -> list:
        keys = []
        for _ in range(count):
            n = self.next_id.get(name, 0)
            self.next_id[name] = n + 1
            keys.append((self.rng.choice(TENANTS), n) if name == "composite" else (n,))
        return keys

    def _predicate(self, name: str, keys: list, literal=sql) -> str:
        if name == "composite":
            return " OR ".join(f"(tenant = {literal(t)} AND n = {n})" for t, n in keys)
        return f"id IN ({', '.join(str(k[0]) for k in keys)})"

    def _some(self, name: str, most: int) -> list:
        live = sorted(self.live[name])
        return self.rng.sample(live, min(len(live), self.rng.randint(1, most))) if live else []

    # -- operations ---------------------------------------------------------------------------------
    def create(self, name: str) -> dict:
        keys = self._new_keys(name, self.rng.randint(20, 60))
        write_deltalake(str(self.lake / name), self._rows(name, keys), configuration=CDF)
        self.live[name] = set(keys)
        return self._entry(name, "create")

    def grow(self, name: str) -> dict:
        """The table gains a column: an append whose rows carry it (schema merge)."""
        self.grown = True
        keys = self._new_keys(name, 3)
        write_deltalake(str(self.lake / name), self._rows(name, keys), mode="append", schema_mode="merge")
        self.live[name] |= set(keys)
        return self._entry(name, "add_column")

    def step(self, name: str) -> dict:
        ops = ["append", "update", "update", "delete", "merge", "merge", "reinsert", "optimize"]
        if name == "moving":
            ops += ["rekey", "rekey", "regroup", "regroup"]
        op = self.rng.choice(ops)
        if not self.live[name] and op != "append":
            op = "append"
        if name in SPARK_TABLES and self.live[name] and self.rng.random() < self.spark_share:
            return self._spark_step(name)
        path, dt = str(self.lake / name), DeltaTable(str(self.lake / name))
        if op == "append":
            keys = self._new_keys(name, self.rng.randint(1, 8))
            write_deltalake(path, self._rows(name, keys), mode="append")
            self.live[name] |= set(keys)
        elif op == "update":
            keys = self._some(name, 3)
            dt.update(updates=self._changes(name), predicate=self._predicate(name, keys))
        elif op == "delete":
            keys = self._some(name, 3)
            dt.delete(self._predicate(name, keys))
            self.live[name] -= set(keys)
        elif op == "reinsert":  # the same keys removed and written again, in one commit
            keys = self._some(name, 2)
            write_deltalake(
                path, self._rows(name, keys), mode="overwrite", predicate=self._predicate(name, keys)
            )
        elif op == "merge":  # matched: some deleted, the rest updated; not matched: inserted
            old, new = self._some(name, 3), self._new_keys(name, self.rng.randint(0, 3))
            gone = set(old[: self.rng.randint(0, len(old))])
            source = self._rows(name, old + new)
            flags = pa.array([k in gone for k in old + new])
            source = source.append_column("_drop", flags)
            on = " AND ".join(f"t.{c} = s.{c}" for c in (["tenant", "n"] if name == "composite" else ["id"]))
            columns = [c for c in source.column_names if c != "_drop"]
            (
                dt.merge(source, on, source_alias="s", target_alias="t", merge_schema=False)
                .when_matched_delete(predicate="s._drop")
                .when_matched_update(updates={c: f"s.{c}" for c in columns})
                .when_not_matched_insert(updates={c: f"s.{c}" for c in columns})
                .execute()
            )
            self.live[name] = (self.live[name] - gone) | set(new)
        elif op == "rekey":  # an UPDATE of the key column itself
            (key,) = self._some(name, 1)
            (new,) = self._new_keys(name, 1)
            dt.update(updates={"id": str(new[0])}, predicate=f"id = {key[0]}")
            self.live[name] = (self.live[name] - {key}) | {new}
        elif op == "regroup":  # an UPDATE of a sorting-key column: the row moves to another identity
            keys = self._some(name, 2)
            dt.update(updates={"grp": sql(self.rng.choice(GROUPS))}, predicate=self._predicate(name, keys))
        elif op == "optimize":
            dt.optimize.compact()
        return self._entry(name, op)

    def _start_spark(self) -> None:
        from cdc2ch.model.config import SparkSettings
        from cdc2ch.source.spark.session import session

        self._spark = session(SparkSettings(master="local[1]"))

    def _spark_step(self, name: str) -> dict:
        """An UPDATE, DELETE or MERGE through Spark SQL."""
        if self._starting is not None:
            self._starting.join()
        if self._spark is None:
            self._start_spark()
        path, op = self.lake / name, self.rng.choice(["update", "delete", "merge"])
        keys = self._some(name, 3)
        where = self._predicate(name, keys, spark_sql)
        if op == "update":
            sets = ", ".join(f"{c} = {v}" for c, v in self._changes(name, spark_sql).items())
            self._spark.sql(f"UPDATE delta.`{path}` SET {sets} WHERE {where}")
        elif op == "delete":
            self._spark.sql(f"DELETE FROM delta.`{path}` WHERE {where}")
            self.live[name] -= set(keys)
        else:  # matched: updated; not matched: inserted
            new = self._new_keys(name, self.rng.randint(1, 3))
            self._spark.createDataFrame(self._rows(name, keys + new).to_pandas()).createOrReplaceTempView(
                "src"
            )
            on = " AND ".join(f"t.{c} = s.{c}" for c in (["tenant", "n"] if name == "composite" else ["id"]))
            self._spark.sql(
                f"MERGE INTO delta.`{path}` t USING src s ON {on} "
                f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            )
            self.live[name] |= set(new)
        return self._entry(name, f"spark_{op}")

    def _changes(self, name: str, literal=sql) -> dict[str, str]:
        r = self.rng
        if name == "composite":
            return {"amount": "amount + 1.5"}
        if name == "texts":
            return {"txt": literal(r.choice(TEXTS)), "note": literal(r.choice(TEXTS))}
        if name == "moving":
            return {"val": "val + 1"}
        changes = {"v": "v + 1"}
        if name == "growing" and self.grown:
            changes["extra"] = literal(r.choice(TEXTS))
        return changes

    def _entry(self, name: str, op: str) -> dict:
        return {
            "table": name,
            "version": DeltaTable(str(self.lake / name)).version(),
            "t": time.time(),
            "op": op,
        }
