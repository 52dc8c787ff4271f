"""The Spark session: its jars, class archive, settings, jobs and threads, started on first use."""
