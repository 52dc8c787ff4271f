"""Nothing recorded before it is true: every way a new pipeline's first `run` can fail — the refusals the
README lists, ClickHouse refusing the table or the first insert, another runner holding the pipeline — leaves
the target database as it was: the same tables (SHOW TABLES), no offset row and no live claim of the pipeline,
and the rows of tables it did not create untouched. Real chdb, Delta tables written by Spark."""

from __future__ import annotations

import pytest

from cdc2ch.clickhouse.state.lock import PipelineLock
from cdc2ch.model import schema
from cdc2ch.model.config import TargetName
from tests.e2e.replication.test_design import delta_table
from tests.support.helpers import assert_replicated, committed_version, create_table

META = (
    "_commit_version UInt64, _commit_timestamp DateTime64(3, 'UTC'), _change_type LowCardinality(String), "
    "_is_deleted UInt8, _version UInt64, _synced_at DateTime64(3, 'UTC') DEFAULT now64(3)"
)
COLUMNS = (
    "id Int64, name Nullable(String), city Nullable(String), created_at Nullable(Date32), "
    "amount Nullable(Float64), email Nullable(String)"
)


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """Delta tables shared by the cases (none of them writes to Delta): 20 rows, and one with a null key."""
    root = tmp_path_factory.mktemp("lake")
    nulls = str(root / "nulls")
    create_table(spark, nulls, "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{nulls}` VALUES (1, 'a'), (NULL, 'b')")
    return {"rows": delta_table(spark, root, "rows", 20), "nulls": nulls}


def hand_made(sink, target: TargetName, tail: str) -> None:
    sink.ensure_database(target.database)
    sink.command(f"CREATE TABLE {schema.qualified(target)} ({COLUMNS}, {tail}")


def footprint(sink, database: str, pipeline: str) -> dict:
    """What a failed attempt must not change: the database's tables, the pipeline's offset rows and live
    claims, and the rows of every table that is not cdc2ch's own."""
    if not sink.query_rows(f"SELECT 1 FROM system.databases WHERE name = '{database}'"):
        return {"database": None}
    tables = sorted(
        n for (n,) in sink.query_rows(f"SELECT name FROM system.tables WHERE database = '{database}'")
    )
    q = schema.quote(database)
    offsets = claims = 0
    if "cdc2ch_state" in tables:
        offsets = sink.query_rows(f"SELECT count() FROM {q}.cdc2ch_state WHERE pipeline = '{pipeline}'")[0][0]
    if "cdc2ch_locks" in tables:
        claims = sink.query_rows(
            f"SELECT count() FROM {q}.cdc2ch_locks FINAL WHERE pipeline = '{pipeline}' AND released = 0"
        )[0][0]
    rows = {t: sink.row_count(f"{q}.{schema.quote(t)}") for t in tables if not t.startswith("cdc2ch_")}
    return {"tables": tables, "offsets": offsets, "claims": claims, "rows": rows}


def _other_pipeline(cli, lake, database: str) -> None:
    """Another pipeline replicating into the same database, so cdc2ch's own tables are there and in use."""
    cli("run", "--table", lake["rows"], "--primary-key", "id", "--target", f"{database}.other", "--once")


# (case, setup(sink, cli, lake, target), arguments, exit code, what the paragraph says)
CASES = {
    "a hand-made table with another sorting key": (
        lambda sink, cli, lake, t: hand_made(
            sink,
            t,
            f"{META}) ENGINE = ReplacingMergeTree(_version, _is_deleted) ORDER BY (name, id) "
            f"SETTINGS allow_nullable_key = 1",
        ),
        (),
        2,
        "it is sorted by (name, id)",
    ),
    "a hand-made table whose engine cdc2ch cannot version": (
        lambda sink, cli, lake, t: hand_made(
            sink, t, f"{META}) ENGINE = ReplacingMergeTree(_commit_version) ORDER BY id"
        ),
        (),
        2,
        "ReplacingMergeTree(_version, _is_deleted)",
    ),
    "ClickHouse refusing the first insert into a hand-made table": (
        lambda sink, cli, lake, t: hand_made(
            sink,
            t,
            f"{META}, CONSTRAINT small CHECK id < 5) ENGINE = ReplacingMergeTree(_version, _is_deleted) "
            f"ORDER BY id",
        ),
        (),
        1,
        "VIOLATED_CONSTRAINT",
    ),
    "ClickHouse refusing the table": (None, ("--column-codecs", "amount=NoSuchCodec"), 1, "failed to create"),
    "ClickHouse refusing the first insert into the table cdc2ch created": (
        None,
        ("--partition-by", "throwIf(id > 3)"),
        1,
        "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",
    ),
    "ClickHouse refusing the first chunk of the initial snapshot": (
        None,
        ("--initial-load", "snapshot", "--partition-by", "throwIf(id > 3)"),
        1,
        "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",
    ),
    "the same in a database other pipelines use": (
        lambda sink, cli, lake, t: _other_pipeline(cli, lake, t.database),
        ("--partition-by", "throwIf(id > 3)"),
        1,
        "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",
    ),
    "a target another pipeline owns": (
        lambda sink, cli, lake, t: cli(
            "run",
            "--table",
            lake["rows"],
            "--primary-key",
            "id",
            "--target",
            str(t),
            "--pipeline",
            "owner",
            "--once",
        ),
        (),
        1,
        "already replicated by pipeline 'owner'",
    ),
    "an unknown primary-key column": (None, ("--primary-key", "nosuch"), 1, "nosuch"),
    "a null primary key in the first range": (None, ("--table", "nulls"), 1, "null"),
    "--from-version beyond the latest version": (None, ("--from-version", "99"), 1, "is beyond the latest"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_first_start_leaves_the_database_as_it_was(spark, sink, cli, lake, database, case):
    setup, extra, code, says = CASES[case]
    target = TargetName(database, "p")
    if setup is not None:
        setup(sink, cli, lake, target)
    before = footprint(sink, database, str(target))
    args = {"--table": lake["rows"], "--primary-key": "id", "--target": str(target)}
    rest = []
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in args:
            args[flag] = lake.get(value, value)
        else:
            rest += [flag, value]
    result = cli("run", *[x for kv in args.items() for x in kv], "--once", *rest, expect=code)
    err = " ".join(result.stderr.split())
    assert says in err and "Traceback" not in err, err
    assert footprint(sink, database, str(target)) == before


def test_another_runner_holding_the_new_pipeline_gets_no_table_made_for_it(spark, sink, cli, lake, database):
    target = TargetName(database, "p")
    holder = PipelineLock(sink, database, str(target))
    holder.acquire()  # a live claim of this process: not a stale one
    try:
        before = footprint(sink, database, str(target))
        cli.replicate("run", lake["rows"], target, "--once", expect=75)
        assert footprint(sink, database, str(target)) == before  # its claim is still there, untouched
    finally:
        holder.release()


def test_after_a_failed_first_start_the_corrected_run_starts_anew(spark, sink, cli, lake, database):
    """The refused flags are not remembered: an offset left by the failure would now be 'a stored offset
    that disagrees with the flags'."""
    target = TargetName(database, "p")
    result = cli.replicate(
        "run", lake["rows"], target, "--once", "--partition-by", "throwIf(id > 3)", expect=1
    )
    assert cli.events(result, "first_attempt_taken_back")
    cli.replicate("run", lake["rows"], target, "--once", "--partition-by", "intDiv(id, 5)")
    assert_replicated(spark, sink, lake["rows"], target)
    assert committed_version(sink, database, str(target)) == 1
