"""Where status reads a table's log: Python where it can, Spark (said so) where it cannot."""

from __future__ import annotations

import json

import pytest

from cdc2ch.base.errors import SourceError
from cdc2ch.commands.status import table_log
from cdc2ch.source.deltalog.logfiles import python_log


def _commit(log_dir, version: int, ts_ms: int, *actions: dict) -> None:
    lines = [{"commitInfo": {"timestamp": ts_ms, "operation": "WRITE", "inCommitTimestamp": ts_ms}}, *actions]
    (log_dir / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in lines))


def test_python_reads_a_local_log(tmp_path):
    log_dir = tmp_path / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    for v in range(6):
        _commit(
            log_dir,
            v,
            1_000_000 + v * 1500,
            {"add": {"path": f"f{v}", "size": 100, "stats": '{"numRecords": 4}'}},
        )
    log = python_log(str(tmp_path / "t"))
    latest = log.latest()
    assert latest.version == 5 and latest.estimated_rows == 4
    assert log.lag(2, latest) == (3, 4.5)  # in-commit timestamps 3 versions apart
    assert log.lag(-1, latest) == (6, 7.5)  # nothing committed: from version 0
    (log_dir / "00000000000000000006.json").write_text("")  # a new commit appears
    assert log.latest_version() == 6


def test_python_names_a_missing_table_and_a_directory_without_a_log(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        python_log(str(tmp_path / "nowhere"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(SourceError, match="is not a Delta table"):
        python_log(str(tmp_path / "plain"))


def test_storage_python_cannot_reach_falls_back_to_spark():
    from structlog.testing import capture_logs

    class NoSpark(Exception):
        pass

    def spark_factory():
        raise NoSpark

    with capture_logs() as logs, pytest.raises(Exception) as raised:  # the Spark path was taken
        table_log("hdfs://namenode:8020/lake/t", spark_factory).latest()
    assert isinstance(raised.value, NoSpark) or isinstance(raised.value.__cause__, NoSpark)
    assert [e["event"] for e in logs] == ["status_reads_log_with_spark"] and "hdfs" in logs[0]["reason"]
