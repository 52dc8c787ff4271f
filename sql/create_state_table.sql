-- Replication offsets, one row per pipeline (the latest updated_at wins). committed_version moves only
-- after every batch of a version range has landed, so a crash replays the range instead of skipping it.
-- pending_version is the end of the range being written: a restart replays exactly that range, so the
-- replayed batches match the first attempt's deduplication tokens.
-- location: where the table's files were when last resolved (a catalog name's location may change);
-- table_id: the Delta table's id (metaData.id), new for a table dropped and created again.
-- initial_load, initial_reason: how a new pipeline began (a snapshot or the change feed), and why.
CREATE TABLE IF NOT EXISTS {table}
(
    `pipeline`          String,
    `source`            String,
    `target`            String,
    `committed_version` Int64,
    `pending_version`   Int64,
    `rows_written`      UInt64,
    `updated_at`        DateTime64(3, 'UTC'),
    `location`          String DEFAULT '',
    `table_id`          String DEFAULT '',
    `initial_load`      String DEFAULT '',
    `initial_reason`    String DEFAULT ''
)
ENGINE = ReplacingMergeTree(`updated_at`)
ORDER BY `pipeline`
