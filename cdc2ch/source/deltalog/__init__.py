"""The Delta log read by Python, no JVM: commits, files, a version's state, replays."""
