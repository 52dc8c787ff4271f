"""Whole-table loads: a snapshot at one version, resumable by chunk, and the resync built on it."""
