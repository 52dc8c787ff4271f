"""`cdc2ch status` at fleet size: its filters over rows, and what it reads of a Delta log."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from cdc2ch.base.errors import ConfigError
from cdc2ch.cli import main
from cdc2ch.commands.selection import Selection, failing, lagging, matches
from cdc2ch.commands.status import parse_lagging
from cdc2ch.source.deltalog.logfiles import ArrowLogFiles, python_log


def _row(pipeline="sales.orders", behind=None, seconds=None, is_failing=False, **more) -> dict:
    row = {"pipeline": pipeline, "target": pipeline, "source": "/lake/sales/orders", "failing": is_failing}
    return {**row, "versions_behind": behind, "seconds_behind": seconds, **more}


def test_a_pattern_matches_the_pipeline_its_target_or_its_table():
    row = _row("orders_eu", target="sales.orders", source="/lake/eu/orders")
    assert matches(row, "orders_*") and matches(row, "sales.*") and matches(row, "/lake/eu/*")
    assert matches(row, "*orders*") and matches(row, "orders_[de][ue]")
    assert not matches(row, "ops.*") and not matches(row, "Orders_*")  # case counts
    assert not matches(row, "orders")  # a glob matches whole names
    assert matches(_row(source=None), "sales.orders")  # a pipeline that never ran has no table


def test_failing_is_the_last_attempt_skipped_tables_included():
    assert failing(_row(is_failing=True, error="no primary key", last_error_kind="skipped"))
    assert not failing(_row(error="has not run yet"))  # never ran: nothing failed
    assert not failing(_row(behind=None, error="The Delta table path /x does not exist"))


@pytest.mark.parametrize(
    "behind, seconds, listed",
    [
        (3, 301.0, True),  # more than 5 minutes behind
        (3, 300.0, False),  # exactly the limit: not more
        (3, None, True),  # versions behind, the older commit's time no longer in the log
        (0, 0.0, False),  # caught up
        (None, None, False),  # lag unknown (table unreadable): --failing and --max-lag find those
    ],
)
def test_lagging_is_more_than_the_time_or_behind_without_a_time(behind, seconds, listed):
    assert lagging(_row(behind=behind, seconds=seconds), 300) is listed


def test_filters_compose_and_those_needing_no_log_come_first():
    rows = [
        _row("sales.a", 1, 900.0, True),
        _row("sales.b", 1, 900.0, False),
        _row("sales.c", 1, 10.0, True),
        _row("ops.d", 1, 900.0, True),
    ]
    select = Selection("sales.*", failing=True, lagging=60)
    assert [r["pipeline"] for r in rows if select(r)] == ["sales.a"]
    # Before the logs are read, the lag is unknown: only the pattern and --failing apply.
    assert [r["pipeline"] for r in rows if select.before_lag(r)] == ["sales.a", "sales.c"]
    assert all(Selection()(r) for r in rows) and not Selection()
    assert select.describe() == "--pattern 'sales.*' --failing --lagging 60s"


def test_lagging_takes_a_duration_and_refuses_anything_else():
    assert parse_lagging("5m") == 300 and parse_lagging("1h30m") == 5400 and parse_lagging("0") == 0
    for bad in ("abc", "300", "-5m", ""):
        with pytest.raises(ConfigError, match="--lagging .* is not a duration"):
            parse_lagging(bad)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lagging", "abc"], "--lagging 'abc' is not a duration cdc2ch understands. Give a whole number"),
        (["--max-lag", "soon"], "--max-lag 'soon' is neither a number of versions"),
        (["--json", "--format", "table"], "--json asks for --format json, but --format table is given"),
    ],
)
def test_bad_filters_end_the_command_with_one_paragraph(argv, message, tmp_path):
    # Refused before ClickHouse is opened: the directory named is never created.
    dsn = f"chdb://{tmp_path / 'nowhere'}"
    result = CliRunner().invoke(main, ["status", *argv, "--clickhouse", dsn], catch_exceptions=False)
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "nowhere").exists()


def test_the_python_api_refuses_a_bad_filter_before_opening_clickhouse(tmp_path):
    from cdc2ch import api

    with pytest.raises(ConfigError, match="--lagging 'soon' is not a duration"):
        api.status(clickhouse=f"chdb://{tmp_path / 'nowhere'}", lagging="soon")
    assert not (tmp_path / "nowhere").exists()


def test_status_declares_the_filters_and_formats():
    help_text = CliRunner().invoke(main, ["status", "--help"]).stdout
    for flag in ("--pattern GLOB", "--failing", "--lagging DURATION", "--format [table|json]", "--json"):
        assert flag in help_text, flag


# -- the Delta log, read as little as status needs ------------------------------------------------------
def _commit(log_dir, version: int, first: dict | None, *, size: int = 0) -> None:
    adds = [{"add": {"path": f"f{version}-{i}", "size": 1}} for i in range(size)]
    lines = ([first] if first else []) + adds
    lines.append({"commitInfo": {"operation": "WRITE"}} if first is None else {"txn": {"appId": "x"}})
    (log_dir / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in lines) + "\n")


def test_a_long_log_is_not_listed_and_commits_are_read_to_their_first_line(tmp_path, monkeypatch):
    log_dir = tmp_path / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    for v in range(40):  # an in-commit timestamp (first action) on every commit: 2.5 s apart
        _commit(log_dir, v, {"commitInfo": {"inCommitTimestamp": 1_000_000 + 2500 * v}}, size=2000)
    (log_dir / "_last_checkpoint").write_text(json.dumps({"version": 30, "size": 1}))
    listed, read = [], []
    monkeypatch.setattr(ArrowLogFiles, "names", lambda self: listed.append(1) or [])
    read_whole, first_line = ArrowLogFiles.read, ArrowLogFiles.first_line
    monkeypatch.setattr(ArrowLogFiles, "read", lambda self, name: read.append(name) or read_whole(self, name))
    monkeypatch.setattr(ArrowLogFiles, "first_line", lambda self, name: first_line(self, name, chunk=256))

    log = python_log(str(tmp_path / "t"))
    assert log.behind(9) == (39, 30, 75.0) and log.behind(39) == log.behind(60) == (39, 0, 0.0)
    assert log.behind(-1) == (39, 40, 97.5)  # nothing replicated: from version 0
    assert not listed and read == ["_last_checkpoint"]  # never the commit files whole, nor a listing
    monkeypatch.undo()
    latest = log.latest()  # what replication reads: the same times from the whole commit
    assert log.lag(9, latest) == (30, 75.0)


def test_without_an_in_commit_timestamp_a_commit_is_dated_by_its_file(tmp_path):
    import os

    log_dir = tmp_path / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    for v in range(3):  # commitInfo last, as delta-rs writes it: no in-commit timestamp
        _commit(log_dir, v, None, size=3)
        os.utime(log_dir / f"{v:020d}.json", (1_000_000 + 60 * v, 1_000_000 + 60 * v))
    log = python_log(str(tmp_path / "t"))
    assert log.behind(0) == (2, 2, 120.0)
    assert log.lag(0, log.latest()) == (2, 120.0)
    (log_dir / f"{0:020d}.json").unlink()  # the replicated commit cleaned up: its time is unknown
    assert log.behind(0) == (2, 2, None)


def _status_row(**kw) -> dict:
    row = {
        "pipeline": "analytics.orders_eu_west",
        "target": "analytics.orders_eu_west",
        "source": "s3a://lake/sales/orders_eu_west",
        "name": None,
        "location": None,
        "committed_version": 1234,
        "latest_version": 1240,
        "versions_behind": 6,
        "seconds_behind": 42.3,
        "rows_written": 12_345_678,
        "initial_load": "snapshot",
        "last_success": "2026-12-01T18:17:44+00:00",
        "verified": "ok 2026-12-01T18:17:44+00:00",
        "failing": False,
        "error": None,
    }
    return {**row, **kw}


def test_the_status_table_fits_120_columns_and_says_each_pipelines_state_in_words():
    from cdc2ch.commands.status import render_table, with_compaction
    from cdc2ch.model.records import Compacted

    def row(name: str, **kw) -> dict:
        return _status_row(pipeline=f"analytics.{name}", target=f"analytics.{name}", **kw)

    rows = [
        row("orders_eu_west"),
        row("orders_us", paused=True, paused_by="ann@host", paused_at="2026-12-01T18:00:00+00:00"),
        row("items", failing=True, error="ClickHouse at http://h:8123/ refused: " + "word " * 80),
        row("shops", source=None, committed_version=None, error="has not run yet"),
    ]
    when = datetime(2026, 12, 1, 18, 17, 44, tzinfo=timezone.utc)
    with_compaction(rows[0], Compacted("analytics.orders_eu_west", when, 1, 7, 0.5, 3))
    lines = render_table(rows).splitlines()
    assert max(map(len, lines)) <= 120, "\n".join(lines)  # today: every column, about 260 wide
    # pipelines named after their targets (the default): no second column of the same names
    assert lines[0].split() == ["pipeline", "committed", "behind", "behind_s", "rows_written", "state"]
    states = [line.split("  ")[-1].strip() for line in lines[1:]]
    assert states[0] == "ok"
    assert states[1] == "paused by ann@host"
    assert states[2].startswith("failing: ClickHouse at http://h:8123/ refused")
    assert states[2].endswith("…")
    assert states[3] == "has not run yet"
    renamed = render_table([*rows, _status_row(pipeline="eu", target="analytics.orders_eu")]).splitlines()
    assert renamed[0].split()[:2] == ["pipeline", "target"] and max(map(len, renamed)) <= 120
    # --wide: every column; the compaction says what its number is (today: `2026-12-01T18:17:44+00:00 -1`)
    wide = render_table(rows, wide=True)
    assert "compacted" in wide.splitlines()[0] and "2026-12-01T18:17:44+00:00 (1 tombstone removed)" in wide
    assert max(map(len, wide.splitlines())) > 120


def test_status_help_explains_every_column_it_shows():
    from click.testing import CliRunner

    from cdc2ch.cli import main
    from cdc2ch.commands.status import NARROW_COLUMNS, TABLE_COLUMNS

    text = CliRunner().invoke(main, ["status", "--help"]).output
    for heading, _ in (*NARROW_COLUMNS, *TABLE_COLUMNS):
        assert heading in text.split("Options:")[0], heading
    assert "--wide" in text and "tombstones it" in text


def test_a_pipeline_that_never_committed_is_starting_while_claimed_else_it_has_not_run_yet():
    """status --config during a service's first run (its first snapshot loading): before, `has not run yet`
    whoever held it."""
    from cdc2ch.clickhouse.state.lock import Claim
    from cdc2ch.commands.status import _row, state, with_claims
    from cdc2ch.model.records import Health

    def unrun() -> dict:
        return _row(None, Health("sales.items", "", "sales.items"))

    claim = Claim("t", "cdc2ch run", "host-a", 4242, datetime(2026, 12, 1), 3.0)
    claimed, free = unrun(), unrun()
    with_claims(claimed, [claim])
    with_claims(free, [])
    assert (
        state(claimed) == "starting: claimed by cdc2ch run (pid 4242 on host host-a), nothing committed yet"
    )
    assert state(free) == "has not run yet" and not failing(claimed)
    # A service that began it recorded its health with no outcome yet: starting, before any claim.
    begun = _row(None, Health("sales.items", "/lake/sales/items", "sales.items"))
    assert state(begun) == "starting: a service began it, nothing committed yet" and not failing(begun)
    with_claims(begun, [claim])
    assert state(begun).startswith("starting: claimed by cdc2ch run (pid 4242")
