"""The official `delta-sharing` connector as a test oracle for tests/support/sharing_server.py.

The connector pins an older pyarrow than cdc2ch runs, so it lives in its own virtualenv, `.venv-sharing`
(built by `make install`; built here on first use when missing; a venv that cannot be built fails the test,
it never skips it). `read_with_connector` runs tests/support/sharing_client.py there; `assert_connector_agrees`
checks that what the connector reads through the server equals what Spark reads from the Delta table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sharing_canon import canon_rows

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-sharing"
REQUIREMENTS = Path(__file__).with_name("sharing-requirements.txt")
CLIENT = Path(__file__).with_name("sharing_client.py")
CDF_TYPES = {"_change_type": "string", "_commit_version": "long", "_commit_timestamp": "commit_ms"}


def connector_python() -> str:
    """The connector venv's interpreter, building the venv first when `make install` has not."""
    python, stamp = VENV / "bin" / "python", VENV / ".installed"
    if python.exists() and stamp.exists():
        return str(python)
    steps = [
        [os.environ.get("PYTHON", "python3"), "-m", "venv", str(VENV)],
        [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(
                f"could not build {VENV} for the delta-sharing connector: {' '.join(step)}\n{done.stderr}"
            )
    stamp.touch()
    return str(python)


def read_with_connector(tasks: list[dict], timeout: float = 300) -> list[dict]:
    """Run the connector on `tasks` (see tests/support/sharing_client.py) in one subprocess; its results."""
    done = subprocess.run(
        [connector_python(), str(CLIENT)],
        input=json.dumps(tasks),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    assert done.returncode == 0, f"connector script failed:\n{done.stderr}"
    return json.loads(done.stdout)


# -- Spark's side -------------------------------------------------------------------------------------
def _types(schema) -> dict[str, object]:
    return {f["name"]: f["type"] for f in schema.jsonValue()["fields"]}


def spark_snapshot(spark, path: str, version: int | None = None) -> tuple[dict, dict]:
    """(task for the connector, Spark's own result) for the snapshot at `version` (latest when None)."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(str(path))
    types = _types(df.schema)
    expected = {"columns": df.columns, "rows": canon_rows(df.collect(), df.columns, types)}
    return {"kind": "snapshot", "version": version, "types": types}, expected


def spark_changes(spark, path: str, start: int, end: int) -> tuple[dict, dict]:
    """(task, Spark's result) for the change data feed of versions [start, end]."""
    df = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(str(path))
    )
    types = {**_types(df.schema), **CDF_TYPES}
    expected = {"columns": df.columns, "rows": canon_rows(df.collect(), df.columns, types)}
    return {"kind": "changes", "start": start, "end": end, "types": types}, expected


def spark_derived(spark, path: str, start: int, end: int) -> tuple[dict, dict]:
    """(task, Spark's result) for the changes of versions [start, end] derived from the files each version
    adds and removes, by Delta's own function for it (CDCReader.changesToBatchDF, coarse-grained: an added
    file's rows inserts, a removed one's deletes), which needs no change data feed."""
    from cdc2ch.source.sparkread.cdfscan import scanned_changes

    df = scanned_changes(spark, path, start, end, coarse=True)
    types = {**_types(df.schema), **CDF_TYPES}
    expected = {"columns": df.columns, "rows": canon_rows(df.collect(), df.columns, types)}
    return {"kind": "since", "start": start, "end": end, "types": types}, expected


def assert_agree(got: dict, expected: dict, what: str) -> None:
    assert "error" not in got, f"{what}: the connector failed: {got}"
    assert got["columns"] == expected["columns"], f"{what}: columns differ"
    missing = [r for r in expected["rows"] if r not in got["rows"]]
    extra = [r for r in got["rows"] if r not in expected["rows"]]
    assert got["rows"] == expected["rows"], (
        f"{what}: {len(got['rows'])} rows through sharing, {len(expected['rows'])} in Spark; "
        f"only in Spark: {missing[:5]}; only through sharing: {extra[:5]}"
    )


def assert_connector_agrees(
    server, profile_path, name, spark, delta_path, *, versions: tuple[int, int] | None = None
) -> None:
    """The official connector, reading `name` through `server`, sees what Spark sees in the Delta table at
    `delta_path`: the latest snapshot and, with `versions`, the change data feed of that range."""
    url = server.url(str(profile_path), name)
    pairs = [spark_snapshot(spark, delta_path)]
    if versions is not None:
        pairs.append(spark_changes(spark, delta_path, *versions))
    results = read_with_connector([{**task, "url": url} for task, _ in pairs])
    for (task, expected), got in zip(pairs, results, strict=True):
        assert_agree(got, expected, f"{name} {task['kind']} {versions if task['kind'] == 'changes' else ''}")


if __name__ == "__main__":  # `python -m tests.support.sharing_connector`: build the venv
    print(connector_python(), file=sys.stderr)
