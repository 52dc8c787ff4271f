"""Delta tables read through Spark: the source, its change-feed scans and reads to Arrow."""
