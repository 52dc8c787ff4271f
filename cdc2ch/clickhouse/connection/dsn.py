"""A ClickHouse target named by a DSN: `chdb:///path` (the embedded engine) or `http(s)://user@host:port/db`
(a server; the password comes from the environment, never from the DSN)."""

from __future__ import annotations

from cdc2ch.base.errors import ConfigError, SinkError
from cdc2ch.base.log import get_logger
from cdc2ch.clickhouse.connection import embedded, remote
from cdc2ch.clickhouse.connection.placement import placement
from cdc2ch.clickhouse.connection.remote import redact
from cdc2ch.clickhouse.connection.transport import Sink

__all__ = ["EMBEDDED_SCHEMES", "SERVER_SCHEMES", "connect", "redact"]

log = get_logger("cdc2ch.clickhouse")

EMBEDDED_SCHEMES = ("chdb:",)
SERVER_SCHEMES = ("http://", "https://", "clickhouse://", "clickhouses://")


def connect(
    dsn: str, retries: int = 5, create: bool = True, reader: bool = False, cluster: str | None = None
) -> Sink:
    """Open the target named by a DSN: chdb:///path (embedded) or http(s)://user@host:port/db (server).
    `create` False: an embedded database must exist already (for commands that work on one). A `reader`
    (status, query) of an embedded directory held by a `cdc2ch run --serve` goes through that service.
    `cluster`: the server's cluster the targets live on (placement.Cluster)."""
    if dsn.startswith(EMBEDDED_SCHEMES):
        if cluster:
            raise ConfigError(
                f"--cluster {cluster} names a ClickHouse cluster, but --clickhouse {redact(dsn)} is the embedded "
                f"engine, which is one process and has no cluster. Point --clickhouse at a node of the cluster "
                f"(http(s)://user@host:8123/database), or drop --cluster."
            )
        return embedded.connect(dsn, retries, create, via_service=reader)
    if dsn.startswith(SERVER_SCHEMES):
        sink = remote.connect(dsn, retries, placement=placement(cluster))
        if cluster:
            _check_cluster(sink, cluster)
        return sink
    raise SinkError(
        f"--clickhouse {redact(dsn)!r} is not a DSN cdc2ch understands. Use chdb:///absolute/path for the "
        f"embedded engine or http(s)://user@host:8123/database for a server (password in the "
        f"CDC2CH_CLICKHOUSE_PASSWORD environment variable)."
    )


def _check_cluster(sink: Sink, cluster: str) -> None:
    """Refuse a --cluster the server does not define, before any statement ON CLUSTER is sent."""
    rows = sink.query_rows(
        "SELECT cluster, uniqExact(shard_num), count() FROM system.clusters GROUP BY cluster ORDER BY cluster",
        what="list the server's clusters",
    )
    known = {name: (int(shards), int(nodes)) for name, shards, nodes in rows}
    if cluster in known:
        log.info("cluster", cluster=cluster, shards=known[cluster][0], nodes=known[cluster][1])
        return
    sink.close()
    listed = f"its clusters are {', '.join(sorted(known))}" if known else "it defines no cluster"
    raise ConfigError(
        f"--cluster {cluster} names no cluster of ClickHouse at {sink.display}: {listed} (system.clusters, "
        f"from the server's remote_servers). Name one of them, or drop --cluster to write to this server "
        f"alone. Nothing was written."
    )
