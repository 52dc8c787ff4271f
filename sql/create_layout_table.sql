-- The layout of cdc2ch's own tables in this database (the highest layout wins): a newer cdc2ch upgrades an
-- older layout in place and records its own; an older cdc2ch refuses a layout newer than it knows.
CREATE TABLE IF NOT EXISTS {table}
(
    `layout`     UInt32,
    `written_by` String,
    `written_at` DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(`written_at`)
ORDER BY `layout`
