-- What was asked of each pipeline from outside its service (the latest requested_at wins): `cdc2ch pause`,
-- `resume` and `resync`; a running service reads it every poll and records a resync it has done.
CREATE TABLE IF NOT EXISTS {table}
(
    `pipeline`     String,
    `action`       LowCardinality(String),
    `reason`       String,
    `requested_by` String,
    `requested_at` DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(`requested_at`)
ORDER BY `pipeline`
