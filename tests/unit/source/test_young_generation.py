"""The local JVM's young generation, sized from the driver heap Spark is given (source/spark/session.py)."""

from __future__ import annotations

import pytest

from cdc2ch.source.spark.session import young_generation

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("memory", "young"),
    [
        ("1g", 204),
        ("1024m", 204),
        ("2G", 409),
        ("2gb", 409),
        ("1536", 307),
        (" 512M ", 102),
        ("1048576k", 204),
    ],
)
def test_a_fifth_of_the_heap_with_large_survivor_spaces(memory, young):
    assert young_generation(memory) == f" -Xmn{young}m -XX:SurvivorRatio=3"


@pytest.mark.parametrize("memory", ["100m", "0", "", "1.5g", "lots"])
def test_a_small_or_unread_heap_keeps_the_jvms_own_sizing(memory):
    assert young_generation(memory) == ""
