-- How each pipeline fares, one row per pipeline (the latest updated_at wins): what `cdc2ch status` shows
-- besides the offsets, including pipelines that failed before replicating anything.
CREATE TABLE IF NOT EXISTS {table}
(
    `pipeline`        String,
    `source`          String,
    `target`          String,
    `last_success_at` Nullable(DateTime64(3, 'UTC')),
    `last_error`      String,
    `last_error_kind` LowCardinality(String),
    `last_error_at`   Nullable(DateTime64(3, 'UTC')),
    `failures`        UInt32,
    `updated_at`      DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(`updated_at`)
ORDER BY `pipeline`
