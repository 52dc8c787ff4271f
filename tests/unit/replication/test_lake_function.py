"""ClickHouse reading the lake itself (--reader clickhouse): the table function for each place."""

from __future__ import annotations

import pytest

from cdc2ch.base.errors import ConfigError, SourceError
from cdc2ch.clickhouse.writers.lakesql import LakeAccess, lake_access, lake_function
from cdc2ch.clickhouse.writers.pushdown import files_gone
from cdc2ch.model.config import RunConfig, SparkSettings, TargetName
from cdc2ch.model.objectstore import S3Settings


def test_clickhouse_s_lake_function_for_each_place_and_a_server_s_named_collection():
    assert lake_function("/lake/t") == "deltaLakeLocal('/lake/t')"
    assert lake_function("s3a://lake/t") == "deltaLake('https://lake.s3.amazonaws.com/t/')"
    minio = S3Settings.of({}, {"AWS_ENDPOINT_URL": "http://minio:9000"})
    assert lake_function("s3a://lake/t", LakeAccess(minio, "lake_s3")) == (
        "deltaLake(lake_s3, url = 'http://minio:9000/lake/t/')"
    )
    assert lake_function("https://host/t", LakeAccess(minio, "lake_s3")) == "deltaLake('https://host/t/')"
    with pytest.raises(SourceError, match="--reader spark"):
        lake_function("abfss://c@a.dfs.core.windows.net/t")

    ceph = SparkSettings(conf=(("spark.hadoop.fs.s3a.endpoint", "http://ceph:7480"),))
    cfg = RunConfig(
        "s3a://lake/t", ("id",), TargetName("db", "t"), "chdb://x", "p", spark=ceph, lake_collection="ceph"
    )
    assert lake_access(cfg) == LakeAccess(S3Settings.of(dict(cfg.spark.conf), {}), "ceph")
    with pytest.raises(ConfigError, match="letters, digits and underscores"):
        RunConfig("s3a://lake/t", ("id",), TargetName("db", "t"), "chdb://x", "p", lake_collection="x) --")


def test_a_file_of_the_table_that_is_gone_is_told_apart_from_other_read_failures():
    kernel = (
        "Code: 742. DB::Exception: Received DeltaLake kernel error ParquetError: Arrow error: External: Object "
        "at location /tmp/p/orders/_change_data/cdc-00000-d5.c000.snappy.parquet not found: No such file or "
        "directory (os error 2) (in scan_table_changes_next)"
    )
    assert files_gone(kernel, "/tmp/p/orders")
    assert files_gone(
        "Code: 499. DB::Exception: The specified key does not exist. (NoSuchKey) while reading "
        "lake/sales/orders/part-00000-1.snappy.parquet",
        "s3a://lake/sales/orders",
    )
    assert not files_gone(kernel, "/tmp/p/customers")  # another table's file
    assert not files_gone(
        "Code: 47. Missing columns: 'x' while reading /tmp/p/orders/part-0.parquet", "/tmp/p/orders"
    )
    assert not files_gone("Code: 60. Table t not found", "/tmp/p/orders")
