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
    """ClickHouse refused or could not be reached.

    `code` is ClickHouse's error code when it gave one (see cdc2ch.clickhouse.codes), else None: test
    `exc.code == codes.X` rather than the message text.
    """

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # keeps the code across pickling (Spark, multiprocessing)
        return (type(self), (str(self), self.code))


class StateError(Cdc2chError):
    """The stored offset disagrees with what was asked."""


class SchemaChangeError(SourceError):
    """The Delta schema changed in a way the ClickHouse table cannot follow in place."""
