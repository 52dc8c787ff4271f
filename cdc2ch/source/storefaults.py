"""What object storage's refusals mean, in one paragraph each: the text of a failure from Spark (S3A, ABFS,
GCS connectors), pyarrow or ClickHouse's reader, recognised by the words those clients use for it."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from cdc2ch.base.errors import SourceError
from cdc2ch.model.objectstore import connector_of
from cdc2ch.source.spark.jars import connector

_KEPT = "Nothing was written and no offset moved: run the same command again once it is fixed."


def _bucket(uri: str) -> str:
    return urlsplit(uri).netloc or uri


_CAUSES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "connector",
        re.compile(
            r"ClassNotFoundException: Class org\.apache\.hadoop\.fs\.\w+\.\w+|No FileSystem for scheme"
            r"|ClassNotFoundException: Class com\.google\.cloud\.hadoop\.fs",
        ),
        "",
    ),
    (
        "clock",
        re.compile(r"RequestTimeTooSkewed|RequestExpired|time skew", re.I),
        "The storage refused the request because this machine's clock differs too much from its own "
        "(signed requests are valid for minutes). Synchronise the clock (chrony, systemd-timesyncd), then "
        "run again.",
    ),
    (
        "region",
        re.compile(
            r"PermanentRedirect|AuthorizationHeaderMalformed|IllegalLocationConstraint|wrong region"
            r"|\b301\b.*Moved Permanently|the region '[^']*' is wrong",
            re.I,
        ),  # fmt: skip
        "The bucket is in another region than the one the request went to. Set the bucket's region: "
        "AWS_REGION in the environment, or --spark-conf spark.hadoop.fs.s3a.endpoint.region=<region>.",
    ),
    (
        "token",
        re.compile(r"InvalidToken|token is malformed|ExpiredToken|token has expired", re.I),
        "The storage refused the session token sent with the request (malformed or expired). Refresh the "
        "temporary credentials (AWS_SESSION_TOKEN with its keys, or the role that issues them). ClickHouse's "
        "Delta reader (--reader clickhouse) sends an empty session token with static keys, which stores that "
        "check tokens refuse: give it temporary credentials, or read with --reader spark.",
    ),
    (
        "credentials",
        re.compile(
            r"AccessDenied|Access Denied|ACCESS_DENIED|InvalidAccessKeyId|SignatureDoesNotMatch|403 Forbidden"
            r"|Status Code: 403|status code: 403|HTTP status 403|AuthorizationPermissionMismatch"
            r"|Error getting access token|Invalid configuration value detected for fs\.azure|AuthenticationFailed"
            r"|NoAuthWithAWSException|No AWS Credentials|Unable to load credentials|Forbidden \(403\)",
        ),
        "The storage refused the credentials, or found none (a wrong or missing key, or a role without read "
        "access to the table). On S3, cdc2ch reads with the AWS default chain: AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN for temporary keys), AWS_PROFILE, or the instance's or "
        "pod's role; or spark.hadoop.fs.s3a.access.key and .secret.key in the config file's spark-conf (not "
        "on the command line); the role needs s3:ListBucket on the bucket and s3:GetObject on the table. On "
        "ADLS, set spark.hadoop.fs.azure.account.* (OAuth or an account key); on GCS, "
        "GOOGLE_APPLICATION_CREDENTIALS.",
    ),
    (
        "bucket",
        re.compile(
            r"NoSuchBucket|bucket does not exist|NO_SUCH_BUCKET|ContainerNotFound|Bucket not found", re.I
        ),
        "",
    ),
    (
        "unreachable",
        re.compile(
            r"UnknownHostException|Unable to execute HTTP request|Connection refused|NETWORK_CONNECTION"
            r"|Could not resolve host|Name or service not known|ConnectException|connect timed out"
            r"|SdkClientException: Received an UnknownHostException|Couldn't connect to server",
        ),
        "",
    ),
    (
        "throttled",
        re.compile(
            r"SlowDown|503 Service Unavailable|Status Code: 503|ServiceUnavailable|SLOW_DOWN"
            r"|Please reduce your request rate|AWSStatus500Exception|InternalError|HTTP status 50[03]",
            re.I,
        ),  # fmt: skip
        "The storage is throttling or unavailable (503 SlowDown or a server error) and stayed so through the "
        "client's retries. This passes: a service retries at its next poll; from cron, the next run "
        "continues. If it persists, lower the request rate (fewer pipelines at once with --max-parallel) or "
        "check the store's health.",
    ),
)


def storage_error(text: str, uri: str, what: str) -> SourceError | None:
    """The paragraph for a failure reading `what` of the table at `uri` whose text names an object-storage
    cause; None for any other failure."""
    if connector_of(uri) is None:
        return None
    for cause, pattern, advice in _CAUSES:
        if pattern.search(text):
            return SourceError(f"Reading {what} of {uri} failed: {_advice(cause, advice, uri)} {_KEPT}")
    return None


def _advice(cause: str, advice: str, uri: str) -> str:
    if cause == "connector":
        scheme = urlsplit(uri).scheme
        package = ",".join(connector(connector_of(uri) or "s3").packages)
        return (
            f"Spark has no file system for {scheme}:// URIs: the storage connector is not on its classpath. "
            f"cdc2ch adds it by itself for tables it is given by path, unless spark.jars or "
            f"spark.jars.packages is set (then add {package} there), and for a catalog table once it is "
            f"named: --spark-conf spark.cdc2ch.connectors={connector_of(uri)}."
        )
    if cause == "bucket":
        return (
            f"The bucket {_bucket(uri)} does not exist at this endpoint. Check the bucket's name in --table, "
            f"and the endpoint (AWS_ENDPOINT_URL, or spark.hadoop.fs.s3a.endpoint for an S3-compatible store)."
        )
    if cause == "unreachable":
        return (
            "The storage endpoint could not be reached (unknown host or connection refused). Check the "
            "endpoint: AWS_ENDPOINT_URL, or spark.hadoop.fs.s3a.endpoint (with "
            "spark.hadoop.fs.s3a.path.style.access=true for MinIO, Ceph and most S3-compatible stores), and "
            "that this machine reaches it (proxy, firewall, DNS)."
        )
    return advice
