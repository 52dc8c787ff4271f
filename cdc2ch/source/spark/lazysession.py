"""The process's Spark session as a value started on first use: a JVM only when something reads through Spark."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from cdc2ch.base import phases
from cdc2ch.base.errors import SourceError
from cdc2ch.base.log import get_logger
from cdc2ch.base.stop import Stopped
from cdc2ch.model.config import SparkSettings
from cdc2ch.model.objectstore import S3Settings

log = get_logger("cdc2ch.spark")


class LazySpark:
    """One Spark session for every pipeline of the process, built the first time one of them asks for it
    (`get`), once, whichever thread asks first. Until then no JVM runs: a poll that finds nothing new, the
    log, the metadata and the ClickHouse reader never ask. `on_start` is told the session when it starts. A
    `stop` set before or while it starts ends the wait with Stopped: a stop is never held up by the JVM."""

    def __init__(
        self,
        start: Callable,
        settings: SparkSettings | None = None,
        on_start: Callable | None = None,
        stop: threading.Event | None = None,
    ):
        self.settings = settings or SparkSettings()
        self._start, self._on_start = start, on_start  # start: (settings, what, stop) -> session
        self.stop = stop
        self._session = None
        self._lock = threading.Lock()
        self._local = threading.local()  # the pipeline whose jobs this thread runs (see jobs_of)

    @property
    def started(self):
        """The session when it runs, else None (never starts it)."""
        return self._session

    def get(self, what: str = "reading through Spark"):
        """The session, started now if it is not yet. `what` says what needs it, for the paragraph given
        when no Java can be started."""
        if self._session is None:
            with self._lock:
                if self._session is None:
                    if self.stop is not None and self.stop.is_set():
                        raise Stopped(what)  # nothing starts after a stop
                    log.info("starting_spark", needed_for=what)
                    began = time.monotonic()
                    with phases.timed("jvm"):
                        self._session = self._start(self.settings, what, self.stop)
                    log.info("spark_started", seconds=round(time.monotonic() - began, 1))
                    if self._on_start is not None:
                        self._on_start(self._session)
        group = getattr(self._local, "group", None)
        if group is not None and not self._local.applied:  # started inside a jobs_of block of this thread
            self._local.applied = True
            group(self._session)
        return self._session

    __call__ = get

    def local_master(self) -> bool:
        """Whether Spark runs (or will run) in this process: from the session once started, else from the
        settings, without starting it."""
        if self._session is not None:
            return self._session.sparkContext.master.startswith("local")
        if self.settings.master:
            return self.settings.master.startswith("local")
        return "PYSPARK_GATEWAY_PORT" not in os.environ  # spark-submit chose the master

    def pending_group(self, apply: Callable | None) -> bool:
        """Remember `apply` (a session -> None) for this thread: run at once if Spark runs, else when this
        thread starts it. None forgets it. Returns whether it has been applied."""
        self._local.group, self._local.applied = apply, False
        if apply is not None and self._session is not None:
            self._local.applied = True
            apply(self._session)
        return self._local.applied


def session_of(spark, what: str = "reading through Spark"):
    """A session from `spark`: a session itself, a LazySpark, or a function returning one."""
    if isinstance(spark, LazySpark):
        return spark.get(what)
    if spark is not None and not hasattr(spark, "sparkContext") and callable(spark):
        return spark()
    return spark


def s3_settings(spark) -> S3Settings:
    """The S3 settings `spark` (as session_of takes it) is given in its conf, then the environment's."""
    settings = spark.settings if isinstance(spark, LazySpark) else SparkSettings()
    return S3Settings.of(dict(settings.conf), os.environ)


def running(spark):
    """The session behind `spark` if it runs now, else None; never starts one."""
    if isinstance(spark, LazySpark):
        return spark.started
    return spark if hasattr(spark, "sparkContext") else None


def local_master(spark) -> bool:
    """Whether `spark` (as session_of takes it) runs Spark in this process; a LazySpark is not started."""
    if isinstance(spark, LazySpark):
        return spark.local_master()
    return session_of(spark).sparkContext.master.startswith("local")


class JavaMissing(SourceError):
    """Spark was needed and no JVM could be started."""


def no_java(what: str, why: str) -> JavaMissing:
    return JavaMissing(
        f"{what[:1].upper()}{what[1:]} needs Java (Spark runs on it), but {why}. Install Java 17 (for example "
        "`apt-get install openjdk-17-jre-headless`) and put it on PATH or set JAVA_HOME to its directory, then "
        "run the same command again: progress is recorded only once data has landed, so nothing half-done was "
        "kept. Without Java, `--reader clickhouse` replicates and loads local Delta tables that ClickHouse reads "
        "itself, and `cdc2ch status` and a poll that finds nothing new need no Java either."
    )
