"""The Delta side: a Spark session with Delta enabled, and reads of versions, changes and snapshots."""
