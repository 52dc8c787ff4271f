-- Who runs each pipeline: one row per claim (token), refreshed by a heartbeat; the newest heartbeat of a
-- claim wins. A claim counts while it is not released and its heartbeat is younger than the lock TTL, so a
-- killed runner stops blocking others once its heartbeat ages out. Old claims expire after a week.
CREATE TABLE IF NOT EXISTS {table}
(
    `pipeline`     String,
    `token`        String,
    `holder`       String,
    `host`         String,
    `pid`          UInt32,
    `claimed_at`   DateTime64(3, 'UTC'),
    `heartbeat_at` DateTime64(3, 'UTC'),
    `released`     UInt8
)
ENGINE = ReplacingMergeTree(`heartbeat_at`)
ORDER BY (`pipeline`, `token`)
TTL toDateTime(`heartbeat_at`) + INTERVAL 7 DAY
