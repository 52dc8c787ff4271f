"""Which server versions are refused, and how a version is read."""

from __future__ import annotations

import pytest

from cdc2ch.clickhouse.connection import compatibility

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "version, refused",
    [("18.16.1", True), ("22.8.21.38", True), ("23.1.9", True), ("23.2.1.2537", False), ("26.9.2.1", False),
     ("", False), ("not a version", False), (None, False)],
)  # fmt: skip
def test_below_23_2_is_refused_and_an_unknown_version_is_given_the_benefit(version, refused):
    error = compatibility.too_old(version, "http://h:8123/")
    assert (error is not None) == refused
    if refused:
        assert f"is version {version}, and cdc2ch needs 23.2 or later" in str(error)


def test_a_probe_of_nothing_listening_is_none():
    assert compatibility.probe("127.0.0.1", 1, False, "default", "", None) is None
