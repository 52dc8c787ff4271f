"""Many pipelines in one process: table patterns, their discovery, and the runner that schedules them, driving
the ports of `serviceports`, which `assembly` builds."""
