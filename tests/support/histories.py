"""Generated Delta histories written by delta-rs: the operations a history is made of, drawn by Hypothesis, and
their application to a table (one commit each, with a Change Data Feed or without one: replicated from its
log), keeping primary keys unique. They stay
within what both readers read (docs/guides/run.md, limits of `--reader clickhouse`): long and string columns, no
VARIANT,
no timestamps; delta-rs writes no deletion vectors and no column mapping."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from hypothesis import strategies as st

KEYS = 20  # ids 0..19: few keys, so operations meet the same rows again
MAX_ADDED_COLUMNS = 2
CDF = {"delta.enableChangeDataFeed": "true"}

keys = st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=5)
operations = st.one_of(
    st.tuples(st.just("insert"), keys),
    st.tuples(st.just("update"), keys, st.booleans()),  # bool: also move the rows to another group
    st.tuples(st.just("delete"), keys),
    st.tuples(
        st.just("delete_group"), st.integers(0, 2)
    ),  # a partition's files removed whole where partitioned
    # upserted keys, keys the MERGE deletes, and whether it deletes the rows of a group missing from its source
    st.tuples(st.just("merge"), keys, keys, st.booleans()),
    st.tuples(
        st.just("rekey"),
        st.lists(st.tuples(st.integers(0, KEYS - 1), st.integers(0, KEYS - 1)), min_size=1, max_size=3),
        st.booleans(),  # also move the rows to another group
    ),
    st.tuples(st.just("replace"), keys),  # delete and re-insert these keys in one commit (replaceWhere)
    # the whole table replaced: kept keys deleted and re-inserted; no keys: every row deleted
    st.tuples(st.just("overwrite"), st.lists(st.integers(0, KEYS - 1), max_size=5)),
    st.tuples(st.just("add_column"), st.booleans()),  # bool: by an append that merges its schema, else ALTER
    st.tuples(st.just("checkpoints")),  # a metadata-only commit: table property delta.checkpointInterval = 2
    st.tuples(st.just("optimize")),
)


@dataclass
class Layout:
    """How the Delta table is laid out and how the ClickHouse target is designed."""

    delta_partitioned: bool  # Delta PARTITIONED BY grp
    sorted_by_group: bool  # target ORDER BY grp,id PARTITION BY grp: an update of grp moves the row
    feed: bool = True  # the table records a change data feed (else its changes are derived from its log)

    def options(self) -> tuple[str, ...]:
        return ("--order-by", "grp,id", "--partition-by", "grp") if self.sorted_by_group else ()


layouts = st.builds(Layout, st.booleans(), st.booleans(), st.booleans())


@dataclass
class History:
    """A delta-rs table being written (Spark, an independent reader, checks the rows)."""

    path: str
    layout: Layout
    extra: list[str] = field(default_factory=list)  # columns added so far
    step: int = 0
    present: set[int] = field(default_factory=set)  # the keys before the operation being applied

    def create(self, first: list[int]) -> None:
        from deltalake import write_deltalake

        ids = sorted(set(first))
        part = ["grp"] if self.layout.delta_partitioned else None
        write_deltalake(
            self.path, self._rows(ids), partition_by=part, configuration=CDF if self.layout.feed else None
        )

    def _rows(self, ids: list[int], moved: bool = False) -> pa.Table:
        cols = {
            "id": pa.array(ids, pa.int64()),
            "grp": pa.array([(i + self.step * moved) % 3 for i in ids], pa.int64()),
            "name": pa.array([f"ñ{i}·{self.step}" if i % 4 else None for i in ids], pa.string()),
            "v": pa.array([self.step] * len(ids), pa.int64()),
        }
        for c in self.extra:
            cols[c] = pa.array([self.step * 10 + i for i in ids], pa.int64())
        return pa.table(cols)

    def apply(self, op: tuple) -> str | None:
        """One commit for `op` as far as it is valid for the keys present; what it did, or None (no commit)."""
        from deltalake import DeltaTable, write_deltalake
        from deltalake.schema import Field

        self.step += 1
        kind, *args = op
        table = DeltaTable(self.path)
        self.present = set(table.to_pyarrow_table(columns=["id"])["id"].to_pylist())
        if kind == "insert":
            new = sorted(set(args[0]) - self.present)
            if not new:
                return None
            write_deltalake(table, self._rows(new), mode="append")
        elif kind == "update":
            hit = self._pick(args[0])
            if not hit:
                return None
            updates = {"v": f"v + {self.step}", "name": f"'u{self.step}'"}
            if args[1]:
                updates["grp"] = "(grp + 1) % 3"
            table.update(updates=updates, predicate=_in(hit))
        elif kind == "delete":
            hit = self._pick(args[0])
            if not hit:
                return None
            table.delete(_in(hit))
        elif kind == "delete_group":
            if not table.delete(f"grp = {args[0]}")["num_removed_files"]:
                return None
        elif kind == "merge":
            upsert, drop = set(args[0]), set(args[1]) - set(args[0])
            ids = sorted(upsert | drop)
            source = self._rows(ids, moved=True).append_column("d", pa.array([i in drop for i in ids]))
            sets = {c: f"s.{c}" for c in source.column_names if c not in ("id", "d")}
            merge = (
                table.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_delete("s.d")
                .when_matched_update(sets)
                .when_not_matched_insert({"id": "s.id", **sets}, "NOT s.d")
            )
            if args[2]:
                merge = merge.when_not_matched_by_source_delete(f"t.grp = {self.step % 3}")
            merge.execute()
        elif kind == "rekey":
            moves = _injective([(self._pick([a])[0], b) for a, b in args[0] if self.present], self.present)
            if not moves:
                return None
            case = " ".join(f"WHEN id = {a} THEN {b}" for a, b in moves.items())
            updates = {"id": f"CASE {case} END", **({"grp": "(grp + 1) % 3"} if args[1] else {})}
            table.update(updates=updates, predicate=_in(sorted(moves)))
        elif kind == "replace":
            ids = sorted(set(args[0]))
            write_deltalake(table, self._rows(ids), mode="overwrite", predicate=_in(ids))
        elif kind == "overwrite":
            ids = sorted(set(args[0]))
            write_deltalake(table, self._rows(ids), mode="overwrite")
        elif kind == "add_column":
            if len(self.extra) >= MAX_ADDED_COLUMNS:
                return None
            self.extra.append(f"größe{len(self.extra) + 1}" if args[0] else f"c{len(self.extra) + 1}")
            if args[0]:
                new = min(set(range(2 * KEYS)) - self.present)
                write_deltalake(table, self._rows([new]), mode="append", schema_mode="merge")
            else:
                table.alter.add_columns(Field(self.extra[-1], "long", nullable=True))
        elif kind == "checkpoints":
            table.alter.set_table_properties({"delta.checkpointInterval": "2"})
        elif kind == "optimize":
            if not table.optimize.compact()["numFilesRemoved"]:
                return None
        return kind

    def _pick(self, indexes: list[int]) -> list[int]:
        """Keys present, chosen by position (so that drawn operations mostly meet rows)."""
        present = sorted(self.present)
        return sorted({present[i % len(present)] for i in indexes}) if present else []

    def version(self) -> int:
        from deltalake import DeltaTable

        return DeltaTable(self.path).version()


def _in(ids: list[int]) -> str:
    return f"id IN ({', '.join(map(str, ids))})"


def _injective(pairs: list[tuple[int, int]], present: set[int]) -> dict[int, int]:
    """The key changes of `pairs` (a -> b) that keep keys unique: swaps and moves to free keys."""
    moves: dict[int, int] = {}
    for a, b in pairs:
        if a not in present or a in moves or a == b:
            continue
        trial = {**moves, a: b}
        if len({trial.get(k, k) for k in present}) == len(present):
            moves = trial
    return moves
