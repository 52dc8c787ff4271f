-- Replicated Delta table. One row per change; FINAL collapses each row identity (its sorting key within
-- its partition) to its state at the last committed Delta version (design: _version = _commit_version * 4
-- + rank, rank 3 live, 2 delete, 1 update pre-image). Deleted rows stay as tombstones (_is_deleted = 1).
-- Replayed batches carry the same insert_deduplication_token and are dropped on arrival
-- (non_replicated_deduplication_window, among the settings); merges are vertical, one column at a time
-- (vertical_merge_algorithm_min_columns_to_activate = 1, also among them).
CREATE TABLE IF NOT EXISTS {table}
(
{columns},
    `_commit_version`   UInt64,
    `_commit_timestamp` DateTime64(3, 'UTC'),
    `_change_type`      LowCardinality(String),
    `_is_deleted`       UInt8,
    `_version`          UInt64,
    `_synced_at`        DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(`_version`, `_is_deleted`)
{partition_by}ORDER BY ({order_by})
SETTINGS {settings}
