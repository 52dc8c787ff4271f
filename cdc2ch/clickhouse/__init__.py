"""The ClickHouse side of cdc2ch, on clickhouse-connect whatever the target (embedded chdb or a server).

Layers, each importing only those before it: `codes` (error codes) <- `transport` (Sink: calls, retries,
errors) <- `embedded`, `server` (open a client) <- `dsn` (pick one from a DSN); `ddl` (target tables),
`state` (offsets, snapshot progress, health) and `lock` (one runner per pipeline) work on a Sink.
"""
