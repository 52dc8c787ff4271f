"""A pipeline's standing towards its offset (replication/standing.py): only the named transitions, and what
each stage lets the runner do."""

from __future__ import annotations

from typing import cast

import pytest

from cdc2ch.replication.standing import Stage, Standing
from cdc2ch.replication.startup.inputs import Inputs

pytestmark = pytest.mark.unit

INPUTS = cast(Inputs, object())  # what a held pipeline claims with: carried, never read here


def test_a_new_pipeline_holds_no_offset_until_it_is_claimed():
    new = Standing()
    assert (new.stage, new.claimed, new.holds_offset) == (Stage.NEW, False, False)
    claimed = new.claim()
    assert (claimed.stage, claimed.claimed, claimed.holds_offset, claimed.inputs) == (
        Stage.CLAIMED,
        True,
        True,
        None,
    )


def test_a_held_offset_keeps_its_inputs_until_it_is_claimed():
    held = Standing().held(INPUTS)
    assert (held.stage, held.claimed, held.holds_offset, held.inputs) == (Stage.HELD, False, True, INPUTS)
    assert held.claim() == Standing(Stage.CLAIMED)  # the inputs are used up by the claim


def test_only_a_new_pipeline_is_held_and_a_held_one_is_never_taken_back():
    with pytest.raises(AssertionError):
        Standing().claim().held(INPUTS)
    with pytest.raises(AssertionError):
        Standing().held(INPUTS).taken_back()
    assert Standing().claim().taken_back() == Standing() == Standing().taken_back()
