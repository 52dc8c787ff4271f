"""cdc2ch: replicate Delta Lake tables into ClickHouse through Delta's Change Data Feed.

The Python API is cdc2ch.api (`replicate`, `snapshot`, `status`); `cdc2ch.replicate` is its `replicate`
too. (`cdc2ch.replication.fullload.snapshot` and `cdc2ch.commands.status` are the modules doing that work, hence not
the functions.) It is imported on first use, so that the command line does not pay for it."""

from cdc2ch.base.version import __version__

__all__ = ["__version__"]

_API = ("replicate", "ReplicateResult", "SnapshotResult", "PipelineStatus")


def __getattr__(name: str):
    if name in _API:
        from cdc2ch import api

        return getattr(api, name)
    raise AttributeError(f"module 'cdc2ch' has no attribute {name!r}")
