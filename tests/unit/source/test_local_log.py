"""A local table's log read by Python (source/deltalog/logfiles.py ArrowLogFiles): `run` reads local tables so, as
`status` does, and a path is a path, not a URI."""

from __future__ import annotations

import json

from cdc2ch.source.deltalog.commitlog import DeltaLog
from cdc2ch.source.deltalog.logfiles import ArrowLogFiles


def test_a_local_log_is_read_whatever_characters_its_path_holds(tmp_path):
    for name in ("a b", "a#b", "a?b", "ü"):
        log_dir = tmp_path / name / "_delta_log"
        log_dir.mkdir(parents=True)
        (log_dir / f"{0:020d}.json").write_text(
            json.dumps({"commitInfo": {"operation": "CREATE TABLE"}}) + "\n"
        )
        log = DeltaLog(ArrowLogFiles(str(tmp_path / name)))
        assert log.latest_version() == 0 and log.commit(0).operation == "CREATE TABLE"
