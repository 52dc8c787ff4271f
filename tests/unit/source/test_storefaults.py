"""Object storage's refusals, as S3A, pyarrow and ClickHouse word them, each read as its cause and what to do."""

from __future__ import annotations

import pytest

from cdc2ch.source.spark.jars import hadoop_version
from cdc2ch.source.storefaults import storage_error

URI = "s3a://lake/sales/orders"

# One failure text of each cause from each client that meets it (abridged as they come).
TEXTS = {
    "connector": [
        "py4j.protocol.Py4JJavaError: An error occurred while calling o52.load.\n: java.lang.RuntimeException: "
        "java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found",
        'org.apache.hadoop.fs.UnsupportedFileSystemException: No FileSystem for scheme "s3a"',
    ],
    "credentials": [
        "When getting information for key 'sales/orders/_delta_log/00000000000000000000.json' in bucket 'lake': "
        "AWS Error ACCESS_DENIED during HeadObject operation: No response body.",
        "java.nio.file.AccessDeniedException: s3a://lake/sales/orders/_delta_log: getFileStatus on "
        "s3a://lake/sales/orders/_delta_log: software.amazon.awssdk.services.s3.model.S3Exception: Forbidden "
        "(Service: S3, Status Code: 403, Request ID: x)",
        "Code: 499. DB::Exception: Access Denied. (S3_ERROR)",
        "AWS Error UNKNOWN (HTTP status 403) during GetObject operation: InvalidAccessKeyId",
        "java.io.IOException: Error getting access token from metadata server at: 'http://169.254.169.254/"
        "computeMetadata/v1/instance/service-accounts/default/token'. cause='403 Forbidden",
        'Failure to initialize configuration for acct.dfs.core.windows.net key ="null": Invalid configuration '
        "value detected for fs.azure.account.key",
    ],
    "bucket": [
        "When listing objects under key 'sales/orders/_delta_log' in bucket 'lake': AWS Error NO_SUCH_BUCKET "
        "during ListObjectsV2 operation: The specified bucket does not exist",
        "software.amazon.awssdk.services.s3.model.NoSuchBucketException: The specified bucket does not exist",
    ],
    "unreachable": [
        "When reading information for key 'x' in bucket 'lake': AWS Error NETWORK_CONNECTION during HeadObject "
        "operation: curlCode: 7, Couldn't connect to server",
        "org.apache.hadoop.fs.s3a.AWSClientIOException: getFileStatus on s3a://lake/x: "
        "software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request: Connection "
        "refused",
        "java.net.UnknownHostException: lake.s3.nowhere.example",
    ],
    "region": [
        "AWS Error UNKNOWN (HTTP status 301) during HeadObject operation: PermanentRedirect",
        "AuthorizationHeaderMalformed: the region 'us-east-1' is wrong; expecting 'eu-west-1'",
    ],
    "clock": [
        "RequestTimeTooSkewed: The difference between the request time and the current time is too large."
    ],
    "token": [
        "<Error><Code>InvalidToken</Code><Message>The provided token is malformed or otherwise invalid."
    ],
    "throttled": [
        "AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.",
        "org.apache.hadoop.fs.s3a.AWSServiceThrottledException: getFileStatus: SlowDown (Status Code: 503)",
        "AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body.",
    ],
}
WORDS = {
    "connector": "no file system for s3a://",
    "credentials": "refused the credentials",
    "bucket": "The bucket lake does not exist",
    "unreachable": "could not be reached",
    "region": "another region",
    "clock": "clock",
    "token": "session token",
    "throttled": "throttling",
}


@pytest.mark.parametrize(("cause", "text"), [(c, t) for c, texts in TEXTS.items() for t in texts])
def test_each_refusal_is_read_as_its_cause(cause, text):
    found = storage_error(text, URI, "the Delta log")
    assert found is not None, text
    message = str(found)
    assert WORDS[cause] in message, message
    assert message.startswith(f"Reading the Delta log of {URI} failed: ")
    assert message.endswith("run the same command again once it is fixed.")
    for other, words in WORDS.items():
        if other != cause:
            assert words not in message, f"{cause} read as {other}: {message}"


def test_the_connector_paragraph_names_the_package_for_each_storage():
    text = "ClassNotFoundException: Class org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem not found"
    azure = str(storage_error(text, "abfss://c@acct.dfs.core.windows.net/t", "the Delta log"))
    assert f"org.apache.hadoop:hadoop-azure:{hadoop_version()} there" in azure
    assert "spark.cdc2ch.connectors=azure" in azure
    gcs = str(storage_error('No FileSystem for scheme "gs"', "gs://b/t", "the Delta log"))
    assert "gcs-connector" in gcs and "spark.cdc2ch.connectors=gcs" in gcs


def test_local_tables_and_other_failures_are_not_storage_failures():
    assert storage_error("java.nio.file.AccessDeniedException: /lake/t", "/lake/t", "the Delta log") is None
    assert storage_error("DELTA_MISSING_CHANGE_DATA", URI, "the Delta log") is None
    assert storage_error("Py4JJavaError: something else entirely", URI, "the Delta log") is None
