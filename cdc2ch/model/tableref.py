"""What `--table` names: a catalog table (`schema.table`, `catalog.schema.table`), a path/URI, or a Delta
Sharing table (`<profile file>#<share>.<schema>.<table>`).

The rule, decided on the text alone so that it never depends on what exists on disk or in a catalog:

0. Text with a `#` and no `/` after its last `#` is a Delta Sharing table, as every Delta Sharing client
   writes it: the profile file before the last `#`, `<share>.<schema>.<table>` after it (schema and table
   names hold no dots; the share is everything before them). A malformed name there is refused.
1. A URI (a scheme followed by `:/`, as in `s3a://bucket/t`, `file:/data/t`) is a path.
2. Text containing `/` or `\\`, or starting with `.` or `~`, is a path (`./orders`, `/lake/orders`).
3. Two or three dot-separated identifiers are a catalog name. An identifier is letters, digits and `_`
   (not only digits), or anything between backticks (a doubled backtick is a literal one):
   `sales.orders`, `main.sales.orders`, `` `my-schema`.`my.table` ``.
4. Anything else (a bare word, four parts, spaces) is refused: it could be either.

A directory in the working directory whose name looks like a name (`orders.delta`) is written `./orders.delta`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from cdc2ch.base.errors import ConfigError
from cdc2ch.model.objectstore import canonical_uri

DELTA_LOG = "_delta_log"  # the directory that makes a directory a Delta table
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")
_PLAIN = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class TableRef:
    """`--table` parsed: `parts` of a catalog name, or None for a path/URI."""

    text: str
    parts: tuple[str, ...] | None = None
    profile: str | None = None  # a Delta Sharing table: its profile file (absolute) ...
    shared: tuple[str, str, str] | None = None  # ... and (share, schema, table)

    @property
    def is_name(self) -> bool:
        return self.parts is not None

    @property
    def is_shared(self) -> bool:
        return self.shared is not None

    @property
    def uri(self) -> str:
        """A shared table's identity: `<absolute profile path>#share.schema.table`."""
        return f"{self.profile}#{'.'.join(self.shared or ())}"

    @property
    def last(self) -> str:
        """The table's own name: the last name part, or the last path segment."""
        if self.parts is not None:
            return self.parts[-1]
        if self.shared is not None:
            return self.shared[-1]
        return self.text.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] or "table"

    def sql(self) -> str:
        """The name as Spark SQL reads it, each part backquoted."""
        return quote_name(self.parts or ())


def quote_name(parts: tuple[str, ...] | list[str]) -> str:
    return ".".join("`" + p.replace("`", "``") + "`" for p in parts)


def display_name(parts: tuple[str, ...] | list[str]) -> str:
    """A name as people write it: parts quoted only where they need it (`sales.orders`)."""
    return ".".join(p if _plain(p) else "`" + p.replace("`", "``") + "`" for p in parts)


def _plain(part: str) -> bool:
    return bool(_PLAIN.fullmatch(part)) and not part.isdigit()


def is_path(text: str) -> bool:
    t = text.strip()
    return bool(_URI.match(t)) or "/" in t or "\\" in t or t.startswith((".", "~"))


def is_shared(text: str) -> bool:
    t = text.strip()
    return "#" in t and "/" not in t.rpartition("#")[2]


def _shared(text: str) -> TableRef:
    profile, _, name = text.rpartition("#")
    parts = name.rsplit(".", 2)
    bad = [
        p for p in parts if not p or p != p.strip() or any(c in p for c in " /\x7f") or not p.isprintable()
    ]
    if not profile.strip() or len(parts) != 3 or bad:
        why = (
            "no profile file before the `#`"
            if not profile.strip()
            else f"{name!r} is not <share>.<schema>.<table>"
        )
        raise ConfigError(
            f"--table {text!r} reads as a Delta Sharing table, but {why}. Write the profile file the data "
            f"provider gave you, a `#`, and the shared table's three-part name: "
            f"--table ./config.share#my_share.sales.orders (names without spaces or slashes; schema and "
            f"table without dots)."
        )
    return TableRef(
        text, profile=os.path.abspath(os.path.expanduser(profile)), shared=(parts[0], parts[1], parts[2])
    )


def parse_table(text: str) -> TableRef:
    """Apply the rule above; ConfigError, with what to write instead, for text that is neither."""
    t = (text or "").strip()
    if not t:
        raise ConfigError(
            "--table is empty. Give a Delta table's path or URI (/lake/orders, s3a://bucket/orders) or its "
            "catalog name (sales.orders or catalog.sales.orders)."
        )
    if is_shared(t):
        return _shared(t)
    if is_path(t):
        if re.fullmatch(r"[A-Za-z][\w+.-]*:/*", t):
            raise ConfigError(
                f"--table {t!r} is a scheme with no location after it. Give the whole URI of the Delta table, "
                f"e.g. s3a://bucket/orders or file:///lake/orders."
            )
        return TableRef(t)
    parts: list[str] | None
    try:
        parts = split_name(t)
    except ValueError as exc:
        parts, why = None, str(exc)
    else:
        why = (
            "a single word could be a directory or a table"
            if len(parts) == 1
            else f"it has {len(parts)} dot-separated parts"
        )
    if parts is not None and len(parts) in (2, 3):
        return TableRef(t, tuple(parts))
    raise ConfigError(
        f"--table {t!r} is neither a path nor a catalog table name ({why}). cdc2ch reads text with a `/` or "
        f"`\\`, starting with `.` or `~`, or with a scheme (s3a://, file:/) as a path, and two or three "
        f"dot-separated identifiers (schema.table or catalog.schema.table, parts with other characters in "
        f"backticks: `my-schema`.`orders`) as a name. Write ./{t} for a directory here, or schema.{t} for a "
        f"table of the catalog."
    )


def split_name(text: str) -> list[str]:
    """Split on dots outside backticks; each part an identifier (ValueError saying why not)."""
    parts: list[str] = []
    i = 0
    while True:
        if text.startswith("`", i):
            end = i + 1
            while True:
                end = text.find("`", end)
                if end == -1:
                    raise ValueError("a backtick is not closed")
                if text.startswith("``", end):
                    end += 2
                    continue
                break
            part, i = text[i + 1 : end].replace("``", "`"), end + 1
            if not part:
                raise ValueError("a part is empty")
        else:
            m = _PLAIN.match(text, i)
            if not m or m.group().isdigit():
                bad = text[i : i + 1] or "the end"
                raise ValueError(f"{bad!r} at position {i + 1} cannot start an unquoted identifier")
            part, i = m.group(), m.end()
        parts.append(part)
        if i == len(text):
            return parts
        if text[i] != ".":
            raise ValueError(f"{text[i]!r} at position {i + 1} is not allowed unquoted")
        i += 1


def is_local(location: str) -> bool:
    """Whether a location is on this machine's file system: a path with no scheme, or a `file:` URI."""
    return urlsplit(location).scheme in ("", "file")


def normalize_uri(table: str) -> str:
    """Local paths become absolute (so the pipeline's identity does not depend on the cwd); URIs stay, but
    for S3's, which all read as s3a://."""
    if is_local(table):
        path = table[len("file:") :] if table.startswith("file:") else table
        while path.startswith("//"):
            path = path[1:]
        return os.path.abspath(os.path.expanduser(path))
    return canonical_uri(table)


def anchored(text: str) -> str:
    """`--table` with a local path (or pattern) or a share's profile made absolute, as the working directory
    means it now: a configuration is anchored once, so what a pipeline reads never depends on where the
    process stands later. Anything else, and text `parse_table` refuses, unchanged."""
    t = (text or "").strip()
    if is_shared(t):
        try:
            return _shared(t).uri
        except ConfigError:
            return text
    return normalize_uri(t) if t and is_path(t) and is_local(t) else text


def same_location(a: str, b: str) -> bool:
    """Two locations of one directory: `file:/x/t`, `file:///x/t/` and `/x/t` are the same."""
    return bool(a) and bool(b) and normalize_uri(a.rstrip("/")) == normalize_uri(b.rstrip("/"))
