"""Which pipelines `cdc2ch status` lists: `--pattern`, `--failing` and `--lagging`, over its rows."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

# The row fields a --pattern is matched against: the pipeline's name, its target (database.table) and its
# Delta table (path, URI, catalog name or shared table).
PATTERN_FIELDS = ("pipeline", "target", "source")


def matches(row: dict, pattern: str) -> bool:
    """The glob (*, ?, [abc]; case-sensitive) matches the pipeline's name, target or Delta table."""
    return any(row.get(f) and fnmatchcase(row[f], pattern) for f in PATTERN_FIELDS)


def failing(row: dict) -> bool:
    """Its last attempt failed (a table a --table pattern skipped included); `error` says why."""
    return bool(row.get("failing"))


def lagging(row: dict, seconds: float) -> bool:
    """Behind by more than `seconds` between the commit times of the latest Delta version and the last
    replicated one, or versions behind with no time to compare (the log no longer holds the commit). A
    pipeline whose lag is unknown (its table cannot be read) is not: --failing and --max-lag find those."""
    if not row.get("versions_behind"):
        return False
    behind = row.get("seconds_behind")
    return behind is None or behind > seconds


@dataclass(frozen=True)
class Selection:
    """The filters given (none: every pipeline); a row is listed when it passes all of them."""

    pattern: str | None = None
    failing: bool = False
    lagging: float | None = None  # seconds

    def before_lag(self, row: dict) -> bool:
        """The filters that need no Delta log, so that the logs of pipelines they drop are never read."""
        return (self.pattern is None or matches(row, self.pattern)) and (not self.failing or failing(row))

    def __call__(self, row: dict) -> bool:
        return self.before_lag(row) and (self.lagging is None or lagging(row, self.lagging))

    def __bool__(self) -> bool:
        return self.pattern is not None or self.failing or self.lagging is not None

    def describe(self) -> str:
        """The filters as flags, for messages: --pattern 'sales.*' --failing."""
        flags = [f"--pattern {self.pattern!r}"] if self.pattern is not None else []
        flags += ["--failing"] if self.failing else []
        flags += [f"--lagging {self.lagging:g}s"] if self.lagging is not None else []
        return " ".join(flags)
