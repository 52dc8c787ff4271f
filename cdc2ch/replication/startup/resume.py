"""When a pipeline with a stored offset is claimed, and where it resumes once this runner holds it: the offset
as stored (recording how the table was reached this time), or, with --reset, moved to just before the start
version. A --once poll with nothing to write claims nothing: a claim is two writes and, against a server, a
pause in which a rival claiming at the same instant shows up, on every cron poll of every table."""

from __future__ import annotations

from cdc2ch.base.log import Logger
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.replication import plan
from cdc2ch.replication.fullload.resync import Resync
from cdc2ch.replication.ports import ChangeSource, OffsetStore
from cdc2ch.replication.startup.inputs import Inputs


def nothing_to_write(cfg: RunConfig, inputs: Inputs, source: ChangeSource, resync: Resync) -> bool:
    """Whether a --once poll of a pipeline with an offset has nothing to write: no version after its offset,
    no range left half-written, no --reset, the table reached as recorded, nothing a crash left mid-resync."""
    stored = inputs.stored
    return (
        cfg.once
        and stored is not None
        and not cfg.reset
        and stored.interrupted_range is None
        and stored.committed_version >= inputs.latest
        and stored.relabelled(source.uri, source.location, inputs.table_id) == stored
        and not resync.leftover(stored)
    )


def resumed(
    cfg: RunConfig, source: ChangeSource, store: OffsetStore, start: int, table_id: str, log: Logger
) -> PipelineState:
    """The pipeline's offset, read again now that nobody else can move it: as stored, or with `cfg.reset`
    moved to before `start`, and saved as such."""
    stored = store.load(cfg.pipeline)
    store.ensure()
    if stored is not None and not cfg.reset:
        return _relabelled(stored, source, store, table_id, log)
    if stored is not None:
        log.warning("state_reset", was=stored.committed_version, now=start - 1)
    fresh = plan.state_pointed_at(
        stored,
        cfg.pipeline,
        source.uri,
        str(cfg.target),
        start - 1,
        location=source.location,
        table_id=table_id,
    )
    store.save(fresh)
    return fresh


def _relabelled(
    stored: PipelineState, source: ChangeSource, store: OffsetStore, table_id: str, log: Logger
) -> PipelineState:
    """The stored offset, recording the name, location and table id the table was reached by this time
    (a path now named through the catalog, or a state from before these were recorded)."""
    state = stored.relabelled(source.uri, source.location, table_id)
    if state != stored:
        store.save(state)
        log.info("source_recorded", source=state.source, location=state.location, was=stored.source)
    return state
