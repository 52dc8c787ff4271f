"""How a new pipeline begins: the facts its initial load is chosen from (initial.py), the snapshot that choice
may ask for, and the claim that records the pipeline's first offset.

The snapshot is the Snapshotter's load (snapshot.py, through the `load_snapshot` port) into the target
itself: chunked, recorded chunk by chunk, stopped between chunks by the stop event. The offset moves to its
version only once the whole of it has landed; until then the pipeline has no offset, so a run killed midway
(`kill -9` included) or stopped is a new pipeline again the next time, finds the snapshot it began
(`OffsetStore.snapshot_begun`) and resumes it at the same version, skipping the chunks that landed. The
change feed then continues after that version.

A first attempt that fails before anything is committed is taken back (`take_back`): the claim released,
no offset recorded, and the tables it created dropped (the Footprint port), so that the next attempt, with
the same flags or others, starts a new pipeline again. A snapshot with chunks landed is kept to resume.
"""

from __future__ import annotations

from cdc2ch.base.errors import LockedError, StateError, summarise
from cdc2ch.base.log import Logger
from cdc2ch.model.changeset import FEED
from cdc2ch.model.config import RunConfig
from cdc2ch.model.records import PipelineState
from cdc2ch.replication import plan
from cdc2ch.replication.ports import ChangeSource, Ports
from cdc2ch.replication.startup import initial
from cdc2ch.replication.startup.initial import Choice
from cdc2ch.replication.startup.replay import replay


class Bootstrap:
    def __init__(self, cfg: RunConfig, source: ChangeSource, ports: Ports, log: Logger) -> None:
        self.cfg, self.source, self.ports, self.log = cfg, source, ports, log
        self.pending: Choice | None = None  # a snapshot to load before the change feed
        self.locked = False
        self.taken = False  # another runner started the pipeline while this one checked its inputs

    # -- the choice -------------------------------------------------------------------------------
    def choose(
        self, stored: PipelineState | None, requested: int | None, start: int, latest: int
    ) -> Choice | None:
        """How the pipeline begins when it is new (no stored offset); None when it has an offset. Reads the
        log (auto), storage (one file) and the snapshot progress; writes nothing."""
        if stored is not None:
            return None
        mode, facts = self.cfg.initial_load, initial.Facts()
        if mode != initial.CHANGES and requested is None:
            facts = self._facts(start, latest, weigh_replay=mode == "auto")
        return initial.decide(mode, requested, start, latest, facts)

    def _facts(self, start: int, latest: int, weigh_replay: bool) -> initial.Facts:
        interrupted = self._interrupted(latest)
        if not weigh_replay or interrupted is not None:
            return initial.Facts(interrupted=interrupted)
        commits = self.source.commits(start, latest)
        found = replay(commits)
        gone = found.first_gone if found is not None else None
        if gone is not None and self.source.file_exists(gone[1]) is not False:
            gone = None  # still there (or the source cannot tell): nothing a replay reads is gone
        derives = self.cfg.changes_from != FEED and self.source.derives
        return initial.Facts(commits, found, gone, derives=derives, read_rows=self.cfg.max_rows_per_read)

    def _interrupted(self, latest: int) -> int | None:
        """The version of a snapshot of this pipeline begun and not finished, when it can be resumed: its
        target table is there (chunks recorded for a table since dropped are not) and the log still holds
        the version."""
        version = self.ports.store.snapshot_begun(self.cfg.pipeline)
        if version is None or version > latest or self.ports.tables.comment() is None:
            return None
        return version if self.source.commit(version) is not None else None

    # -- a first attempt that fails ----------------------------------------------------------------
    def mark(self) -> None:
        """Before a new pipeline's first attempt writes: note what the target holds."""
        self.ports.footprint.mark()

    def take_back(self, exc: Exception) -> bool:
        """The first attempt failed with `exc` before committing anything: release the claim and take back
        what the attempt recorded and created; whether it was. Not when another runner holds the pipeline
        (what is there is its), nor for a snapshot with chunks landed (the next run resumes it). When
        ClickHouse cannot be reached for it either, the next run resumes as after a crash."""
        if isinstance(exc, LockedError) or self.taken:
            return False
        try:
            self.ports.lock.release()  # as a normal exit does
            self.locked = False
            if self.ports.store.snapshot_begun(self.cfg.pipeline) is not None:
                return False
            dropped = self.ports.footprint.undo()
        except Exception as failed:
            self.log.warning("first_attempt_kept", error=summarise(str(failed), 300))
            return False
        self.log.info("first_attempt_taken_back", dropped=dropped)
        return True

    # -- acting on it -----------------------------------------------------------------------------
    def begin(self, choice: Choice, start: int, table_id: str) -> PipelineState:
        """The new pipeline's state before its first version, recording the choice (saved by `claim`'s caller
        or by `load`); a snapshot chosen is loaded by `load` before any change."""
        self.log.info("initial_load", choice=choice.load, version=choice.version, reason=choice.reason)
        self.pending = choice if choice.load == initial.SNAPSHOT else None
        state = plan.state_pointed_at(
            None, self.cfg.pipeline, self.source.uri, str(self.cfg.target), start - 1,
            location=self.source.location, table_id=table_id,
        )  # fmt: skip
        return state.began(choice.describe(), choice.reason)

    def claim(self) -> None:
        """Claim the new pipeline, which must still have no offset, before its first write that counts: its
        first range passed its checks, or its snapshot begins."""
        if not self.locked:
            self.ports.lock.acquire()
            self.locked = True
        if self.ports.store.load(self.cfg.pipeline) is not None:  # another runner started it meanwhile
            self.taken = True
            raise StateError(
                f"Pipeline {self.cfg.pipeline!r} was started by another runner while this one was checking its "
                f"inputs; nothing was written by this one. Run the same command again to resume it."
            )
        self.ports.store.ensure()

    def claim_first_range(self, state: PipelineState) -> None:
        """A new pipeline's first range passed its checks: claim the pipeline and record its offset `state`."""
        self.claim()
        self.ports.store.save(state)
        self.log.info("claimed", committed=state.committed_version)

    def load(self, state: PipelineState) -> PipelineState | None:
        """Load the pending snapshot and record the offset at its version (returned); None when stopped
        between chunks (the next run resumes it)."""
        assert self.pending is not None  # the caller checks
        version = self.pending.version
        self.claim()
        rows = self.ports.load_snapshot(self.cfg, version, None)
        if rows is None:
            self.log.warning("initial_load_interrupted", version=version)
            return None
        done = plan.state_pointed_at(
            state, self.cfg.pipeline, self.source.uri, str(self.cfg.target), version, rows,
            self.source.location, state.table_id,
        )  # fmt: skip
        self.ports.store.save(done)
        self.pending = None
        self.log.info("initial_load_done", version=version, rows=rows, committed=version)
        return done
