"""Scala sequences through py4j: JVM objects handed to Delta's Scala functions as a Seq, and a Seq's items
brought back as a Python list."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def scala_seq(jvm, items: Iterable[Any]) -> Any:
    """A Scala Seq of `items` (JVM objects or values py4j converts)."""
    found = jvm.java.util.ArrayList()
    for item in items:
        found.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(found).toSeq()


def python_list(seq) -> list[Any]:
    """The items of a Scala Seq, in order."""
    return [seq.apply(i) for i in range(seq.size())]
