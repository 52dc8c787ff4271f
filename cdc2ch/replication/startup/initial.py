"""Whether a new pipeline starts with a snapshot or replays the change feed, and why.

Pure: bootstrap.py gathers the facts (the Delta log's commits, one file looked up in storage, an interrupted
snapshot) and acts on the answer. Only a new pipeline (no stored offset) is decided for; one that has an
offset resumes after it, as ever.

`--initial-load auto` (the default) starts with a snapshot of the latest version when the changes cannot be
replayed from version 0 — versions the log no longer holds, a Change Data Feed enabled after version 0 where
only the feed may be read (`--changes-from cdf`, or a share), files a replay reads that VACUUM removed — or
when the replay costs clearly more than a snapshot:

- more than REPLAY_RATIO (2) times the rows the table holds now. A change row and a snapshot row cost about
  the same to move (docs/benchmarks.md, 2 cores, Spark reader: the change feed 368,000–479,000 rows/s, a snapshot
  282,000–326,000 rows/s), and the replay's count is an upper bound (Commit.estimated_rows), so twice as many
  rows is a replay that costs more even where the estimate is generous and the feed reads faster per row;
- and more than REPLAY_FLOOR (1,000,000) rows beyond them: below that the difference is a few seconds, less
  than Spark's start-up, and the replay keeps what a snapshot cannot have — every version's rows and the
  tombstones of keys deleted before it.

- or when one version of it holds more than LARGE_VERSION (10) times the rows a read is meant to hold
  (--max-rows-per-read): a version is never split across reads, and Spark holds a read whole in memory, where
  a snapshot reads the table in chunks. A table loaded in one large commit is the usual case.

Otherwise it replays the change feed from version 0: the whole history, exactly as `--initial-load changes`,
which also keeps today's refusals where the feed cannot be replayed. `snapshot` always starts with one. An
explicit --from-version/--from-timestamp means the change feed from there. A snapshot that an earlier run
began and did not finish (killed, or stopped) is resumed at its version, whatever the history says.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc2ch.model.changeset import Commit
from cdc2ch.replication import plan
from cdc2ch.replication.startup.replay import Replay

REPLAY_RATIO = 2
REPLAY_FLOOR = 1_000_000
LARGE_VERSION = 10
SNAPSHOT, CHANGES = "snapshot", "changes"


@dataclass(frozen=True)
class Choice:
    """How a new pipeline begins: a snapshot of `version`, or the change feed from `version`."""

    load: str  # SNAPSHOT or CHANGES
    version: int
    reason: str

    def describe(self) -> str:
        """As status shows it: `snapshot at version 12`, `changes from version 0`."""
        return f"{self.load} {'at' if self.load == SNAPSHOT else 'from'} version {self.version}"


@dataclass(frozen=True)
class Facts:
    """What the Delta log says about replaying a new pipeline's table from version 0 (auto only), and the
    version of a snapshot of the pipeline that an earlier run began and did not finish."""

    commits: list[Commit] | None = None  # the commits from version 0 to the latest that the log still holds
    replay: Replay | None = None  # what replaying them reads and yields (None: the log cannot say)
    gone: tuple[int, str] | None = None  # (version, file) a replay reads that storage no longer has
    interrupted: int | None = None
    derives: bool = False  # versions the feed does not record are derived from the log (--changes-from)
    read_rows: int | None = None  # the rows one read is meant to hold (--max-rows-per-read)


def decide(mode: str, requested: int | None, start: int, latest: int, facts: Facts) -> Choice:
    """How a new pipeline begins. `mode`: --initial-load; `requested`: the version --from-version or
    --from-timestamp names (None: not given); `start`: where the change feed would start; `latest`: the
    table's latest version."""
    if mode == CHANGES:
        return Choice(CHANGES, start, f"--initial-load changes: the changes from version {start}")
    if requested is not None:
        return Choice(CHANGES, start, f"--from-version/--from-timestamp: the changes from version {start}")
    if facts.interrupted is not None:
        return Choice(
            SNAPSHOT,
            facts.interrupted,
            f"a snapshot of version {facts.interrupted} was begun for this pipeline and not finished: resumed",
        )
    if mode == SNAPSHOT:
        return Choice(SNAPSHOT, latest, "--initial-load snapshot")
    why = cannot_replay(start, facts) or costs_more(facts.replay) or too_large(facts)
    if why:
        return Choice(SNAPSHOT, latest, why)
    return Choice(CHANGES, start, replays(start, latest, facts.replay))


def cannot_replay(start: int, facts: Facts) -> str | None:
    """Why the change feed cannot replay the history from `start`, or None."""
    commits = facts.commits or []
    missing = plan.missing_versions(start, commits)
    if missing:
        return f"versions {missing[0]}..{missing[-1]} are no longer in the Delta log (log retention removed them)"
    since = cdf_since(commits)
    if since is not None and since > start and not facts.derives:
        return f"the Change Data Feed was enabled at version {since}; versions before it have no change data"
    if facts.gone is not None:
        version, path = facts.gone
        return f"the change data of version {version} ({path}) is gone from storage (removed by VACUUM)"
    return None


def costs_more(replay: Replay | None) -> str | None:
    """Why replaying the history costs clearly more than a snapshot of the table now, or None."""
    if replay is None or replay.rows is None:
        return None
    if replay.change_rows > REPLAY_RATIO * replay.rows and replay.change_rows - replay.rows > REPLAY_FLOOR:
        return (
            f"replaying the history would write about {replay.change_rows:,} change rows, the table holds "
            f"{replay.rows:,}: more than {REPLAY_RATIO}x as many and over {REPLAY_FLOOR:,} more"
        )
    return None


def too_large(facts: Facts) -> str | None:
    """Why one version of the replay is too large to read whole, where a snapshot reads in chunks, or None."""
    if not facts.commits or not facts.read_rows:
        return None
    largest = max(facts.commits, key=lambda c: c.estimated_rows)
    if largest.estimated_rows <= LARGE_VERSION * facts.read_rows:
        return None
    return (
        f"version {largest.version} alone holds about {largest.estimated_rows:,} change rows, over "
        f"{LARGE_VERSION}x --max-rows-per-read ({facts.read_rows:,}); a version is read whole, a snapshot in chunks"
    )


def replays(start: int, latest: int, replay: Replay | None) -> str:
    """Why the change feed is replayed (auto)."""
    if replay is None or replay.rows is None:
        return f"the changes of versions {start}..{latest} can be replayed (the log records no row counts to compare)"
    return (
        f"the changes of versions {start}..{latest} can be replayed, and replaying them (about {replay.change_rows:,} "
        f"change rows) costs about what a snapshot ({replay.rows:,} rows) does"
    )


def cdf_since(commits: list[Commit]) -> int | None:
    """The version from which the change feed is recorded without a break up to the last of `commits`: the
    later of what the table properties of their metaData actions and what the operations that set them
    (plan.cdf_enabled_at) say; None when neither tells."""
    since, known = None, False
    for commit in commits:
        if commit.properties is None:
            continue
        on = str(commit.properties.get("delta.enableChangeDataFeed", "")).lower() == "true"
        since = (since if since is not None else commit.version) if on else None
        known = True
    found = [v for v in (since if known else None, plan.cdf_enabled_at(commits)) if v is not None]
    return max(found, default=None)
