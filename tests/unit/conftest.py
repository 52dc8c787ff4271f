"""The unit layer: in-memory fakes of the ports, no JVM, no ClickHouse engine. Every test here is marked
`unit` (`pytest -m unit` runs just these) and fails if it starts a JVM."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/unit/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _no_jvm():
    """A unit test must not start Spark: if no JVM ran before it, none may run after it."""
    from pyspark import SparkContext

    before = SparkContext._gateway is not None
    yield
    assert before or SparkContext._gateway is None, "a unit test started a JVM"
