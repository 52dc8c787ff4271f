"""The line `run --once` and `snapshot` end with on stdout, whatever the log level: what was written."""

from __future__ import annotations

import json
import re

from cdc2ch.model.config import TargetName
from tests.support.helpers import orders


def test_run_once_and_snapshot_end_with_what_they_wrote_at_any_log_level(spark, cli, database, tmp_path):
    path = str(tmp_path / "orders")
    orders(spark, path)  # versions 0..3
    target, loaded = TargetName(database, "orders"), TargetName(database, "loaded")
    quiet = ("--log-level", "warning", "--log-format", "console")

    first = cli.replicate("run", path, target, "--once", *quiet)
    assert re.fullmatch(
        rf"{target}: versions 0\.\.3 replicated, \d+ rows written, in \d+\.\ds\n", first.stdout
    )
    again = cli.replicate("run", path, target, "--once", *quiet)
    assert re.fullmatch(rf"{target}: up to date at version 3, nothing written, in \d+\.\ds\n", again.stdout)
    snap = cli.replicate("snapshot", path, loaded, *quiet)
    assert re.fullmatch(rf"{loaded}: snapshot of version 3 loaded, 2 rows, in \d+\.\ds\n", snap.stdout)

    # With JSON logs, the same line is a JSON event: stdout stays parseable.
    (line,) = cli.replicate("run", path, target, "--once").stdout.splitlines()
    event = json.loads(line)
    assert event["event"] == "summary" and event["command"] == "run" and event["rows"] == 0, event
    assert event["pipelines"] == [
        {"pipeline": str(target), "rows": 0, "before": 3, "after": 3, "failed": None, "snapshot": False,
         "note": None}
    ]  # fmt: skip
