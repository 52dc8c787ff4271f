"""What a pipeline starts from: its table, keys, change feed, stored offset and options checked against each
other, writing nothing (what `run` checks first and `validate` reports)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cdc2ch.base.log import Logger
from cdc2ch.model import schema
from cdc2ch.model.changeset import FEED, LOG
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.replication import follow, plan, readers
from cdc2ch.replication.ports import ChangeSource, Ports
from cdc2ch.replication.startup.bootstrap import Bootstrap
from cdc2ch.replication.startup.initial import Choice


@dataclass(frozen=True)
class Inputs:
    """What the checks of `run` found (and `validate` reports)."""

    start: int  # the first version to replicate
    stored: PipelineState | None
    latest: int
    writer: str
    table_id: str = ""  # the Delta table's id, recorded with the offset
    initial: Choice | None = None  # how a new pipeline begins (None: it has an offset)
    reader: readers.ReaderChoice | None = None  # what `--reader auto` chose, and why (None: a reader given)


def check_inputs(
    cfg: RunConfig, source: ChangeSource, ports: Ports, bootstrap: Bootstrap, log: Logger | None = None
) -> Inputs:
    """Check table, keys, change data feed, offsets and options, writing nothing (what `validate` runs).
    `--reader auto` is decided here (logged to `log`), from the table as it is now, once a key column Delta
    renamed since the offset has been told: the choice reads the latest schema."""
    uri = source.uri
    latest = source.latest().version
    if cfg.changes_from == LOG and not source.derives:
        raise plan.cannot_derive_error(uri)
    if (cfg.changes_from == FEED or not source.derives) and not source.cdf_enabled():
        raise plan.cdf_disabled_error(uri)
    requested = source.version_at(cfg.from_timestamp) if cfg.from_timestamp else cfg.from_version
    stored = ports.store.load(cfg.pipeline)
    if stored is None:  # a new pipeline: its target must not be another pipeline's
        plan.check_owner(cfg.pipeline, str(cfg.target), ports.store.load_all())
    table_id = source.table_id()
    start = plan.start_version(
        uri, str(cfg.target), stored, requested, latest, cfg.reset, source.location, table_id
    )  # fmt: skip
    if stored is not None:  # before the key is looked for in the latest schema
        follow.check_key_moves(cfg, source, stored.committed_version, latest)
    chosen = None
    if cfg.reader == "auto":
        chosen = readers.decided(cfg, source, ports.remote_target, ports.lake_reader, log, latest)
        cfg = dataclasses.replace(cfg, reader=chosen.reader)
    latest_schema = source.schema_at(latest)
    ports.tables.check(  # an existing target fits the design (a new pipeline's: the types too)
        schema.column_types(latest_schema, cfg.design), new=stored is None
    )
    writer = plan.choose_writer(cfg.reader, cfg.writer, ports.remote_target, ports.local_master)
    if writer == "clickhouse":  # refuse what ClickHouse cannot read, before any write
        outcome = (
            f"replication stopped with version {stored.committed_version} committed"
            if stored
            else "nothing was written"
        )
        protocol, properties = source.protocol(), source.properties()
        # Ranges from the log read files at a version, which older servers do too; the feed needs a setting.
        feed = cfg.changes_from == FEED or (cfg.changes_from != LOG and source.cdf_enabled())
        readers.check_clickhouse_reads(
            source, ports.lake_reader, latest_schema, protocol, properties, feed=feed, outcome=outcome
        )
    initial = bootstrap.choose(stored, requested, start, latest)  # a new pipeline's first load
    return Inputs(start, stored, latest, writer, table_id, initial, chosen)
