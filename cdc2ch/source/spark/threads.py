"""Spark jobs and threads: reads on threads other than the one that planned them (the loop reads the next
range ahead), and each pipeline's jobs in a group and a scheduler pool of their own."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from cdc2ch.base import phases

if TYPE_CHECKING:
    import pyarrow as pa

_P = ParamSpec("_P")
_R = TypeVar("_R")


def on_other_threads(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn`, to be run on another thread (readahead.py) with this thread's Spark local properties: the
    caller's job group and description, scheduler pool and job tags, and what managed platforms keep there.
    In PySpark's pinned-thread mode each Python thread has its own JVM thread, which starts with none (what
    pyspark.inheritable_thread_target does). No active SparkContext: `fn` with the caller's context only."""
    from py4j.clientserver import ClientServer
    from pyspark import SparkContext

    in_context = phases.carried(fn)
    sc = SparkContext._active_spark_context
    if sc is None or not isinstance(SparkContext._gateway, ClientServer):
        return in_context
    properties = sc._jsc.sc().getLocalProperties().clone()

    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        sc._jsc.sc().setLocalProperties(properties)
        return in_context(*args, **kwargs)

    return run


def _group(name: str) -> str:
    return f"cdc2ch:{name}"


@contextmanager
def jobs_of(spark, name: str) -> Iterator[None]:
    """Spark jobs this thread starts inside the block belong to pipeline `name`: its job group (so that
    cancel_jobs stops them and no other pipeline's) and its FAIR scheduler pool (each pipeline an equal share
    of the executors, whatever another one asks for). Without a session: nothing to do; with a LazySpark
    not started yet, done when this thread starts it inside the block."""
    from cdc2ch.source.spark.lazysession import LazySpark, running

    def apply(session) -> None:
        sc = session.sparkContext
        sc.setJobGroup(_group(name), f"cdc2ch pipeline {name}", interruptOnCancel=True)
        sc.setLocalProperty("spark.scheduler.pool", name)

    if isinstance(spark, LazySpark):
        spark.pending_group(apply)
    elif getattr(spark, "sparkContext", None) is not None:
        apply(spark)
    try:
        yield
    finally:
        if isinstance(spark, LazySpark):
            spark.pending_group(None)
        session = running(spark)
        if session is not None:
            session.sparkContext.setLocalProperty("spark.scheduler.pool", None)
            session.sparkContext._jsc.clearJobGroup()


def cancel_jobs(spark, name: str) -> None:
    """Cancel the Spark jobs of pipeline `name` that are running, and only those."""
    from cdc2ch.source.spark.lazysession import running

    session = running(spark)
    if session is not None:
        session.sparkContext.cancelJobGroup(_group(name))


_tags = itertools.count()


def to_arrow(df):
    """df.toArrow(), its time split into phases: until its first Spark job was submitted (planning), while
    its jobs ran (the scan; results stream to this process meanwhile) and after the last one ended (the
    rest of the transfer). Only timed while a pipeline records its phases."""
    if not phases.recording_now():
        return df.toArrow()
    sc = df.sparkSession.sparkContext
    tag = f"cdc2ch-read-{next(_tags)}"
    t0 = time.time()
    sc.addJobTag(tag)
    try:
        table = df.toArrow()
    finally:
        sc.removeJobTag(tag)
    _timed_jobs(sc, tag, t0, time.time())
    return table


@dataclass(frozen=True)
class _Failed:
    """The reader thread's own failure (not the stream's): raised as it is."""

    exc: BaseException


def arrow_batches(df, held_rows: int) -> Generator[pa.RecordBatch, None, None]:
    """df's rows as Arrow record batches, each as soon as the Spark task that made it has ended (in the order
    tasks end, not the frame's): what df.toArrow() reads, handed over while the scan still runs. Each batch
    is the same on every read of the same plan (one task's rows, cut at
    spark.sql.execution.arrow.maxRecordsPerBatch). Batches not yet taken hold at most `held_rows` rows in
    memory (and at least one batch); those beyond wait on local disk (spill.RowQueue). Leaving the loop
    early cancels the job; its failure is raised when the stream ends. Timed into phases as to_arrow is."""
    import pyarrow as pa
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.util import _create_local_socket

    from cdc2ch.source.sparkread.spill import RowQueue

    sc = df.sparkSession.sparkContext
    tag = f"cdc2ch-read-{next(_tags)}"
    t0 = time.time()
    sc.addJobTag(tag)  # the job runs on a thread the call starts, which takes this thread's tags
    try:
        port, secret, server = df._jdf.collectAsArrowToPython()
    finally:
        sc.removeJobTag(tag)
    # Spark writes each task's batches from its scheduler's event loop: while that write waits for this
    # process, every other pipeline's jobs wait too. A reader thread takes them as they come, never waiting.
    sockfile, items, done = _create_local_socket((port, secret)), RowQueue(held_rows), object()

    def drain() -> None:
        try:
            for item in ArrowCollectSerializer().load_stream(sockfile):
                if isinstance(item, pa.RecordBatch):  # the last item is the tasks' order
                    try:
                        items.put(item, item.num_rows)
                    except BaseException as exc:  # this side's own failure (a spill to a full disk)
                        items.put(_Failed(exc))
                        return
        except BaseException as exc:  # the stream broke: the job's own failure says why (below)
            items.put(exc)
            return
        items.put(done)

    reader = threading.Thread(target=drain, name="cdc2ch-arrow-stream", daemon=True)
    reader.start()
    try:
        while (item := items.get()) is not done:
            if isinstance(item, _Failed):
                raise item.exc
            if isinstance(item, BaseException):
                sockfile.close()  # nothing reads on: the JVM must not wait for it
                with unwrap_spark_exception():
                    server.getResult()  # the job's failure, or that the JVM is gone
                raise item
            yield item
    except BaseException:  # stopped early, or failed here: so does the job
        try:
            sc.cancelJobsWithTag(tag)
        except Exception:  # best effort (the JVM may be gone)
            pass
        raise
    finally:
        sockfile.close()  # ends the reader thread, if still reading
        items.close()  # and drops what waits, spilled batches too
        if items.spilled:  # the inserts lagged behind the scan by more than `held_rows`
            from cdc2ch.base.log import get_logger

            get_logger("cdc2ch.read").info("read_spilled", batches=items.spilled, held_rows=held_rows)
    with unwrap_spark_exception():
        server.getResult()  # the job's failure, if any
    if phases.recording_now():
        _timed_jobs(sc, tag, t0, time.time())


def _timed_jobs(sc, tag: str, t0: float, t1: float) -> None:
    """Phases of the jobs tagged `tag` between t0 and t1: planning until the first was submitted, the scan
    while they ran, the rest of the transfer after the last one ended."""
    first: float | None = None
    last: float | None = None
    try:  # from Spark's status store (kept with the UI off too); a job not yet seen ended just now
        store = sc._jsc.sc().statusStore()
        for job_id in sc._jsc.sc().statusTracker().getJobIdsForTag(tag):
            job = store.job(job_id)
            began = job.submissionTime().get().getTime() / 1000 if job.submissionTime().isDefined() else t0
            ended = job.completionTime().get().getTime() / 1000 if job.completionTime().isDefined() else t1
            first, last = min(first or began, began), max(last or ended, ended)
    except Exception:  # only timing lost
        first = last = None
    if first is None or last is None:  # both or neither
        phases.add("scan", t1 - t0)
        return
    first, last = min(max(first, t0), t1), min(max(last, t0), t1)
    phases.add("plan", first - t0)
    phases.add("scan", last - first)
    phases.add("transfer", t1 - last)
