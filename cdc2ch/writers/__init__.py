"""Range writers (the RangeWriter port): driver Arrow batches, Spark executors, ClickHouse push-down."""
