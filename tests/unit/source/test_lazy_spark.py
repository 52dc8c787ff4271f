"""The process's Spark session started on first use (source/spark/lazysession.py), once, whichever thread asks
first; and the paragraph given when no Java can start it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from cdc2ch.model.config import SparkSettings
from cdc2ch.source.spark.lazysession import JavaMissing, LazySpark, local_master, running, session_of

pytestmark = pytest.mark.unit


def fake_session(master: str = "local[2]"):
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master))


def test_the_session_starts_once_for_all_threads_and_only_when_asked():
    calls, told = [], []

    def start(settings, what, stop):
        calls.append(what)
        time.sleep(0.05)  # long enough for the other threads to ask meanwhile
        return fake_session()

    lazy = LazySpark(start, SparkSettings("local[2]"), on_start=told.append)
    assert running(lazy) is None and lazy.local_master() and local_master(lazy) and calls == []
    got = []
    threads = [threading.Thread(target=lambda i=i: got.append(lazy.get(f"reading t{i}"))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and told == [got[0]] and all(s is got[0] for s in got)
    assert running(lazy) is got[0] and session_of(lazy) is got[0] and session_of(lazy.get) is got[0]


def test_a_threads_pipeline_is_applied_when_that_thread_starts_spark():
    applied = []
    lazy = LazySpark(lambda settings, what, stop: fake_session())
    assert lazy.pending_group(applied.append) is False and applied == []  # nothing runs yet
    session = lazy.get()
    assert applied == [session]
    lazy.get()
    assert applied == [session]  # once per block
    lazy.pending_group(None)
    assert (
        LazySpark(lambda s, w, stop: fake_session(), SparkSettings("spark://h:7077")).local_master() is False
    )


def test_without_java_the_start_is_one_paragraph_naming_what_needed_it(monkeypatch, tmp_path):
    from pyspark import SparkContext

    from cdc2ch.source.spark import session as spark

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(
        SparkContext, "_gateway", None
    )  # as in a process with no JVM (the suite may have one)
    with pytest.raises(JavaMissing) as raised:
        spark.lazy_session(SparkSettings()).get("reading the change feed of /lake/t through Spark")
    text = str(raised.value)
    assert text.startswith("Reading the change feed of /lake/t through Spark needs Java")
    assert "no `java` is on PATH" in text and "Install Java 17" in text and "--reader clickhouse" in text
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(JavaMissing, match=f"JAVA_HOME is {tmp_path / 'jdk'}, which has no bin/java"):
        spark.start(SparkSettings(), "reading a snapshot")


def test_after_a_stop_nothing_starts_spark():
    from cdc2ch.base.stop import Stopped

    stop, calls = threading.Event(), []
    lazy = LazySpark(lambda settings, what, given: calls.append(given) or fake_session(), stop=stop)
    stop.set()
    with pytest.raises(Stopped):
        lazy.get("reading t")
    assert calls == [] and running(lazy) is None
