"""Target tables: their DDL, whether an existing one fits the design, compaction."""
