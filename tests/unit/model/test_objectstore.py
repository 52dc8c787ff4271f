"""Object storage settings: one source of truth (Spark conf, then the AWS environment) for every reader."""

from __future__ import annotations

import pytest

from cdc2ch.model.objectstore import (
    CONNECTORS_KEY,
    CREDENTIAL_CHAIN,
    S3Settings,
    canonical_uri,
    connector_of,
    connectors_for,
)
from cdc2ch.model.tableref import normalize_uri

S3A = "spark.hadoop.fs.s3a."


@pytest.mark.parametrize(
    ("uri", "canonical"),
    [
        ("s3://lake/sales/orders", "s3a://lake/sales/orders"),
        ("S3://lake/t", "s3a://lake/t"),
        ("s3n://lake/t", "s3a://lake/t"),
        ("s3a://lake/t", "s3a://lake/t"),
        ("abfss://c@acct.dfs.core.windows.net/t", "abfss://c@acct.dfs.core.windows.net/t"),
    ],
)
def test_s3_uris_read_as_s3a(uri, canonical):
    assert canonical_uri(uri) == canonical
    assert normalize_uri(uri) == canonical  # the pipeline's identity: one table, one name


def test_a_local_path_is_no_uri():
    assert canonical_uri("lake/s3://x") == "lake/s3://x"


def test_each_scheme_names_its_connector_and_the_conf_adds_more():
    assert [
        connector_of(u) for u in ("s3a://b/t", "S3://b/t", "abfss://c@a/t", "wasbs://c@a/t", "gs://b/t")
    ] == [
        "s3",
        "s3",
        "azure",
        "azure",
        "gcs",
    ]
    assert connector_of("/lake/t") is None and connector_of("file:/lake/t") is None
    assert connector_of("hdfs://nn/t") is None
    assert connectors_for(["/a", "s3a://b/t", "gs://b/t"], {}) == {"s3", "gcs"}
    assert connectors_for(["/a"], {CONNECTORS_KEY: " S3, azure ,"}) == {"s3", "azure"}
    assert connectors_for([], {}) == frozenset()


def test_the_environment_s_endpoint_reaches_s3a_with_path_style_and_the_default_chain():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000/", "AWS_REGION": "eu-west-1"}
    s3 = S3Settings.of({}, env)
    assert (s3.endpoint, s3.region, s3.path_style) == ("http://127.0.0.1:9000", "eu-west-1", True)
    assert s3.hadoop_conf({}, provider_chain=True) == {
        S3A + "aws.credentials.provider": CREDENTIAL_CHAIN,
        S3A + "endpoint": "http://127.0.0.1:9000",
        S3A + "path.style.access": "true",
        S3A + "endpoint.region": "eu-west-1",
    }
    # what the user set stays theirs; without cdc2ch's connector, no provider of the SDK it ships
    mine = {S3A + "endpoint.region": "us-west-2"}
    assert S3Settings.of(mine, env).hadoop_conf(mine, provider_chain=False) == {
        S3A + "endpoint": "http://127.0.0.1:9000",
        S3A + "path.style.access": "true",
    }
    assert S3Settings.of({}, {}).hadoop_conf({}, provider_chain=False) == {}
    # the S3-only variable wins over the general one
    both = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://s3:2", "AWS_DEFAULT_REGION": "x"}
    assert (S3Settings.of({}, both).endpoint, S3Settings.of({}, both).region) == ("http://s3:2", "x")


def test_spark_conf_wins_over_the_environment_and_its_keys_reach_pyarrow_only():
    conf = {
        S3A + "endpoint": "minio.local:9000",
        S3A + "connection.ssl.enabled": "false",
        S3A + "path.style.access": "false",
        S3A + "access.key": "AK",
        S3A + "secret.key": "SK",
        S3A + "session.token": "TOKEN",
    }
    s3 = S3Settings.of(conf, {"AWS_ENDPOINT_URL": "http://elsewhere:1"})
    assert (s3.endpoint, s3.path_style) == ("http://minio.local:9000", False)
    assert s3.arrow_options() == {
        "endpoint_override": "minio.local:9000",
        "scheme": "http",
        "force_virtual_addressing": True,
        "access_key": "AK",
        "secret_key": "SK",
        "session_token": "TOKEN",
    }
    assert "AK" not in repr(s3) and "SK" not in repr(s3) and "TOKEN" not in repr(s3)
    assert all("key" not in k and "token" not in k for k in s3.hadoop_conf({}, provider_chain=True))
    # TLS by default; an AWS endpoint keeps virtual hosts
    aws = S3Settings.of({S3A + "endpoint": "s3.eu-west-1.amazonaws.com"}, {})
    assert (aws.endpoint, aws.path_style) == ("https://s3.eu-west-1.amazonaws.com", False)
    assert S3Settings.of({}, {}).arrow_options() == {}
    assert S3Settings.of({S3A + "access.key": "AK"}, {}).arrow_options() == {}  # half a pair is not a pair


def test_clickhouse_reads_s3a_at_the_same_endpoint():
    assert S3Settings().http_url("s3a://lake/sales/orders") == "https://lake.s3.amazonaws.com/sales/orders/"
    assert (
        S3Settings(region="eu-west-1").http_url("s3a://lake/t/")
        == "https://lake.s3.eu-west-1.amazonaws.com/t/"
    )
    minio = S3Settings.of({}, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    assert minio.http_url("s3a://lake/sales/orders") == "http://127.0.0.1:9000/lake/sales/orders/"
    hosted = S3Settings(endpoint="https://r2.example.com", path_style=False)
    assert hosted.http_url("s3a://lake/t") == "https://lake.r2.example.com/t/"
