-- The last `cdc2ch verify` of each pipeline (the latest finished_at wins): what `status` and the metrics show.
CREATE TABLE IF NOT EXISTS {table}
(
    `pipeline`    String,
    `version`     Int64,
    `ok`          UInt8,
    `missing`     UInt64,
    `extra`       UInt64,
    `differing`   UInt64,
    `repaired`    UInt64,
    `summary`     String,
    `finished_at` DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(`finished_at`)
ORDER BY `pipeline`
