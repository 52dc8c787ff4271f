-- Snapshot progress, next to the offsets: one row per finished chunk, so a killed snapshot started again
-- with the same arguments skips what already landed. `plan` fingerprints the chunking (files and split
-- settings); a different plan starts over, which is safe because snapshot rows are idempotent under FINAL.
CREATE TABLE IF NOT EXISTS {table}
(
    `pipeline` String,
    `version`  Int64,
    `plan`     String,
    `chunk`    UInt32,
    `rows`     UInt64,
    `done_at`  DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(`done_at`)
ORDER BY (`pipeline`, `version`, `plan`, `chunk`)
