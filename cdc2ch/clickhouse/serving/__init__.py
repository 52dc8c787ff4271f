"""The embedded engine behind the ClickHouse HTTP interface: statements, the read-only gate."""
