"""A failed ClickHouse call in cdc2ch's words.

clickhouse-connect reports a failure of the transport as urllib3 renders it: the pool, its own retry
counts and the URL with the query id of the attempt (`Max retries exceeded with url: /?query_id=…`). What
the user can act on is underneath: the connection was refused, the host name does not resolve, no answer
came in time. `cause` says that, and of any other error its text without query ids.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl

from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ReadTimeoutError

from cdc2ch.base.errors import chain, one_line

# A query id as clickhouse-connect puts one in a URL (a fresh one per attempt: noise in a message)
_QUERY_ID = re.compile(r"[?&]?query_id=[^\s&)'\"]*")


def cause(exc: BaseException) -> str:
    """What made a ClickHouse call fail, on one line: for a failure of the transport the network's cause
    (refused, unresolved, reset, timed out, TLS), else the error's own text; never a query id."""
    errors = list(chain(exc))[::-1]  # the innermost error first: the most precise
    for said in (_network(e) for e in errors):
        if said is not None:
            return said
    for e in errors:
        if isinstance(e, TimeoutError):
            return "timed out"
        if isinstance(e, OSError) and e.strerror:  # no route to host, network unreachable…
            return e.strerror[:1].lower() + e.strerror[1:]
    library = [e for e in errors if isinstance(e, HTTPError)]
    return scrubbed(str(library[0] if library else exc))


def scrubbed(text: str) -> str:
    """An error's text on one line, without the query ids clickhouse-connect puts in its URLs."""
    return one_line(_QUERY_ID.sub("", text))


def _network(e: BaseException) -> str | None:
    if isinstance(e, socket.gaierror):
        return f"the host name does not resolve ({e.strerror})"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens at that address and port)"
    if isinstance(e, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(e, ConnectionError):  # reset, aborted, broken pipe
        return f"the connection broke ({e.strerror or type(e).__name__})"
    if isinstance(e, ssl.SSLError):
        return f"the TLS handshake failed ({getattr(e, 'verify_message', None) or e.reason or e})"
    if isinstance(e, ConnectTimeoutError) and not isinstance(e, NewConnectionError):
        return "no connection within connect_timeout"
    if isinstance(e, ReadTimeoutError):
        return "no answer within send_receive_timeout"
    return None
