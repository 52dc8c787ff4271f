"""Which columns identify a row in a target table: its sorting key and the columns its partition expression
reads (docs/design.md, "Row identity"), and the rule that a sorting key holds the primary key.

ReplacingMergeTree collapses the rows whose whole sorting key is equal, within one partition. Every place
that collapses, ranks, leaves out or counts rows per key takes this value, so none decides identity for
itself. The partition expression is represented by the columns it reads, which is finer than its value
(two rows of one month are one ClickHouse identity, two here): where cdc2ch leaves out an outranked row
that is the safe side (it writes a row ClickHouse would collapse anyway, never leaves out one it keeps).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cdc2ch.base.errors import ConfigError

# Words of a ClickHouse expression that are never column names.
_KEYWORDS = frozenset(
    "and or not in is null like ilike between case when then else end as cast true false".split()
)
_INTERVAL = re.compile(r"\bINTERVAL\s+[-+]?\w+\s+[A-Za-z]+", re.IGNORECASE)  # INTERVAL 1 DAY: no column
_TOKEN = re.compile(
    r"`((?:[^`\\]|\\.)*)`|'(?:[^'\\]|\\.)*'|\"((?:[^\"\\]|\\.)*)\"|([A-Za-z_][A-Za-z0-9_]*)(\s*\()?"
)


def expression_columns(expression: str | None) -> tuple[str, ...]:
    """The names a ClickHouse expression reads as columns, in order of appearance: quoted identifiers and bare
    words that are neither functions (followed by `(`), keywords nor inside string literals."""
    found: list[str] = []
    for m in _TOKEN.finditer(_INTERVAL.sub(" ", expression or "")):
        quoted = m.group(1) if m.group(1) is not None else m.group(2)
        if quoted is not None:
            name = re.sub(r"\\(.)", r"\1", quoted)
        elif m.group(3) and not m.group(4) and m.group(3).lower() not in _KEYWORDS:
            name = m.group(3)
        else:
            continue
        if name not in found:
            found.append(name)
    return tuple(found)


@dataclass(frozen=True)
class Identity:
    """A target row's identity, in target column names."""

    primary_key: tuple[str, ...]  # the user's key: never null, never Nullable
    order_by: tuple[str, ...]  # the sorting key: the primary key and any columns ahead of or after it
    partition_columns: tuple[str, ...] = ()  # what the partition expression reads

    def __post_init__(self) -> None:
        missing = [k for k in self.primary_key if k not in self.order_by]
        if missing:
            raise ConfigError(
                f"The sorting key ({', '.join(self.order_by)}) does not hold primary-key column(s) "
                f"{', '.join(missing)}. ReplacingMergeTree keeps one row per sorting key, so a sorting key "
                f"without the whole primary key would merge different rows into one. Add "
                f"{', '.join(missing)} to --order-by (anywhere in it), or leave --order-by out to sort by the "
                f"primary key."
            )
        if len(set(self.order_by)) != len(self.order_by):
            raise ConfigError(f"--order-by {','.join(self.order_by)} names a column twice.")

    @classmethod
    def of(
        cls, primary_key: Sequence[str], order_by: Sequence[str] = (), partition_by: str | None = None
    ) -> "Identity":
        return cls(tuple(primary_key), tuple(order_by or primary_key), expression_columns(partition_by))

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column that takes part in a row's identity: the sorting key, then the partition columns."""
        return self.order_by + tuple(c for c in self.partition_columns if c not in self.order_by)

    @property
    def sorting_extra(self) -> tuple[str, ...]:
        """Identity columns that are not primary-key columns (they may hold nulls)."""
        return tuple(c for c in self.columns if c not in self.primary_key)

    def moves(self) -> bool:
        """Whether an update that keeps the primary key can move a row to another identity."""
        return bool(self.sorting_extra)
