"""Session settings held for a block and put back after it, safely when blocks on several threads overlap."""

from __future__ import annotations

import threading
from contextlib import contextmanager

# (session, key) -> [blocks inside, the value before the first]: threads sharing a session (the Python API
# called from several threads, a verify beside a run) may be inside session_conf at once.
_CONF_HELD: dict[tuple[int, str], list] = {}
_CONF_LOCK = threading.Lock()


@contextmanager
def session_conf(spark, conf: dict[str, str]):
    """`conf` set on the session for the block, then each key back to its previous value (or unset): the
    session may be the caller's (the Python API), which must find it as it was. Delta reads these settings
    when a read is planned (`load`), which builds the relation the later actions run. Blocks on several
    threads overlap safely: the settings stay until the last one leaves, and are then put back as they were
    before the first (leaving one's own block must not unset them under another thread's `load`)."""
    entered, failed = [], True
    try:
        with _CONF_LOCK:
            for key, value in conf.items():
                held = _CONF_HELD.setdefault((id(spark), key), [0, None])
                if held[0] == 0:
                    held[1] = spark.conf.get(key, None)
                held[0] += 1
                entered.append(key)
                spark.conf.set(key, value)
        yield
        failed = False
    finally:
        try:
            _leave(spark, entered)
        except Exception:
            if not failed:  # else the block's own error is what the user must see (the JVM may be gone)
                raise


def _leave(spark, entered: list[str]) -> None:
    """Count each key's blocks down, the last one out putting its value back; the first failure is raised last."""
    failure = None
    with _CONF_LOCK:
        for key in entered:
            held = _CONF_HELD[(id(spark), key)]
            held[0] -= 1
            if held[0] > 0:
                continue
            del _CONF_HELD[(id(spark), key)]
            try:  # put back as it was before the first block
                if held[1] is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, held[1])
            except Exception as exc:
                failure = failure or exc
    if failure is not None:
        raise failure
