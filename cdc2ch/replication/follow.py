"""Which renames and drops `--on-schema-change follow` makes in place: the source's schemas compared by field
id (model/renames.py), and a rename or drop of a key column refused before anything is written."""

from __future__ import annotations

from typing import Any

from cdc2ch.model import renames, schema
from cdc2ch.model.changeset import Commit
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.model.schema import SchemaDiff
from cdc2ch.replication import plan
from cdc2ch.replication.ports import ChangeSource, TargetTables


def target_moves(
    cfg: RunConfig, source: ChangeSource, commit: Commit | None, state: PipelineState
) -> renames.TargetMoves | None:
    """The renames and drops of `commit` (a schema change) as the target makes them; a rename or drop of a
    key column is refused. None: nothing to follow (another --on-schema-change, or no column mapping)."""
    if cfg.on_schema_change != "follow" or commit is None or commit.version < 1:
        return None
    before, after = (source.mapped_schema(v) for v in (commit.version - 1, commit.version))
    moves = renames.column_moves(before, after)
    if moves is None:
        return None
    where = f"{source.uri} at version {commit.version} ({plan.describe(commit)})"
    renames.check_keys(moves, cfg.design, where, state.committed_version, str(cfg.target))
    return renames.in_target(moves, cfg.design)


def prepare(
    tables: TargetTables,
    cfg: RunConfig,
    source: ChangeSource,
    commit: Commit | None,
    state: PipelineState,
    schema_json: dict[str, Any],
) -> SchemaDiff:
    """The target made ready for a range's rows of `schema_json`: its renames and drops first (`commit`, a
    schema change the range begins at; a renamed key refused in a paragraph), then the columns' types."""
    moves = target_moves(cfg, source, commit, state) if commit is not None else None
    return tables.prepare(schema.column_types(schema_json, cfg.design), moves=moves)


def check_key_moves(cfg: RunConfig, source: ChangeSource, committed: int, latest: int) -> None:
    """At start: refuse a key column Delta renamed or dropped after `committed` in the same paragraph (the
    loop would stop at its version; the checks of the latest schema would not say why)."""
    if cfg.on_schema_change != "follow" or not 0 <= committed < latest:
        return
    moves = renames.column_moves(source.mapped_schema(committed), source.mapped_schema(latest))
    if moves is not None:
        renames.check_keys(
            moves, cfg.design, f"{source.uri} after version {committed}", committed, str(cfg.target)
        )
