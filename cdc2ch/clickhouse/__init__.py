"""The ClickHouse side of cdc2ch, on clickhouse-connect whatever the target (embedded chdb or a server).

Packages, each importing only those before it: `codes` (error codes) <- `connection` (one target: the Sink
and its calls, retries and errors; the embedded engine or a server, picked from a DSN; where its tables
live) <- `state` (cdc2ch's own tables: offsets, snapshot progress, health, claims, requests, compactions)
<- `tables` (target tables: DDL, adoption, compaction). `writers` (a range's and a snapshot's inserts, Spark
tasks' included) build on `connection`. `serving` puts the embedded engine behind the
ClickHouse HTTP interface.
"""
