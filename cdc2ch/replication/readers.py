"""Which reader reads a table's rows: what `--reader auto` chooses, and what ClickHouse's own reader refuses.

`auto` has ClickHouse read a table itself (one `INSERT ... SELECT` per range, no JVM) where that is known to
give exactly Spark's rows, and Spark everywhere else. Known means: no feature or type its Delta reader reads
differently, and a place it reads as this process does. A local table is read by the embedded engine from
this process's own paths. A table on object storage is read with credentials the target holds (a server's
named collection, `--lake-collection`; a server's own S3 settings; for the embedded engine, this process's
AWS environment), which this process cannot inspect: a probe proves them, ClickHouse's rows per file at one
version against the live rows of each file the log lists there. A probe that fails or differs keeps Spark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from cdc2ch.base.errors import Cdc2chError, ConfigError, SourceError, summarise
from cdc2ch.base.log import Logger
from cdc2ch.model import schema
from cdc2ch.model.changeset import Changes
from cdc2ch.model.config import RunConfig
from cdc2ch.model.objectstore import S3Settings
from cdc2ch.model.records import PipelineState
from cdc2ch.model.tableref import is_local
from cdc2ch.replication.ports import ChangeSource, LakeReader

OBJECT_STORE_SCHEMES = ("s3", "s3a", "s3n")  # the object storage ClickHouse's Delta reader reaches here
PROBE_REASON_CHARS = 300  # of a failed probe's error in the reason logged


# Reader features (Delta protocol names) that ClickHouse's Delta reader (delta-kernel-rs, in chdb 26.9) reads;
# a table with any other reader feature is refused. Data features in this list that it reads wrongly get a
# rule of their own in unsupported_by_clickhouse_reader. Log features need none: v2 checkpoints with sidecars,
# classic multi-part checkpoints, log compaction files, in-commit timestamps (its _commit_timestamp is the
# in-commit timestamp) and early commits removed after a checkpoint each replicate equal to Delta
# (tests/e2e/replication/test_table_history.py).
CLICKHOUSE_READER_FEATURES = frozenset(
    {
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "timestampNtz",
        "deletionVectors",
        "columnMapping",
        "typeWidening",
        "typeWidening-preview",
        "variantType",
        "variantType-preview",
    }
)


def unsupported_by_clickhouse_reader(
    protocol: Mapping[str, Any], properties: Mapping[str, str], schema_json: dict[str, Any] | None = None
) -> list[str]:
    """The features of a Delta table that `--reader clickhouse` cannot read correctly, in user words (empty:
    it reads the table). `protocol`: minReaderVersion, readerFeatures...; `properties`: the table properties;
    `schema_json`: the Spark JSON schema. Pure: the caller reads the latest version's.

    Measured with chdb 26.9 (delta-kernel-rs), table data and change data feed alike: any reader feature
    outside CLICKHOUSE_READER_FEATURES is refused by name; deletion vectors, column mapping (name and id),
    type widening, row tracking, liquid clustering and TIMESTAMP_NTZ are read right
    (tests/e2e/replication/test_table_features.py pins each); a VARIANT column is refused ("Unsupported Variant data
    type"), at any depth."""
    found = [
        f"table feature {f}"
        for f in sorted(set(protocol.get("readerFeatures") or ()))
        if f not in CLICKHOUSE_READER_FEATURES
    ]
    fields = schema.user_fields(schema_json) if schema_json else []
    variants = [f["name"] for f in fields if schema.contains_type(f["type"], "variant")]
    if variants:
        found.append(f"VARIANT columns ({', '.join(variants)})")
    return found


def clickhouse_reader_error(
    uri: str, features: list[str], outcome: str = "nothing was written"
) -> ConfigError:
    """The refusal of --reader clickhouse for a table with `features` (unsupported_by_clickhouse_reader)."""
    return ConfigError(
        f"{uri} uses {' and '.join(features)}, which ClickHouse's Delta reader (--reader clickhouse) cannot "
        f"read, so {outcome}. Replicate this table with --reader spark, or auto (the default), which "
        f"chooses Spark for it: Spark reads every table feature."
    )


def on_object_storage(location: str) -> bool:
    return urlsplit(location).scheme.lower() in OBJECT_STORE_SCHEMES


def place_needs_spark(location: str, remote_target: bool, keys_in_spark_conf: bool = False) -> str | None:
    """Why `auto` leaves a table to Spark for where it is and where it goes (None: ClickHouse may read it; on
    object storage, once a probe shows it reads the same table). `keys_in_spark_conf`: the S3 keys are set
    as fs.s3a.* in the Spark conf, which the embedded engine does not take."""
    if is_local(location):
        if remote_target:
            return (
                "the target is a ClickHouse server, which reads local paths on its own host, not this one's"
            )
        return None
    if not on_object_storage(location):
        return "the table is neither on a local path nor on S3, the storage ClickHouse's reader reaches here"
    if keys_in_spark_conf and not remote_target:
        return (
            "its S3 keys are set in the Spark conf (fs.s3a.*), which the embedded engine does not take (it "
            "reads with the AWS environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or a profile)"
        )
    return None


def probe_differs(listed: list[tuple[str, int | None]], read: Mapping[str, int], version: int) -> str | None:
    """How ClickHouse's rows per file (`read`, by `_path`) at `version` differ from the live rows of each file
    the log lists there (`listed`; None: the log keeps no count for it, any count is taken), or None."""
    known = dict(listed)
    extra = sorted(path for path in read if path not in known)
    wrong = sorted(path for path, rows in known.items() if rows is not None and read.get(path, 0) != rows)
    if not extra and not wrong:
        return None
    example = (extra or wrong)[0]
    expected = sum(rows or 0 for rows in known.values())
    return (
        f"a probe at version {version} differs from the log: ClickHouse read {sum(read.values())} rows in "
        f"{len(read)} files where the log lists {expected} live rows in {len(known)} files (first difference: "
        f"{example}), so it does not read the table this process reads"
    )


def probe_needs_spark(cfg: RunConfig, source: ChangeSource, lake: LakeReader, version: int) -> str | None:
    """Why a probe keeps a table on object storage with Spark: the log's files at `version` cannot be listed
    without Spark, ClickHouse's read of them failed, or it read other rows (None: it read the same)."""
    listed = source.snapshot_files(version)
    if listed is None:
        return (
            f"its files at version {version} cannot be listed from its log without Spark to probe ClickHouse"
        )
    try:
        read = lake.probe(cfg, source.location, version)
    except Cdc2chError as exc:  # the target's message, which names no secret (Sink masks its password)
        return f"a probe of ClickHouse reading it at version {version} failed: " + summarise(
            str(exc), PROBE_REASON_CHARS
        )
    return probe_differs(listed, read, version)


def table_needs_spark(
    schema_json: dict[str, Any], protocol: Mapping[str, Any], properties: Mapping[str, str]
) -> str | None:
    """Why `auto` leaves a table to Spark for what it holds (None: ClickHouse reads it as Spark does)."""
    found = unsupported_by_clickhouse_reader(protocol, properties, schema_json)
    if found:
        return f"ClickHouse's Delta reader cannot read its {' and '.join(found)}"
    zoned = [
        f["name"] for f in schema.user_fields(schema_json) if schema.contains_type(f["type"], "timestamp")
    ]
    if (
        zoned
    ):  # Spark writes them as INT96, which ClickHouse reads wrong after 2262 (docs/guides/run.md: limits)
        return f"it has TIMESTAMP columns ({', '.join(zoned)}), which ClickHouse reads wrong beyond 2262"
    return None


@dataclasses.dataclass(frozen=True)
class ReaderChoice:
    """What `auto` chose for a pipeline, and why (logged as `reader_chosen`, shown by `validate`)."""

    reader: str
    reason: str


def choose(
    cfg: RunConfig, source: ChangeSource, remote_target: bool, lake: LakeReader, version: int | None = None
) -> ReaderChoice:
    """The reader `auto` chooses for `source`, from the schema of `version` (default: the latest) and the
    latest protocol; on object storage, after a probe at that version."""
    if cfg.writer == "executors":
        return ReaderChoice("spark", "--writer executors has Spark's tasks insert the rows they read")
    keys_in_conf = S3Settings.of(dict(cfg.spark.conf), {}).access_key is not None
    why = place_needs_spark(source.location, remote_target, keys_in_conf)
    at = version
    if why is None:  # the log read without a JVM, then one query
        at = source.latest().version if version is None else version
        why = table_needs_spark(source.schema_at(at), source.protocol(), source.properties())
    lacks = lake.lacks() if why is None else None
    if lacks is not None:
        why = f"this ClickHouse lacks {lacks}"
    if why is None and at is not None and not is_local(source.location):
        why = probe_needs_spark(cfg, source, lake, at)
        if why is None:
            held = lake.credentials(cfg)
            return ReaderChoice("clickhouse", f"ClickHouse reads this table on object storage itself ({held}), as a "
                          f"probe at version {at} showed: the rows of each file its log lists")  # fmt: skip
    if why:
        return ReaderChoice("spark", why)
    return ReaderChoice("clickhouse", "ClickHouse reads this local table itself")


def decided(
    cfg: RunConfig,
    source: ChangeSource,
    remote_target: bool,
    lake: LakeReader,
    log: Logger | None = None,
    version: int | None = None,
) -> ReaderChoice:
    """What `auto` chooses for `source` (choose), logged with its reason."""
    chosen = choose(cfg, source, remote_target, lake, version)
    if log is not None:
        log.info("reader_chosen", reader=chosen.reader, reason=chosen.reason)
    return chosen


def resolved(
    cfg: RunConfig,
    source: ChangeSource,
    remote_target: bool,
    lake: LakeReader,
    log: Logger | None = None,
    version: int | None = None,
) -> RunConfig:
    """`cfg` with `auto` replaced by the reader chosen for `source` (decided); any other reader as given."""
    if cfg.reader != "auto":
        return cfg
    return dataclasses.replace(cfg, reader=decided(cfg, source, remote_target, lake, log, version).reader)


def check_clickhouse_reads(
    source: ChangeSource,
    lake: LakeReader,
    schema_json: dict[str, Any],
    protocol: Mapping[str, Any] | None = None,
    properties: Mapping[str, str] | None = None,
    feed: bool = False,
    outcome: str = "nothing was written",
) -> None:
    """Refuse, before anything is written, a table `--reader clickhouse` cannot read: storage ClickHouse
    does not reach, features of `protocol`, `properties` or `schema_json` its reader reads wrong, and, for
    a change `feed`, a ClickHouse that cannot read one. `outcome`: what the refusal left."""
    lake.check(source.location, feed)
    found = unsupported_by_clickhouse_reader(protocol or {}, properties or {}, schema_json)
    if found:
        raise clickhouse_reader_error(source.uri, found, outcome)


def check_range(uri: str, changes: Changes, state: PipelineState, chosen: bool) -> None:
    """Stop before writing a range ClickHouse cannot read (a VARIANT column added since the start) or, when
    `auto` `chosen` ClickHouse, one it would read differently from Spark (a TIMESTAMP column added): the next
    attempt chooses again, from the table as it is now."""
    stopped = f"replication stopped before versions {changes.start}..{changes.end}, with version "
    stopped += f"{state.committed_version} committed"
    why = table_needs_spark(changes.schema, {}, {}) if chosen else None
    found = unsupported_by_clickhouse_reader({}, {}, changes.schema)
    if found and not why:
        raise clickhouse_reader_error(uri, found, stopped)
    if why:
        raise SourceError(
            f"{uri} changed since --reader auto chose ClickHouse's reader for it: {why}. So {stopped}; the "
            f"next attempt (a service retries it; rerun a --once run) chooses again and reads it through Spark."
        )
