"""A local table's metadata, protocol and live files replayed from its log by Python (source/deltalog/logstate.py),
on logs written here action by action: JSON commits, classic, multi-part and v2 checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc2ch.source.deltalog.logfiles import LocalLogFiles
from cdc2ch.source.deltalog.logstate import LogStates, cdf_schema, live_files, live_paths, table_state

pytestmark = pytest.mark.unit

SCHEMA = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}


def meta(schema: dict, **conf: str) -> dict:
    return {"metaData": {"id": "table-1", "schemaString": json.dumps(schema), "configuration": conf,
                         "format": {"provider": "parquet", "options": {}}, "partitionColumns": []}}  # fmt: skip


def add(path: str, rows: int | None, deleted: int = 0) -> dict:
    action = {"path": path, "size": 10, "dataChange": True}
    if rows is not None:
        action["stats"] = json.dumps({"numRecords": rows})
    if deleted:
        action["deletionVector"] = {
            "storageType": "u",
            "pathOrInlineDv": f"dv{deleted}",
            "cardinality": deleted,
        }
    return {"add": action}


def commit(log: Path, version: int, *actions: dict) -> None:
    log.mkdir(parents=True, exist_ok=True)
    lines = [{"commitInfo": {"operation": "WRITE", "operationParameters": {"protocol": "x"}}}, *actions]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in lines) + "\n")


def files(table: Path) -> LocalLogFiles:
    return LocalLogFiles(str(table), lambda: pytest.fail("no Spark for a local log"))


PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}


def test_the_state_of_each_version_is_the_last_metadata_and_protocol_before_it(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    commit(log, 0, PROTOCOL, meta(SCHEMA, **{"delta.enableChangeDataFeed": "true"}), add("a.parquet", 3))
    mapped = {"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "col-x", "c": 1}
    wider = {
        **SCHEMA,
        "fields": SCHEMA["fields"] + [{"name": "s", "type": "string", "nullable": True, "metadata": mapped}],
    }
    features = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                             "writerFeatures": ["deletionVectors", "changeDataFeed"]}}  # fmt: skip
    commit(log, 1, add("b.parquet", 2))
    commit(log, 2, features, meta(wider, **{"delta.enableChangeDataFeed": "true", "k": "v"}))
    first, last = table_state(files(tmp_path / "t"), 1), table_state(files(tmp_path / "t"), 2)
    assert first.schema == SCHEMA and first.properties == {"delta.enableChangeDataFeed": "true"}
    assert first.features() == {"minReaderVersion": 1, "minWriterVersion": 2, "readerFeatures": [],
                                "writerFeatures": []}  # fmt: skip
    # column mapping's bookkeeping is left out, as from the schema Spark reads the table with
    assert last.schema["fields"][1]["metadata"] == {"c": 1} and last.table_id == "table-1"
    assert last.features()["readerFeatures"] == ["deletionVectors"] and last.properties["k"] == "v"
    assert [f["name"] for f in cdf_schema(last.schema)["fields"]] == [
        "id", "s", "_change_type", "_commit_version", "_commit_timestamp"
    ]  # fmt: skip
    states = LogStates()
    assert states.at(files(tmp_path / "t"), 2) == last
    (log / f"{0:020d}.json").unlink()  # a later state replays only what came after the one it knows
    commit(log, 3, add("c.parquet", 1))
    assert states.at(files(tmp_path / "t"), 3).schema == last.schema


def checkpoint(log: Path, name: str, rows: list[dict]) -> None:
    """A checkpoint file of actions (one column per kind, as Delta writes them), maps as key-value pairs."""

    def arrow(action):
        if action is None:
            return None
        return {k: list(v.items()) if k in ("configuration", "options") else arrow(v) if isinstance(v, dict) else v
                for k, v in action.items()}  # fmt: skip

    kinds = sorted({k for r in rows for k in r})
    pq.write_table(pa.Table.from_pylist([{k: arrow(r.get(k)) for k in kinds} for r in rows]), log / name)


def test_checkpoints_classic_multi_part_and_v2_with_sidecars_start_the_replay(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    both = [PROTOCOL, meta(SCHEMA, mode="classic")]
    checkpoint(log, f"{10:020d}.checkpoint.parquet", [*both, add("a.parquet", 5), add("b%20c.parquet", 4, 1)])
    # b c.parquet gets a new deletion vector as Delta writes it: added with the new one, then removed with the old
    old_vector = add("b%20c.parquet", 4, 1)["add"]["deletionVector"]
    commit(log, 11, add("d.parquet", None), {"remove": {"path": "a.parquet", "dataChange": True}},
           add("b%20c.parquet", 4, 2), {"remove": {"path": "b%20c.parquet", "deletionVector": old_vector}})  # fmt: skip
    (log / f"{9:020d}.json").write_text("not read: the checkpoint stands for it\n")
    assert table_state(files(tmp_path / "t"), 11).properties == {"mode": "classic"}
    assert live_files(files(tmp_path / "t"), 11) == {"b%20c.parquet": 2, "d.parquet": None}
    assert live_paths(str(tmp_path / "t"), files(tmp_path / "t"), 11) == [
        (f"{tmp_path}/t/b c.parquet", 2), (f"{tmp_path}/t/d.parquet", None)
    ]  # fmt: skip

    parts = [f"{20:020d}.checkpoint.{i:010d}.{2:010d}.parquet" for i in (1, 2)]
    checkpoint(log, parts[0], [PROTOCOL, add("e.parquet", 1)])
    with pytest.raises(FileNotFoundError, match="commit 12 is missing"):  # half a checkpoint is none
        table_state(files(tmp_path / "t"), 20)
    checkpoint(log, parts[1], [meta(SCHEMA, mode="multi"), add("f.parquet", 2)])
    assert table_state(files(tmp_path / "t"), 20).properties == {"mode": "multi"}
    assert live_files(files(tmp_path / "t"), 20) == {"e.parquet": 1, "f.parquet": 2}

    (log / "_sidecars").mkdir()
    checkpoint(log / "_sidecars", "side-1.parquet", [add("g.parquet", 7)])
    top = [PROTOCOL, meta(SCHEMA, mode="v2"), {"sidecar": {"path": "side-1.parquet", "sizeInBytes": 1}}]
    (log / f"{30:020d}.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json").write_text(
        "\n".join(json.dumps(a) for a in top) + "\n"
    )
    assert table_state(files(tmp_path / "t"), 30).properties == {"mode": "v2"}
    assert live_files(files(tmp_path / "t"), 30) == {"g.parquet": 7}
    assert table_state(files(tmp_path / "t"), 11).properties == {"mode": "classic"}  # an older version


def test_a_checksum_file_nearer_than_the_checkpoint_starts_the_replay(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    checkpoint(log, f"{10:020d}.checkpoint.parquet", [PROTOCOL, meta(SCHEMA, mode="checkpoint")])

    def checksum(version: int, text: str) -> None:
        (log / f"{version:020d}.crc").write_text(text)

    checksum(9, json.dumps({"metadata": meta(SCHEMA, mode="older")["metaData"], **PROTOCOL}))
    checksum(12, json.dumps({"tableSizeBytes": 10, "metadata": meta(SCHEMA, mode="sum")["metaData"],
                             "protocol": {"minReaderVersion": 1, "minWriterVersion": 7}}))  # fmt: skip
    for v in (11, 12):
        (log / f"{v:020d}.json").write_text("not read: the checksum of 12 stands for them\n")
    commit(log, 13, add("a.parquet", 1))
    commit(log, 14, meta(SCHEMA, mode="later"))
    at_13, at_14 = table_state(files(tmp_path / "t"), 13), table_state(files(tmp_path / "t"), 14)
    assert at_13.properties == {"mode": "sum"} and at_13.features()["minWriterVersion"] == 7
    assert at_14.properties == {"mode": "later"}
    # a checksum older than the checkpoint is not the nearer start
    assert table_state(files(tmp_path / "t"), 10).properties == {"mode": "checkpoint"}
    for text in ('{"metadata": {"id"', json.dumps({"tableSizeBytes": 10, "metadata": {"id": "x"}})):
        checksum(12, text)  # cut short while written, or from a writer that left the actions out
        for v in (11, 12):
            commit(log, v)
        assert table_state(files(tmp_path / "t"), 13).properties == {"mode": "checkpoint"}


def test_a_missing_commit_is_an_error_not_a_guess(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    commit(log, 0, PROTOCOL, meta(SCHEMA))
    commit(log, 2, add("a.parquet", 1))
    with pytest.raises(FileNotFoundError, match="commit 1 is missing"):
        table_state(files(tmp_path / "t"), 2)
