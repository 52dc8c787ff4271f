"""Object storage as every reader reaches it: which connector a URI needs, and the S3 settings Spark,
pyarrow and ClickHouse each read from the same sources.

The sources are the standard ones: the AWS environment (`AWS_ENDPOINT_URL`, `AWS_REGION`, keys, profiles
and roles through each client's own default chain) and Hadoop's `fs.s3a.*` keys, given as
`spark.hadoop.fs.s3a.*` with `--spark-conf` or in the config file. Keys set there reach the readers that
take them as values; keys in the environment stay there, read by each client itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

# URI scheme -> the storage connector Spark needs for it (source/spark/jars.py fetches each).
CONNECTORS = {
    "s3a": "s3",
    "s3": "s3",
    "s3n": "s3",
    "abfs": "azure",
    "abfss": "azure",
    "wasb": "azure",
    "wasbs": "azure",
    "gs": "gcs",
}
# Spark conf listing connectors to put on the classpath besides those the tables' URIs need (a catalog
# table's location is known only once Spark runs).
CONNECTORS_KEY = "spark.cdc2ch.connectors"

_S3A = "spark.hadoop.fs.s3a."
# Hadoop's own providers first (keys and session tokens in fs.s3a.*), then the AWS SDK's default chain:
# environment, web identity, profiles, container and instance roles.
CREDENTIAL_CHAIN = ",".join(
    (
        "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
        "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
    )
)


def canonical_uri(uri: str) -> str:
    """`s3://` and `s3n://` name the same objects as `s3a://`, the scheme Hadoop reads S3 with."""
    scheme, sep, rest = uri.partition("://")
    return f"s3a://{rest}" if sep and scheme.lower() in ("s3", "s3n") else uri


def connector_of(uri: str) -> str | None:
    """The connector a location needs (s3, azure, gcs); None for local paths and other schemes."""
    return CONNECTORS.get(urlsplit(uri).scheme.lower())


def connectors_for(locations: list[str], conf: Mapping[str, str]) -> frozenset[str]:
    """The connectors a process reading `locations` needs, with those its Spark conf names."""
    named = {c.strip().lower() for c in conf.get(CONNECTORS_KEY, "").split(",") if c.strip()}
    return frozenset({c for c in map(connector_of, locations) if c} | named)


@dataclass(frozen=True)
class S3Settings:
    """Where S3 is and how to address it, from the Spark conf first and the environment second."""

    endpoint: str | None = None  # None: AWS itself
    region: str | None = None
    path_style: bool = False
    access_key: str | None = None  # only keys given in fs.s3a.*: the environment's stay there
    secret_key: str | None = None
    session_token: str | None = None

    def __repr__(self) -> str:
        return f"S3Settings(endpoint={self.endpoint!r}, region={self.region!r}, path_style={self.path_style})"

    @classmethod
    def of(cls, conf: Mapping[str, str], env: Mapping[str, str]) -> S3Settings:
        endpoint = (
            conf.get(_S3A + "endpoint")
            or env.get("AWS_ENDPOINT_URL_S3")
            or env.get("AWS_ENDPOINT_URL")
            or None
        )
        if endpoint and "://" not in endpoint:
            secure = conf.get(_S3A + "connection.ssl.enabled", "true").lower() != "false"
            endpoint = ("https://" if secure else "http://") + endpoint
        style = conf.get(_S3A + "path.style.access")
        return cls(
            endpoint=endpoint.rstrip("/") if endpoint else None,
            region=conf.get(_S3A + "endpoint.region")
            or env.get("AWS_REGION")
            or env.get("AWS_DEFAULT_REGION"),
            path_style=style.lower() == "true" if style else bool(endpoint and not _on_aws(endpoint)),
            access_key=conf.get(_S3A + "access.key"),
            secret_key=conf.get(_S3A + "secret.key"),
            session_token=conf.get(_S3A + "session.token"),
        )

    def hadoop_conf(self, conf: Mapping[str, str], provider_chain: bool) -> dict[str, str]:
        """The `spark.hadoop.fs.s3a.*` settings that bring the environment's endpoint (and with
        `provider_chain`, for the S3A connector cdc2ch ships, the SDK's default chain) to S3A, for the keys
        `conf` does not set itself. No secret among them."""
        derived = {_S3A + "aws.credentials.provider": CREDENTIAL_CHAIN} if provider_chain else {}
        if self.endpoint:
            derived[_S3A + "endpoint"] = self.endpoint
            derived[_S3A + "path.style.access"] = str(self.path_style).lower()
        if self.region:
            derived[_S3A + "endpoint.region"] = self.region
        return {k: v for k, v in derived.items() if k not in conf}

    def arrow_options(self) -> dict[str, object]:
        """Keyword arguments of pyarrow's S3FileSystem for the same store (its own chain finds the rest)."""
        options: dict[str, object] = {}
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            options.update(endpoint_override=parts.netloc + parts.path, scheme=parts.scheme)
            options["force_virtual_addressing"] = not self.path_style
        if self.region:
            options["region"] = self.region
        if self.access_key and self.secret_key:
            options.update(access_key=self.access_key, secret_key=self.secret_key)
            if self.session_token:
                options["session_token"] = self.session_token
        return options

    def http_url(self, uri: str) -> str:
        """The HTTP(S) URL of an s3a:// location, as ClickHouse's S3 reader takes it (ending in `/`)."""
        parts = urlsplit(uri)
        path = parts.path.rstrip("/") + "/"
        if self.endpoint and self.path_style:
            return f"{self.endpoint}/{parts.netloc}{path}"
        if self.endpoint:
            scheme, host = self.endpoint.split("://", 1)
            return f"{scheme}://{parts.netloc}.{host}{path}"
        host = f"s3.{self.region}.amazonaws.com" if self.region else "s3.amazonaws.com"
        return f"https://{parts.netloc}.{host}{path}"


def _on_aws(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    return host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn")
