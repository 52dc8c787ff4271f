"""The class data sharing archive across processes: a `run` saves it at its end, the next JVM maps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cdc2ch.source.spark.jars import delta_jars
from tests.support.helpers import Proc, create_table

# A second process: its session, one CDF read, and whether its JVM mapped the archive.
PROBE = """
import json, sys
from pyspark import SparkContext
from cdc2ch.source.spark.session import session
from cdc2ch.source.sparkread.deltasource import DeltaSource
spark = session()
rows = DeltaSource(spark, sys.argv[1]).changes(0, 1).spark_rows(False).toArrow().num_rows
maps = open(f"/proc/{SparkContext._gateway.proc.pid}/maps").read()
print(json.dumps({"rows": rows, "mapped": sorted({ln.split()[-1] for ln in maps.splitlines() if ln.endswith(".jsa")})}))
"""


def test_a_run_leaves_a_class_archive_that_the_next_jvm_maps(spark, tmp_path):
    jars = tmp_path / "jars"  # a cache of its own: the same jars, no archive yet
    jars.mkdir()
    for jar in delta_jars():
        (jars / Path(jar).name).symlink_to(jar)
    (jars / ".complete").write_text("test\n")
    path = str(tmp_path / "t")
    create_table(spark, path, "id BIGINT, name STRING")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'b')")
    env = {"CDC2CH_JARS_DIR": str(jars)}

    first = Proc(
        "run", "--table", path, "--primary-key", "id", "--clickhouse", f"chdb://{tmp_path}/ch", "--once",
        "--reader", "spark", env=env,
    )  # fmt: skip
    assert first.wait() == 0, first.stderr[-3000:]
    saved = first.events("class_archive_saved")
    assert len(saved) == 1, first.stderr[-3000:]
    archive = Path(saved[0]["path"])
    assert archive.parent == jars and archive.stat().st_size > 10 << 20
    assert not list(jars.glob("*.partial"))
    assert "cds" not in first.stderr.lower()  # the JVM's own archive chatter stays out of the log

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, path],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["rows"] == 2
    assert str(archive) in found["mapped"], found
    assert "class_archive_saved" not in probe.stderr  # mapped, not saved again
    assert sorted(jars.glob("classes-*")) == [archive]  # nothing else written beside it
