"""Which ClickHouse server versions cdc2ch works with, and how a server too old is told from one unreachable.

The minimum is set by the table engine every target uses: `ReplacingMergeTree(_version, _is_deleted)`, whose
`is_deleted` argument ClickHouse 23.2 introduced. Features beyond it are checked by what the server has (a
setting in system.settings), not by version numbers, before anything is written.
"""

from __future__ import annotations

import re
import ssl
import urllib.request
from urllib.parse import quote

from cdc2ch.base.errors import SinkError

MINIMUM = (23, 2)
WHY = "its targets are ReplacingMergeTree tables with an is_deleted column, which ClickHouse 23.2 introduced"
PROBE_TIMEOUT = 5.0  # seconds for the one plain request that asks an unhelpful server its version


def parse(text: str | None) -> tuple[int, ...] | None:
    """'23.8.2.7' -> (23, 8, 2, 7); None when `text` is not a version."""
    found = re.match(r"\s*(\d+(?:\.\d+)+)", text or "")
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def too_old(version: str | None, display: str) -> SinkError | None:
    """The refusal of a server below the minimum, or None (an unknown version is given the benefit)."""
    found = parse(version)
    if found is None or found[:2] >= MINIMUM:
        return None
    need = ".".join(map(str, MINIMUM))
    return SinkError(
        f"ClickHouse at {display} is version {version}, and cdc2ch needs {need} or later: {WHY}. Nothing was "
        f"written. Upgrade the server (any release from {need} on; docs/guides/deploying.md lists the versions "
        f"each feature needs), or replicate into another one."
    )


def probe(host: str, port: int, secure: bool, user: str, password: str, ca_cert: str | None) -> str | None:
    """The server's version by the plainest request there is (GET `SELECT version()`), for when the driver's
    own start-up queries fail; None when no ClickHouse answers it."""
    url = f"{'https' if secure else 'http'}://{host}:{port}/?query={quote('SELECT version()')}"
    request = urllib.request.Request(url, headers={"X-ClickHouse-User": user, "X-ClickHouse-Key": password})
    context = ssl.create_default_context(cafile=ca_cert) if secure else None
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT, context=context) as response:
            text = response.read(100).decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return None
    return text if parse(text) else None


def missing_setting(feature: str, setting: str) -> SinkError:
    """The refusal of a feature whose setting the server lacks (it is older than the feature)."""
    return SinkError(
        f"{feature} needs ClickHouse's setting {setting}, which the ClickHouse target does not have (it is "
        f"older than that feature). Nothing was written. Upgrade the server, or use the default Spark reader "
        f"(drop --reader clickhouse)."
    )
