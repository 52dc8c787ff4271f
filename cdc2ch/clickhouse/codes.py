"""The ClickHouse error codes cdc2ch acts on, and how to read one off an exception.

clickhouse-connect puts the server's numeric code on its exceptions (`Error.code`), over HTTP (from the
X-ClickHouse-Exception-Code header) and from the embedded engine alike; it is None for transport errors
(refused connections, resets, timeouts). cdc2ch decides by that number, never by the message text, whose
digits may as well be a port or a query id. Names and numbers as in ClickHouse's src/Common/ErrorCodes.cpp.
"""

from __future__ import annotations

from clickhouse_connect.driver.exceptions import Error, OperationalError

from cdc2ch.base.errors import SinkError, chain

UNEXPECTED_END_OF_FILE = 3
BAD_ARGUMENTS = 36
UNKNOWN_TABLE = 60
SYNTAX_ERROR = 62
CANNOT_OPEN_FILE = 76
UNKNOWN_DATABASE = 81
UNKNOWN_SETTING = 115
TIMEOUT_EXCEEDED = 159
READONLY = 164
UNKNOWN_USER = 192
WRONG_PASSWORD = 193
REQUIRED_PASSWORD = 194
TOO_MANY_SIMULTANEOUS_QUERIES = 202
SOCKET_TIMEOUT = 209
NETWORK_ERROR = 210
ABORTED = 236
MEMORY_LIMIT_EXCEEDED = 241
TABLE_IS_READ_ONLY = 242
TOO_MANY_PARTS = 252
UNKNOWN_STATUS_OF_INSERT = 319
CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN = 349
QUERY_WAS_CANCELLED = 394
SYSTEM_ERROR = 425
ACCESS_DENIED = 497
AUTHENTICATION_FAILED = 516
KEEPER_EXCEPTION = 999

# Worth another try: the server is busy or restarting, a replica is read-only for a moment (242: its Keeper
# session is being restored), or the network hiccuped. READONLY (164) is not: it is the user's own setting.
TRANSIENT = frozenset(
    {
        UNEXPECTED_END_OF_FILE,
        TIMEOUT_EXCEEDED,
        TOO_MANY_SIMULTANEOUS_QUERIES,
        SOCKET_TIMEOUT,
        NETWORK_ERROR,
        ABORTED,
        TABLE_IS_READ_ONLY,
        TOO_MANY_PARTS,
        UNKNOWN_STATUS_OF_INSERT,
        QUERY_WAS_CANCELLED,
        SYSTEM_ERROR,
        KEEPER_EXCEPTION,
    }
)

# The server refused the user or the password. Current servers answer all of these with 516; older ones
# told an unknown user from a wrong or missing password.
CREDENTIALS_REJECTED = frozenset({AUTHENTICATION_FAILED, UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD})


# Refusals another try cannot change, and what to do about each (the server's own text says what was refused).
REFUSED = {
    READONLY: "This connection may only read (ClickHouse's `readonly` setting, or a read-only endpoint such as "
    "`cdc2ch run --serve`): connect as a user that may write, or run this command where the data is written.",
    ACCESS_DENIED: "The user lacks a privilege the statement needs (the server's text above names it): GRANT "
    "it to the user cdc2ch connects as, or connect as another user.",
}


def clickhouse_error(exc: BaseException | None) -> Error | None:
    """The first clickhouse-connect error in `exc`'s chain (itself included), or None."""
    return next((e for e in chain(exc) if isinstance(e, Error)), None)


def error_code(exc: BaseException | None) -> int | None:
    """The ClickHouse error code behind `exc`: the first code a clickhouse-connect error in its chain
    carries (a cdc2ch SinkError's own `code` counts too), or None."""
    for e in chain(exc):
        code = e.code if isinstance(e, (Error, SinkError)) else None
        if isinstance(code, int):
            return code
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether trying again may succeed. With a ClickHouse code, the code decides; without one, a failure
    of the transport (connection refused or reset, timeout) is transient and anything else is not."""
    code = error_code(exc)
    if code is not None:
        return code in TRANSIENT
    return any(isinstance(e, (OperationalError, ConnectionError, TimeoutError)) for e in chain(exc))
