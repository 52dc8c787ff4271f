"""Where a pipeline named on the command line is: the target its records in ClickHouse name (its offset or
its health), for the commands that act on one pipeline by name (`compact`, `pause`, `resume`, `resync`).
The lookup and its refusals are written here once."""

from __future__ import annotations

from collections.abc import Collection

from cdc2ch.base.errors import ConfigError
from cdc2ch.clickhouse.connection.transport import Sink
from cdc2ch.clickhouse.state.statestore import (
    HEALTH_TABLE,
    STATE_TABLE,
    HealthStore,
    StateStore,
    state_tables,
)
from cdc2ch.model.config import TargetName


def target_of(
    sink: Sink, pipeline: str, within: Collection[str] | None = None, known: TargetName | None = None
) -> TargetName:
    """The target of the pipeline of that name, from its records in the databases `within` (None: any).
    `known`: its target as a config file names it, or the service running it: a pipeline that has no record
    yet (it has not committed anything) is there."""
    return one_target(pipeline, recorded_targets(sink, pipeline, within), sink.display, known)


def recorded_targets(sink: Sink, pipeline: str, within: Collection[str] | None) -> list[TargetName]:
    """The target of the pipeline's records in each database `within` (None: any) that holds some."""
    found = []
    for db, tables in state_tables(sink, within).items():
        targets = []
        if STATE_TABLE in tables:
            targets += [
                s.target for s in StateStore(sink, db).load_all(tables[STATE_TABLE]) if s.pipeline == pipeline
            ]
        if HEALTH_TABLE in tables:
            health = HealthStore(sink, db).load_all(exists=True).get(pipeline)
            targets += [health.target] if health is not None else []
        if targets:
            found.append(TargetName.parse(targets[0]))
    return found


def one_target(
    pipeline: str, found: list[TargetName], where: str, known: TargetName | None = None
) -> TargetName:
    """The one of `found` (the targets of the pipeline's records, one per database), that of the database
    `known` names, or `known` itself when there is none; the refusal naming what to do otherwise. `where`:
    the ClickHouse they were looked for in."""
    if known is not None:
        found = [t for t in found if t.database == known.database] or [known]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConfigError(
            f"No pipeline named {pipeline!r} has a record in ClickHouse at {where} (a pipeline has one "
            f"from its first run). `cdc2ch status` lists the pipelines there by name. Nothing was changed."
        )
    raise ConfigError(
        f"Pipelines named {pipeline!r} have records in several databases of ClickHouse at {where}: "
        f"{', '.join(t.database for t in found)}. Add --target with the database.table of the one you mean "
        f"(`cdc2ch status` shows each pipeline's target). Nothing was changed."
    )
