"""Spark reads on threads other than the one that planned them (the loop reads the next range ahead)."""

from __future__ import annotations


def on_other_threads(fn):
    """`fn`, to be run on another thread (readahead.py) with this thread's Spark local properties: the
    caller's job group and description, scheduler pool and job tags, and what managed platforms keep there.
    In PySpark's pinned-thread mode each Python thread has its own JVM thread, which starts with none (what
    pyspark.inheritable_thread_target does). No active SparkContext: `fn` itself."""
    from py4j.clientserver import ClientServer
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or not isinstance(SparkContext._gateway, ClientServer):
        return fn
    properties = sc._jsc.sc().getLocalProperties().clone()

    def run(*args, **kwargs):
        sc._jsc.sc().setLocalProperties(properties)
        return fn(*args, **kwargs)

    return run
