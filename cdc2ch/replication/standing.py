"""A pipeline's standing towards its offset, one value with named transitions (docs/design.md, "The lifecycle
of a pipeline"). Only a claimed pipeline writes:

    new ──claimed──▶ claimed         start: an offset of its own and something to write; or, for a new
                                     pipeline, its first range read and checked, or its first snapshot begun
    new ──held─────▶ held            start of a --once poll of a pipeline with an offset and nothing to write
    held ──claimed─▶ claimed         a version that came since the look, a resync asked for
    claimed ──taken_back──▶ new      a new pipeline's first attempt failed before it committed anything
                                     (a new one not yet claimed stays new)

`held` keeps the inputs the pipeline was checked with, to claim by them without checking again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cdc2ch.replication.startup.inputs import Inputs


class Stage(Enum):
    NEW = "new"  # no claim, no offset this runner may write
    HELD = "held"  # an offset of its own, not claimed
    CLAIMED = "claimed"


@dataclass(frozen=True)
class Standing:
    stage: Stage = Stage.NEW
    inputs: Inputs | None = None  # held: what to claim with

    @property
    def claimed(self) -> bool:
        return self.stage is Stage.CLAIMED

    @property
    def holds_offset(self) -> bool:
        """Whether the pipeline has an offset this runner may write: claimed, or held unclaimed."""
        return self.stage is not Stage.NEW

    def held(self, inputs: Inputs) -> Standing:
        assert self.stage is Stage.NEW, self.stage
        return Standing(Stage.HELD, inputs)

    def claim(self) -> Standing:
        return Standing(Stage.CLAIMED)

    def taken_back(self) -> Standing:
        assert self.stage is not Stage.HELD, self.stage  # (a new pipeline's: claimed, or not yet)
        return Standing()


@dataclass(frozen=True)
class StepOutcome:
    """What one step of a pipeline did: whether it committed versions, whether it ended between two ranges
    to let other pipelines run, with work left, and whether it ended caught up (every version it saw
    replicated: what the service's merges wait for, fleet/merges.py)."""

    committed: bool
    gave_way: bool = False
    caught_up: bool = False

    @classmethod
    def of(cls, before: int, after: int, latest: int, gave_way: bool) -> StepOutcome:
        """A step that moved the committed version from `before` to `after`, `latest` the newest it saw (one
        that gave way has ranges left: it is behind)."""
        return cls(after != before, gave_way, caught_up=after >= latest)
