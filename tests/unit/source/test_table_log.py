"""Which way a table's log is read (source/deltalog/logfiles.py TableLog): Python where it can, without a JVM."""

from __future__ import annotations

import socket

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdc2ch.base.errors import SourceError
from cdc2ch.model.objectstore import S3Settings
from cdc2ch.source.deltalog.logfiles import LocalLogFiles, TableLog


def no_spark():
    pytest.fail("no Spark for this log")


def test_a_local_log_is_read_by_python_and_google_s_or_azure_s_through_spark(tmp_path):
    write_deltalake(str(tmp_path / "t"), pa.table({"id": [1, 2]}))
    local = TableLog(str(tmp_path / "t"), None, no_spark, S3Settings)
    assert local.by_python() and local.get(no_spark).latest_version() == 0
    assert isinstance(local.files, LocalLogFiles)
    for uri in ("gs://b/t", "abfss://c@a.dfs.core.windows.net/t"):
        assert (
            TableLog(uri, None, no_spark, S3Settings).by_python() is False
        )  # not tried: no client looks around


def test_an_s3_endpoint_that_refuses_says_so_without_a_jvm():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    keys = {
        "spark.hadoop.fs.s3a.access.key": "k",
        "spark.hadoop.fs.s3a.secret.key": "s",
    }  # no metadata server
    s3 = S3Settings.of(keys, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_REGION": "us-east-1"})
    log = TableLog("s3a://lake/t", None, no_spark, lambda: s3)
    with pytest.raises(SourceError, match="could not be reached") as refused:
        log.by_python()
    assert "no offset moved" in str(refused.value)


def test_a_turn_takes_the_table_properties_of_the_version_its_poll_found(tmp_path):
    """Without a version, the properties are those of the version the last poll found, read without another
    search of the log (on object storage, requests): a change committed since is the next poll's."""
    from deltalake import DeltaTable

    from cdc2ch.source.sparkread.tablemeta import LogMetadata

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [1, 2]}), configuration={"delta.appendOnly": "false"})
    table_log = TableLog(uri, None, no_spark, S3Settings)
    log = table_log.get(no_spark)
    metadata = LogMetadata(uri, table_log, lambda: log, lambda exc, *_: exc)
    assert log.latest().version == 0
    DeltaTable(uri).alter.set_table_properties({"delta.appendOnly": "true"})
    assert metadata.properties()["delta.appendOnly"] == "false"  # as of version 0, the poll's
    assert log.latest().version == 1 and metadata.properties()["delta.appendOnly"] == "true"
