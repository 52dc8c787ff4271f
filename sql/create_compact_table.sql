-- The last compaction of each target table (the latest finished_at wins): what `status` shows and when a
-- service's --compact-every compacts next. removed_total: tombstones removed by every compaction recorded.
CREATE TABLE IF NOT EXISTS {table}
(
    `target`         String,
    `finished_at`    DateTime64(3, 'UTC'),
    `cutoff`         Nullable(DateTime64(3, 'UTC')),
    `removed`        UInt64,
    `kept`           UInt64,
    `rows_before`    UInt64,
    `rows_after`     UInt64,
    `recovered`      UInt64,
    `seconds`        Float64,
    `removed_total`  UInt64
)
ENGINE = ReplacingMergeTree(`finished_at`)
ORDER BY `target`
