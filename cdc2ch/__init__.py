"""cdc2ch: replicate Delta Lake tables into ClickHouse through Delta's Change Data Feed."""

__version__ = "0.1.0"
