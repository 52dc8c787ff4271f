"""What a table's log says about replaying its change feed from version 0: the rows the table holds now, the
change rows the replay yields, and the first file the replay reads that has left the table since.

Pure: it reads the commits' file actions (model/commit.py), never storage. VACUUM deletes the files that left
the table (removed, or change files, which never belong to it) longer ago than the retention period, the
earliest first: if that earliest one is still in storage, so are all the others a replay reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc2ch.model.changeset import Commit


@dataclass(frozen=True)
class Replay:
    rows: int | None  # live rows after the last commit; None when a live file records no numRecords
    change_rows: int  # change rows the replay yields: the commits' estimates summed (an upper bound)
    first_gone: tuple[int, str] | None  # (version reading it, path): the replay's file that left first


def replay(commits: list[Commit]) -> Replay | None:
    """The replay of `commits`, which must be every commit from version 0 on, oldest first; None when they
    are not, or when a commit's file actions are not known."""
    if not commits or commits[0].version != 0 or any(c.files is None for c in commits):
        return None
    if [c.version for c in commits] != list(range(len(commits))):
        return None
    live: dict[str, int | None] = {}
    read_as_added: dict[str, int] = {}  # files a replay reads as inserted rows -> the version that added them
    first: tuple[int, str] | None = None
    for commit in commits:
        files = commit.files
        assert files is not None  # (checked above)
        # A version with change files is read from them alone, and they never belong to the table; a version
        # without is read from the files it adds (inserted rows) and removes (deleted rows).
        reads_actions = not files.change_files
        if files.change_files and first is None:
            first = (commit.version, files.change_files[0])
        kept = {path for path, _, _ in files.added}
        for path, _, data_change in files.removed:
            if path in kept:  # removed and added again with a new deletion vector: the file stays
                continue
            live.pop(path, None)
            added_at = read_as_added.pop(path, None)
            if first is None:
                if added_at is not None:
                    first = (added_at, path)
                elif data_change and reads_actions:
                    first = (commit.version, path)
        for path, rows, data_change in files.added:
            live[path] = rows
            if data_change and reads_actions and path not in read_as_added:
                read_as_added[path] = commit.version
    rows = None if any(n is None for n in live.values()) else sum(n or 0 for n in live.values())
    return Replay(rows, sum(c.estimated_rows for c in commits), first)
