"""Errors a user can cause or meet. Each carries one paragraph: what happened and what to do."""


class Cdc2chError(Exception):
    """A failure with a message fit for the user; the CLI prints it and exits non-zero."""

    exit_code = 1


class ConfigError(Cdc2chError):
    """Bad flags or arguments."""

    exit_code = 2


class SourceError(Cdc2chError):
    """The Delta table cannot be read as asked."""


class SinkError(Cdc2chError):
    """ClickHouse refused or could not be reached."""


class StateError(Cdc2chError):
    """The stored offset disagrees with what was asked."""


class SchemaChangeError(SourceError):
    """The Delta schema changed in a way the ClickHouse table cannot follow in place."""
