"""cdc2ch's one retry policy: a bounded number of attempts with capped exponential backoff.

Standard library only, and no other cdc2ch module, so that a Spark task can take it along by value
(cloudpickle) and retry exactly as the driver does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def backoff(attempt: int, base: float = 0.5, max_wait: float = 10.0) -> float:
    """Seconds to wait after failed attempt number `attempt` (1, 2, ...): base, 2*base, 4*base..., at most
    `max_wait`."""
    return min(base * 2 ** max(attempt - 1, 0), max_wait)


def call(
    fn: Callable[[], T],
    attempts: int,
    retry_if: Callable[[BaseException], bool],
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    base: float = 0.5,
    max_wait: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    hint: Callable[[BaseException], float | None] | None = None,
) -> T:
    """Call `fn` up to `attempts` times (at least once) while it raises an exception `retry_if` accepts.

    Before each new attempt, `on_retry(attempt, exception, wait)` is told of the failed attempt and the
    pause that follows it. `hint(exception)` may give the wait the other side asked for (an HTTP
    Retry-After): it is honoured up to `max_wait`, never shorter than the backoff. The last exception, or
    the first one `retry_if` refuses, propagates unchanged.
    """
    attempts = max(1, attempts)
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as exc:
            if attempt >= attempts or not retry_if(exc):
                raise
            wait = backoff(attempt, base, max_wait)
            asked = hint(exc) if hint is not None else None
            if asked is not None:
                wait = min(max(wait, asked), max_wait)
            if on_retry is not None:
                on_retry(attempt, exc, wait)
            sleep(wait)
            attempt += 1
