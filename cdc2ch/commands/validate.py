"""`cdc2ch validate`: every check `run` makes before writing, for each pipeline, and nothing written; and a
warning when the Delta table holds a primary-key value more than once."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import dataclass

from cdc2ch.base.errors import Cdc2chError
from cdc2ch.clickhouse.connection import embedded
from cdc2ch.clickhouse.connection.dsn import connect
from cdc2ch.model.changeset import records_feed
from cdc2ch.model.config import RunConfig
from cdc2ch.replication import plan
from cdc2ch.replication.projection import designed_source
from cdc2ch.replication.startup import initial
from cdc2ch.source import open_source


@dataclass(frozen=True)
class Finding:
    subject: str  # "ClickHouse" or a pipeline name
    ok: bool
    detail: str
    warning: bool = False  # ok, but the user should know (run goes ahead)

    @property
    def verdict(self) -> str:
        return "FAIL" if not self.ok else "WARN" if self.warning else "ok"


def duplicates_finding(cfg: RunConfig, version: int, found: tuple[int, int, dict]) -> Finding:
    keys, rows, example = found
    shown = ", ".join(f"{k}={v}" for k, v in example.items())
    identity = cfg.identity
    what = "primary-key" if identity.columns == identity.primary_key else "sorting-key and partition"
    return Finding(
        cfg.pipeline,
        True,
        f"{cfg.table} at version {version} holds {rows} rows for {keys} {what} value(s) of "
        f"{','.join(identity.columns)} (e.g. {shown}); ClickHouse keeps one row per key, so {cfg.target} will "
        f"have {rows - keys} fewer rows than the Delta table. Choose a --primary-key that identifies a row.",
        warning=True,
    )


def initial_text(choice: initial.Choice | None) -> str:
    """How a new pipeline begins, as validate lists it: whether an initial load (a snapshot) is needed, and
    why; "" for a pipeline that has an offset."""
    if choice is None:
        return ""
    if choice.load == initial.SNAPSHOT:
        what = f"initial load needed: a snapshot of version {choice.version}, then the changes"
    else:
        what = f"no initial load: the changes from version {choice.version}"
    return f"; {what}, because {choice.reason}"


def _design_text(cfg: RunConfig) -> str:
    """The design choices that differ from the defaults, as validate lists them."""
    shown = cfg.design.describe()
    return "".join(f", {k.replace('_', ' ')} {_shown(v)}" for k, v in shown.items())


def _shown(value) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return ",".join(value) if isinstance(value, list) else str(value)


def _duplicates(source, cfg: RunConfig, version: int):
    """The duplicate keys of the table (a Spark aggregate), as duplicate_keys gives them; without Java, the
    warning that they went unchecked."""
    from cdc2ch.source.spark.lazysession import JavaMissing

    try:
        return source.duplicate_keys(cfg.identity.columns, version)
    except JavaMissing as exc:
        return Finding(cfg.pipeline, True, f"duplicate keys not checked: {exc}", warning=True)


def check(configs: list[RunConfig], spark) -> list[Finding]:
    """ClickHouse reachable, then each pipeline's table, keys, change data feed, offset and options."""
    from cdc2ch.replication.pipeline import Replicator, fed_versions

    dsn = configs[0].clickhouse_dsn
    findings: list[Finding] = []
    with ExitStack() as stack:
        target = dsn
        if dsn.startswith("chdb:") and not embedded.data_path(dsn).exists():
            # Opening an embedded database creates it; an empty one in a scratch directory answers the same.
            target = f"chdb://{stack.enter_context(tempfile.TemporaryDirectory(prefix='cdc2ch-validate-'))}"
            note = f"embedded database {embedded.data_path(dsn)} does not exist yet; `run` creates it"
        try:
            sink = stack.enter_context(connect(target, retries=1, cluster=configs[0].cluster))
            version = sink.query_rows("SELECT version()", what="ask ClickHouse its version")[0][0]
            if target == dsn:
                note = f"reachable, ClickHouse {version}"
            findings.append(Finding("ClickHouse", True, note))
        except Cdc2chError as exc:
            return [Finding("ClickHouse", False, str(exc))]
        for cfg in configs:
            try:
                # a catalog name is resolved here; the rows as the target's design sees them
                source = designed_source(open_source(spark, cfg.table), cfg.design)
                job = Replicator(cfg, source, sink)
                inputs = job.check_inputs()
                chosen = f", reader {job.choice.reader} (auto: {job.choice.reason})" if job.choice else ""
                snapshot = inputs.initial is not None and inputs.initial.load == initial.SNAPSHOT
                commits = []
                if not snapshot:  # the commits `run` checks before its first read (a snapshot replays none)
                    commits = source.commits(inputs.start, inputs.latest)
                    plan.check_commits(inputs.start, commits, source.uri, cfg)
                origins = plan.origins_text(
                    cfg.changes_from,
                    fed_versions(cfg, source, inputs.start, commits),
                    inputs.latest + 1 if snapshot else inputs.start,
                    inputs.latest,
                    records_feed(source.properties()),
                )
                duplicates = _duplicates(source, cfg, inputs.latest)
            except Cdc2chError as exc:
                findings.append(Finding(cfg.pipeline, False, f"{cfg.table} -> {cfg.target}: {exc}"))
                continue
            start, latest = inputs.start, inputs.latest
            if source.name:
                found = f"{source.name} at {source.location}, "
            else:  # a share names its table by profile; where its server serves it is worth showing
                found = f"served at {source.location}, " if source.location != source.uri else ""
            where = (
                f"resumes at version {start}, "
                if inputs.stored and not cfg.reset
                else ""  # initial_text tells of the snapshot
                if snapshot
                else f"starts at version {start}, "
            )
            findings.append(
                Finding(
                    cfg.pipeline,
                    True,
                    f"{cfg.table} -> {cfg.target}: {found}latest version {latest}, {where}key "
                    f"{','.join(cfg.primary_key)}{_design_text(cfg)}, writer {inputs.writer}{chosen}, {origins}"
                    f"{initial_text(inputs.initial)}",
                )
            )
            if isinstance(duplicates, Finding):
                findings.append(duplicates)
            elif duplicates is not None:
                findings.append(duplicates_finding(cfg, latest, duplicates))
    return findings
